"""One simulation: scenario -> workload -> engine (SimPy) -> Results.

``simulate(scenario)`` builds the request stream with ``workloads``, the cost model from the
profile, the policy from the registry, and runs the engine loop as one SimPy process whose clock
is integer nanoseconds. Arrivals are pre-generated columnar arrays that the loop ingests when
the clock passes them (no process per request); closed-loop users' next requests are pushed on a
heap when their previous request ends.
"""
from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import simpy

import workloads
from sim import native
from policies import make_policy
from sim.config import Scenario
from sim.core.costs import NS, load_profile
from sim.core.engine import NEVER, Engine
from sim.core.errors import ScenarioError
from sim.core.kvpool import KVPool
from sim.core.loop import replica_loop
from sim.progress import progress_bar
from sim.core.source import RequestSource
from sim.core.prefix_cache import PrefixCache
from sim.results import Results
from sim.core.telemetry import Telemetry


def _seed_for(seed: int, name: str) -> int:
    """A child seed for a named random stream (SeedSequence keyed by the name)."""
    words = [ord(ch) for ch in name]
    return int(np.random.SeedSequence([seed, *words]).generate_state(1)[0])


def build_engine(sc: Scenario, env: simpy.Environment, costs=None, *, trace: list | None = None,
                 gate=None, engine_cfg=None, seed_tag: str = "") -> Engine:
    """One replica's engine (KV pool, policy, admission gate, telemetry) for scenario ``sc``.

    ``engine_cfg`` overrides ``sc.engine`` (a cluster's replica groups may differ in hardware);
    ``seed_tag`` separates the random streams of several replicas.
    """
    cfg = engine_cfg or sc.engine
    base_dir = Path(sc.base_dir)
    costs = costs or load_profile(cfg.profile, base_dir, overhead=cfg.overhead)
    kv_blocks = cfg.kv_blocks or costs.kv_blocks(cfg.block_size)
    if kv_blocks <= 0:
        raise ScenarioError(f"{sc.source}: engine.kv_blocks: the profile does not say how much KV "
                            "memory there is; set engine.kv_blocks > 0")
    cls_prio = [c.priority for c in sc.classes]
    cache = None
    if cfg.prefix_caching:
        try:
            cache = PrefixCache(cfg.prefix_block_tokens, cfg.block_size)
        except ValueError as exc:
            raise ScenarioError(f"{sc.source}: {exc}") from None
    pool = KVPool(kv_blocks, cfg.block_size, cls_prio, [c.reserved_blocks for c in sc.classes],
                  host_total=cfg.swap_blocks if cfg.preemption in ("swap", "auto") else 0, cache=cache)
    policy = make_policy(sc.policy.name, **sc.policy.params())
    if hasattr(policy, "bind"):
        policy.bind({c.name: c.model_dump() for c in sc.classes}, _seed_for(sc.seed, "policy" + seed_tag))
    if sc.fair_accounting:  # the fairness accountant wraps any policy
        from sim.admission import make_fair_policy
        policy = make_fair_policy(sc, policy)
    if gate is None and sc.admission_tables:
        gate = _make_gate(sc, costs)
    interval_ns = int(round(cfg.timeseries_interval_s * NS))
    tel = Telemetry(sc.class_names, interval_ns, costs, cfg.block_size)
    engine = Engine(env, cfg, costs, policy, sc.classes, pool, tel, gate=gate, trace=trace,
                    spec_seed=_seed_for(sc.seed, "speculative" + seed_tag))
    if gate is not None and hasattr(gate, "bind"):
        gate.bind(engine)
    return engine


def build_workload(sc: Scenario, load_scale: float = 1.0, lenient: bool = False):
    """The scenario's request stream (``workloads.Workload``). ``lenient``: skip bad trace rows
    (counted in ``meta``) instead of failing on the first."""
    try:
        return workloads.build_workload(sc.streams, horizon_s=sc.horizon_s, seed=_seed_for(sc.seed, "workload"),
                                        base_dir=Path(sc.base_dir), load_scale=load_scale, lenient=lenient)
    except workloads.WorkloadError as exc:
        raise ScenarioError(f"{sc.source}: {exc}") from None


@contextmanager
def quiet_gc(gen0: int = 50_000):
    """Run the event loop with less garbage-collector work: objects that exist when it starts
    (the workload, imports) are frozen out of collections, and the youngest generation is
    collected every ``gen0`` allocations instead of 700. The loop makes few reference cycles,
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


def skipped_rows(meta: dict) -> int:
    """Bad trace rows skipped under ``lenient`` (0 otherwise)."""
    return sum(int(m.get("rows_skipped", 0) or 0) for m in meta.get("streams", []) if isinstance(m, dict))


def simulate(scenario: Scenario, *, trace_iterations: bool = False, progress: bool | None = False,
             load_scale: float = 1.0, gate=None, check_invariants: bool = False,
             lenient: bool = False) -> Results:
    """Run ``scenario`` and return its Results (requests, summary, time series).

    ``load_scale`` multiplies every stream's arrival rate (traces: time compression).
    ``check_invariants`` verifies KV conservation after every engine event (tests use it).
    ``progress``: True a tqdm bar of simulated seconds, None that bar on a terminal and a line
    every 10 s elsewhere (:mod:`sim.progress`), False nothing.
    A scenario with a ``[cluster]`` table runs its replicas behind the router
    (:func:`sim.cluster.replicas.simulate_cluster`, a ``ClusterResults``).
    """
    if scenario.cluster:
        if gate is not None or lenient:
            what = "a custom gate" if gate is not None else "lenient trace reading"
            raise ScenarioError(f"{scenario.source}: cluster: {what} is not available for a [cluster] scenario "
                                f"(expected a scenario without [cluster])")
        from sim.cluster.replicas import simulate_cluster
        return simulate_cluster(scenario, trace_iterations=trace_iterations, progress=progress,
                                load_scale=load_scale, check_invariants=check_invariants)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    sc = scenario
    env = simpy.Environment()
    trace: list | None = [] if trace_iterations else None
    engine = build_engine(sc, env, trace=trace, gate=gate)
    costs, tel = engine.costs, engine.tel
    interval_ns = tel.interval_ns
    wl = build_workload(sc, load_scale, lenient)
    cls_idx = {c.name: i for i, c in enumerate(sc.classes)}
    cls_prio = [c.priority for c in sc.classes]
    source = RequestSource(wl, cls_idx, cls_prio, delay_ns=round(costs.overhead.frontend_s * NS))
    wl.open = None  # the source holds the stream in compact arrays now; free the DataFrame
    if source.closed:  # closed-loop users send their next request when one ends
        engine.on_request_end = source.on_request_end
    engine.through_finishes = not source.closed  # a finish sends no new request
    horizon_ns = int(round(sc.horizon_s * NS))
    stop_ns = NEVER if sc.drain else horizon_ns

    bar, on_boundary = sim_seconds_bar(progress, sc.horizon_s, sc.name)
    env.process(replica_loop(env, engine, source, stop_ns, interval_ns, check_invariants, on_boundary))
    run_to_end(env, bar)
    end_ns = int(env.now)
    engine.close(end_ns)
    run_info = {
        **engine_run_info(engine, end_ns),
        "wall_s": time.perf_counter() - wall0,
        "cpu_s": time.process_time() - cpu0,
        "workload": wl.meta,
    }
    return Results.build(sc, costs, tel, run_info, trace)


def sim_seconds_bar(progress: bool | None, horizon_s: float, desc: str):
    """A progress bar of simulated seconds (:func:`sim.progress.progress_bar`; None when off) and
    the loop's ``on_boundary(now_ns)`` callback that moves it forward."""
    bar = progress_bar(progress, total=round(horizon_s), unit="sim-s", desc=desc)

    def on_boundary(now: int) -> None:
        if bar is not None:
            n = min(now // NS, bar.total)
            if n > bar.n:
                bar.update(n - bar.n)

    return bar, on_boundary


def run_to_end(env: simpy.Environment, bar) -> None:
    """Run the SimPy clock until no event is left (the GC quieter meanwhile), then close ``bar``."""
    try:
        with quiet_gc():
            env.run()
    finally:
        if bar is not None:
            bar.close()


def engine_run_info(engine: Engine, end_ns: int) -> dict:
    """One replica's run facts for summary.json (events, busy and thrash time, KV, preemptions,
    the policy's and the admission gate's reports)."""
    pool, tel = engine.pool, engine.tel
    return {
        "engine_events": engine.events,
        "engine_build": native.BUILD,  # "mypyc" (compiled hot modules) or "python"
        "lazy_batch": engine.cohort is not None,  # steady decoders advanced as one cohort
        "iterations": engine.iterations,
        "busy_s": engine.busy_ns / NS,
        "thrash_s": engine.thrash_ns / NS,
        "end_s": end_ns / NS,
        "idle_with_work_s": tel.idle_with_work_ns / NS,
        "kv_blocks": pool.total,
        "swap_blocks": pool.host_total,
        "preemptions_by_mode": dict(tel.preempt_by_mode),
        "prefix_evictions": pool.cache.evictions if pool.cache is not None else 0,
        "prefix_attribution": _attribution(engine) if pool.cache is not None else None,
        "speculative": _spec_report(engine),
        "policy": getattr(engine.policy, "report", lambda: {})(),
        **({"admission": engine.gate.report()} if getattr(engine.gate, "report", None) else {}),
    }


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
    st = dict(engine.spec_stats)
    n = max(st["sequence_steps"], 1)
    st.update(k=engine.spec_k, mean_accepted_per_sequence_step=st["accepted"] / n,
              mean_emitted_per_sequence_step=st["emitted"] / n,
              wasted_draft_tokens=st["drafted"] - st["accepted"])
    return st


def _make_gate(sc: Scenario, costs):
    """The admission gate / fairness accountant when the scenario configures one."""
    from sim.admission import make_gate
    return make_gate(sc, costs)
