"""Turn ``[[streams]]`` tables into a :class:`Workload`: open requests and closed-loop users.

A stream is one of four kinds, decided by its keys:

* ``synthetic``: an ``arrival`` process x ``prompt_tokens``/``output_tokens`` length models;
* ``replay``: a per-request ``trace`` with times and no ``arrival`` (times shifted by ``t0``,
  cut to ``trace.window``, compressed by ``load_scale``);
* ``trace_lengths``: a ``trace`` *and* an ``arrival`` process: each request's lengths (and
  hash_ids, features) are a row drawn at random from the trace;
* ``servegen``: a ServeGen client sampled window by window.

Any of them with ``arrival.process = "closed_loop"`` becomes a :class:`ClosedLoopStream` that
the engine drives. Times are seconds from the start of the simulation; token counts are int64.
Randomness: named child seeds ``SeedSequence(seed, spawn_key=(stream index, name))``, so adding
a stream never changes another stream's requests.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import pandas as pd

from plumbing.notices import warn
from workloads.arrivals import ClosedLoop
from workloads.errors import WorkloadError, integer, number, require
from workloads.contracts import LengthModel
from workloads.lengths import sample_pair
from workloads.prefix import synthetic_hash_ids
from workloads.servegen import load_client, sample_client
from workloads.streams import StreamSpec, check_stream, check_volume, stream_duration, stream_end
from workloads.traces import load_trace

RNG_NAMES = {"arrivals": 0, "lengths": 1, "attributes": 2, "closed": 3, "prefix": 90}
REQUIRED_COLUMNS = {"arrival_s": "float64", "tenant": "object", "cls": "object",
                    "prompt_tokens": "int64", "output_tokens": "int64", "max_tokens": "int64",
                    "deadline_s": "float64", "stream": "int64"}


def child_rng(seed: int, stream: int, name: str) -> np.random.Generator:
    """The generator for one named purpose of one stream (independent of other streams)."""
    return np.random.Generator(np.random.PCG64(
        np.random.SeedSequence(seed, spawn_key=(stream, RNG_NAMES[name]))))


def _load_stream_trace(st: StreamSpec, base_dir: Path, lenient: bool, until_s: float | None = None,
                       class_names: set[str] | None = None):
    """The stream's trace (read up to ``until_s`` s after t0 when given); an error in it names
    the stream. A class column's values must be ``class_names`` (when known)."""
    try:
        tr = load_trace(st.trace, base_dir, lenient, until_s=until_s)
        if class_names is not None and "cls" in tr.df.columns:
            _check_classes(tr, class_names, st.trace.get("columns", {}).get("class", "class"))
        return tr
    except WorkloadError as exc:
        raise WorkloadError(f"streams[{st.index}].trace: {exc}") from None


def _check_classes(tr, class_names: set[str], col: str) -> None:
    """Every row's class (from the trace's class column) is a declared class; a row that names
    none (an empty cell, a JSON line without the field) takes its stream's (:func:`_apply_rules`)."""
    cls = tr.df["cls"].to_numpy(dtype=object)
    unknown = ~np.isin(cls, np.array(sorted(class_names), dtype=object)) & ~pd.isna(cls)
    if unknown.any():
        r = int(np.argmax(unknown))
        line = f" line {tr.lines[r]}" if tr.lines is not None else ""
        raise WorkloadError(f"{tr.source}{line}: {col} {cls[r]!r} is not a class of the scenario "
                            f"(expected one of the [[classes]] names: {', '.join(sorted(class_names))})")


def replay_until(st: StreamSpec, horizon_s: float, load_scale: float) -> float | None:
    """How far into a replayed trace (s after t0) its rows are needed, or None: all of it.

    A replay uses the rows inside its window that arrive before the stream ends. Reading stops
    there unless ``sample`` goes with a ``fraction`` rule (both draw from one generator, the
    draws of every row in the window). The default ``max_tokens`` is the largest output among
    the rows read, so rows the replay never reaches do not change it."""
    if st.kind != "replay":
        return None
    if "sample" in st.trace and any("fraction" in r for r in st.assign):
        return None
    w0, w1 = st.trace.get("window", [0.0, math.inf])
    return min(float(w1), float(w0) + (stream_end(st, horizon_s) - st.start_s) * load_scale)




class ClosedLoopStream:
    """``users`` closed-loop users of one stream; the engine calls ``start`` then ``next``.

    Each user has its own generator (spawned from the stream's ``closed`` seed), so the requests
    a user sends do not depend on the order in which the engine reports completions.
    Times in seconds; the row dict has prompt_tokens, output_tokens, max_tokens (int) and
    deadline_s (float, NaN if none).
    """

    def __init__(self, stream: int, tenant: str, cls: str, users: int, think: LengthModel,
                 start_s: float, stop_s: float, draw_row: Callable[[np.random.Generator], dict],
                 seed: int) -> None:
        self.stream, self.tenant, self.cls, self.users = stream, tenant, cls, users
        self.think, self.start_s, self.stop_s = think, start_s, stop_s
        self._draw_row = draw_row
        seq = np.random.SeedSequence(seed, spawn_key=(stream, RNG_NAMES["closed"]))
        self._rngs = [np.random.Generator(np.random.PCG64(c)) for c in seq.spawn(users)]

    def start(self) -> list[tuple[int, float, dict]]:
        """Each user's first request, staggered uniformly within one mean think time."""
        if self._rows is not None:
            return self._start_sequential()
        out = []
        for u, rng in enumerate(self._rngs):
            t = self.start_s + float(rng.random()) * self.think.mean
            if t < self.stop_s:
                out.append((u, t, self._draw_row(rng)))
        return out

    def next(self, user: int, done_s: float) -> tuple[float, dict] | None:
        """User ``user``'s next request after its answer came back at ``done_s`` (None: none)."""
        rng = self._rngs[user]
        t = float(done_s) + float(self.think.sample(rng, 1)[0])
        if self._rows is not None:
            return self._next_sequential(t)
        if t >= self.stop_s:
            return None
        return t, self._draw_row(rng)

    def sequential(self, rows: list[dict], ready_s: np.ndarray) -> "ClosedLoopStream":
        """Send ``rows`` in order, each once, by whichever user is free first, not before its
        ``ready_s`` (seconds after ``start_s``): a benchmark client's concurrency semaphore
        over a fixed request list (``order = "sequential"``)."""
        self._rows, self._ready, self._cursor = rows, np.asarray(ready_s, dtype=float), 0
        return self

    _rows: list[dict] | None = None

    def _take(self, t: float) -> tuple[float, dict] | None:
        if self._rows is None or self._cursor >= len(self._rows):
            return None
        k = self._cursor
        t = max(t, self.start_s + float(self._ready[k]))
        if t >= self.stop_s:
            return None
        self._cursor += 1
        return t, self._rows[k]

    def _start_sequential(self) -> list[tuple[int, float, dict]]:
        out = []
        for u in range(self.users):  # (no stagger: a semaphore's first holders start together)
            got = self._take(self.start_s)
            if got is None:
                break
            out.append((u, *got))
        return out

    def _next_sequential(self, t: float) -> tuple[float, dict] | None:
        return self._take(t)

    def __repr__(self) -> str:
        return (f"ClosedLoopStream(stream={self.stream}, tenant={self.tenant!r}, cls={self.cls!r}, "
                f"users={self.users}, think_mean_s={self.think.mean:.3g})")


@dataclass
class Workload:
    """Pre-generated open requests (sorted by arrival), closed-loop users, and provenance."""

    open: pd.DataFrame
    closed: list[ClosedLoopStream]
    meta: dict


def empty_frame() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series([], dtype=t) for c, t in REQUIRED_COLUMNS.items()})


def _apply_rules(st: StreamSpec, df: pd.DataFrame, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    n = len(df)
    # every row holds the stream's one tenant and class string (np.full would make a new copy of
    # the string per row: converted through a fixed-width string array): a million rows convert
    # and hash as a few shared objects all the way to the request table
    tenant = np.empty(n, dtype=object)
    cls = np.empty(n, dtype=object)
    # a trace's tenant / class column gives each row its own (rules below still override it)
    for arr, col, default in ((tenant, "tenant", st.tenant), (cls, "cls", st.cls)):
        if col in df.columns:
            arr[:] = df[col].to_numpy(dtype=object)
            arr[pd.isna(arr)] = default  # (a row that names none: the stream's own)
        else:
            arr.fill(default)
    free = np.ones(n, dtype=bool)
    for j, r in enumerate(st.assign):
        if "fraction" in r:
            hit = rng.random(n) < float(r["fraction"])
        else:
            c = r["column"]
            if c not in df.columns:
                raise WorkloadError(f"streams[{st.index}].assign[{j}].column: {c!r} is not a column "
                                    f"of this stream ({', '.join(df.columns)})")
            v = df[c]
            hit = np.ones(n, dtype=bool)
            if "equals" in r:
                hit &= (v == r["equals"]).to_numpy()
            if "above" in r:
                hit &= (pd.to_numeric(v, errors="coerce") > r["above"]).to_numpy()
            if "below" in r:
                hit &= (pd.to_numeric(v, errors="coerce") < r["below"]).to_numpy()
            if n and not (hit & free).any():  # (a fraction rule that draws no row is chance, not a mistake)
                why = "an earlier rule took every row it matches" if hit.any() else "no row matches it"
                warn(f"streams[{st.index}].assign[{j}] {_rule_text(r)}: assigns no row of {n:,} ({why}); "
                     f"they keep tenant '{st.tenant}', class '{st.cls}'")
        hit &= free
        if "tenant" in r:
            tenant[hit] = r["tenant"]
        if "class" in r:
            cls[hit] = r["class"]
        free &= ~hit
    return tenant, cls


def _rule_text(r: dict) -> str:
    """An assign rule as written, ``{column = "model", equals = "b"}``, for messages."""
    return "{" + ", ".join(f"{k} = {v!r}" for k, v in r.items()) + "}"


def _cap(st: StreamSpec, out: np.ndarray, default_max: int, meta: dict,
         own: np.ndarray | None = None, prompt: np.ndarray | None = None,
         context: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Declared ``max_tokens`` caps outputs (generation stops there); else each row's own
    (``own``: a trace's ``max_tokens`` column, as a benchmark client sends its output length),
    at least its output; else max(default, output), and with a server's ``context`` (tokens)
    no more than the context leaves after the ``prompt``: a request that declares nothing is
    never refused as too long by vLLM's or SGLang's server, which fill what the context leaves
    (``max_model_len - prompt``) and stop generating there."""
    if st.max_tokens is not None:
        meta["outputs_capped"] = int((out > st.max_tokens).sum())
        out = np.minimum(out, st.max_tokens)
        return out, np.full(out.size, st.max_tokens, dtype=np.int64)
    if own is not None:
        meta["max_tokens_per_request"] = True  # (the trace's own)
        return out, np.maximum(out, own).astype(np.int64)
    meta["max_tokens_default"] = int(default_max)
    mx = np.maximum(out, default_max).astype(np.int64)
    if context is not None and prompt is not None:
        left = context - prompt.astype(np.int64)
        cut = (left >= 1) & (mx > left)  # (a prompt that fills the context is refused as too long)
        if cut.any():
            meta["max_tokens_context_left"] = int(cut.sum())
            mx = np.where(cut, left, mx)
            out = np.minimum(out, mx)
    return out, mx


def _synthetic_lengths(st: StreamSpec, rng: np.random.Generator, n: int) -> pd.DataFrame:
    p, o = sample_pair(rng, n, st.prompt, st.output, st.rho)
    return pd.DataFrame({"prompt_tokens": p.astype(np.int64), "output_tokens": o.astype(np.int64)})


def _build_open(st: StreamSpec, seed: int, horizon_s: float, load_scale: float, base_dir: Path,
                lenient: bool, meta: dict, class_names: set[str] | None = None,
                context: int | None = None) -> pd.DataFrame:
    end = stream_end(st, horizon_s)
    dur = stream_duration(st, horizon_s)
    r_arr, r_len, r_att = (child_rng(seed, st.index, k) for k in ("arrivals", "lengths", "attributes"))
    trace_df, default_max = None, None
    if st.kind in ("replay", "trace_lengths"):
        trace_df, default_max = _read_trace_rows(st, base_dir, lenient, meta, replay_until(st, horizon_s, load_scale),
                                                 class_names)
    if st.kind == "synthetic" or st.kind == "trace_lengths":
        df, default_max = _sampled_arrival_rows(st, trace_df, default_max, dur, load_scale, r_arr, r_len, meta)
    elif st.kind == "replay":
        df = _replayed_rows(st, trace_df, load_scale, meta)
    else:  # servegen
        df, default_max = _servegen_rows(st, base_dir, dur, load_scale, r_arr, r_len, meta)
    if st.kind in ("replay", "servegen") and st.trace is not None and "sample" in st.trace:
        keep = r_att.random(len(df)) < float(st.trace["sample"])
        meta["rows_sampled_out"] = int((~keep).sum())
        df = df.loc[keep].reset_index(drop=True)
    df = _rows_in_window(st, df, end, meta)
    return _finish_rows(st, df, seed, default_max, r_att, meta, context)


def _read_trace_rows(st: StreamSpec, base_dir: Path, lenient: bool, meta: dict, until_s: float | None,
                     class_names: set[str] | None) -> tuple[pd.DataFrame, int]:
    """The stream's trace rows and the default output cap (its longest output, tokens)."""
    tr = _load_stream_trace(st, base_dir, lenient, until_s, class_names)
    if not tr.complete and _stopped_on_ms_times(st, tr.df, until_s):
        # the rows read look like milliseconds read as seconds: read them all, so that the warning
        # (_warn_after_horizon) counts every row after the horizon, as a whole read would
        tr = _load_stream_trace(st, base_dir, lenient, None, class_names)
    elif not tr.complete:
        _warn_few_before(st, tr.df, until_s)
    meta.update(source=tr.source, rows_read=tr.rows_read, rows_skipped=tr.rows_skipped,
                zero_lengths_raised=tr.zero_lengths)
    if not tr.complete:  # (rows_read, rows_after_horizon: up to where reading stopped)
        meta["trace_read_until_s"] = until_s
    if tr.skipped_examples:
        meta["skipped_examples"] = tr.skipped_examples
    trace_df = tr.df
    return trace_df, int(trace_df["output_tokens"].max()) if len(trace_df) else 1


def _stopped_on_ms_times(st: StreamSpec, df: pd.DataFrame, until_s: float) -> bool:
    """Whether a replay that stopped reading at ``until_s`` (s of trace time) stopped on the
    signature of millisecond times read as seconds: most rows read past it, the last far past."""
    if "time_unit" in st.trace or "arrival_s" not in df or not len(df):
        return False
    t = df["arrival_s"].to_numpy()
    after = int((t >= until_s).sum())
    return after > t.size - after and float(t.max()) >= MS_TIMES_FACTOR * until_s


def _warn_few_before(st: StreamSpec, df: pd.DataFrame, until_s: float) -> None:
    """A replay that stopped reading past ``until_s`` (s of trace time) with fewer than
    MS_FEW_ROWS rows before it: the file goes on, so its times may be milliseconds read as
    seconds (a minute of such a trace leaves the first row or two). Warned, not read further:
    the rest of a large file is what streaming spares."""
    if "time_unit" in st.trace or "arrival_s" not in df or not len(df):
        return
    t = df["arrival_s"].to_numpy()
    before = int((t < until_s).sum())
    if before < MS_FEW_ROWS:
        nxt = float(t[t >= until_s].min()) if before < t.size else float("nan")
        warn(f"streams[{st.index}].trace: only {before} row{'s' if before != 1 else ''} of the trace arrive before "
             f"the stream's end ({until_s:g} s; the next at {nxt:.4g} s) though the file goes on: if the timestamps "
             f"are milliseconds, set time_unit = 'ms' in the trace table")


def _sampled_arrival_rows(st: StreamSpec, trace_df: pd.DataFrame | None, default_max: int | None, dur: float,
                          load_scale: float, r_arr, r_len, meta: dict) -> tuple[pd.DataFrame, int | None]:
    """Arrivals from the stream's process over ``dur`` s, lengths synthetic or drawn from the
    trace's rows; returns the rows and the default output cap (tokens)."""
    proc = st.arrival.scaled(load_scale)
    check_volume(st, proc, dur)
    meta["mean_rate"] = float(proc.mean_rate)
    t = proc.sample(r_arr, dur) + st.start_s
    if st.kind == "synthetic":
        df = _synthetic_lengths(st, r_len, t.size)
        default_max = st.output.upper_bound()
    else:
        if len(trace_df) == 0:
            raise WorkloadError(f"streams[{st.index}].trace: no usable rows in {meta['source']}")
        df = trace_df.iloc[r_len.integers(0, len(trace_df), t.size)].drop(
            columns=["arrival_s"], errors="ignore").reset_index(drop=True)
    df.insert(0, "arrival_s", t)
    return df, default_max


def _replayed_rows(st: StreamSpec, trace_df: pd.DataFrame, load_scale: float, meta: dict) -> pd.DataFrame:
    """The trace's rows inside its window, their times compressed by ``load_scale`` and shifted to the start."""
    w0, w1 = st.trace.get("window", [0.0, math.inf])
    t = trace_df["arrival_s"].to_numpy()
    inside = (t >= w0) & (t < w1)
    meta["rows_outside_window"] = int((~inside).sum())
    df = trace_df.loc[inside].reset_index(drop=True)
    df["arrival_s"] = (df["arrival_s"].to_numpy() - w0) / load_scale + st.start_s
    return df


def _servegen_rows(st: StreamSpec, base_dir: Path, dur: float, load_scale: float, r_arr, r_len,
                   meta: dict) -> tuple[pd.DataFrame, int]:
    """Rows sampled from a ServeGen client over its window; returns them and the default output cap."""
    spec = st.trace
    from workloads.traces import resolve_path
    client = load_client(resolve_path(spec["path"], base_dir), spec.get("client"))
    w0, w1 = spec.get("window", [0.0, math.inf])
    w1 = min(w1, w0 + dur * load_scale)
    df = sample_client(client, r_arr, r_len, w0, w1)
    meta.update(source=client.name, trace_window_s=[float(w0), float(w1)])
    df["arrival_s"] = (df["arrival_s"].to_numpy() - w0) / load_scale + st.start_s
    return df, int(max((e.values.max() for e in client.outputs if e is not None), default=1))


def _rows_in_window(st: StreamSpec, df: pd.DataFrame, end: float, meta: dict) -> pd.DataFrame:
    """Drop rows arriving before the stream starts or at / after ``end`` (s)."""
    t = df["arrival_s"].to_numpy()
    late = (t >= end) | (t < st.start_s)
    if st.kind == "replay":
        meta["rows_before_start"] = int((t < st.start_s).sum())
        meta["rows_after_horizon"] = after = int((t >= end).sum())
        _warn_after_horizon(st, t, after, end)
    return df.loc[~late].reset_index(drop=True)


#: Replayed rows reaching past this many times the stream's end (with most of them after it)
#: suggest millisecond timestamps read as seconds.
MS_TIMES_FACTOR = 100.0
#: a streamed replay that stops with fewer rows than this before the stream's end is warned about
MS_FEW_ROWS = 10


def _warn_after_horizon(st: StreamSpec, t: np.ndarray, after: int, end: float) -> None:
    """Warn when most of a replayed trace's rows fall after the horizon and the last reaches
    :data:`MS_TIMES_FACTOR` times past it without a declared ``time_unit``: the signature of
    millisecond timestamps read as seconds. A trace cut short on purpose (a 10-minute replay of an
    hour) is not warned about, nor one whose unit is declared."""
    if after == 0 or "time_unit" in st.trace or after <= t.size - after or t.max() < MS_TIMES_FACTOR * end:
        return
    warn(f"streams[{st.index}].trace: {after:,} of {t.size:,} rows arrive after the stream's end ({end:g} s; "
         f"the last at {t.max():.4g} s) and are not replayed: if the timestamps are milliseconds, "
         f"set time_unit = 'ms' in the trace table")


def _finish_rows(st: StreamSpec, df: pd.DataFrame, seed: int, default_max: int, r_att, meta: dict,
                 context: int | None = None) -> pd.DataFrame:
    """Cap outputs, assign tenant / class, add the per-stream columns and sort by arrival."""
    own = df["max_tokens"].to_numpy(dtype=np.int64) if "max_tokens" in df.columns else None
    out, mx = _cap(st, df["output_tokens"].to_numpy(dtype=np.int64), default_max, meta, own,
                   df["prompt_tokens"].to_numpy(dtype=np.int64), context)
    df["output_tokens"] = out
    tenant, cls = _apply_rules(st, df, r_att)
    # kept as objects (the workload's dtype, see REQUIRED_COLUMNS): assigned as they are, pandas
    # would make them strings here and _assemble objects again, a million rows each way
    df["tenant"] = pd.Series(tenant, index=df.index, dtype=object)
    df["cls"] = pd.Series(cls, index=df.index, dtype=object)
    df["max_tokens"] = mx
    df["deadline_s"] = np.full(len(df), st.deadline_s, dtype=np.float64)
    df["stream"] = np.full(len(df), st.index, dtype=np.int64)
    df["arrival_s"] = df["arrival_s"].astype(np.float64)
    if st.prefix is not None:
        df["hash_ids"] = pd.Series(synthetic_hash_ids(st.prefix, st.tenant, df["prompt_tokens"].to_numpy(),
                                                      child_rng(seed, st.index, "prefix"), st.index << 40),
                                   dtype=object)
    order = np.argsort(df["arrival_s"].to_numpy(), kind="stable")
    meta["requests"] = len(df)
    return df.iloc[order].reset_index(drop=True)


def _build_closed(st: StreamSpec, seed: int, horizon_s: float, load_scale: float, base_dir: Path,
                  lenient: bool, meta: dict, context: int | None = None) -> ClosedLoopStream:
    proc = st.arrival.scaled(load_scale)
    end = stream_end(st, horizon_s)
    meta.update(users=proc.users, think_mean_s=proc.think.mean, mean_rate_bound=proc.mean_rate)
    deadline = st.deadline_s
    if st.trace is not None:
        tr = _load_stream_trace(st, base_dir, lenient)
        meta.update(source=tr.source, rows_read=tr.rows_read, rows_skipped=tr.rows_skipped)
        if len(tr.df) == 0:
            raise WorkloadError(f"streams[{st.index}].trace: no usable rows in {tr.source}")
        P = tr.df["prompt_tokens"].to_numpy()
        O = tr.df["output_tokens"].to_numpy()
        # (a trace's own max_tokens column, as a benchmark client sends each request's: _cap)
        M = tr.df["max_tokens"].to_numpy() if "max_tokens" in tr.df.columns else None
        default_max = int(O.max())

        def lengths(rng: np.random.Generator) -> tuple[int, int, int | None]:
            k = int(rng.integers(0, P.size))
            return int(P[k]), int(O[k]), (int(M[k]) if M is not None else None)
    else:
        M = None
        default_max = st.output.upper_bound()

        def lengths(rng: np.random.Generator) -> tuple[int, int, int | None]:
            p, o = sample_pair(rng, 1, st.prompt, st.output, st.rho)
            return int(p[0]), int(o[0]), None

    cap = st.max_tokens

    def row(p: int, o: int, own: int | None) -> dict:
        """A request's lengths and max_tokens as :func:`_cap` sets them for an open stream."""
        if cap is not None:
            o, mx = min(o, cap), cap
        elif own is not None:
            mx = max(o, own)
        else:
            mx = max(o, default_max)
            if context is not None and 1 <= context - p < mx:  # (what the context leaves: _cap)
                mx = context - p
                o = min(o, mx)
        return {"prompt_tokens": p, "output_tokens": o, "max_tokens": mx, "deadline_s": deadline}

    def draw_row(rng: np.random.Generator) -> dict:
        return row(*lengths(rng))

    stream = ClosedLoopStream(st.index, st.tenant, st.cls, proc.users, proc.think, st.start_s, end,
                              draw_row, seed)
    if proc.order == "sequential":  # (validated: the stream has a per-request trace)
        df = tr.df
        ready = df["arrival_s"].to_numpy(dtype=float) if "arrival_s" in df.columns else np.zeros(len(df))
        own = M.tolist() if M is not None else [None] * len(P)
        rows = [row(int(p), int(o), m) for p, o, m in zip(P.tolist(), O.tolist(), own)]
        meta.update(order="sequential", rows=len(rows))
        stream.sequential(rows, np.maximum(ready, 0.0))
    return stream


def build_workload(streams: list[dict], *, horizon_s: float, seed: int, base_dir: Path,
                   load_scale: float = 1.0, lenient: bool = False,
                   class_names: Iterable[str] | None = None, context_tokens: int | None = None) -> Workload:
    """Generate every stream's requests up to ``horizon_s`` seconds (see module docstring).
    ``class_names``: the scenario's classes, which a trace's class column is checked against.
    ``context_tokens``: the server's context length (``max_model_len``), which bounds what a
    request that declares no ``max_tokens`` may generate (:func:`_cap`); None: no such bound."""
    number("horizon_s", horizon_s, gt=0)
    integer("seed", seed, ge=0)
    number("load_scale", load_scale, gt=0)
    require("streams", streams, isinstance(streams, list), "a list of [[streams]] tables")
    base_dir = Path(base_dir)
    names = None if class_names is None else set(class_names)
    checked = [check_stream(i, s, None, base_dir) for i, s in enumerate(streams)]
    frames, closed, metas = [], [], []
    for st in checked:
        m: dict[str, Any] = {"stream": st.index, "kind": st.kind, "tenant": st.tenant,
                             "class": st.cls}
        if isinstance(st.arrival, ClosedLoop):
            m["kind"] = "closed_loop" + ("" if st.kind == "synthetic" else f"+{st.kind}")
            closed.append(_build_closed(st, seed, horizon_s, load_scale, base_dir, lenient, m, context_tokens))
        else:
            frames.append(_build_open(st, seed, horizon_s, load_scale, base_dir, lenient, m, names, context_tokens))
        metas.append(m)
    df = _assemble(frames)
    return Workload(df, closed, {"seed": seed, "horizon_s": horizon_s, "load_scale": load_scale,
                                 "lenient": lenient, "streams": metas})


def _assemble(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    if not frames:
        return empty_frame()
    df = pd.concat(frames, ignore_index=True, sort=False)
    df = df.iloc[np.argsort(df["arrival_s"].to_numpy(), kind="stable")].reset_index(drop=True)
    cols = list(REQUIRED_COLUMNS)
    if "hash_ids" in df.columns:
        h = df["hash_ids"].to_numpy(dtype=object)
        df["hash_ids"] = pd.Series([x if isinstance(x, tuple) else None for x in h], dtype=object)
        cols.append("hash_ids")
    cols += sorted(c for c in df.columns if c.startswith("f_"))
    df = df[cols]
    for c, t in REQUIRED_COLUMNS.items():
        df[c] = df[c].astype(t)
    return df


__all__ = ["Workload", "ClosedLoopStream", "build_workload", "child_rng", "empty_frame", "REQUIRED_COLUMNS"]
