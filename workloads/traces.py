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

import csv
import gzip
import io
import json
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

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
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"{path.name}: cannot read: {exc}") from None


class _Checker:
    """Collects bad rows; strict mode raises on the earliest, lenient mode drops them all."""

    def __init__(self, name: str, n: int, line0: int, lenient: bool) -> None:
        self.name, self.line0, self.lenient = name, line0, lenient
        self.bad = np.zeros(n, dtype=bool)
        self.first: tuple[int, str] | None = None
        self.examples: list[str] = []

    def line(self, row: int) -> int:
        return int(row) + self.line0

    def flag(self, mask: np.ndarray, describe: Any) -> None:
        """Mark rows where ``mask``; ``describe(row)`` gives the message for one row."""
        rows = np.flatnonzero(mask & ~self.bad)
        if rows.size == 0:
            return
        self.bad[rows] = True
        r = int(rows[0])
        msg = f"{self.name} line {self.line(r)}: {describe(r)}"
        if self.first is None or r < self.first[0]:
            self.first = (r, msg)
        for rr in rows[: max(0, 5 - len(self.examples))]:
            self.examples.append(f"line {self.line(rr)}: {describe(int(rr))}")

    def finish(self) -> None:
        if self.first is not None and not self.lenient:
            raise WorkloadError(self.first[1] + " (use lenient mode to skip bad rows)")


def _lengths(ck: _Checker, raw: pd.Series, col: str) -> np.ndarray:
    """Parse a length column: non-negative integers; bad rows flagged; returns int64 (bad -> 0)."""
    num = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(num) | (num < 0) | (np.mod(num, 1) != 0)
    vals = raw.to_numpy()
    ck.flag(bad, lambda r: f"{col} {vals[r]!r} is not a non-negative integer")
    with np.errstate(invalid="ignore"):
        huge = ~bad & (num > MAX_LENGTH)
    ck.flag(huge, lambda r: f"{col} {vals[r]!r} is more than {MAX_LENGTH:,} tokens")
    return np.where(bad | huge, 0, num).astype(np.int64)


def _times_numeric(ck: _Checker, raw: pd.Series, col: str, unit: float) -> np.ndarray:
    num = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    vals = raw.to_numpy()
    ck.flag(~np.isfinite(num), lambda r: f"{col} {vals[r]!r} is not a number")
    return num * unit


def _times_datetime(ck: _Checker, raw: pd.Series, col: str) -> np.ndarray:
    """Datetimes (ISO 8601, any number of fractional digits) as int64 nanoseconds."""
    ts = pd.to_datetime(raw.astype(str), format="ISO8601", errors="coerce")
    vals = raw.to_numpy()
    bad = ts.isna().to_numpy()
    ck.flag(bad, lambda r: f"{col} {vals[r]!r} is not a timestamp YYYY-MM-DD HH:MM:SS.fffffff")
    return ts.to_numpy(dtype="datetime64[ns]").astype(np.int64)


def _check_sorted(ck: _Checker, t: np.ndarray, col: str, shown: np.ndarray) -> None:
    """Flag rows whose time is earlier than an earlier (good) row's time."""
    tt = np.where(ck.bad, -np.inf, t.astype(float))
    prev_max = np.concatenate([[-np.inf], np.maximum.accumulate(tt)[:-1]])
    unsorted = tt < prev_max
    ck.flag(unsorted, lambda r: f"{col} {shown[r]!r} is earlier than an earlier row "
                                f"(times must be sorted)")


def _read_csv(path: Path, header: bool = True) -> pd.DataFrame:
    """Every field as a string. A row with more fields than the header is an error naming its
    line (pandas would otherwise take the first column as an index and shift the others)."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", pd.errors.ParserWarning)
            df = pd.read_csv(path, dtype=str, keep_default_na=False, skip_blank_lines=False,
                             header=0 if header else None, index_col=False)
    except FileNotFoundError:
        raise WorkloadError(f"{path}: file not found") from None
    except pd.errors.EmptyDataError:
        raise WorkloadError(f"{path.name} line 1: the file is empty (expected a header line, then one "
                            f"row per request)") from None
    except pd.errors.ParserError as exc:
        m = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", str(exc))
        if m:
            raise WorkloadError(f"{path.name} line {m[2]}: {m[3]} fields, but the header has {m[1]} "
                                f"(expected one value per header column)") from None
        raise WorkloadError(f"{path.name}: cannot parse as CSV: {exc}") from None
    except (UnicodeDecodeError, OSError, EOFError) as exc:  # OSError, EOFError: a bad gzip file
        raise WorkloadError(f"{path.name}: cannot parse as CSV: {exc}") from None
    if any(issubclass(w.category, pd.errors.ParserWarning) for w in caught):
        n = len(df.columns)
        with io.StringIO(read_text(path), newline="") as f:
            for line, row in enumerate(csv.reader(f), start=1):
                if len(row) > n:
                    raise WorkloadError(f"{path.name} line {line}: {len(row)} fields, but the header has {n} "
                                        f"(expected one value per header column)")
    return df


def _need_columns(df: pd.DataFrame, name: str, cols: list[str]) -> None:
    for c in cols:
        if c not in df.columns:
            raise WorkloadError(f"{name} line 1 (header): missing column '{c}' "
                                f"(columns found: {', '.join(map(str, df.columns))})")


def _read_jsonl(path: Path, ck_name: str, lenient: bool) -> tuple[list[dict], list[int], list[str]]:
    """Parse JSON lines; returns (records, 1-based line numbers, bad-line messages)."""
    recs, lines, bad = [], [], []
    text = read_text(path)
    for i, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            msg = f"{ck_name} line {i}: not a JSON object ({exc}): {line[:80]!r}"
            if not lenient:
                raise WorkloadError(msg) from None
            bad.append(msg)
            continue
        recs.append(obj)
        lines.append(i)
    return recs, lines, bad


def _finish(ck: _Checker, df: pd.DataFrame, name: str, rows_read: int, extra_bad: int = 0,
            extra_examples: list[str] | None = None) -> Trace:
    ck.finish()
    keep = ~ck.bad
    df = df.loc[keep].reset_index(drop=True)
    if len(df) == 0:
        skipped = int(ck.bad.sum()) + extra_bad
        raise WorkloadError(f"{name}: no requests (expected at least one row; {rows_read} rows read"
                            + (f", {skipped} skipped as bad" if skipped else "") + ")")
    zeros = 0
    for c in ("prompt_tokens", "output_tokens"):
        z = df[c].to_numpy() == 0
        zeros += int(z.sum())
        df[c] = np.maximum(df[c].to_numpy(), 1).astype(np.int64)
    return Trace(df, name, rows_read, int(ck.bad.sum()) + extra_bad, zeros,
                 (extra_examples or []) + ck.examples)


def _t0_ns(spec: dict, t_ns: np.ndarray, good: np.ndarray) -> int:
    if "t0" in spec:
        try:
            return int(pd.Timestamp(spec["t0"]).value)
        except (ValueError, TypeError):
            raise WorkloadError(f"t0: must be a timestamp like '2023-11-16 18:17:00' "
                                f"(got {spec['t0']!r})") from None
    return int(t_ns[np.argmax(good)]) if good.any() else 0


def _t0_s(spec: dict, t: np.ndarray, good: np.ndarray) -> float:
    if "t0" in spec:
        return number("t0", spec["t0"]) * TIME_UNITS[spec.get("time_unit", "s")]
    return float(t[np.argmax(good)]) if good.any() else 0.0


def load_azure(path: Path, spec: dict, lenient: bool) -> Trace:
    """Azure LLM inference trace 2023: ``TIMESTAMP, ContextTokens, GeneratedTokens``."""
    raw = _read_csv(path)
    _need_columns(raw, path.name, ["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
    ck = _Checker(path.name, len(raw), 2, lenient)
    t_ns = _times_datetime(ck, raw["TIMESTAMP"], "TIMESTAMP")
    p = _lengths(ck, raw["ContextTokens"], "ContextTokens")
    o = _lengths(ck, raw["GeneratedTokens"], "GeneratedTokens")
    _check_sorted(ck, t_ns, "TIMESTAMP", raw["TIMESTAMP"].to_numpy())
    t0 = _t0_ns(spec, t_ns, ~ck.bad)
    df = pd.DataFrame({"arrival_s": (t_ns - t0) / 1e9, "prompt_tokens": p, "output_tokens": o})
    return _finish(ck, df, path.name, len(raw))


def load_mooncake(path: Path, spec: dict, lenient: bool) -> Trace:
    """Mooncake JSONL: ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``.

    Requests sharing one timestamp are spread evenly over ``spread_bucket_s`` (default 3 s, the
    trace's bucketing): the k-th of n goes to ``t + spread * k / n``; 0 keeps them as a batch.
    """
    recs, lines, bad_lines = _read_jsonl(path, path.name, lenient)
    cols = {"timestamp": "timestamp", "input_length": "input_length",
            "output_length": "output_length"}
    df, ck = _records_frame(recs, lines, path.name, cols, lenient)
    t = _times_numeric(ck, df["timestamp"], "timestamp", 1e-3)
    p = _lengths(ck, df["input_length"], "input_length")
    o = _lengths(ck, df["output_length"], "output_length")
    _check_sorted(ck, t, "timestamp", df["timestamp"].to_numpy())
    t0 = _t0_s({**spec, "time_unit": "ms"} if "t0" in spec else spec, t, ~ck.bad)
    out = pd.DataFrame({"arrival_s": t - t0, "prompt_tokens": p, "output_tokens": o})
    hashes = [None if not isinstance(r.get("hash_ids"), list) else tuple(int(x) for x in r["hash_ids"])
              for r in recs]
    out["hash_ids"] = pd.Series(hashes, dtype=object)
    tr = _finish(ck, out, path.name, len(recs) + len(bad_lines), len(bad_lines), bad_lines[:5])
    spread = number("spread_bucket_s", spec.get("spread_bucket_s", 3.0), ge=0)
    if spread > 0 and len(tr.df):
        g = tr.df.groupby("arrival_s", sort=False)["arrival_s"]
        k = g.cumcount().to_numpy()
        n = g.transform("size").to_numpy()
        tr.df["arrival_s"] = tr.df["arrival_s"].to_numpy() + spread * k / n
    return tr


def _records_frame(recs: list[dict], lines: list[int], name: str, cols: dict[str, str],
                   lenient: bool) -> tuple[pd.DataFrame, _Checker]:
    """Columns ``cols`` (our name -> field) of JSON records; a missing field is a bad row."""
    ck = _Checker(name, len(recs), 0, lenient)
    ck.line = lambda r: lines[r]  # type: ignore[method-assign]
    data = {}
    for ours, fld in cols.items():
        vals = [r.get(fld) for r in recs]
        missing = np.array([v is None for v in vals], dtype=bool)
        ck.flag(missing, lambda r, fld=fld: f"missing field '{fld}'")
        data[ours] = pd.Series([str(v) if isinstance(v, (int, float, str)) else v for v in vals],
                               dtype=object)
    return pd.DataFrame(data), ck


def load_sharegpt(path: Path, spec: dict, lenient: bool) -> Trace:
    """ShareGPT length table (Sarathi-Serve): ``num_prefill_tokens``, ``num_decode_tokens``."""
    raw = _read_csv(path)
    _need_columns(raw, path.name, ["num_prefill_tokens", "num_decode_tokens"])
    ck = _Checker(path.name, len(raw), 2, lenient)
    p = _lengths(ck, raw["num_prefill_tokens"], "num_prefill_tokens")
    o = _lengths(ck, raw["num_decode_tokens"], "num_decode_tokens")
    return _finish(ck, pd.DataFrame({"prompt_tokens": p, "output_tokens": o}), path.name, len(raw))


def _mapping(spec: dict) -> dict[str, str]:
    cols = spec.get("columns")
    require("columns", cols, isinstance(cols, dict),
            "a table {arrival_s = ..., prompt_tokens = ..., output_tokens = ...}")
    for k, v in cols.items():
        ok = k in ("arrival_s", "prompt_tokens", "output_tokens", "hash_ids") or k.startswith("f_")
        require(f"columns.{k}", k, ok, "one of arrival_s, prompt_tokens, output_tokens, "
                "hash_ids, or a feature name starting with f_")
        require(f"columns.{k}", v, isinstance(v, str), "a column name")
    for k in ("prompt_tokens", "output_tokens"):
        require(f"columns.{k}", None, k in cols, "given (the column holding it)")
    return cols


def _generic(df: pd.DataFrame, ck: _Checker, spec: dict, cols: dict[str, str], name: str,
             rows_read: int, extra_bad: int = 0, examples: list[str] | None = None) -> Trace:
    out = {}
    unit = spec.get("time_unit", "s")
    if "arrival_s" in cols:
        c = cols["arrival_s"]
        if unit == "datetime":
            t_ns = _times_datetime(ck, df[c], c)
            _check_sorted(ck, t_ns, c, df[c].to_numpy())
            out["arrival_s"] = (t_ns - _t0_ns(spec, t_ns, ~ck.bad)) / 1e9
        else:
            t = _times_numeric(ck, df[c], c, TIME_UNITS[unit])
            _check_sorted(ck, t, c, df[c].to_numpy())
            out["arrival_s"] = t - _t0_s(spec, t, ~ck.bad)
    out["prompt_tokens"] = _lengths(ck, df[cols["prompt_tokens"]], cols["prompt_tokens"])
    out["output_tokens"] = _lengths(ck, df[cols["output_tokens"]], cols["output_tokens"])
    frame = pd.DataFrame(out)
    for k, c in cols.items():
        if k.startswith("f_"):
            col = df[c]
            num = pd.to_numeric(col, errors="coerce")
            frame[k] = num if num.notna().all() else col.astype(object)
        elif k == "hash_ids":
            frame[k] = pd.Series([None if not isinstance(v, (list, tuple)) else tuple(int(x) for x in v)
                                  for v in df[c]], dtype=object)
    return _finish(ck, frame, name, rows_read, extra_bad, examples)


def load_csv(path: Path, spec: dict, lenient: bool) -> Trace:
    """Any CSV with a header, read through ``columns = {arrival_s=..., prompt_tokens=..., ...}``."""
    cols = _mapping(spec)
    raw = _read_csv(path)
    _need_columns(raw, path.name, list(cols.values()))
    return _generic(raw, _Checker(path.name, len(raw), 2, lenient), spec, cols, path.name, len(raw))


def load_jsonl(path: Path, spec: dict, lenient: bool) -> Trace:
    """Any JSON-lines file, read through a ``columns`` mapping (missing field = bad row)."""
    cols = _mapping(spec)
    recs, lines, bad_lines = _read_jsonl(path, path.name, lenient)
    df, ck = _records_frame(recs, lines, path.name, {v: v for v in cols.values()}, lenient)
    if "hash_ids" in cols:
        df[cols["hash_ids"]] = pd.Series([r.get(cols["hash_ids"]) for r in recs], dtype=object)
    return _generic(df, ck, spec, cols, path.name, len(recs) + len(bad_lines), len(bad_lines),
                    bad_lines[:5])


@dataclass(frozen=True)
class TraceFormat:
    """A registered trace format (:class:`~workloads.contracts.TraceLoader`) built from its load
    function ``read(path, spec, lenient) -> Trace``. ``times``: whether rows carry arrival
    times, or a function of the table saying so. ``checker(spec)``: checks of the table beyond
    its options' own (no file read). ``per_request=False``: sampled window by window (ServeGen),
    not read here."""

    read: Callable[[Path, dict, bool], Trace] | None
    description: str = ""
    times: bool | Callable[[dict], bool] = True
    options: Mapping[str, Callable[[Any], Any] | None] = field(default_factory=dict)
    checker: Callable[[dict], None] | None = None
    per_request: bool = True

    def check(self, spec: dict) -> None:
        if self.checker is not None:
            self.checker(spec)

    def has_times(self, spec: dict) -> bool:
        return self.times(spec) if callable(self.times) else self.times

    def load(self, path: Path, spec: dict, lenient: bool) -> Trace:
        assert self.read is not None, "not a per-request format"
        return self.read(path, spec, lenient)


TRACE_LOADERS = Registry("trace format")


def register_format(name: str, fmt: TraceFormat) -> None:
    """Add a trace format (a name used twice is an error)."""
    TRACE_LOADERS.register(name, fmt, fmt.description)


def _mapped_times(spec: dict) -> bool:
    return "arrival_s" in spec.get("columns", {})


register_format("azure", TraceFormat(load_azure, "Azure LLM inference trace 2023 (CSV)"))
register_format("mooncake", TraceFormat(
    load_mooncake, "Mooncake JSONL (ms timestamps, hash_ids)",
    options={"spread_bucket_s": lambda v: number("spread_bucket_s", v, ge=0)}))
register_format("sharegpt", TraceFormat(load_sharegpt, "ShareGPT length table (lengths only)", times=False))
register_format("csv", TraceFormat(load_csv, "any CSV through a columns mapping", times=_mapped_times,
                                   options={"columns": None}, checker=_mapping))
register_format("jsonl", TraceFormat(load_jsonl, "any JSON lines through a columns mapping", times=_mapped_times,
                                     options={"columns": None}, checker=_mapping))
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


def load_trace(spec: dict, base_dir: Path, lenient: bool = False) -> Trace:
    """Load and check the trace a ``trace = {...}`` table names (cached per file and options)."""
    path = check_trace_spec(spec, base_dir)
    loader = trace_loader(spec["format"])
    require("format", spec["format"], loader.per_request, "a per-request format (servegen is sampled, not loaded)")
    opts = tuple(sorted((k, json.dumps(v, sort_keys=True, default=str)) for k, v in spec.items()
                        if k not in ("window", "sample", "client")))
    key = (str(path.resolve()), path.stat().st_mtime_ns, opts, lenient)
    if key not in _CACHE:
        _CACHE[key] = loader.load(path, spec, lenient)
    tr = _CACHE[key]
    return Trace(tr.df.copy(), tr.source, tr.rows_read, tr.rows_skipped, tr.zero_lengths,
                 list(tr.skipped_examples))


__all__ = ["Trace", "TraceFormat", "TRACE_LOADERS", "register_format", "formats", "trace_loader",
           "load_trace", "check_trace_spec", "resolve_path", "read_text", "bundled_names",
           "BUNDLED", "BUNDLED_PREFIX", "DATA_DIR"]
