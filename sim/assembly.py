"""What a run is built from, for one replica or a cluster: seeds, engines, the request stream,
the clock, and the run facts each replica reports.

:func:`prepare` does the setup every run shares (the SimPy clock, the request stream and its
source, the stop time, the progress bar, the wall and CPU clocks); :func:`build_engine` builds
one replica's engine. Both :func:`sim.run.simulate` and the cluster (:mod:`sim.cluster`) use
them, so a replica is built the same way alone or behind a router.
"""
from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import simpy

import workloads
from policies import POLICIES, make_policy
from sim import native
from sim.config import EngineConfig, Scenario
from sim.core.costs import NEVER, NS, CostModel, load_profile
from sim.core.engine import Engine
from sim.core.errors import ScenarioError
from sim.core.guard import guard_policy
from sim.core.kvpool import KVPool
from sim.core.observe import ClockGuard
from sim.core.preemption import PREEMPTION_MODES
from sim.core.prefix_cache import PrefixCache
from sim.core.simpy_adapter import run_all
from sim.core.source import RequestSource
from sim.core.telemetry import Telemetry
from sim.progress import progress_bar


def seed_for(seed: int, name: str) -> int:
    """A child seed for a named random stream (SeedSequence keyed by the name): the scenario's
    ``seed`` gives every stream (``workload``, ``policy``, ``router``, ...) its own."""
    words = [ord(ch) for ch in name]
    return int(np.random.SeedSequence([seed, *words]).generate_state(1)[0])


# ---- the parts ----------------------------------------------------------------------------------
def engine_costs(sc: Scenario, cfg: EngineConfig | None = None) -> CostModel:
    """The cost model a replica with engine settings ``cfg`` (``sc``'s ``[engine]`` for None)
    prices its steps with: its profile, overhead, host CPU, entrypoint and cost scale."""
    cfg = sc.engine if cfg is None else cfg
    return load_profile(cfg.profile, Path(sc.base_dir), overhead=cfg.overhead, host_cpu=cfg.host_cpu,
                        entrypoint=cfg.entrypoint, scale=cfg.cost_scale)


def build_engine(sc: Scenario, env: simpy.Environment, costs: CostModel | None = None, *,
                 trace: list | None = None, gate=None, seed_tag: str = "") -> Engine:
    """One replica's engine (KV pool, policy, admission gate, telemetry) for scenario ``sc``
    (a cluster's replica group passes its own scenario: the group's engine and policy).
    ``seed_tag`` separates the random streams of several replicas.
    """
    cfg = sc.engine
    costs = costs or engine_costs(sc)
    pool = _kv_pool(sc, cfg, costs)
    policy = make_policy(sc.policy.name, **sc.policy.params())
    if hasattr(policy, "bind"):
        policy.bind({c.name: c.model_dump() for c in sc.classes}, seed_for(sc.seed, "policy" + seed_tag))
    if needs_guard(sc.policy.name):  # a user's policy sees read-only requests, its keys checked
        policy = guard_policy(policy, sc.policy.name)
    if sc.fair_accounting:  # the fairness accountant wraps any policy
        from sim.admission import make_fair_policy
        policy = make_fair_policy(sc, policy)
    if gate is None and sc.admission_tables:
        from sim.admission import make_gate
        gate = make_gate(sc, costs)
    tel = Telemetry(sc.class_names, sample_interval_ns(sc), costs, cfg.block_size)
    engine = Engine(env, cfg, costs, policy, sc.classes, pool, tel, gate=gate, trace=trace,
                    spec_seed=seed_for(sc.seed, "speculative" + seed_tag))
    if gate is not None and hasattr(gate, "bind"):
        gate.bind(engine.gate_view)
    return engine


def needs_guard(name: str) -> bool:
    """Whether the policy a scenario names is a user's (a dotted or file path), handed read-only
    requests and its answers checked (:mod:`sim.core.guard`); a shipped (registered) one is
    handed the requests directly (``tests/test_policy_guard.py`` shows they write nothing)."""
    return name not in POLICIES.names()


def kv_blocks_of(cfg: EngineConfig, costs: CostModel) -> int:
    """The KV blocks a replica with engine settings ``cfg`` has: ``engine.kv_blocks``, else what
    its cost model's memory holds in blocks of ``engine.block_size`` tokens."""
    return cfg.kv_blocks or costs.kv_blocks(cfg.block_size)


def _kv_pool(sc: Scenario, cfg: EngineConfig, costs: CostModel) -> KVPool:
    """The replica's KV blocks (:func:`kv_blocks_of`), with its prefix cache."""
    kv_blocks = kv_blocks_of(cfg, costs)
    if kv_blocks <= 0:
        raise ScenarioError(f"{sc.source}: engine.kv_blocks: the profile does not say how much KV "
                            "memory there is; set engine.kv_blocks > 0")
    cache = None
    if cfg.prefix_caching:
        try:
            cache = PrefixCache(cfg.prefix_block_tokens, cfg.block_size)
        except ValueError as exc:
            raise ScenarioError(f"{sc.source}: {exc}") from None
    return KVPool(kv_blocks, cfg.block_size, [c.priority for c in sc.classes],
                  [c.reserved_blocks for c in sc.classes],
                  host_total=cfg.swap_blocks if PREEMPTION_MODES.resolve(cfg.preemption).host_space else 0,
                  cache=cache)


def build_workload(sc: Scenario, load_scale: float = 1.0, lenient: bool = False):
    """The scenario's request stream (``workloads.Workload``). ``lenient``: skip bad trace rows
    (counted in ``meta``) instead of failing on the first. A request that declares no
    ``max_tokens`` generates at most what ``engine.max_model_len`` leaves after its prompt, as
    the servers default it (the scenario's ``[engine]`` value; a cluster group that sets another
    still refuses by its own)."""
    try:
        wl = workloads.build_workload(sc.streams, horizon_s=sc.horizon_s, seed=seed_for(sc.seed, "workload"),
                                      base_dir=Path(sc.base_dir), load_scale=load_scale, lenient=lenient,
                                      class_names=[c.name for c in sc.classes],
                                      context_tokens=sc.engine.max_model_len)
    except workloads.WorkloadError as exc:
        raise ScenarioError(f"{sc.source}: {exc}") from None
    if sc.engine.admission_estimate == "sglang":
        _warn_undeclared_max_tokens(sc, wl.meta)
    return wl


def _warn_undeclared_max_tokens(sc: Scenario, meta: dict) -> None:
    """Warn when SGLang's admission, which reserves what each request declares (``max_tokens``),
    meets a stream that declares nothing: its requests then declare the stream's default (the
    longest output it can give), a choice the user never made that sets how many run at once."""
    from plumbing.notices import warn

    for m in meta.get("streams", []):
        if isinstance(m, dict) and "max_tokens_default" in m:
            warn(f"{sc.source}: streams[{m['stream']}] declares no max_tokens, and SGLang's admission "
                 f"(engine.admission_estimate = 'sglang') reserves what each request declares: each declares "
                 f"{m['max_tokens_default']:,} tokens (the stream's longest output); set the stream's max_tokens "
                 f"to what its clients send, or map a trace's max_tokens column")


def skipped_rows(meta: dict) -> int:
    """Bad trace rows skipped under ``lenient`` (0 otherwise)."""
    return sum(int(m.get("rows_skipped", 0) or 0) for m in meta.get("streams", []) if isinstance(m, dict))


# ---- the setup every run shares ---------------------------------------------------------------
@dataclass
class Setup:
    """A run about to start: its clock, request stream and source, when it stops, its progress
    bar, and when it began (wall and CPU clocks)."""

    env: simpy.Environment
    costs: CostModel  # of the engine settings given to prepare (the first group's, in a cluster)
    workload: Any  # workloads.Workload
    source: RequestSource
    stop_ns: int  # replicas stop at the horizon, or never (drain: until every request ends)
    interval_ns: int  # time-series sampling interval
    bar: Any
    on_boundary: Any  # replica_loop's callback that moves the bar
    wall0: float = field(default_factory=time.perf_counter)
    cpu0: float = field(default_factory=time.process_time)

    @property
    def closed_loop(self) -> bool:
        """Whether closed-loop users send their next request when one ends."""
        return bool(self.source.closed)

    def run(self, proc=None, guard: ClockGuard | None = None) -> int:
        """Run the clock to the end (the garbage collector quieter meanwhile): on a
        :class:`LoneClock`, its one process ``proc``; else SimPy's queue, its clock watched by
        ``guard`` when given (a cluster's); the end, ns."""
        run_to_end(self.env, self.bar, proc, guard)
        return int(self.env.now)

    def timing(self) -> dict:
        """Wall and CPU seconds since the setup began."""
        return {"wall_s": time.perf_counter() - self.wall0, "cpu_s": time.process_time() - self.cpu0}


class LoneClock(simpy.Environment):
    """The clock of a run whose only process is one replica's loop (:meth:`run_process`): a
    timeout is just its delay, which the loop yields and the clock moves by. With nothing else
    to order against, SimPy's event queue would give the same instants for more work (an event
    object, a push and a pop, a resume through its callbacks at every step boundary)."""

    def timeout(self, delay, value=None):  # type: ignore[override]
        return delay

    def run_process(self, proc) -> None:
        """Run ``proc`` (a generator yielding the delays it waits, ns) to its end."""
        now = self._now
        for delay in proc:
            now += delay
            self._now = now
        if self._queue:  # (an event scheduled here would never be processed)
            raise RuntimeError("a LoneClock runs one process: something scheduled a SimPy event on it")


def prepare(sc: Scenario, engine_cfg: EngineConfig, *, load_scale: float = 1.0, lenient: bool = False,
            workload=None, progress: bool | None = False, desc: str | None = None, frontends: int = 1,
            alone: bool = False) -> Setup:
    """The setup of a run of ``sc``: the cost model of ``engine_cfg``, the request stream
    (``workload``, when the caller built it: it is not modified, so several runs may share it)
    and its source, whose front end is that cost model's (``frontends``: how many API servers
    share the stream's requests; a cluster's replicas each have one, modelled as one server
    ``frontends`` times as fast); the progress bar is labelled ``desc``. ``alone``: one
    replica's loop will be the only process, on a :class:`LoneClock`."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    with quiet_gc():  # (a full collection would walk every imported module's objects: 0.04 s)
        wl = build_workload(sc, load_scale, lenient) if workload is None else workload
        costs = engine_costs(sc, engine_cfg)
        cls_idx = {c.name: i for i, c in enumerate(sc.classes)}
        # the API server ahead of the engine: its latency, and its serial work per request
        # spread over ``frontends`` servers (a cluster's replicas each run their own)
        source = RequestSource(wl, cls_idx, [c.priority for c in sc.classes],
                               delay_ns=round(costs.overhead.frontend_s * NS),
                               busy_ns=round(costs.overhead.frontend_busy_s * NS / frontends))
    if workload is None:
        wl.open = None  # the source holds the stream in compact arrays now; free the DataFrame
    stop_ns = NEVER if sc.drain else int(round(sc.horizon_s * NS))
    bar, on_boundary = sim_seconds_bar(progress, sc.horizon_s, desc or sc.name)
    return Setup(LoneClock() if alone else simpy.Environment(), costs, wl, source, stop_ns,
                 sample_interval_ns(sc, notice=True), bar, on_boundary, wall0, cpu0)


#: Most time-series samples a run takes over its horizon: each sample keeps a row per class,
#: so an interval far below horizon_s / MAX_SAMPLES (1e-6 s over 10 s, or 1 s over 1e9 s) would
#: take gigabytes; such an interval is raised to horizon_s / MAX_SAMPLES.
MAX_SAMPLES = 200_000


def sample_interval_ns(sc: Scenario, notice: bool = False) -> int:
    """The time-series sampling interval a run of ``sc`` uses, integer ns: the scenario's
    ``engine.timeseries_interval_s``, or horizon_s / :data:`MAX_SAMPLES` when that is longer
    (said in one line when ``notice``; summary.json records the interval used)."""
    asked = sc.engine.timeseries_interval_s
    if sc.horizon_s / asked <= MAX_SAMPLES:
        return int(round(asked * NS))  # (the interval as written: every run below the cap unchanged)
    used = sc.horizon_s / MAX_SAMPLES
    if notice:
        from plumbing.notices import warn

        warn(f"{sc.source}: engine.timeseries_interval_s = {asked:g} s over horizon_s = {sc.horizon_s:g} s "
             f"is more than {MAX_SAMPLES:,} samples; sampling every {used:g} s instead")
    return int(round(used * NS))


# ---- the clock -------------------------------------------------------------------------------------
@contextmanager
def quiet_gc(gen0: int = 50_000):
    """Run the event loop (or the setup, or the end of a run) with less garbage-collector work:
    objects that exist when it starts (the workload, imports) are frozen out of collections, and
    the youngest generation is collected every ``gen0`` allocations instead of 700. The loop makes few reference cycles,
    but with hundreds of thousands of live objects each full collection walks all of them (about
    10 % of a million-request run). Everything is restored afterwards; results do not change."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(gen0, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def sim_seconds_bar(progress: bool | None, horizon_s: float, desc: str):
    """A progress bar of simulated seconds (:func:`sim.progress.progress_bar`) and the loop's
    ``on_boundary(now_ns)`` callback that moves it forward; both None when it is off (the loop
    then calls nothing at a step boundary)."""
    bar = progress_bar(progress, total=round(horizon_s), unit="sim-s", desc=desc)
    if bar is None:
        return None, None
    past = [bar.total]  # the last simulated second said past the horizon

    def on_boundary(now: int) -> None:
        s = now // NS
        n = min(s, bar.total)
        if n > bar.n:
            bar.update(n - bar.n)
        if s > past[0]:
            # a drain goes on past the horizon to an end nobody knows before: the bar stays at
            # 100 % ("00:00 left"), and says how far the drain has come
            past[0] = s
            bar.set_postfix(draining=f"t={s}s")

    return bar, on_boundary


def run_to_end(env: simpy.Environment, bar, proc=None, guard: ClockGuard | None = None) -> None:
    """Run the SimPy clock until no event is left (watched by ``guard``), or a
    :class:`LoneClock`'s one process ``proc`` to its end (the GC quieter meanwhile), then close
    ``bar``."""
    try:
        with quiet_gc():
            if isinstance(env, LoneClock):
                env.run_process(proc)
            else:
                run_all(env, guard)
    finally:
        if bar is not None:
            bar.close()


# ---- what a replica reports ------------------------------------------------------------------------
def engine_run_info(engine: Engine, end_ns: int, reports: bool = True) -> dict:
    """One replica's run facts for summary.json (events, busy and thrash time, KV, preemptions,
    the policy's and the admission gate's reports). ``reports=False`` leaves out what only a
    replica's own summary shows (prefix attribution, speculation, the policy's and the gate's
    reports; a policy's can take a while), for a cluster that sums the facts only."""
    pool, tel = engine.pool, engine.tel
    info = {
        "engine_events": engine.events,
        **({"engine_build": native.BUILD,  # "mypyc" (compiled hot modules) or "python"
            "lazy_batch": engine.cohort is not None} if reports else {}),  # steady decoders as one cohort
        "iterations": engine.iterations,
        "busy_s": engine.busy_ns / NS,
        "thrash_s": engine.thrash_ns / NS,
        "end_s": end_ns / NS,
        "idle_with_work_s": tel.idle_with_work_ns / NS,
        "kv_blocks": pool.total,
        "swap_blocks": pool.host_total,
        "preemptions_by_mode": dict(tel.preempt_by_mode),
        "prefix_evictions": pool.cache.evictions if pool.cache is not None else 0,
    }
    if reports:
        info.update(prefix_attribution=_attribution(engine) if pool.cache is not None else None,
                    speculative=_spec_report(engine), policy=engine.policy.report(),
                    **({"admission": engine.gate.report()} if getattr(engine.gate, "report", None) else {}))
    return info


def _attribution(engine: Engine) -> list[dict]:
    """Prefix evictions booked to the class and tenant whose request held the group last, by
    cause (a preemption released it, or cache pressure evicted what a finished request left),
    with the re-prefill tokens later paid by that request itself and pushed onto others."""
    names = [c.name for c in engine.classes]
    return [{"class": names[c] if c is not None else None, "tenant": t, "cause": cause, "evictions": n,
             "own_refill_tokens": own, "pushed_refill_tokens": others}
            for c, t, cause, n, own, others in engine.pool.cache.attribution_rows()]


def _spec_report(engine: Engine) -> dict | None:
    if not engine.spec_k:
        return None
    st = dict(engine.spec.stats)
    n = max(st["sequence_steps"], 1)
    st.update(k=engine.spec_k, mean_accepted_per_sequence_step=st["accepted"] / n,
              mean_emitted_per_sequence_step=st["emitted"] / n,
              wasted_draft_tokens=st["drafted"] - st["accepted"])
    return st
