"""Reading a trace file's rows, chunk by chunk, as text: CSV (a header, then one row per request)
or JSON lines (one object per line), plain or gzip-compressed (``.gz``).

Every field comes back as a string (or, for JSON, the object's value), each row with its 1-based
line as a person counts it (a CSV header is line 1); checking the values is
:mod:`workloads.tracerows`'s job. A file that is missing or cannot be decoded raises one
:class:`WorkloadError` line naming it.
"""
from __future__ import annotations

import gzip
import json
import re
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pandas as pd

from workloads.errors import WorkloadError


def unreadable(path: Path, exc: BaseException, what: str = "read") -> WorkloadError:
    """The one-line error for a file that cannot be decoded: a damaged gzip body (zlib.error,
    EOFError, BadGzipFile), bytes that are not UTF-8, or an OS error."""
    if isinstance(exc, UnicodeDecodeError):
        # (the decoder's position counts in its own buffer, not the file: the file is read again)
        return WorkloadError(f"{path.name}: {_utf8_error(path) or f'{exc} (expected UTF-8 text)'}")
    elif path.suffix == ".gz" and isinstance(exc, (zlib.error, EOFError, OSError)):
        why = f"{exc} (expected a whole gzip-compressed file, as its .gz name says)"
    else:
        why = str(exc)
    return WorkloadError(f"{path.name}: cannot {what}: {why}")


def _utf8_error(path: Path) -> str | None:
    """Where the (decompressed) bytes of ``path`` stop being UTF-8, for a message; None when
    they are UTF-8 after all or cannot be read again."""
    from plumbing.documents import utf8_error

    try:
        with (gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")) as f:
            return utf8_error(iter(lambda: f.read(1 << 20), b""))
    except (OSError, EOFError, zlib.error):
        return None


#: what a file that cannot be decoded raises while it is read (zlib.error is not an OSError)
DECODE_ERRORS = (OSError, EOFError, UnicodeDecodeError, zlib.error)


def read_text(path: Path) -> str:
    """A file's UTF-8 text; a ``.gz`` file is decompressed as it is read (the bundled traces are
    stored gzip-compressed). A missing or corrupt file raises :class:`WorkloadError`."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rt", encoding="utf-8") as f:
                return f.read()
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise WorkloadError(f"{path}: file not found") from None
    except DECODE_ERRORS as exc:
        raise unreadable(path, exc) from None


#: rows parsed at a time: a small first chunk (a short horizon stops after it), then larger ones;
#: the memory a load holds grows with the rows it keeps, not with the file
FIRST_CHUNK_ROWS = 4096
CHUNK_ROWS = 65_536


def _chunk_sizes() -> Iterator[int]:
    yield FIRST_CHUNK_ROWS
    while True:
        yield CHUNK_ROWS

_CSV_OPTIONS = dict(dtype=str, keep_default_na=False, skip_blank_lines=False, header=0, index_col=False)


def _extra_field_error(path: Path, exc: Exception) -> tuple[int, str] | None:
    m = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", str(exc))
    if m:
        header, line, n = int(m[1]), int(m[2]), int(m[3])
    elif "Length of header or names does not match" in str(exc) and (found := _first_long_row(path)):
        # (pandas names no line when the first data row is the long one: found here, in the
        # error's path only)
        line, n, header = found
    else:
        return None
    return line, (f"{path.name} line {line}: {n} fields, but the header has {header} "
                  f"(expected one value per header column)")


def _first_long_row(path: Path) -> tuple[int, int, int] | None:
    """The first row with more fields than the header: (its line, its fields, the header's)."""
    import csv

    with _open_text(path) as f:
        rows = csv.reader(f)
        header = next(rows, None)
        if header is None:
            return None
        for row in rows:
            if len(row) > len(header):
                return rows.line_num, len(row), len(header)
    return None


@dataclass
class Chunk:
    """Rows of a file as parsed (strings), each row's 1-based line, and what happened at the end."""

    raw: pd.DataFrame
    lines: np.ndarray
    json_errors: dict[int, str] = field(default_factory=dict)  # row -> message (JSONL)
    error_after: str | None = None  # the file cannot be read past this chunk: raise unless the load stops here
    # (JSONL) the parsed objects, row by row: hash_ids are read from them. Not in ``raw.attrs``:
    # pandas deep-copies a frame's attrs into every column taken from it (half of a load's time)
    objects: list[dict] | None = None


def csv_chunks(path: Path) -> Iterator[Chunk]:
    """A CSV file's rows, every field a string, chunk by chunk (the header is line 1). A row
    with more fields than the header is an error naming its line."""
    try:
        reader = pd.read_csv(path, iterator=True, **_CSV_OPTIONS)
    except FileNotFoundError:
        raise WorkloadError(f"{path}: file not found") from None
    except pd.errors.EmptyDataError:
        raise WorkloadError(f"{path.name} line 1: the file is empty (expected a header line, then one "
                            f"row per request)") from None
    except pd.errors.ParserError as exc:
        raise WorkloadError(f"{path.name}: cannot parse as CSV: {exc}") from None
    except DECODE_ERRORS as exc:
        raise unreadable(path, exc, "parse as CSV") from None
    done = 0  # data rows before this chunk
    with reader:
        for size in _chunk_sizes():
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("error", pd.errors.ParserWarning)
                    raw = reader.get_chunk(size)
            except StopIteration:
                return
            except (pd.errors.ParserError, pd.errors.ParserWarning) as exc:
                bad = _extra_field_error(path, exc)
                if bad is None:
                    raise WorkloadError(f"{path.name}: cannot parse as CSV: {exc}") from None
                # the rows before the bad line, read again: the load may stop before it
                line, msg = bad
                raw = _csv_rows(path, done, line - 2 - done)
                yield Chunk(raw, np.arange(done + 2, done + 2 + len(raw), dtype=np.int64), error_after=msg)
                raise WorkloadError(msg)
            except DECODE_ERRORS as exc:
                raise unreadable(path, exc, "parse as CSV") from None
            yield Chunk(raw, np.arange(done + 2, done + 2 + len(raw), dtype=np.int64))
            done += len(raw)
            if len(raw) < size:
                return


def _csv_rows(path: Path, skip: int, n: int) -> pd.DataFrame:
    """Data rows ``[skip, skip + n)`` of a CSV file, as strings."""
    try:
        return pd.read_csv(path, skiprows=range(1, skip + 1), nrows=max(0, n), **_CSV_OPTIONS)
    except (pd.errors.ParserError, *DECODE_ERRORS) as exc:
        raise WorkloadError(f"{path.name}: cannot parse as CSV: {exc}") from None


def _open_text(path: Path):
    """A text file, or a gzip-compressed one (``.gz``), read as UTF-8; a byte-order mark at the
    start is dropped (as pandas drops it from a CSV header)."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8-sig")
    return open(path, encoding="utf-8-sig")


def _json_line(line: str) -> Any:
    try:
        obj = json.loads(line)
    except RecursionError:
        raise ValueError("nested too deeply (expected one flat JSON object per line)") from None
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    return obj


def _jsonl_chunks(path: Path) -> Iterator[tuple[list[dict], np.ndarray, dict[int, str]]]:
    """A JSON-lines file's objects chunk by chunk, each with its 1-based line; a line that is
    not a JSON object is a row with an error message (blank lines are skipped). Lines are
    counted as ``str.splitlines`` counts them."""
    try:
        f = _open_text(path)
    except FileNotFoundError:
        raise WorkloadError(f"{path}: file not found") from None
    except DECODE_ERRORS as exc:
        raise unreadable(path, exc) from None
    sizes = _chunk_sizes()
    size = next(sizes)
    recs: list[dict] = []
    lines: list[int] = []
    errors: dict[int, str] = {}
    i = 0
    with f:
        try:
            for phys in f:
                for line in phys.splitlines():
                    i += 1
                    if not line.strip():
                        continue
                    try:
                        obj = _json_line(line)
                    except ValueError as exc:
                        errors[len(recs)] = f"not a JSON object ({exc}): {line[:80]!r}"
                        obj = {}
                    recs.append(obj)
                    lines.append(i)
                if len(recs) >= size:
                    yield recs, np.array(lines, dtype=np.int64), errors
                    recs, lines, errors = [], [], {}
                    size = next(sizes)
        except DECODE_ERRORS as exc:
            raise unreadable(path, exc) from None
    if recs or i == 0 or not lines:
        yield recs, np.array(lines, dtype=np.int64), errors


def _records(recs: list[dict], fields: list[str]) -> pd.DataFrame:
    """Fields of JSON records as object columns: numbers and strings as strings (None: missing)."""
    data = {}
    for fld in fields:
        vals = [r.get(fld) for r in recs]
        data[fld] = pd.Series([str(v) if isinstance(v, (int, float, str)) else v for v in vals], dtype=object)
    return pd.DataFrame(data, index=pd.RangeIndex(len(recs)))


def json_chunks(path: Path, fields: list[str]) -> Iterator[Chunk]:
    for recs, lines, errors in _jsonl_chunks(path):
        yield Chunk(_records(recs, fields), lines, errors, objects=recs)

