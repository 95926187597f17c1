"""Per-request traces: a scenario's ``trace = {format, path, ...}`` table checked and loaded.

Every format returns a :class:`Trace` whose table has ``prompt_tokens`` and ``output_tokens``
(int64 tokens), ``arrival_s`` (float64 seconds after ``t0``; absent for lengths-only tables),
optionally ``hash_ids`` (tuples of prefix-block hashes) and ``f_*`` feature columns; its rows are
checked as :mod:`workloads.tracerows` says (bad rows named by file and line; ``lenient=True``
skips and counts them).

Formats live in the open registry ``TRACE_LOADERS`` (name -> :class:`TraceFormat`, a
:class:`~workloads.contracts.TraceLoader`; :mod:`workloads.traceformat`). The shipped ones are
one file each in :mod:`workloads.formats` (Azure 2023 CSV, Mooncake JSONL, ShareGPT lengths,
generic CSV / JSONL, ServeGen), each ending in one :func:`register_format` call with the options
it reads; a user's own loads by ``format = "pkg.mod:obj"`` or by the same call.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Mapping

import workloads.formats  # noqa: F401  (registers the shipped formats)
from plumbing.suggest import did_you_mean
from workloads.contracts import TraceLoader
from workloads.errors import WorkloadError, number, require, unknown_keys
from workloads.traceformat import TRACE_LOADERS, Trace, TraceFormat, formats, register_format
from workloads.tracefile import read_text
from workloads.tracerows import TIME_UNITS

DATA_DIR = Path(__file__).resolve().parent / "data"
BUNDLED = {
    "azure_code": "AzureLLMInferenceTrace_code.csv",
    "azure_conv": "AzureLLMInferenceTrace_conv.csv",
}
# ``path = "bundled:NAME"`` names a file (or a ServeGen client prefix) under DATA_DIR, wherever the
# package is installed; any other path is the user's own, relative to the scenario's folder.
BUNDLED_PREFIX = "bundled:"
#: keys every ``trace = {...}`` table may have; a format adds its own (``TraceFormat.options``)
COMMON_KEYS = ("format", "path", "t0", "time_unit", "window", "sample")


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


def trace_loader(fmt: Any) -> TraceLoader:
    """The loader of ``format`` (a registered name or ``pkg.mod:obj``); WorkloadError otherwise."""
    names = formats()
    dotted = isinstance(fmt, str) and ":" in fmt and fmt not in names
    if not (fmt in names or dotted):  # (the names the registry holds now: shipped, then registered)
        raise WorkloadError(f"format: must be one of {', '.join(names)}, or a dotted path 'package.module:obj' "
                            f"(got {fmt!r}){did_you_mean(fmt, names)}")
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
