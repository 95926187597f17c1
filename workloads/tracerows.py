"""Checking a trace's rows as they are read: lengths, times, names, prefix hashes and features,
chunk by chunk, until the last row a run needs.

Rows are checked before use. A missing column, an unparsable timestamp, a negative or
non-integer length, or a time earlier than an earlier row raises :class:`WorkloadError` naming
the file, the 1-based line as a person counts it (a CSV header is line 1) and the value. With
``lenient=True`` those rows are skipped instead and counted in ``Trace.rows_skipped``. A length
of 0 is not an error; it is raised to 1 token (the engine needs >= 1) and counted in
``Trace.zero_lengths``. Nothing is dropped without being counted.

A format says which of a file's columns hold what (:class:`Columns`) and hands the file's chunks
(:mod:`workloads.tracefile`) to :func:`read_table`, which returns the checked rows.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pandas as pd

from workloads.errors import WorkloadError, number
from workloads.traceformat import Trace
from workloads.tracefile import Chunk

#: the longest prompt or output a trace row may declare, tokens (far above any model's context;
#: a larger number is a corrupt row, and would not fit the int64 token arithmetic)
MAX_LENGTH = 100_000_000
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9, "min": 60.0, "h": 3600.0}


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
    """A tenant or class column: strings; a row that names none (an empty cell, a missing JSON
    field, null) gets None, the stream's own tenant or class; anything else is flagged (a
    number, a name of spaces); returns objects."""
    vals = raw.to_numpy(dtype=object)
    out = vals.copy()
    bad = np.zeros(len(vals), dtype=bool)
    for r, v in enumerate(vals):
        if v is None or v == "" or (isinstance(v, float) and v != v):  # (an empty CSV cell reads as NaN)
            out[r] = None
        elif not (isinstance(v, str) and v.strip() != ""):
            bad[r] = True
    ck.flag(bad, lambda r: f"{col} {vals[r]!r} is not a name (expected a non-empty string, or nothing for the "
                           f"stream's own)")
    return out


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


def _flag_json(ck: _Checker, chunk: Chunk, fields: list[str]) -> None:
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


class Rows:
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
class Columns:
    """How one format reads a chunk: its time column and unit, lengths, names and extras."""

    time: str | None  # the file's time column (None: lengths only)
    unit: str  # a TIME_UNITS key, or "datetime"
    prompt: str
    output: str
    names: dict[str, str] = field(default_factory=dict)  # "tenant"/"cls" -> the file's column
    features: dict[str, str] = field(default_factory=dict)  # f_* -> the file's column
    hash_ids: str | None = None
    max_tokens: str | None = None  # the file's column of each request's max_tokens (as its client sent)
    datetime_hint: bool = False
    sort_first: bool = False  # (the generic formats checked order before lengths: the same message)


def read_table(path: Path, chunks: Iterator[Chunk], cols: Columns, spec: dict, lenient: bool,
          until_s: float | None, json_fields: list[str] | None = None) -> tuple[Rows, pd.DataFrame, np.ndarray]:
    """Check a file's rows chunk by chunk, keeping the good ones, until ``until_s`` (see
    :class:`Rows`); returns the rows and the finished table (``arrival_s`` after t0)."""
    ns = cols.unit == "datetime"
    t0 = (_t0_ns(spec) if ns else _t0_s(spec, cols.unit)) if cols.time is not None else None
    rows = Rows(path.name, lenient, until_s if cols.time is not None else None, t0, ns)
    needed = [c for c in (cols.time, cols.prompt, cols.output, *cols.names.values(), *cols.features.values(),
                          cols.hash_ids, cols.max_tokens) if c is not None]
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
        if cols.max_tokens is not None:
            frame["max_tokens"] = _lengths(ck, raw[cols.max_tokens], cols.max_tokens)
        if cols.hash_ids is not None:
            objs = chunk.objects
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


