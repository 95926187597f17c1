"""Calibrate-then-simulate, checked: a real mini serving loop on the decoder, and the comparison of
its per-request times with the simulator's.

The loop (:class:`MiniScheduler` + an executor) models one replica the way the simulator does
(vLLM V1 semantics, FCFS):

* each iteration first gives every running request its share, in admission order: one decode
  token to those past their prompt, the next prompt chunk to those still prefilling; then admits
  waiting requests in arrival order while the step has token budget and fewer than
  ``max_num_seqs`` run; a prompt that does not fit the remaining budget is chunked
  (``chunked_prefill``) or waits (without it);
* a request's first token is emitted at the end of the step that completes its prompt
  (TTFT = that time - arrival); each later step emits one token; it finishes at the end of the
  step that emits its ``output_tokens``-th token; TPOT = (finish - first token) / (output - 1);
* KV memory is a slot per running request, sized for the trace, so it never binds and nothing
  is preempted (the built-in trace is sized for this; a swap/recompute run is future work).

Executors: :func:`run_real` executes every step for real on the decoder (on a CPU clocked by
the engine thread's CPU time by default, or by the wall clock); :func:`run_priced` prices each
step with the profile's cost model in virtual time, a reference the simulator's engine should
agree with. :func:`compare` turns a real and a simulated requests table into
``{"metrics": [{"class", "metric", "real", "sim", "rel_error"}, ...]}``.

Requests table columns: ``arrival_s``, ``prompt_tokens``, ``output_tokens`` (required),
``cls`` (or ``class``; default "default"), ``request_id`` (default: row order).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd


DEFAULT_ENGINE = {"token_budget": 256, "max_num_seqs": 16, "chunked_prefill": True}


@dataclass
class _Req:
    request_id: int
    arrival_s: float
    cls: str
    prompt: int
    output: int
    prefilled: int = 0
    generated: int = 0
    slot: int = -1
    admitted_s: float = float("nan")
    first_token_s: float = float("nan")
    finish_s: float = float("nan")
    token_s: list[float] = field(default_factory=list)  # when each output token was emitted


@dataclass
class _Part:
    """One request's share of a step (the model's Item, plus the request)."""

    req: _Req
    n: int
    start: int


@dataclass
class MiniScheduler:
    """FCFS continuous batching with chunked prefill, a token budget and max_num_seqs.

    ``schedule()`` decides a step (list of parts) without changing state; ``admit(parts, now)``
    moves the newly scheduled waiting requests into the running set; ``apply(parts, t)``
    advances tokens and finishes requests at the step's end time ``t``.
    """

    token_budget: int = 256
    max_num_seqs: int = 16
    chunked_prefill: bool = True
    waiting: list[_Req] = field(default_factory=list)
    running: list[_Req] = field(default_factory=list)
    free_slots: list[int] = field(default_factory=list)

    def __post_init__(self):
        self.free_slots = list(range(self.max_num_seqs))[::-1]

    def schedule(self) -> list[_Part]:
        budget = self.token_budget
        parts: list[_Part] = []
        for r in self.running:
            if budget <= 0:
                break
            if r.prefilled < r.prompt:
                n = min(r.prompt - r.prefilled, budget)
                parts.append(_Part(r, n, r.prefilled))
            else:
                n = 1
                parts.append(_Part(r, 1, r.prompt + r.generated - 1))
            budget -= n
        seats = self.max_num_seqs - len(self.running)
        for r in self.waiting:
            if budget <= 0 or seats <= 0:
                break
            if r.prompt > budget and not self.chunked_prefill:
                break
            n = min(r.prompt, budget)
            parts.append(_Part(r, n, 0))
            budget -= n
            seats -= 1
        return parts

    def admit(self, parts: list[_Part], now: float) -> None:
        """Move the step's newly admitted requests from waiting to running, giving them slots."""
        for p in parts:
            r = p.req
            if r.slot < 0:
                self.waiting.remove(r)
                r.slot = self.free_slots.pop()
                r.admitted_s = now
                self.running.append(r)

    def apply(self, parts: list[_Part], t_end: float) -> list[_Req]:
        done = []
        for p in parts:
            r = p.req
            if r.prefilled < r.prompt:
                r.prefilled += p.n
                if r.prefilled == r.prompt:
                    r.generated = 1
                    r.first_token_s = t_end
                    r.token_s.append(t_end)
            else:
                r.generated += 1
                r.token_s.append(t_end)
            if r.generated >= r.output:
                r.finish_s = t_end
                done.append(r)
        for r in done:
            self.running.remove(r)
            self.free_slots.append(r.slot)
        return done


def _engine_params(params: dict | None) -> dict:
    """Defaults plus ``params``; ``max_batched_tokens`` (sim's name) is accepted for token_budget."""
    p = {**DEFAULT_ENGINE, **(params or {})}
    if "max_batched_tokens" in p:
        p["token_budget"] = p.pop("max_batched_tokens")
    unknown = sorted(set(p) - set(DEFAULT_ENGINE))
    if unknown:
        raise KeyError(f"engine_params: unknown key '{unknown[0]}' (expected {sorted(DEFAULT_ENGINE)} "
                       "or max_batched_tokens)")
    return p


def _requests(df: pd.DataFrame) -> list[_Req]:
    for col in ("arrival_s", "prompt_tokens", "output_tokens"):
        if col not in df.columns:
            raise KeyError(f"requests table: missing column '{col}' (have {list(df.columns)})")
    cls = (df["cls"] if "cls" in df.columns else df["class"] if "class" in df.columns
           else ["default"] * len(df))
    ids = df["request_id"] if "request_id" in df.columns else range(len(df))
    reqs = [_Req(int(i), float(a), str(c), int(p), max(1, int(o)))
            for i, a, c, p, o in zip(ids, df["arrival_s"], cls, df["prompt_tokens"], df["output_tokens"])]
    return sorted(reqs, key=lambda r: (r.arrival_s, r.request_id))


def _serve(reqs: list[_Req], params: dict, execute: Callable[[list[_Part]], None],
           now: Callable[[], float], wait_until: Callable[[float], None], bar=None) -> pd.DataFrame:
    p = _engine_params(params)
    sch = MiniScheduler(int(p["token_budget"]), int(p["max_num_seqs"]), bool(p["chunked_prefill"]))
    pending = list(reqs)
    i = 0
    finished = 0
    steps = 0
    log: list[tuple] = []
    while finished < len(reqs):
        t = now()
        while i < len(pending) and pending[i].arrival_s <= t:
            sch.waiting.append(pending[i])
            i += 1
        parts = sch.schedule()
        if not parts:
            wait_until(pending[i].arrival_s)
            continue
        sch.admit(parts, t)
        agg = _aggregates(parts)   # before apply: what the step computes
        t1 = now()
        execute(parts)
        t2 = now()
        done = len(sch.apply(parts, t2))
        finished += done
        if bar is not None and done:
            bar.update(done)
        steps += 1
        log.append((t, t1, t2, agg["P"], agg["D"], agg["sum_l2"], agg["sum_lc"], agg["sum_ctx"],
                    agg["n_prefill"]))
    rows = []
    for r in reqs:
        tpot = (r.finish_s - r.first_token_s) / (r.output - 1) if r.output > 1 else float("nan")
        rows.append({"request_id": r.request_id, "cls": r.cls, "arrival_s": r.arrival_s,
                     "prompt_tokens": r.prompt, "output_tokens": r.output,
                     "admitted_s": r.admitted_s, "first_token_s": r.first_token_s,
                     "finish_s": r.finish_s, "queue_s": r.admitted_s - r.arrival_s,
                     "ttft_s": r.first_token_s - r.arrival_s, "tpot_s": tpot,
                     "e2e_s": r.finish_s - r.arrival_s,
                     "token_s": [t - r.arrival_s for t in r.token_s]})
    out = pd.DataFrame(rows)
    out.attrs["steps"] = steps
    out.attrs["step_log"] = pd.DataFrame(log, columns=["t_plan", "t_start", "t_end", "P", "D", "sum_l2",
                                                       "sum_lc", "sum_ctx", "chunks"])
    return out


def _aggregates(parts: list[_Part]) -> dict:
    """The step's aggregates as sim/core/costs.py defines them (a part still in its prompt is prefill)."""
    pre = [q for q in parts if q.req.prefilled < q.req.prompt]
    dec = [q for q in parts if q.req.prefilled >= q.req.prompt]
    return {"P": sum(q.n for q in pre), "D": len(dec), "sum_l2": sum(q.n * q.n for q in pre),
            "sum_lc": sum(q.n * q.start for q in pre), "sum_ctx": sum(q.start + 1 for q in dec),
            "n_prefill": len(pre)}


def _load(profile_path) -> dict:
    return json.loads(Path(profile_path).read_text())


def run_real(profile_path: str | Path, requests_df: pd.DataFrame, engine_params: dict | None = None,
             repeats: int = 1, seed: int = 0, clock: str = "auto",
             busy_wait: bool = True, progress: bool | None = False, warmup: bool = True) -> pd.DataFrame:
    """Execute the trace for real on the profile's device, shape and dtype; per-request times.

    ``engine_params``: ``token_budget`` (tokens per step), ``max_num_seqs``, ``chunked_prefill``.
    ``clock``: "wall" runs in real time (arrivals are waited for; steps take what they take);
    "cpu" executes every step for real but advances the replica's clock by the CPU time the
    engine thread spent (its steps and its scheduling) and jumps over idle gaps to the next
    arrival, so the other tenants of a shared CPU do not count (the profile is clocked the same
    way, see calibrate.timing). "auto": "cpu" on a CPU device, "wall" on CUDA.
    ``busy_wait`` (wall clock only): poll for the next arrival instead of sleeping.
    ``warmup``: first execute the trace's steps once, untimed (see :func:`_warm_on_the_trace`).
    ``progress``: requests finished, over all repeats (see :func:`sim.progress.progress_bar`).
    With ``repeats > 1`` the trace runs that many times and each time column is the per-request
    median (the machine is noisy). Returns the requests table (columns: ``request_id``, ``cls``,
    ``arrival_s``, ``prompt_tokens``, ``output_tokens``, ``admitted_s``, ``first_token_s``,
    ``finish_s``, ``queue_s``, ``ttft_s``, ``tpot_s``, ``e2e_s``, and with one run ``token_s``,
    each output token's time after the arrival, s; ``attrs["step_log"]``).
    """
    import torch

    meta = _load(profile_path)["meta"]
    dev, clock = _device_and_clock(profile_path, meta, clock)
    p = _engine_params(engine_params)
    reqs0 = _requests(requests_df)
    model = _warm_model(meta, dev, int(p["max_num_seqs"]), max(r.prompt + r.output for r in reqs0) + 1, seed)
    graphs = _decode_graphs(model, int(p["max_num_seqs"])) if _graphed(meta, dev) else None
    gen = torch.Generator().manual_seed(seed)

    from sim.progress import progress_bar

    bar = progress_bar(progress, total=repeats * len(reqs0), desc=f"validate: {meta['shape']} for real", unit="requests")
    runs = []
    if warmup:
        _warm_on_the_trace(profile_path, requests_df, p, _forward_fn(model, gen, graphs))
    try:
        for _ in range(repeats):
            reqs = _requests(requests_df)
            execute, now, wait_until = _clocked(clock, _forward_fn(model, gen, graphs), busy_wait)
            runs.append(_serve(reqs, p, execute, now, wait_until, bar))
    finally:
        if bar is not None:
            bar.close()
    out = _median_of_runs(runs, repeats, clock)
    if graphs:
        out.attrs["executor"] += ", decode-only steps under CUDA graphs"
    return out


def _warm_on_the_trace(profile_path, requests_df: pd.DataFrame, params: dict,
                       forward: Callable[[list[_Part]], None]) -> None:
    """Execute the trace's steps once for real, untimed, in the profile's virtual time
    (:func:`run_priced` with ``forward``).

    The first step of each new shape is slow on a GPU (library kernels chosen and loaded,
    allocator growth): up to a second each on an H200, against milliseconds once warm. The
    profile's cells were each warmed before being timed; this gives the serving loop the same
    start, on steps of the shapes it will meet (the trace as the profile prices it).
    """
    run_priced(profile_path, requests_df, params, forward=forward)


def step_report(step_log: pd.DataFrame, profile_path) -> tuple[pd.DataFrame, dict]:
    """Each real step's measured duration next to the profile's price for its aggregates.

    Returns the step table (the log plus ``measured_s`` = t_end - t_start, ``priced_s``,
    ``gap_s`` = host time from this step's end to the next step's planning, ``kind`` decode |
    prefill | mixed) and a summary per kind: steps, median measured and priced seconds and the
    median of priced / measured - 1.
    """
    from sim.core.costs import load_profile
    cm = load_profile(str(profile_path))
    st = step_log.copy()
    st["measured_s"] = st["t_end"] - st["t_start"]
    st["priced_s"] = [cm.step_ns(int(r.P), int(r.D), int(r.sum_l2), int(r.sum_lc), int(r.sum_ctx),
                                 int(r.chunks)) / 1e9 for r in st.itertuples()]
    st["gap_s"] = st["t_plan"].shift(-1) - st["t_end"]
    st["kind"] = np.where(st["P"] == 0, "decode", np.where(st["D"] == 0, "prefill", "mixed"))
    summary = {}
    for kind, g in st.groupby("kind"):
        summary[str(kind)] = {"steps": int(len(g)), "measured_s_p50": float(g["measured_s"].median()),
                              "priced_s_p50": float(g["priced_s"].median()),
                              "rel_error_p50": float((g["priced_s"] / g["measured_s"] - 1).median()),
                              "gap_s_p50": float(g["gap_s"].median())}
    return st, summary


def _graphed(meta: dict, dev: str) -> bool:
    """Run decode-only steps under CUDA graphs? As the profile measured its decode rows."""
    return dev == "cuda" and bool(meta.get("cuda_graphs"))


def _decode_graphs(model, max_seqs: int, capture=None) -> dict:
    """One captured decode step per batch size 1..``max_seqs`` and key bucket, keyed
    ``(size, keys)``.

    As serving engines do (vLLM captures decode graphs per batch size): a decode-only step
    replays the graph of its size and of its longest context's bucket
    (:func:`calibrate.model.key_bucket`) with its own inputs; a step with any prefill runs
    eagerly. The profile's decode rows were timed the same way (keys padded to their bucket
    and masked): an earlier version padded every step to the cache length and measured decode
    steps 5-13% above their price on an H200. ``capture(model, batch)`` makes a step's runner
    (default: a :class:`calibrate.model.GraphedStep` in one shared memory pool).
    """
    import torch
    from calibrate.model import GraphedStep, Item, key_bucket

    L = model.max_len
    buckets = sorted({key_bucket(c, L) for c in range(2, L + 1)})
    if capture is None:
        pool = torch.cuda.graph_pool_handle()   # replayed one at a time, each output read at once

        def capture(m, batch):
            return GraphedStep(m, batch, pool=pool)
    return {(d, k): capture(model, model.plan([Item(i, 1, 1) for i in range(d)], dec_len=k))
            for d in range(1, max_seqs + 1) for k in buckets}


def _device_and_clock(profile_path, meta: dict, clock: str) -> tuple[str, str]:
    """The profile's device and the clock to run on ("auto" resolved); sets the CPU thread count
    the profile was measured with."""
    import torch
    from calibrate.timing import configure_cpu

    dev = meta.get("device_type", "cpu")
    if dev == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"{profile_path}: profile was measured on CUDA but torch sees none")
    if clock == "auto":
        clock = "cpu" if dev == "cpu" else "wall"
    if clock not in ("cpu", "wall") or (clock == "cpu" and dev != "cpu"):
        raise ValueError(f"'clock' must be 'wall', or 'cpu' on a CPU device (got {clock!r} on {dev})")
    if dev == "cpu":
        configure_cpu(int(meta.get("threads", 1)))
    return dev, clock


def _warm_model(meta: dict, dev: str, slots: int, max_len: int, seed: int):
    """The profile's model (shape, dtype) on ``dev`` with ``slots`` KV slots of ``max_len`` tokens,
    warmed up (allocator, kernels)."""
    from calibrate.model import Decoder, Item
    from calibrate.shapes import get_shape
    from calibrate.timing import synchronize

    model = Decoder(get_shape(meta["shape"]), device=dev, dtype=meta.get("dtype", "fp32"),
                    slots=slots, max_len=max_len, seed=seed)
    # warm-up: allocator, kernels
    for _ in range(3):
        model.forward(model.plan([Item(0, min(64, max_len - 1), 0), Item(1, 1, 8)]))
    synchronize(model.device)
    return model


def _forward_fn(model, gen, graphs: dict | None = None) -> Callable[[list[_Part]], None]:
    """One step's forward pass: decodes feed each request's last token, prefill chunks random
    tokens drawn from ``gen``. With ``graphs`` ((batch size, key bucket) -> GraphedStep, see
    :func:`_decode_graphs`), a step of decoders only replays the graph of its size and bucket;
    any other step runs eagerly."""
    import torch
    from calibrate.model import Item, key_bucket

    last_tok: dict[int, int] = {}

    def forward(parts: list[_Part]) -> None:
        dec = [q for q in parts if q.req.prefilled >= q.req.prompt]
        pre = [q for q in parts if q.req.prefilled < q.req.prompt]
        toks = [last_tok.get(q.req.request_id, 1) for q in dec]
        toks += torch.randint(0, model.shape.vocab, (sum(q.n for q in pre),), generator=gen).tolist()
        items = [Item(q.req.slot, q.n, q.start) for q in dec + pre]
        if graphs and not pre:
            keys = key_bucket(max(q.start for q in dec) + 1, model.max_len)
            out = graphs[len(dec), keys].run(items, toks).tolist()   # .tolist() synchronises
        else:
            out = model.forward(model.plan(items, toks)).tolist()
        for q, t in zip(dec + pre, out):
            last_tok[q.req.request_id] = int(t)

    return forward


def _clocked(clock: str, forward: Callable[[list[_Part]], None], busy_wait: bool) -> tuple:
    """``(execute, now, wait_until)`` for :func:`_serve` on the wall clock or the engine thread's
    CPU clock (see :func:`run_real`); times in s from the start of this run."""
    if clock == "wall":
        t0 = time.perf_counter()
        now = lambda: time.perf_counter() - t0  # noqa: E731

        def wait_until(t: float) -> None:
            # Poll rather than sleep, as an engine's busy loop does: a sleeping process on a
            # shared machine loses its core and its caches, and the next steps ran 10-25%
            # slower than the profile, which was measured back to back.
            if not busy_wait:
                time.sleep(max(0.0, t - now()))
            while now() < t:
                pass
        return forward, now, wait_until
    state = {"t": 0.0, "cpu": time.thread_time()}
    now = lambda: state["t"]  # noqa: E731

    def wait_until(t: float) -> None:
        state["t"] = max(state["t"], t)
        state["cpu"] = time.thread_time()

    def execute(parts: list[_Part]) -> None:
        forward(parts)
        c = time.thread_time()
        state["t"] += c - state["cpu"]   # this step and the scheduling since the last
        state["cpu"] = c

    return execute, now, wait_until


def _median_of_runs(runs: list[pd.DataFrame], repeats: int, clock: str) -> pd.DataFrame:
    """The first run's table with each time column the per-request median over the runs."""
    out = runs[0].copy()
    if repeats > 1:
        for col in ("admitted_s", "first_token_s", "finish_s", "queue_s", "ttft_s", "tpot_s", "e2e_s"):
            out[col] = np.median(np.stack([r[col].to_numpy() for r in runs]), axis=0)
        out = out.drop(columns="token_s")  # (one run's token times would not match the medians)
    out.attrs["steps"] = runs[0].attrs.get("steps")
    out.attrs["step_log"] = runs[0].attrs.get("step_log")
    out.attrs["executor"] = f"real ({clock} clock)"
    return out


def run_priced(profile_path: str | Path, requests_df: pd.DataFrame,
               engine_params: dict | None = None,
               forward: Callable[[list[_Part]], None] | None = None) -> pd.DataFrame:
    """The same loop in virtual time, each step priced by the profile (sim.core.costs.CostModel);
    ``forward`` (optional) also executes each step, untimed."""
    from sim.core.costs import load_profile
    cm = load_profile(str(profile_path))
    clock = [0.0]

    def execute(parts: list[_Part]) -> None:
        if forward is not None:
            forward(parts)
        clock[0] += int(cm.step_ns(**_aggregates(parts))) / 1e9

    def wait_until(t: float) -> None:
        clock[0] = max(clock[0], t)

    out = _serve(_requests(requests_df), engine_params, execute, lambda: clock[0], wait_until)
    out.attrs["executor"] = "priced"
    return out


def throughput(df: pd.DataFrame) -> float:
    """Output tokens per second over the run (first arrival to last finish)."""
    span = float(df["finish_s"].max() - df["arrival_s"].min())
    return float(df["output_tokens"].sum()) / span if span > 0 else float("nan")


def compare(real_df: pd.DataFrame, sim_df: pd.DataFrame) -> dict:
    """Per-class p50/p90 of TTFT, TPOT and end-to-end latency, and overall throughput.

    Both tables need ``cls`` (or ``class``), ``ttft_s``, ``tpot_s``, ``e2e_s``; throughput also
    needs ``arrival_s``, ``finish_s`` and ``output_tokens``. ``rel_error = (sim - real) / real``.
    """
    def cls_col(df):
        return df["cls"] if "cls" in df.columns else df["class"]

    metrics = []
    for c in sorted(set(cls_col(real_df))):
        r = real_df[cls_col(real_df) == c]
        s = sim_df[cls_col(sim_df) == c]
        for col, name in (("ttft_s", "ttft"), ("tpot_s", "tpot"), ("e2e_s", "e2e")):
            for q in (50, 90):
                rv = float(np.nanpercentile(r[col], q)) if r[col].notna().any() else float("nan")
                sv = float(np.nanpercentile(s[col], q)) if len(s) and s[col].notna().any() else float("nan")
                metrics.append({"class": c, "metric": f"{name}_p{q}", "real": rv, "sim": sv,
                                "rel_error": (sv - rv) / rv if rv else float("nan")})
    rv, sv = throughput(real_df), throughput(sim_df)
    metrics.append({"class": "all", "metric": "throughput", "real": rv, "sim": sv,
                    "rel_error": (sv - rv) / rv if rv else float("nan")})
    return {"metrics": metrics}


def builtin_trace(profile_path: str | Path, n: int = 300, utilization: float = 0.5,
                  seed: int = 0) -> pd.DataFrame:
    """A short two-class Poisson trace sized for the profile's device.

    ``interactive`` (70%): prompts 16-64 tokens, outputs 8-32; ``batch`` (30%): prompts
    128-256, outputs 32-64. The arrival rate is ``utilization`` x an estimate of the replica's
    capacity from the profile (prefill alone plus decode at batch 8), so the run takes
    ``n / rate`` seconds (about 20 s for ``tiny`` on one CPU thread).
    """
    from sim.core.costs import load_profile
    cm = load_profile(str(profile_path))
    rng = np.random.default_rng(seed)
    is_batch = rng.random(n) < 0.3
    prompt = np.where(is_batch, rng.integers(128, 257, n), rng.integers(16, 65, n))
    output = np.where(is_batch, rng.integers(32, 65, n), rng.integers(8, 33, n))
    mp, mo = float(prompt.mean()), float(output.mean())
    ctx = mp + mo / 2
    work = cm.prefill_s(int(mp)) + mo * cm.step_s(D=8, sum_ctx=8 * ctx) / 8
    rate = utilization / work
    arrival = np.cumsum(rng.exponential(1.0 / rate, n))
    return pd.DataFrame({"request_id": np.arange(n), "arrival_s": arrival - arrival[0],
                         "cls": np.where(is_batch, "batch", "interactive"),
                         "prompt_tokens": prompt, "output_tokens": output})


def self_check(profile_path: str | Path, n: int = 300, repeats: int = 3,
               engine_params: dict | None = None, seed: int = 0) -> dict:
    """Built-in trace, served for real (median of ``repeats`` runs) and priced by the profile in
    the same loop; returns :func:`compare`'s dict plus ``trace`` details. The simulator's own
    validation replaces ``run_priced`` with ``sim.simulate`` on the same requests."""
    trace = builtin_trace(profile_path, n=n, seed=seed)
    real = run_real(profile_path, trace, engine_params, repeats=repeats, seed=seed)
    priced = run_priced(profile_path, trace, engine_params)
    out = compare(real, priced)
    out["trace"] = {"requests": n, "span_s": float(trace["arrival_s"].max()), "repeats": repeats,
                    "engine": _engine_params(engine_params), "sim": "calibrate.validate.run_priced"}
    return out
