"""Per-request trace loaders: Azure 2023 CSV, Mooncake JSONL, ShareGPT lengths, generic CSV/JSONL.

Every loader returns a :class:`Trace` whose table has ``prompt_tokens`` and ``output_tokens``
(int64 tokens), ``arrival_s`` (float64 seconds after ``t0``; absent for lengths-only tables),
optionally ``hash_ids`` (tuples of prefix-block hashes) and ``f_*`` feature columns.

Rows are checked before use. A missing column, an unparsable timestamp, a negative or
non-integer length, or a time earlier than an earlier row raises :class:`WorkloadError` naming
the file, the 1-based line as a person counts it (a CSV header is line 1) and the value. With
``lenient=True`` those rows are skipped instead and counted in ``Trace.rows_skipped``. A length
of 0 is not an error; it is raised to 1 token (the engine needs >= 1) and counted in
``Trace.zero_lengths``. Nothing is dropped without being counted.

Formats live in the open registry ``TRACE_LOADERS`` (name -> :class:`TraceFormat`, a
:class:`~workloads.contracts.TraceLoader`): a new format is one load function and one
``register`` call, with the options it reads; a user's own loads by ``format = "pkg.mod:obj"``.
"""
from __future__ import annotations

import gzip
import json
import math
import re
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import pandas as pd

from plumbing.registry import Registry
from workloads.contracts import TraceLoader
from workloads.errors import WorkloadError, number, require, unknown_keys

DATA_DIR = Path(__file__).resolve().parent / "data"
BUNDLED = {
    "azure_code": "AzureLLMInferenceTrace_code.csv",
    "azure_conv": "AzureLLMInferenceTrace_conv.csv",
}
# ``path = "bundled:NAME"`` names a file (or a ServeGen client prefix) under DATA_DIR, wherever the
# package is installed; any other path is the user's own, relative to the scenario's folder.
BUNDLED_PREFIX = "bundled:"
#: the longest prompt or output a trace row may declare, tokens (far above any model's context;
#: a larger number is a corrupt row, and would not fit the int64 token arithmetic)
MAX_LENGTH = 100_000_000
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9, "min": 60.0, "h": 3600.0}
#: keys every ``trace = {...}`` table may have; a format adds its own (``TraceFormat.options``)
COMMON_KEYS = ("format", "path", "t0", "time_unit", "window", "sample")


@dataclass
class Trace:
    """A loaded, checked trace table and where it came from."""

    df: pd.DataFrame
    source: str
    rows_read: int
    rows_skipped: int = 0
    zero_lengths: int = 0
    skipped_examples: list[str] = field(default_factory=list)
    #: each row's 1-based line in the file (None: not known, e.g. a user's own format)
    lines: np.ndarray | None = None
    #: False when reading stopped past the last row needed (``until_s``): ``rows_read`` then
    #: counts the rows read up to there, not the file's
    complete: bool = True

    @property
    def has_times(self) -> bool:
        return "arrival_s" in self.df.columns


def bundled_names() -> list[str]:
    """Every ``bundled:NAME`` there is: the data files, and each ServeGen client as its prefix
    (``servegen/.../chunk-N``, which stands for its ``-trace.csv.gz`` and ``-dataset.json.gz``)."""
    names = set()
    for f in DATA_DIR.rglob("*"):
        rel = f.relative_to(DATA_DIR).as_posix()
        if not f.is_file() or rel.startswith("LICENSES/") or f.name == "README.md":
            continue
        if rel.startswith("servegen/"):
            rel = re.sub(r"-(trace\.csv|dataset\.json)(\.gz)?$", "", rel)
        names.add(BUNDLED_PREFIX + rel)
    return sorted(names)


def resolve_path(path: Any, base_dir: Path) -> Path:
    """A bundled file (``bundled:NAME``, a path under the package's ``workloads/data``; or the
    short names ``azure_code``, ``azure_conv``) or the user's path, relative to ``base_dir``."""
    require("path", path, isinstance(path, str) and path != "", "a bundled name or a file path")
    if path in BUNDLED:
        return DATA_DIR / BUNDLED[path]
    if path.startswith(BUNDLED_PREFIX):
        name = Path(path.removeprefix(BUNDLED_PREFIX))
        require("path", path, bool(name.parts) and not name.is_absolute() and ".." not in name.parts,
                "bundled:<a file under workloads/data>, e.g. bundled:conversation_trace.jsonl.gz")
        return DATA_DIR / name
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path(base_dir) / p


def _unreadable(path: Path, exc: BaseException, what: str = "read") -> WorkloadError:
    """The one-line error for a file that cannot be decoded: a damaged gzip body (zlib.error,
    EOFError, BadGzipFile), bytes that are not UTF-8, or an OS error."""
    if isinstance(exc, UnicodeDecodeError):
        why = f"{exc} (expected UTF-8 text)"
    elif path.suffix == ".gz" and isinstance(exc, (zlib.error, EOFError, OSError)):
        why = f"{exc} (expected a whole gzip-compressed file, as its .gz name says)"
    else:
        why = str(exc)
    return WorkloadError(f"{path.name}: cannot {what}: {why}")


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
        raise _unreadable(path, exc) from None


#: rows parsed at a time: a small first chunk (a short horizon stops after it), then larger ones;
#: the memory a load holds grows with the rows it keeps, not with the file
FIRST_CHUNK_ROWS = 4096
CHUNK_ROWS = 65_536


def _chunk_sizes() -> Iterator[int]:
    yield FIRST_CHUNK_ROWS
    while True:
        yield CHUNK_ROWS


class _Checker:
    """Collects one chunk's bad rows; strict mode raises on the earliest line, lenient mode drops them.

    ``lines``: each row's 1-based line in the file. A check flags the rows it finds bad that no
    earlier check flagged, so each bad row has one message (the first check's)."""

    def __init__(self, name: str, lines: np.ndarray, lenient: bool) -> None:
        self.name, self.lines, self.lenient = name, lines, lenient
        self.bad = np.zeros(len(lines), dtype=bool)
        self._flags: list[tuple[np.ndarray, Any, bool]] = []

    def flag(self, mask: np.ndarray, describe: Any, hint: bool = True) -> None:
        """Mark rows where ``mask``; ``describe(row)`` gives the message for one row; ``hint``:
        the strict error says that lenient mode would skip the row."""
        rows = np.flatnonzero(mask & ~self.bad)
        if rows.size:
            self.bad[rows] = True
            self._flags.append((rows, describe, hint))

    def finish(self, cut: int) -> list[tuple[int, str]]:
        """Rows ``[0, cut)`` are kept: raise on the earliest bad one (strict), or return the
        first five bad ones as (line, message) (lenient)."""
        first = sorted((int(r), d, h) for rows, d, h in self._flags for r in rows[rows < cut][:5])
        if first and not self.lenient:
            r, describe, hint = first[0]
            raise WorkloadError(f"{self.name} line {self.lines[r]}: {describe(r)}"
                                + (" (use lenient mode to skip bad rows)" if hint else ""))
        return [(int(self.lines[r]), f"line {self.lines[r]}: {d(r)}") for r, d, _ in first[:5]]


def _numeric(raw: pd.Series) -> np.ndarray:
    """A column's values as float64 (NaN where a value is not a number)."""
    return pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float, na_value=np.nan)


def _lengths(ck: _Checker, raw: pd.Series, col: str) -> np.ndarray:
    """Parse a length column: non-negative integers; bad rows flagged; returns int64 (bad -> 0)."""
    num = _numeric(raw)
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(num) | (num < 0) | (np.mod(num, 1) != 0)
    vals = raw.to_numpy()
    ck.flag(bad, lambda r: f"{col} {vals[r]!r} is not a non-negative integer")
    with np.errstate(invalid="ignore"):
        huge = ~bad & (num > MAX_LENGTH)
    ck.flag(huge, lambda r: f"{col} {vals[r]!r} is more than {MAX_LENGTH:,} tokens")
    return np.where(bad | huge, 0, num).astype(np.int64)


#: a value that looks like a date and time (the hint for a numeric time column that holds them)
_DATETIME_LIKE = re.compile(r"^\s*\d{4}-\d{2}-\d{2}([ T]\d{1,2}:\d{2}|\s*$)")


def _times_numeric(ck: _Checker, raw: pd.Series, col: str, unit: float, datetime_hint: bool = False) -> np.ndarray:
    num = _numeric(raw)
    vals = raw.to_numpy()

    def describe(r: int) -> str:
        msg = f"{col} {vals[r]!r} is not a number"
        if datetime_hint and isinstance(vals[r], str) and _DATETIME_LIKE.match(vals[r]):
            msg += ' (it looks like a date and time: set time_unit = "datetime" in the trace table)'
        return msg
    ck.flag(~np.isfinite(num), describe)
    return num * unit


def _times_datetime(ck: _Checker, raw: pd.Series, col: str) -> np.ndarray:
    """Datetimes (ISO 8601, any number of fractional digits) as int64 nanoseconds. Times with a
    UTC offset are taken in UTC (a time without one, in a file that mixes them, too)."""
    text = raw.astype(str)
    try:
        ts = pd.to_datetime(text, format="ISO8601", errors="coerce")
    except (ValueError, TypeError):  # mixed UTC offsets, or offsets and none
        ts = pd.to_datetime(text, format="ISO8601", errors="coerce", utc=True)
    vals = raw.to_numpy()
    if getattr(ts.dt, "tz", None) is not None:
        ts = ts.dt.tz_convert("UTC").dt.tz_localize(None)
    bad = ts.isna().to_numpy().copy()
    # (outside 1677..2262 nanoseconds overflow int64: such a row is bad, not an overflow)
    years = ts.dt.year.to_numpy(dtype=float, na_value=np.nan)
    with np.errstate(invalid="ignore"):
        bad |= ~((years > 1677) & (years < 2262))
    ck.flag(bad, lambda r: f"{col} {vals[r]!r} is not a timestamp YYYY-MM-DD HH:MM:SS.fffffff")
    ok = ts.where(~pd.Series(bad, index=ts.index))
    return ok.to_numpy(dtype="datetime64[ns]").astype(np.int64)


def _names(ck: _Checker, raw: pd.Series, col: str) -> np.ndarray:
    """A tenant or class column: non-empty strings; bad rows flagged; returns objects."""
    vals = raw.to_numpy(dtype=object)
    bad = np.array([not (isinstance(v, str) and v.strip() != "") for v in vals], dtype=bool)
    ck.flag(bad, lambda r: f"{col} {vals[r]!r} is not a name (expected a non-empty string)")
    return vals


def _check_sorted(ck: _Checker, t: np.ndarray, col: str, shown: np.ndarray, prev: float) -> float:
    """Flag rows whose time is earlier than an earlier (good) row's time, ``prev`` the latest
    time of the chunks before; returns the latest good time so far."""
    tt = np.where(ck.bad, -np.inf, t.astype(float))
    run = np.maximum.accumulate(np.concatenate([[prev], tt]))
    unsorted = tt < run[:-1]
    ck.flag(unsorted, lambda r: f"{col} {shown[r]!r} is earlier than an earlier row "
                                f"(times must be sorted)")
    return float(run[-1])


def out_of_order(t: np.ndarray) -> np.ndarray:
    """The rows lenient mode skips so that times ``t`` are sorted: one bad row costs one row.

    Rows are compared with the last row kept. A row earlier than it is skipped, unless the
    last kept row is the odd one out: later than the row before it and the rows on both sides
    of it are in order (a single row far ahead, a "spike"), when that row is skipped instead.
    So ``1 2 3 1000 4 5`` skips 1000 and ``1 2 3 4 2.5 5`` skips 2.5."""
    out = np.zeros(t.size, dtype=bool)
    d = np.flatnonzero(np.diff(t) < 0)
    if d.size == 0:
        return out
    tl = t.tolist()
    kept: list[int] = list(range(int(d[0]) + 1))  # every row before the first fall is in order
    for i in range(int(d[0]) + 1, len(tl)):
        last = kept[-1] if kept else -1
        if last < 0 or tl[i] >= tl[last]:
            kept.append(i)
            continue
        prev = tl[kept[-2]] if len(kept) >= 2 else -math.inf
        nxt_ok = i + 1 < len(tl) and tl[i + 1] >= tl[last]  # the next row agrees with the last kept one
        if tl[i] >= prev and not nxt_ok:
            out[last] = True  # the last kept row is the spike
            kept[-1] = i
        else:
            out[i] = True
    return out


def _need_columns(columns: Any, name: str, cols: list[str]) -> None:
    for c in cols:
        if c not in columns:
            raise WorkloadError(f"{name} line 1 (header): missing column '{c}' "
                                f"(columns found: {', '.join(map(str, columns))})")


_CSV_OPTIONS = dict(dtype=str, keep_default_na=False, skip_blank_lines=False, header=0, index_col=False)


def _extra_field_error(path: Path, exc: Exception) -> tuple[int, str] | None:
    m = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", str(exc))
    if not m:
        return None
    return int(m[2]), (f"{path.name} line {m[2]}: {m[3]} fields, but the header has {m[1]} "
                       f"(expected one value per header column)")


@dataclass
class _Chunk:
    """Rows of a file as parsed (strings), each row's 1-based line, and what happened at the end."""

    raw: pd.DataFrame
    lines: np.ndarray
    json_errors: dict[int, str] = field(default_factory=dict)  # row -> message (JSONL)
    error_after: str | None = None  # the file cannot be read past this chunk: raise unless the load stops here


def _csv_chunks(path: Path) -> Iterator[_Chunk]:
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
        raise _unreadable(path, exc, "parse as CSV") from None
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
                yield _Chunk(raw, np.arange(done + 2, done + 2 + len(raw), dtype=np.int64), error_after=msg)
                raise WorkloadError(msg)
            except DECODE_ERRORS as exc:
                raise _unreadable(path, exc, "parse as CSV") from None
            yield _Chunk(raw, np.arange(done + 2, done + 2 + len(raw), dtype=np.int64))
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
        raise _unreadable(path, exc) from None
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
            raise _unreadable(path, exc) from None
    if recs or i == 0 or not lines:
        yield recs, np.array(lines, dtype=np.int64), errors


def _records(recs: list[dict], fields: list[str]) -> pd.DataFrame:
    """Fields of JSON records as object columns: numbers and strings as strings (None: missing)."""
    data = {}
    for fld in fields:
        vals = [r.get(fld) for r in recs]
        data[fld] = pd.Series([str(v) if isinstance(v, (int, float, str)) else v for v in vals], dtype=object)
    return pd.DataFrame(data, index=pd.RangeIndex(len(recs)))


def _json_chunks(path: Path, fields: list[str]) -> Iterator[_Chunk]:
    for recs, lines, errors in _jsonl_chunks(path):
        raw = _records(recs, fields)
        raw.attrs["objects"] = recs  # (hash_ids are read from the objects themselves)
        yield _Chunk(raw, lines, errors)


def _flag_json(ck: _Checker, chunk: _Chunk, fields: list[str]) -> None:
    """Bad JSON lines first (their own message, strict or not), then missing fields."""
    if chunk.json_errors:
        msgs = chunk.json_errors
        mask = np.zeros(len(chunk.lines), dtype=bool)
        mask[list(msgs)] = True
        ck.flag(mask, lambda r: msgs[r], hint=False)
    for fld in fields:
        col = chunk.raw[fld].to_numpy(dtype=object)
        ck.flag(np.array([v is None for v in col], dtype=bool), lambda r, fld=fld: f"missing field '{fld}'")


def _hash_ids(ck: _Checker, values: list[Any], col: str) -> list[tuple | None]:
    """Prefix-block hashes: a list of integers (anything else but a list: none); bad rows flagged."""
    out: list[tuple | None] = []
    bad = np.zeros(len(values), dtype=bool)
    for r, v in enumerate(values):
        if not isinstance(v, (list, tuple)):
            out.append(None)
            continue
        try:
            out.append(tuple(int(x) for x in v))
        except (TypeError, ValueError, OverflowError):
            bad[r] = True
            out.append(None)
    ck.flag(bad, lambda r: f"{col} {values[r]!r:.80} is not a list of integers")
    return out


@dataclass
class _Feature:
    """One ``f_*`` column across chunks: numeric when every value read is a number (as when the
    whole column was converted at once), else the values as read."""

    parts: list[pd.Series] = field(default_factory=list)
    numeric: bool = True
    floats: bool = False

    def add(self, col: pd.Series, keep: np.ndarray, cut: int) -> None:
        col = col.iloc[:cut]
        if len(col) == 0:
            return
        num = pd.to_numeric(col, errors="coerce")
        if not num.notna().all():
            self.numeric = False
        elif num.dtype.kind == "f":
            self.floats = True
        self.parts.append(col[keep])

    def column(self) -> pd.Series:
        col = pd.concat(self.parts, ignore_index=True) if self.parts else pd.Series([], dtype=object)
        if not self.numeric:
            return col.astype(object)
        num = pd.to_numeric(col, errors="coerce")
        return num.astype(np.float64) if self.floats and num.dtype.kind != "f" else num


class _Rows:
    """The checked rows of one trace, chunk by chunk: what a loader keeps, and when it stops.

    ``until_s``: no row at or after this many seconds after t0 is needed (rows are sorted), so
    reading stops at the second row in a row past it (two, so that one row far ahead that
    lenient mode skips does not end the read early)."""

    def __init__(self, name: str, lenient: bool, until_s: float | None, t0: float | None, ns: bool) -> None:
        self.name, self.lenient, self.ns = name, lenient, ns
        self.limit = None if until_s is None or not math.isfinite(until_s) else (
            until_s + 1e-6 * max(1.0, abs(until_s)))  # (a margin above any rounding of the cut downstream)
        self.t0 = t0  # the first good row's time when no t0 is given (raw units: ns or s)
        self.frames: list[pd.DataFrame] = []
        self.lines: list[np.ndarray] = []
        self.times: list[np.ndarray] = []
        self.shown: list[np.ndarray] = []
        self.features: dict[str, _Feature] = {}
        self.rows_read = 0
        self.skipped = 0
        self.examples: list[tuple[int, str]] = []
        self.prev = -math.inf
        self.past = False  # the last good row read is past the limit
        self.last = -math.inf  # its time (raw units)
        self.complete = True

    def cut(self, ck: _Checker, t: np.ndarray | None) -> int:
        """How many rows of this chunk are read: all, or up to the second row past the limit."""
        n = len(ck.bad)
        good = np.flatnonzero(~ck.bad)
        if self.t0 is None and good.size and t is not None:
            self.t0 = t[good[0]]
        if self.limit is None or t is None or good.size == 0 or self.t0 is None:
            return n
        tg = t[good]
        secs = (tg - self.t0) / 1e9 if self.ns else tg - self.t0
        past = secs > self.limit
        both = past & np.concatenate([[self.past], past[:-1]])
        both &= tg >= np.concatenate([[self.last], tg[:-1]])  # (and in order)
        hits = np.flatnonzero(both)
        self.past, self.last = bool(past[-1]), tg[-1]
        if hits.size == 0:
            return n
        self.complete = False
        return int(good[hits[0]]) + 1

    def add(self, ck: _Checker, cut: int, frame: pd.DataFrame, t: np.ndarray | None, shown: np.ndarray | None,
            features: dict[str, pd.Series]) -> None:
        """Keep the good rows of ``[0, cut)`` (strict: raise on the earliest bad one)."""
        examples = ck.finish(cut)
        keep = ~ck.bad[:cut]
        self.rows_read += cut
        self.skipped += int((~keep).sum())
        self.examples = sorted(self.examples + examples)[:5]
        self.frames.append(frame.iloc[:cut][keep])
        self.lines.append(ck.lines[:cut][keep])
        if t is not None:
            self.times.append(t[:cut][keep])
            if self.lenient and shown is not None:
                self.shown.append(shown[:cut][keep])
        for k, col in features.items():
            self.features.setdefault(k, _Feature()).add(col, keep, cut)

    def finish(self, time_col: str | None, spec_t0: bool) -> tuple[pd.DataFrame, np.ndarray | None, np.ndarray]:
        """The kept rows (lenient: out-of-order rows skipped), their raw times and lines."""
        df = pd.concat(self.frames, ignore_index=True) if self.frames else pd.DataFrame()
        lines = np.concatenate(self.lines) if self.lines else np.zeros(0, np.int64)
        t = np.concatenate(self.times) if self.times else None
        for k, feat in self.features.items():
            df[k] = feat.column()
        if t is not None and self.lenient and t.size:
            drop = out_of_order(t)
            if drop.any():
                shown = np.concatenate(self.shown)
                for r in np.flatnonzero(drop)[:5]:
                    self.examples.append((int(lines[r]), f"line {lines[r]}: {time_col} {shown[r]!r} is out of "
                                                         f"order (times must be sorted)"))
                self.examples = sorted(self.examples)[:5]
                self.skipped += int(drop.sum())
                keep = ~drop
                df, lines, t = df.loc[keep].reset_index(drop=True), lines[keep], t[keep]
                if not spec_t0:
                    self.t0 = t[0] if t.size else None
        return df, t, lines

    def trace(self, df: pd.DataFrame, lines: np.ndarray) -> Trace:
        """The finished table: zero lengths raised to 1 and counted; no row at all is an error."""
        if len(df) == 0:
            raise WorkloadError(f"{self.name}: no requests (expected at least one row; {self.rows_read} rows read"
                                + (f", {self.skipped} skipped as bad" if self.skipped else "") + ")")
        zeros = 0
        for c in ("prompt_tokens", "output_tokens"):
            z = df[c].to_numpy() == 0
            zeros += int(z.sum())
            df[c] = np.maximum(df[c].to_numpy(), 1).astype(np.int64)
        return Trace(df.reset_index(drop=True), self.name, self.rows_read, self.skipped, zeros,
                     [m for _, m in self.examples], lines=lines, complete=self.complete)


def _t0_ns(spec: dict) -> int | None:
    if "t0" not in spec:
        return None
    try:
        return int(pd.Timestamp(spec["t0"]).value)
    except (ValueError, TypeError, OverflowError):
        raise WorkloadError(f"t0: must be a timestamp like '2023-11-16 18:17:00' "
                            f"(got {spec['t0']!r})") from None


def _t0_s(spec: dict, unit: str) -> float | None:
    if "t0" not in spec:
        return None
    return number("t0", spec["t0"]) * TIME_UNITS[unit]


@dataclass
class _Columns:
    """How one format reads a chunk: its time column and unit, lengths, names and extras."""

    time: str | None  # the file's time column (None: lengths only)
    unit: str  # a TIME_UNITS key, or "datetime"
    prompt: str
    output: str
    names: dict[str, str] = field(default_factory=dict)  # "tenant"/"cls" -> the file's column
    features: dict[str, str] = field(default_factory=dict)  # f_* -> the file's column
    hash_ids: str | None = None
    datetime_hint: bool = False
    sort_first: bool = False  # (the generic formats checked order before lengths: the same message)


def _read(path: Path, chunks: Iterator[_Chunk], cols: _Columns, spec: dict, lenient: bool,
          until_s: float | None, json_fields: list[str] | None = None) -> tuple[_Rows, pd.DataFrame, np.ndarray]:
    """Check a file's rows chunk by chunk, keeping the good ones, until ``until_s`` (see
    :class:`_Rows`); returns the rows and the finished table (``arrival_s`` after t0)."""
    ns = cols.unit == "datetime"
    t0 = (_t0_ns(spec) if ns else _t0_s(spec, cols.unit)) if cols.time is not None else None
    rows = _Rows(path.name, lenient, until_s if cols.time is not None else None, t0, ns)
    needed = [c for c in (cols.time, cols.prompt, cols.output, *cols.names.values(), *cols.features.values(),
                          cols.hash_ids) if c is not None]
    for chunk in chunks:
        raw = chunk.raw
        if json_fields is None:
            _need_columns(raw.columns, path.name, list(dict.fromkeys(needed)))
        ck = _Checker(path.name, chunk.lines, lenient)
        if json_fields is not None:
            _flag_json(ck, chunk, json_fields)
        t = shown = None
        if cols.time is not None:
            shown = raw[cols.time].to_numpy()
            t = (_times_datetime(ck, raw[cols.time], cols.time) if ns else
                 _times_numeric(ck, raw[cols.time], cols.time, TIME_UNITS[cols.unit], cols.datetime_hint))
            if cols.sort_first and not lenient:
                rows.prev = _check_sorted(ck, t, cols.time, shown, rows.prev)
        frame = pd.DataFrame({"prompt_tokens": _lengths(ck, raw[cols.prompt], cols.prompt),
                              "output_tokens": _lengths(ck, raw[cols.output], cols.output)})
        for ours, c in cols.names.items():
            frame[ours] = pd.Series(_names(ck, raw[c], c), dtype=object)
        if cols.hash_ids is not None:
            objs = raw.attrs.get("objects")
            values = [o.get(cols.hash_ids) for o in objs] if objs is not None else list(raw[cols.hash_ids])
            frame["hash_ids"] = pd.Series(_hash_ids(ck, values, cols.hash_ids), dtype=object)
        if t is not None and not lenient and not cols.sort_first:
            rows.prev = _check_sorted(ck, t, cols.time, shown, rows.prev)
        cut = rows.cut(ck, t)
        if chunk.error_after is not None and cut == len(raw):
            raise WorkloadError(chunk.error_after)
        rows.add(ck, cut, frame, t, shown, {k: raw[c] for k, c in cols.features.items()})
        if cut < len(raw) or not rows.complete:
            break
    df, t, lines = rows.finish(cols.time, "t0" in spec)
    if t is not None:
        t0 = rows.t0 if rows.t0 is not None else 0
        arrival = (t - t0) / 1e9 if ns else t - t0
        df.insert(0, "arrival_s", np.asarray(arrival, dtype=np.float64))
    return rows, df, lines


def load_azure(path: Path, spec: dict, lenient: bool, until_s: float | None = None) -> Trace:
    """Azure LLM inference trace 2023: ``TIMESTAMP, ContextTokens, GeneratedTokens``."""
    cols = _Columns("TIMESTAMP", "datetime", "ContextTokens", "GeneratedTokens")
    rows, df, lines = _read(path, _csv_chunks(path), cols, spec, lenient, until_s)
    return rows.trace(df, lines)


def load_mooncake(path: Path, spec: dict, lenient: bool, until_s: float | None = None) -> Trace:
    """Mooncake JSONL: ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``.

    Requests sharing one timestamp are spread evenly over ``spread_bucket_s`` (default 3 s, the
    trace's bucketing): the k-th of n goes to ``t + spread * k / n``; 0 keeps them as a batch.
    """
    spread = number("spread_bucket_s", spec.get("spread_bucket_s", 3.0), ge=0)
    cols = _Columns("timestamp", "ms", "input_length", "output_length", hash_ids="hash_ids")
    fields = ["timestamp", "input_length", "output_length"]
    rows, df, lines = _read(path, _json_chunks(path, fields), cols, spec, lenient, until_s, json_fields=fields)
    df = df[["arrival_s", "prompt_tokens", "output_tokens", "hash_ids"]] if len(df) else df
    tr = rows.trace(df, lines)
    if spread > 0 and len(tr.df):
        # (the read stops past the last row needed: every timestamp it kept has all its requests)
        g = tr.df.groupby("arrival_s", sort=False)["arrival_s"]
        k = g.cumcount().to_numpy()
        n = g.transform("size").to_numpy()
        tr.df["arrival_s"] = tr.df["arrival_s"].to_numpy() + spread * k / n
    return tr


def load_sharegpt(path: Path, spec: dict, lenient: bool, until_s: float | None = None) -> Trace:
    """ShareGPT length table (Sarathi-Serve): ``num_prefill_tokens``, ``num_decode_tokens``."""
    cols = _Columns(None, "s", "num_prefill_tokens", "num_decode_tokens")
    rows, df, lines = _read(path, _csv_chunks(path), cols, spec, lenient, None)
    return rows.trace(df, lines)


#: the ``columns`` keys that are not features: what each row's column becomes
MAPPED = ("arrival_s", "prompt_tokens", "output_tokens", "hash_ids", "tenant", "class")


def _mapping(spec: dict) -> dict[str, str]:
    cols = spec.get("columns")
    require("columns", cols, isinstance(cols, dict),
            "a table {arrival_s = ..., prompt_tokens = ..., output_tokens = ...}")
    for k, v in cols.items():
        ok = k in MAPPED or k.startswith("f_")
        require(f"columns.{k}", k, ok, "one of arrival_s, prompt_tokens, output_tokens, "
                "hash_ids, tenant, class, or a feature name starting with f_")
        require(f"columns.{k}", v, isinstance(v, str), "a column name")
    for k in ("prompt_tokens", "output_tokens"):
        require(f"columns.{k}", None, k in cols, "given (the column holding it)")
    return cols


def _generic_columns(spec: dict) -> _Columns:
    cols = _mapping(spec)
    return _Columns(cols.get("arrival_s"), spec.get("time_unit", "s"), cols["prompt_tokens"], cols["output_tokens"],
                    names={ours: cols[k] for k, ours in (("tenant", "tenant"), ("class", "cls")) if k in cols},
                    features={k: c for k, c in cols.items() if k.startswith("f_")},
                    hash_ids=cols.get("hash_ids"), datetime_hint=True, sort_first=True)


def _generic_order(df: pd.DataFrame, spec: dict) -> pd.DataFrame:
    """The table's columns in the mapping's order after the three fixed ones (as before chunks)."""
    cols = _mapping(spec)
    first = [c for c in ("arrival_s", "prompt_tokens", "output_tokens") if c in df.columns]
    rest = [k for k in cols if k.startswith("f_") or k == "hash_ids"]
    names = [ours for k, ours in (("tenant", "tenant"), ("class", "cls")) if k in cols]
    return df[first + rest + names] if len(df.columns) else df


def load_csv(path: Path, spec: dict, lenient: bool, until_s: float | None = None) -> Trace:
    """Any CSV with a header, read through ``columns = {arrival_s=..., prompt_tokens=..., ...}``."""
    rows, df, lines = _read(path, _csv_chunks(path), _generic_columns(spec), spec, lenient, until_s)
    return rows.trace(_generic_order(df, spec), lines)


def load_jsonl(path: Path, spec: dict, lenient: bool, until_s: float | None = None) -> Trace:
    """Any JSON-lines file, read through a ``columns`` mapping (missing field = bad row)."""
    cols = _generic_columns(spec)
    fields = list(dict.fromkeys(_mapping(spec).values()))  # (each one a row must have)
    rows, df, lines = _read(path, _json_chunks(path, fields), cols, spec, lenient, until_s, json_fields=fields)
    return rows.trace(_generic_order(df, spec), lines)


@dataclass(frozen=True)
class TraceFormat:
    """A registered trace format (:class:`~workloads.contracts.TraceLoader`) built from its load
    function ``read(path, spec, lenient) -> Trace``. ``times``: whether rows carry arrival
    times, or a function of the table saying so. ``checker(spec)``: checks of the table beyond
    its options' own (no file read). ``per_request=False``: sampled window by window (ServeGen),
    not read here. ``streams``: ``read`` also takes ``until_s`` (seconds after t0) and stops
    reading past it (the rows are sorted by time)."""

    read: Callable[..., Trace] | None
    description: str = ""
    times: bool | Callable[[dict], bool] = True
    options: Mapping[str, Callable[[Any], Any] | None] = field(default_factory=dict)
    checker: Callable[[dict], None] | None = None
    per_request: bool = True
    streams: bool = False

    def check(self, spec: dict) -> None:
        if self.checker is not None:
            self.checker(spec)

    def has_times(self, spec: dict) -> bool:
        return self.times(spec) if callable(self.times) else self.times

    def load(self, path: Path, spec: dict, lenient: bool, until_s: float | None = None) -> Trace:
        assert self.read is not None, "not a per-request format"
        if self.streams:
            return self.read(path, spec, lenient, until_s=until_s)
        return self.read(path, spec, lenient)


TRACE_LOADERS = Registry("trace format")


def register_format(name: str, fmt: TraceFormat) -> None:
    """Add a trace format (a name used twice is an error)."""
    TRACE_LOADERS.register(name, fmt, fmt.description)


def _mapped_times(spec: dict) -> bool:
    return "arrival_s" in spec.get("columns", {})


register_format("azure", TraceFormat(load_azure, "Azure LLM inference trace 2023 (CSV)", streams=True))
register_format("mooncake", TraceFormat(
    load_mooncake, "Mooncake JSONL (ms timestamps, hash_ids)",
    options={"spread_bucket_s": lambda v: number("spread_bucket_s", v, ge=0)}, streams=True))
register_format("sharegpt", TraceFormat(load_sharegpt, "ShareGPT length table (lengths only)", times=False))
register_format("csv", TraceFormat(load_csv, "any CSV through a columns mapping", times=_mapped_times,
                                   options={"columns": None}, checker=_mapping, streams=True))
register_format("jsonl", TraceFormat(load_jsonl, "any JSON lines through a columns mapping", times=_mapped_times,
                                     options={"columns": None}, checker=_mapping, streams=True))
register_format("servegen", TraceFormat(None, "a ServeGen client, sampled window by window (workloads.servegen)",
                                        options={"client": None}, per_request=False))


def formats() -> list[str]:
    """The registered format names, in the order they were registered."""
    return TRACE_LOADERS.names(sort=False)


def trace_loader(fmt: Any) -> TraceLoader:
    """The loader of ``format`` (a registered name or ``pkg.mod:obj``); WorkloadError otherwise."""
    names = formats()
    dotted = isinstance(fmt, str) and ":" in fmt and fmt not in names
    require("format", fmt, fmt in names or dotted, f"one of {', '.join(names)}")
    try:
        loader = TRACE_LOADERS.resolve(fmt)
    except KeyError as exc:
        raise WorkloadError(f"format: {exc.args[0]}") from None
    require("format", fmt, isinstance(loader, TraceLoader),
            "a trace loader (options, per_request, check, has_times, load)")
    return loader  # type: ignore[return-value]


def _allowed_keys(own: Mapping[str, Any]) -> set[str]:
    """The common keys and every registered format's options (a key another format reads is
    not a typo), plus ``own`` (a user's loader's)."""
    keys = set(COMMON_KEYS) | set(own)
    for entry in TRACE_LOADERS.entries():
        if not isinstance(entry.target, str):
            keys |= set(getattr(entry.target, "options", {}))
    return keys


_CACHE: dict[tuple, Trace] = {}


def check_trace_spec(spec: Any, base_dir: Path) -> Path:
    """Check a ``trace = {...}`` table's keys (no file is read); return the resolved path."""
    require("", spec, isinstance(spec, dict), "a table { format = ..., path = ... }")
    fmt = spec.get("format")
    own = trace_loader(fmt).options if isinstance(fmt, str) and ":" in fmt else {}
    unknown_keys("", spec, _allowed_keys(own))  # (before the format: an unknown key is named first)
    loader = trace_loader(fmt)
    path = resolve_path(spec.get("path"), base_dir)
    if not loader.per_request:
        return path
    if not path.is_file():  # (the message lists the bundled files: a walk of the data folder)
        require("path", str(path), False, "an existing file (bundled: "
                f"{', '.join([*BUNDLED, *bundled_names()])}; other paths are relative to the "
                "scenario's directory)")
    loader.check(spec)
    unit = spec.get("time_unit", "s")
    require("time_unit", unit, unit in TIME_UNITS or unit == "datetime",
            f"one of {', '.join(TIME_UNITS)}, datetime")
    for name in formats():  # options with their own checks, whichever format reads them
        for key, check in trace_loader(name).options.items():
            if check is not None and key in spec:
                check(spec[key])
    if "window" in spec:
        w = spec["window"]
        require("window", w, isinstance(w, (list, tuple)) and len(w) == 2, "[start_s, end_s]")
        number("window[0]", w[0], ge=0)
        number("window[1]", w[1], gt=float(w[0]) if isinstance(w[0], (int, float)) else 0)
    if "sample" in spec:
        number("sample", spec["sample"], gt=0, le=1)
    return path


def load_trace(spec: dict, base_dir: Path, lenient: bool = False, until_s: float | None = None) -> Trace:
    """Load and check the trace a ``trace = {...}`` table names (cached per file and options).

    ``until_s``: no row arriving at or after this many seconds after t0 is needed; a format
    that streams (``TraceFormat.streams``) stops reading a little past it, so only the rows up
    to there are parsed, checked and held (``Trace.complete`` is then False)."""
    path = check_trace_spec(spec, base_dir)
    loader = trace_loader(spec["format"])
    require("format", spec["format"], loader.per_request, "a per-request format (servegen is sampled, not loaded)")
    opts = tuple(sorted((k, json.dumps(v, sort_keys=True, default=str)) for k, v in spec.items()
                        if k not in ("window", "sample", "client")))
    streams = bool(getattr(loader, "streams", False)) and until_s is not None and math.isfinite(until_s)
    key = (str(path.resolve()), path.stat().st_mtime_ns, opts, lenient, until_s if streams else None)
    if key not in _CACHE:
        _CACHE[key] = loader.load(path, spec, lenient, until_s=until_s) if streams else loader.load(path, spec, lenient)
    tr = _CACHE[key]
    return Trace(tr.df.copy(), tr.source, tr.rows_read, tr.rows_skipped, tr.zero_lengths,
                 list(tr.skipped_examples), tr.lines, tr.complete)


__all__ = ["Trace", "TraceFormat", "TRACE_LOADERS", "register_format", "formats", "trace_loader",
           "load_trace", "check_trace_spec", "resolve_path", "read_text", "bundled_names",
           "BUNDLED", "BUNDLED_PREFIX", "DATA_DIR"]
