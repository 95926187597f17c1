"""Check ``[[streams]]`` tables before any work: keys, numbers, sources (arrival process, length
models, trace, ServeGen client), the stream's kind, its class-assignment rules, and the volume of
requests it would make. Each stream becomes a :class:`StreamSpec` that :mod:`workloads.build`
turns into requests. Errors are one line naming the stream, the key, the value and what was
expected (:class:`~workloads.errors.WorkloadError`)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from workloads.arrivals import Batch, ClosedLoop, parse_arrival
from workloads.errors import WorkloadError, integer, number, prefixed, require, unknown_keys
from workloads.contracts import ArrivalProcess, LengthModel
from workloads.lengths import parse_length
from workloads.prefix import check_prefix
from workloads.traces import check_trace_spec, load_trace, trace_loader


STREAM_KEYS = {"prefix", "tenant", "class", "arrival", "prompt_tokens", "output_tokens", "max_tokens",
               "deadline_s", "start_s", "stop_s", "correlation", "trace", "assign", "name"}


ASSIGN_KEYS = {"column", "equals", "above", "below", "fraction", "tenant", "class"}


@dataclass
class StreamSpec:
    """A checked stream table."""

    index: int
    tenant: str
    cls: str
    kind: str
    arrival: ArrivalProcess | ClosedLoop | None = None
    prompt: LengthModel | None = None
    output: LengthModel | None = None
    rho: float = 0.0
    max_tokens: int | None = None
    deadline_s: float = math.nan
    start_s: float = 0.0
    stop_s: float | None = None
    trace: dict | None = None
    assign: list[dict] = field(default_factory=list)
    prefix: dict | None = None  # synthetic shared-prefix model (workloads.prefix)


def check_stream(i: int, s: Any, class_names: set[str] | None, base_dir: Path) -> StreamSpec:
    path = f"streams[{i}]"
    _check_stream_names(path, s, class_names)
    st = StreamSpec(i, s["tenant"], s["class"], "synthetic")
    _check_stream_numbers(path, s, st)
    trace = _check_stream_sources(path, s, st, base_dir)
    _set_stream_kind(path, s, st, trace)
    _check_stream_assign(path, s, st, class_names)
    if "prefix" in s:
        st.prefix = check_prefix(f"{path}.prefix", s["prefix"])
    return st


def _check_stream_names(path: str, s: Any, class_names: set[str] | None) -> None:
    """The stream is a table of known keys with a non-empty tenant and a declared class."""
    require(path, s, isinstance(s, dict), "a table")
    unknown_keys(path, s, STREAM_KEYS)
    for k in ("tenant", "class"):
        require(f"{path}.{k}", s.get(k), isinstance(s.get(k), str) and s.get(k) != "",
                "a non-empty string")
    if class_names is not None:
        require(f"{path}.class", s["class"], s["class"] in class_names,
                f"one of the [[classes]] names ({', '.join(sorted(class_names))})")


def _check_stream_numbers(path: str, s: dict, st: StreamSpec) -> None:
    """Copy the stream's scalar settings (times in s, token caps, correlation) onto ``st``."""
    try:
        if "start_s" in s:
            st.start_s = number("start_s", s["start_s"], ge=0)
        if "stop_s" in s:
            st.stop_s = number("stop_s", s["stop_s"], gt=st.start_s)
        if "deadline_s" in s:
            st.deadline_s = number("deadline_s", s["deadline_s"], gt=0)
        if "max_tokens" in s:
            st.max_tokens = integer("max_tokens", s["max_tokens"], ge=1)
        if "correlation" in s:
            st.rho = number("correlation", s["correlation"], ge=-1, le=1)
    except WorkloadError as exc:
        raise prefixed(path, exc) from None


def _check_stream_sources(path: str, s: dict, st: StreamSpec, base_dir: Path) -> dict | None:
    """Parse the stream's trace, arrival process and length models onto ``st``; returns the trace."""
    trace = s.get("trace")
    if trace is not None:
        try:
            check_trace_spec(trace, base_dir)
        except WorkloadError as exc:
            raise prefixed(f"{path}.trace", exc) from None
        st.trace = trace
    if "arrival" in s:
        try:
            st.arrival = parse_arrival(s["arrival"])
        except WorkloadError as exc:
            raise prefixed(f"{path}.arrival", exc) from None
    loader = _column_loader(base_dir)
    for k in ("prompt_tokens", "output_tokens"):
        if k in s:
            require(f"{path}.{k}", s[k], trace is None,
                    "absent when the stream has a trace (its lengths come from the trace)")
            try:
                setattr(st, k.split("_")[0], parse_length(s[k], column_loader=loader))
            except WorkloadError as exc:
                raise prefixed(f"{path}.{k}", exc) from None
    return trace


def _set_stream_kind(path: str, s: dict, st: StreamSpec, trace: dict | None) -> None:
    """Decide how the stream's rows are made (synthetic, servegen, trace lengths or replay),
    checking that it has what that kind needs and nothing it cannot use."""
    if trace is None:
        for k in ("prompt_tokens", "output_tokens"):
            require(f"{path}.{k}", None, k in s, "a length model (or give the stream a trace)")
        require(f"{path}.arrival", None, st.arrival is not None,
                "an arrival process { process = ... } (or give the stream a trace)")
    elif trace["format"] == "servegen":
        st.kind = "servegen"
        require(f"{path}.arrival", s.get("arrival"), st.arrival is None,
                "absent for a servegen trace (it brings its own arrivals)")
    elif st.arrival is not None:
        st.kind = "trace_lengths"
    else:
        st.kind = "replay"
        require(f"{path}.arrival", None, trace_loader(trace["format"]).has_times(trace),
            f"an arrival process: the {trace['format']} trace has no arrival times")
    if isinstance(st.arrival, ClosedLoop) and st.arrival.order == "sequential":
        require(f"{path}.arrival.order", "sequential", trace is not None and st.kind != "servegen",
                "a per-request trace to send in order (order = 'sequential' sends a trace's rows)")
    if "correlation" in s:
        require(f"{path}.correlation", s["correlation"], trace is None,
                "absent for trace streams (their lengths are already paired)")


def _check_stream_assign(path: str, s: dict, st: StreamSpec, class_names: set[str] | None) -> None:
    """Check the stream's ``[[assign]]`` rules (tenant / class per row) and keep them on ``st``."""
    rules = s.get("assign", [])
    require(f"{path}.assign", rules, isinstance(rules, list), "a list of tables")
    if rules:
        require(f"{path}.assign", rules, not isinstance(st.arrival, ClosedLoop),
                "absent for closed-loop streams (one tenant and class per stream)")
    for j, r in enumerate(rules):
        _check_rule(f"{path}.assign[{j}]", r, class_names)
    st.assign = rules
    mapped = [k for k in ("tenant", "class") if isinstance(st.trace, dict)
              and isinstance(st.trace.get("columns"), dict) and k in st.trace["columns"]]
    if mapped:
        require(f"{path}.trace.columns.{mapped[0]}", st.trace["columns"][mapped[0]],
                not isinstance(st.arrival, ClosedLoop),
                "absent for closed-loop streams (one tenant and class per stream)")


def _check_rule(path: str, r: Any, class_names: set[str] | None) -> None:
    require(path, r, isinstance(r, dict), "a table")
    unknown_keys(path, r, ASSIGN_KEYS)
    has_col, has_frac = "column" in r, "fraction" in r
    require(path, r, has_col != has_frac, "a table with either 'column' (and equals/above/below) "
            "or 'fraction'")
    if has_col:
        c = r["column"]
        require(f"{path}.column", c, isinstance(c, str) and (
            c in ("prompt_tokens", "output_tokens") or c.startswith("f_")),
            "prompt_tokens, output_tokens or a feature column f_*")
        conds = [k for k in ("equals", "above", "below") if k in r]
        require(path, r, len(conds) >= 1, "a condition: equals, above or below")
        for k in ("above", "below"):
            if k in r:
                number(f"{path}.{k}", r[k])
    else:
        number(f"{path}.fraction", r["fraction"], ge=0, le=1)
    require(path, r, "tenant" in r or "class" in r, "a target: tenant and/or class")
    if "tenant" in r:
        require(f"{path}.tenant", r["tenant"], isinstance(r["tenant"], str) and r["tenant"],
                "a non-empty string")
    if "class" in r and class_names is not None:
        require(f"{path}.class", r["class"], r["class"] in class_names,
                f"one of the [[classes]] names ({', '.join(sorted(class_names))})")


def _column_loader(base_dir: Path) -> Callable[[Any, str], np.ndarray]:
    def load(trace: Any, column: str) -> np.ndarray:
        try:
            tr = load_trace(trace, base_dir)
        except WorkloadError as exc:
            raise prefixed("trace", exc) from None
        require("column", column, column in tr.df.columns,
                f"a column of the trace ({', '.join(tr.df.columns)})")
        return tr.df[column].to_numpy(dtype=float)
    return load


#: the most requests one stream may make (or closed-loop users it may have): a guard against
#: absurd rates or counts, checked before any array is allocated (about 1 GB of workload)
MAX_REQUESTS = 20_000_000


def check_volume(st: StreamSpec, arrival: Any, duration_s: float) -> None:
    """Refuse a stream whose arrival process would make more than MAX_REQUESTS requests."""
    if arrival is None:
        return
    path = f"streams[{st.index}].arrival"
    limit = f"at most {MAX_REQUESTS:,} requests per stream: lower it, or horizon_s"
    if isinstance(arrival, ClosedLoop):
        n, key, what = arrival.users, "users", f"{arrival.users} users"
    elif hasattr(arrival, "n"):
        n, key, what = arrival.n, "n", f"{arrival.n} requests"
    else:
        rate = float(arrival.mean_rate)
        n = rate * duration_s
        key = "rate" if hasattr(arrival, "rate") else "(mean rate)"
        what = f"{rate:g} requests/s over {duration_s:g} s is about {n:.3g} requests"
    if n > MAX_REQUESTS:
        raise WorkloadError(f"{path}.{key}: {what} (expected {limit})")


def validate_streams(streams: list[dict], class_names: set[str], base_dir: Path,
                     horizon_s: float | None = None, load_scale: float = 1.0) -> list[StreamSpec]:
    """Check every stream table before any work; raise :class:`WorkloadError` naming the key.
    With ``horizon_s``, also refuse streams that would make absurdly many requests (at
    ``load_scale`` times their rates). Returns the checked streams."""
    require("streams", streams, isinstance(streams, list), "a list of [[streams]] tables")
    specs = []
    for i, s in enumerate(streams):
        st = check_stream(i, s, set(class_names), Path(base_dir))
        if horizon_s is not None and st.arrival is not None:
            arrival = st.arrival if load_scale == 1.0 else st.arrival.scaled(load_scale)
            check_volume(st, arrival, stream_duration(st, horizon_s))
        specs.append(st)
    return specs


def quiet_stream(st: StreamSpec, horizon_s: float) -> tuple[str, str] | None:
    """Why stream ``st`` sends nothing (or, drawn at random, likely nothing) before the horizon,
    where its arrivals stop: ``(key = value, why)`` for a warning, or None. It starts at or after
    the horizon; its batch drops at or after the stream's end; or its arrival process expects
    fewer than one request over the stream's time (a rate typed per hour, a time in
    milliseconds). A replayed trace is checked row by row when read (``workloads.build``)."""
    if st.start_s >= horizon_s:
        return (f"start_s = {st.start_s:g}", f"is at or after the horizon (horizon_s = {horizon_s:g}): the stream "
                                             f"sends nothing{_seconds_hint(st.start_s, horizon_s)}")
    dur = stream_duration(st, horizon_s)
    a = st.arrival
    if isinstance(a, Batch):
        if a.n > 0 and a.at_s >= dur:
            return (f"arrival.at_s = {a.at_s:g}", f"is at or after the stream's end ({dur:g} s after its start, "
                                                  f"the horizon): its {a.n:,} requests are never sent"
                                                  f"{_seconds_hint(a.at_s, dur)}")
        return None
    if a is None or isinstance(a, ClosedLoop):  # (closed-loop users send at once)
        return None
    expected = a.expected_count(dur) if hasattr(a, "expected_count") else a.mean_rate * dur
    if expected >= 1:
        return None
    return (f"arrival.rate = {a.rate:g}" if isinstance(getattr(a, "rate", None), (int, float)) else "arrival",
            f"expects {expected:.2g} requests over its {dur:g} s before the horizon (a mean rate of "
            f"{expected / dur:.3g} requests/s): it likely sends nothing (expected a rate of at least "
            f"{1 / dur:.3g} requests/s, or a longer horizon_s)")


def _seconds_hint(value: float, limit: float) -> str:
    """A hint that ``value`` (s) was meant in milliseconds, where that would fit before ``limit``."""
    return f" (the unit is seconds: {value / 1000:g} for {value:g} ms)" if 10 * limit <= value < 1000 * limit else ""


def stream_end(st: StreamSpec, horizon_s: float) -> float:
    """When the stream stops sending, seconds: its ``stop_s``, at most the horizon."""
    return min(st.stop_s if st.stop_s is not None else horizon_s, horizon_s)


def stream_duration(st: StreamSpec, horizon_s: float) -> float:
    """Seconds the stream's arrival process runs for."""
    return max(0.0, stream_end(st, horizon_s) - st.start_s)
