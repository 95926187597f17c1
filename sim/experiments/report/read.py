"""Reading a result folder's files for a report: each missing or damaged file is one line
(:class:`~sim.core.errors.ScenarioError`) naming the file and what was expected."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from sim.core.errors import ScenarioError


def json_file(path: Path, *, required: bool = True, kind: type = dict):
    """The JSON document in ``path`` (None when it is absent and not ``required``)."""
    if not path.is_file():
        if required:
            raise ScenarioError(f"{path}: missing (expected the result's {path.name}; is the folder whole?)")
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ScenarioError(f"{path}: not readable as JSON ({_short(exc)}) (expected the file priosim wrote)") from None
    if not isinstance(doc, kind):
        raise ScenarioError(f"{path}: holds a JSON {type(doc).__name__} (expected a {kind.__name__})")
    return doc


def parquet(path: Path, *, required: bool = True, columns: list[str] | None = None) -> pd.DataFrame | None:
    """The table in ``path``; ``columns``: the ones the report needs, each checked."""
    if not path.is_file():
        if required:
            raise ScenarioError(f"{path}: missing (expected the result's {path.name}; is the folder whole?)")
        return None
    try:
        df = pd.read_parquet(path)
    except Exception as exc:  # (pyarrow raises several kinds for a damaged file)
        raise ScenarioError(f"{path}: not readable as parquet ({_short(exc)}) (expected the table priosim wrote)") \
            from None
    missing = [c for c in columns or () if c not in df.columns]
    if missing:
        raise ScenarioError(f"{path}: no column {missing[0]!r} (expected the columns priosim writes, e.g. "
                            f"{', '.join(columns[:4])})")
    return df


def csv(path: Path) -> pd.DataFrame | None:
    """The CSV table in ``path`` (None when absent)."""
    if not path.is_file():
        return None
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ScenarioError(f"{path}: not readable as CSV ({_short(exc)}) (expected the table priosim wrote)") \
            from None


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:160] + ("..." if len(text) > 160 else "")
