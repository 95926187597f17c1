"""The normalised table of one real benchmark run, and the registry of result-file formats.

Every reader turns its client's file into a :class:`Run`: one row per request the file lists
(``input_tokens``, ``output_tokens``: tokens; ``start_s``: seconds after the run's first
request was sent, NaN when the file has no send times; ``ttft_s``, ``e2e_s``: seconds;
``itl_s``: the gaps between streamed chunks, seconds, a list or None), the run's settings
(``request_rate`` in requests/s, ``inf`` for all at once; ``burstiness``; ``max_concurrency``
or None; ``num_prompts``; ``model``; ``backend``; ``date``), the file's own summary metrics
(its keys, its units) and which client's metric definitions apply (``metrics``: ``vllm``,
``guidellm``, ``genai-perf``; :mod:`calibrate.runs.compare`).

Formats are detected from the content (:func:`read_run`), never from the file name; each is a
:class:`RunFormat` in :data:`RUN_FORMATS` (``plumbing.registry``, as trace formats are).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from plumbing.documents import DocumentError, read_text
from plumbing.registry import Registry
from sim.core.errors import ScenarioError

COLUMNS = ("input_tokens", "output_tokens", "start_s", "ttft_s", "itl_s", "e2e_s")
SETTINGS = ("request_rate", "burstiness", "max_concurrency", "num_prompts", "model", "backend", "date")


class RunError(ScenarioError):
    """A result file that cannot be read: one line naming the file, the key, the value and
    what was expected (the CLI prints it and exits 2)."""


@dataclass
class Run:
    """One benchmark run, normalised (see the module docstring for columns and units)."""

    requests: pd.DataFrame
    settings: dict
    summary: dict
    source: str
    format: str
    metrics: str
    duration_s: float = math.nan  # the client's own benchmark duration, s (NaN when absent)
    notes: list[str] = field(default_factory=list)
    # suspicious but readable input (a per-request list that disagrees with the file's own
    # summary): the command prints each as one ``warning:`` line (plumbing.notices.warn)
    warnings: list[str] = field(default_factory=list)
    # where the request lengths come from: "file" (per request), "law" (a summary-only file's
    # dataset settings, e.g. SGLang's random lengths) or "means" (a summary-only file's totals)
    lengths: str = "file"
    part: int | None = None  # its place (1-based) in a file of several results, else None

    @property
    def summary_only(self) -> bool:
        """No per-request lists in the file: no times, the lengths from its settings or totals,
        the measured metrics its summary keys (:mod:`calibrate.runs.vllm`)."""
        return self.lengths != "file"

    @property
    def label(self) -> str:
        return run_label(self.source, self.part)

    @property
    def has_starts(self) -> bool:
        return bool(len(self.requests)) and bool(np.isfinite(self.requests["start_s"]).all())


def run_label(source: str, part: int | None) -> str:
    """A run's name in reports: its file's name, with ``#N`` for the N-th result of a file of several."""
    name = Path(source).name
    return name if part is None else f"{name}#{part}"


@dataclass(frozen=True)
class RunFormat:
    """A result-file format: ``detect(doc)`` says whether a parsed document is one of its
    files; ``read(doc, name)`` makes the :class:`Run` (raising :class:`RunError`)."""

    detect: Callable[[Any], bool]
    read: Callable[[Any, str], Run]
    description: str = ""
    # every result of a file that may hold several (one per line), each a Run, or (``only`` N)
    # the N-th alone; None: ``read``'s one
    read_all: Callable[..., list[Run]] | None = None


RUN_FORMATS = Registry("benchmark result format")


def register_run_format(name: str, fmt: RunFormat) -> None:
    RUN_FORMATS.register(name, fmt, fmt.description)


def parse_document(path: Path) -> Any:
    """The file's JSON: one document, or a JSON-lines file as the list of its objects (SGLang
    appends one result line per run). Unreadable or invalid text raises :class:`RunError`."""
    try:
        text = read_text(path)
    except FileNotFoundError:
        raise RunError(f"{path}: no such file (expected a benchmark result file)") from None
    except DocumentError as exc:
        raise RunError(f"{path}: {exc}") from None
    except OSError as exc:
        raise RunError(f"{path}: cannot read it ({exc})") from None
    if not text.strip():  # (json's own words for it, "Expecting value", say nothing useful)
        raise RunError(f"{path}: is empty (expected a benchmark result file: vLLM, GuideLLM, SGLang or genai-perf)")
    try:
        return json.loads(text)
    except json.JSONDecodeError as first:
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if len(lines) > 1:
            docs = []
            for i, ln in enumerate(lines, 1):
                try:
                    docs.append(json.loads(ln))
                except json.JSONDecodeError as exc:
                    raise RunError(f"{path} line {i}: not valid JSON ({exc.msg}) (expected one JSON "
                                   f"object per line)") from None
            return docs
        raise RunError(f"{path}: not valid JSON ({first.msg} at line {first.lineno} column {first.colno}) "
                       f"(expected a benchmark result file: vLLM, GuideLLM, SGLang or genai-perf)") from None


def read_run(path: str | Path, fmt: str | None = None) -> Run:
    """Read a result file into a :class:`Run`; its format from the content (or ``fmt``). A file
    of several results (vLLM's ``--append-result``, SGLang's output file) gives its last."""
    f, doc, name = _format_of(path, fmt)
    return f.read(doc, name)


def read_runs(path: str | Path, fmt: str | None = None, only: int | None = None) -> list[Run]:
    """Every result of a file as a :class:`Run` each (one for most files; one per line of a
    vLLM ``--append-result`` or SGLang output file, numbered by ``Run.part``); ``only`` N: the
    N-th alone, the others not read (a replay of one result of a sweep)."""
    f, doc, name = _format_of(path, fmt)
    if f.read_all is not None:
        return f.read_all(doc, name, only)
    if only not in (None, 1):
        raise RunError(f"{name}: result: the file holds 1 result(s) (got {only})")
    return [f.read(doc, name)]


def picked(n: int, only: int | None, name: str) -> range:
    """The results (1-based) of a file of ``n`` that :func:`read_runs` reads: all, or ``only``."""
    if only is None:
        return range(1, n + 1)
    if not 1 <= only <= n:
        raise RunError(f"{name}: result: the file holds {n} result(s) (got {only})")
    return range(only, only + 1)


def _format_of(path: str | Path, fmt: str | None) -> tuple[RunFormat, Any, str]:
    """The file's format (detected from the content, or ``fmt``), its parsed document and name."""
    from calibrate.runs import formats  # noqa: F401  (registers the shipped formats)

    p = Path(path)
    doc = parse_document(p)
    if fmt is not None:
        try:
            return RUN_FORMATS.resolve(fmt), doc, str(p)
        except KeyError as exc:
            raise RunError(f"--format: {exc.args[0]}") from None
    for entry in RUN_FORMATS.entries():
        f = RUN_FORMATS.resolve(entry.name)
        if f.detect(doc):
            return f, doc, str(p)
    kind = type(doc).__name__
    keys = ", ".join(sorted(doc)[:8]) if isinstance(doc, dict) else ""
    raise RunError(f"{p}: not a benchmark result file of a known kind (a JSON {kind}"
                   + (f" with keys {keys}" if keys else "")
                   + f"; expected one of: {', '.join(RUN_FORMATS.names())})")


# -- helpers the readers share -------------------------------------------------------------

def need(doc: dict, key: str, name: str, where: str = "") -> Any:
    if not isinstance(doc, dict) or key not in doc:
        raise RunError(f"{name}: {where}{key}: missing (expected it in this kind of result file)")
    return doc[key]


def number_or_none(v: Any, key: str, name: str) -> float | None:
    """A setting that may be absent (None), a number, or the strings 'inf' / 'Infinity'."""
    if v is None:
        return None
    if isinstance(v, str) and v.strip().lower() in ("inf", "infinity", "+inf"):
        return math.inf
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise RunError(f"{name}: {key}: must be a number or 'inf' (got {v!r})")
    return float(v)


def lengths(vals: Any, key: str, name: str, n: int | None = None) -> np.ndarray:
    """A list of non-negative integer token counts (``n`` of them when given)."""
    if not isinstance(vals, list):
        raise RunError(f"{name}: {key}: must be a list of token counts (got {type(vals).__name__})")
    if n is not None and len(vals) != n:
        raise RunError(f"{name}: {key}: has {len(vals)} entries (expected {n}, one per request)")
    for i, v in enumerate(vals):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or v != int(v):
            raise RunError(f"{name}: {key}[{i}]: must be a non-negative integer token count (got {v!r})")
    return np.asarray(vals, dtype=np.int64)


def seconds(vals: Any, key: str, name: str, n: int, scale: float = 1.0, allow_none: bool = False) -> np.ndarray:
    """A list of ``n`` times >= 0 (times ``scale`` into seconds); None -> NaN when allowed."""
    if not isinstance(vals, list) or len(vals) != n:
        got = f"{len(vals)} entries" if isinstance(vals, list) else type(vals).__name__
        raise RunError(f"{name}: {key}: must be a list of {n} times, one per request (got {got})")
    out = np.full(n, np.nan)
    for i, v in enumerate(vals):
        if v is None and allow_none:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise RunError(f"{name}: {key}[{i}]: must be a time >= 0 (got {v!r})")
        out[i] = float(v) * scale
    return out


def frame(input_tokens, output_tokens, start_s, ttft_s, itl_s, e2e_s) -> pd.DataFrame:
    """The normalised request table (see :data:`COLUMNS`)."""
    n = len(input_tokens)
    df = pd.DataFrame({"input_tokens": np.asarray(input_tokens, dtype=np.int64),
                       "output_tokens": np.asarray(output_tokens, dtype=np.int64),
                       "start_s": np.asarray(start_s, dtype=float) if start_s is not None else np.full(n, np.nan),
                       "ttft_s": np.asarray(ttft_s, dtype=float),
                       "e2e_s": np.asarray(e2e_s, dtype=float) if e2e_s is not None else np.full(n, np.nan)})
    df["itl_s"] = pd.Series(list(itl_s) if itl_s is not None else [None] * n, dtype=object)
    return df[list(COLUMNS)]


def settings(**kw: Any) -> dict:
    out = {k: None for k in SETTINGS}
    out.update(kw)
    return out


__all__ = ["Run", "RunFormat", "RunError", "RUN_FORMATS", "register_run_format", "read_run", "read_runs", "run_label", "picked",
           "parse_document", "COLUMNS", "SETTINGS"]
