"""Running a cluster: the scenario's replicas behind its router on one clock.

:func:`simulate_cluster` shares its setup with a single replica's run (:func:`sim.assembly.prepare`:
the request stream and its source, the stop time, the progress bar) and builds every replica's
engine the same way (:func:`sim.assembly.build_engine`); :func:`sim.run.simulate` calls it for a
scenario with a ``[cluster]`` table.
"""
from __future__ import annotations

import json

from sim.assembly import Setup, build_engine, engine_costs, prepare, quiet_gc, seed_for
from sim.cluster.autoscale import Fleet
from sim.cluster.disagg import DECODE, PREFILL, DisaggCluster, PDReplica
from sim.cluster.replicas import Replica, _Cluster
from sim.cluster.results import ClusterResults, cluster_results, disagg_results
from sim.routers import make_router
from sim.cluster.spec import ClusterSpec, parse_cluster
from sim.config import Scenario
from sim.core.costs import CostModel
from sim.core.errors import ScenarioError
from sim.core.observe import ClockGuard
from sim.core.preemption import PREEMPTION_MODES
from sim.core.source import RequestSource
from sim.core.telemetry import Telemetry
from sim.link import Links
from sim.tables import DECODE_ROLES, FRONT_ROLES, serving_groups


def simulate_cluster(scenario: Scenario, *, trace_iterations: bool = False, progress: bool | None = False,
                     load_scale: float = 1.0, check_invariants: bool = False,
                     per_replica: bool = True, fast: bool = True, workload=None,
                     on_end=None, lenient: bool = False, backend: str = "local", workers: int = 1,
                     address: str | None = None) -> ClusterResults:
    """Run ``scenario`` (which has a ``[cluster]`` table) and return a :class:`ClusterResults`.

    ``per_replica=False`` skips the per-replica and per-group Results (faster; the capacity
    search uses it). ``check_invariants`` checks every replica's KV conservation after every
    engine event. ``fast=False`` stops every replica's run at every arrival in the cluster (the
    plain way; same results, more engine events); with closed-loop users runs always stop there.
    ``workload``: the stream to serve, built by the caller (``sim.assembly.build_workload`` with
    the same ``load_scale``; it is not modified, so several runs may share it). ``on_end(request,
    ns)`` is told of every request that finishes or is rejected; an exception it raises ends the
    run and propagates. ``lenient``: skip bad trace rows instead of failing on the first.
    """
    sc = scenario
    spec = parse_cluster(sc)
    if spec.disaggregated:
        return _simulate_disaggregated(sc, spec, load_scale=load_scale, lenient=lenient, workload=workload,
                                       progress=progress, per_replica=per_replica, trace_iterations=trace_iterations,
                                       check_invariants=check_invariants, on_end=on_end, backend=backend,
                                       workers=workers)
    # the front end (latency, serial work per request) is the first group's engine overhead's
    setup = prepare(sc, spec.groups[0].engine, load_scale=load_scale, lenient=lenient, workload=workload,
                    progress=progress, desc=f"{sc.name} x{spec.n_replicas}", frontends=spec.n_replicas)
    if spec.refresh_s is not None:  # the router reads snapshots: a run in windows, maybe partitioned
        return _simulate_windowed(sc, spec, setup, per_replica=per_replica, trace_iterations=trace_iterations,
                                  check_invariants=check_invariants, on_end=on_end, backend=backend,
                                  workers=workers, address=address)
    if backend != "local" or workers != 1:
        raise ScenarioError(f"{sc.source}: cluster.router: a run on {workers} workers ({backend}) needs the "
                            f"router's refresh_s (expected router = {{ name = ..., refresh_s = 1.0 }}; "
                            f"docs/distributed.md)")
    router = make_router(spec.router, **spec.router_params)
    router.bind(spec.slots, seed_for(sc.seed, "router"))
    closed = setup.closed_loop
    # (an autoscaled cluster's runs stop at every arrival, the plain way: held runs assume
    # fixed candidates)
    cl = _Cluster(setup.env, setup.source, [], router, [], setup.stop_ns, closed=closed,
                  fast=fast and not closed and not spec.autoscaled)
    cl.on_end = on_end
    group_sc = _add_replicas(sc, spec, setup, cl, trace_iterations)
    fleet = Fleet(cl, spec, cl.candidates)
    cl.on_all_exited = fleet.stop
    fleet.start()
    cl.start_router()
    for rep in cl.replicas:
        setup.env.process(cl.replica_proc(rep, setup.interval_ns, check_invariants, setup.on_boundary))
    end_ns = setup.run(guard=clock_guard(setup.source, cl.replicas))
    # the collector kept quiet for the end too: the run's survivors (every request, its
    # telemetry) would otherwise be walked again by the first collections of the results'
    # objects (1 h ServeGen x16: 0.12 s of young collections)
    with quiet_gc():
        for rep in cl.replicas:
            # requests routed but never taken in (a replica that stopped at the horizon) too
            rep.engine.close(end_ns, also=rep.inbox)
            rep.inbox.clear()
        fleet.close(end_ns)
        facts = {**setup.timing(), "workload": setup.workload.meta}
        return cluster_results(sc, spec, cl.replicas, cl.assign, group_sc, router, end_ns, setup.interval_ns,
                               facts, per_replica=per_replica, trace_iterations=trace_iterations, fleet=fleet)


def _simulate_windowed(sc: Scenario, spec: ClusterSpec, setup: Setup, *, per_replica: bool, trace_iterations: bool,
                       check_invariants: bool, on_end, backend: str, workers: int, address: str | None):
    """The cluster in windows of the router's ``refresh_s`` (:mod:`sim.cluster.windows`), its
    replicas on ``workers`` partitions run by ``backend`` (:mod:`sim.cluster.executors`)."""
    from sim.cluster.executors import make_executor
    from sim.cluster.windows import check_windowed, simulate_windows
    check_windowed(sc, spec, setup.closed_loop)
    ex = make_executor(sc, spec, backend=backend, workers=workers, address=address,
                       trace_iterations=trace_iterations, check_invariants=check_invariants, on_end=on_end)
    try:
        return simulate_windows(sc, spec, setup, ex, per_replica=per_replica, trace_iterations=trace_iterations)
    finally:
        ex.close()


def _simulate_disaggregated(sc: Scenario, spec: ClusterSpec, *, load_scale: float, lenient: bool, workload,
                            progress, per_replica: bool, trace_iterations: bool, check_invariants: bool, on_end,
                            backend: str, workers: int) -> ClusterResults:
    """A cluster with prefill and decode groups (:mod:`sim.cluster.disagg`)."""
    if backend != "local" or workers != 1:
        raise ScenarioError(f"{sc.source}: cluster.groups: a run on {workers} workers ({backend}) is not available "
                            f"with prefill and decode groups yet (docs/disaggregation.md)")
    front = [g for g in spec.groups if g.role != DECODE]
    # the front end (latency, serial work per request) is the first prefill or co-located group's
    setup = prepare(sc, front[0].engine, load_scale=load_scale, lenient=lenient, workload=workload,
                    progress=progress, desc=f"{sc.name} x{spec.n_replicas}",
                    frontends=sum(g.replicas for g in front))
    router = make_router(spec.router, **spec.router_params)
    router.bind(spec.slots, seed_for(sc.seed, "router"))
    decode_router = make_router(spec.decode_router, **spec.decode_router_params)
    decode_router.bind(spec.slots, seed_for(sc.seed, "decode_router"))
    assert spec.link is not None  # (a disaggregated spec has one)
    front_tel = Telemetry(sc.class_names, setup.interval_ns, setup.costs, sc.engine.block_size)
    cl = DisaggCluster(setup.env, setup.source, router, decode_router, Links(spec.link, spec.slots), setup.stop_ns,
                       front_tel, spec.first_token)
    cl.on_end = on_end
    group_sc = _add_pd_replicas(sc, spec, setup, cl, trace_iterations)
    if not per_replica:  # (only the per-replica results read a prefill replica's legs)
        for rep in cl.prefills:
            rep.engine.tel.keeps = False
    cl.start()
    for rep in cl.replicas:
        setup.env.process(cl.replica_proc(rep, setup.interval_ns, check_invariants, setup.on_boundary))
    end_ns = setup.run(guard=clock_guard(setup.source, cl.replicas))
    with quiet_gc():
        cl.close(end_ns)
        facts = {**setup.timing(), "workload": setup.workload.meta}
        return disagg_results(sc, spec, cl, group_sc, end_ns, setup.interval_ns, facts, per_replica=per_replica,
                              trace_iterations=trace_iterations)


def _add_pd_replicas(sc: Scenario, spec: ClusterSpec, setup: Setup, cl: DisaggCluster,
                     trace_iterations: bool) -> dict[str, Scenario]:
    """Build every group's replicas into ``cl`` with their roles, and each class's first stops
    and decode replicas; returns each group's scenario."""
    group_sc: dict[str, Scenario] = {}
    priced: dict[str, CostModel] = {}
    group_of: list[int] = []
    for gi, g in enumerate(spec.groups):
        scg = sc.model_copy(update={"engine": g.engine, "policy": g.policy, "cluster": None})
        group_sc[g.name] = scg
        costs = _group_costs(sc, g, priced)
        if g.role == PREFILL and not cl.bytes_per_token:
            link = spec.link
            assert link is not None
            if costs.shape is None and link.kv_bytes_per_token is None:
                raise ScenarioError(f"{sc.source}: cluster.link.kv_bytes_per_token: profile {g.engine.profile!r} does "
                                    f"not give the model's shape, so the KV bytes per token copied to the decode side "
                                    f"are unknown (expected a profile with a 'model' table, or this key)")
            cl.bytes_per_token = link.kv_bytes_per_token or replica_kv_bytes_per_token(costs)
            cl.layers = link.layers or (costs.shape.layers if costs.shape is not None else 1)
        for _ in range(g.replicas):
            i = len(cl.replicas)
            trace = [] if trace_iterations else None
            eng = build_engine(scg, setup.env, costs, trace=trace, seed_tag=f"/replica{i}")
            if g.role == PREFILL:
                eng.keeps_kv = True
                eng.on_request_end = cl.on_leg_end
            else:
                eng.on_request_end = cl.on_request_end
            if g.role == DECODE:
                eng.sampled_token_sent = cl.sampled_sent_at_prefill
            if g.role == DECODE and PREEMPTION_MODES.resolve(g.engine.preemption).name != "swap":
                eng.on_recompute = cl.on_recompute
                cl.victims_to_prefill = True
            rep = PDReplica(i, g.name, g.role, g.gpus, eng, cl, trace)
            cl.replicas.append(rep)
            (cl.prefills if g.role == PREFILL else cl.decodes if g.role == DECODE else []).append(rep)
            group_of.append(gi)
    c = sc.cluster
    for cname in sc.class_names:
        fronts = set(serving_groups(c, cname, FRONT_ROLES))
        decodes = set(serving_groups(c, cname, DECODE_ROLES))
        cl.prefill_cands.append([r for r, gi in zip(cl.replicas, group_of) if gi in fronts])
        cl.decode_cands.append([r for r, gi in zip(cl.replicas, group_of) if gi in decodes])
    return group_sc


def replica_kv_bytes_per_token(costs: CostModel) -> int:
    """KV bytes of one token on a replica of ``costs``'s profile, all its GPUs together (what a
    disaggregated copy moves): a profile's model shape gives one GPU's share (a tensor-parallel
    profile's KV heads are those of one GPU), so it is that times the profile's tensor-parallel
    size (``meta.tp``; 1 where the profile does not say)."""
    assert costs.shape is not None
    return costs.shape.kv_bytes_per_token * int(costs.meta.get("tp", 1) or 1)


def _add_replicas(sc: Scenario, spec: ClusterSpec, setup: Setup, cl: _Cluster,
                  trace_iterations: bool) -> dict[str, Scenario]:
    """Build every group's replicas into ``cl`` (and each class's candidate replicas); returns
    each group's scenario (the cluster's with the group's engine and policy)."""
    group_sc: dict[str, Scenario] = {}
    group_of: list[int] = []
    # one cost model per distinct pricing (profile and overhead), not one per group
    priced = {_pricing(spec.groups[0].engine): setup.costs}
    for gi, g in enumerate(spec.groups):
        scg = sc.model_copy(update={"engine": g.engine, "policy": g.policy, "cluster": None})
        group_sc[g.name] = scg
        costs = _group_costs(sc, g, priced)
        for _ in range(g.slots):
            i = len(cl.replicas)
            trace = [] if trace_iterations else None
            eng = build_engine(scg, setup.env, costs, trace=trace, seed_tag=f"/replica{i}")
            if cl.closed or cl.on_end is not None:  # (else nobody listens to a request's end)
                eng.on_request_end = cl.on_request_end
            # runs may go on past decoders' last tokens (what a router reads is adjusted for
            # them, except KV use, which they would release)
            eng.through_finishes = cl.fast and not getattr(cl.router, "reads_kv", True)
            cl.replicas.append(Replica(i, g.name, eng, cl, trace))
            group_of.append(gi)
    if cl.router.class_aware:
        for c in sc.class_names:
            gs = set(serving_groups(sc.cluster, c))
            cl.candidates.append([r for r, gi in zip(cl.replicas, group_of) if gi in gs])
    else:
        cl.candidates = [list(cl.replicas) for _ in sc.class_names]
    cl.allowed = [{r.index for r in c} for c in cl.candidates]
    cl.routing_ready()
    cl.ahead = max(int(Replica.LOOKAHEAD * len(cl.replicas)), 1) - 1
    return group_sc


def _group_costs(sc: Scenario, g, priced: dict[str, CostModel]) -> CostModel:
    """Group ``g``'s cost model: one per distinct pricing (kept in ``priced``), not one per group."""
    key = _pricing(g.engine)
    if key not in priced:
        priced[key] = engine_costs(sc, g.engine)
    return priced[key]


def _pricing(engine) -> str:
    """What a group's cost model is made from: its profile, overhead settings, entrypoint and cost scale."""
    return json.dumps([engine.profile, engine.overhead, engine.host_cpu, engine.entrypoint, engine.cost_scale],
                      sort_keys=True,
                      default=str)


#: SimPy events between two checks of a cluster's clock (a switch for the tests)
CLOCK_EVERY = 1 << 20


def clock_guard(source: RequestSource, replicas: list) -> ClockGuard:
    """The guard of a cluster's clock (:class:`sim.core.observe.ClockGuard`): progress is the
    requests ``source`` has made and the engine events of ``replicas`` (a list the fleet may
    grow as the run goes)."""
    def progress() -> int:
        return source.i + source.next_id + sum(rep.engine.events for rep in replicas)

    def describe() -> str:
        return "; ".join(f"replica {rep.index} ({rep.group}): {len(rep.engine.queues.running)} running, "
                         f"{len(rep.engine.queues.waiting)} waiting, {len(rep.engine.held)} with KV in flight, "
                         f"{rep.engine.pool.free} of {rep.engine.pool.total} KV blocks free" for rep in replicas)
    return ClockGuard(progress, describe, CLOCK_EVERY)
