"""A cluster whose router reads replica state every ``refresh_s`` seconds, run in windows.

``router = { name = ..., refresh_s = R }``: the router sees a snapshot of every replica
(:class:`policies.contracts.ReplicaView`: outstanding, running, waiting, kv_used,
waiting_by_class) taken at the start of each window ``[t, t + R)`` (``t`` a multiple of R), plus
its own counts of what it routed there since (each routed request adds one to the replica's
``outstanding``, ``waiting`` and ``waiting_by_class``), as a real gateway that scrapes metrics.

That is the lookahead of a conservative synchronous scheme: nothing a replica does inside a
window can change where a request of that window goes, so the window's arrivals are routed by a
coordinator first, and the replicas then advance to ``t + R`` independently, each part of them in
its own SimPy environment (a :class:`Partition`), and return the next snapshot. A replica's
history depends only on the requests routed to it, so the run is the same however the replicas
are partitioned: one partition in this process (``workers = 1``), several in this process (the
tests), one per local process, or one per Ray actor (:mod:`sim.cluster.executors`).

Inside a partition a replica's run stops at its own next arrival or at the window's end (the
lower bound of any request not routed yet), and the snapshot at ``t`` is its state after every
event before ``t``. Open arrivals only (closed-loop users would make a request ending on one
replica send one to another inside a window), and no autoscaler (its ticks would have to align
to windows): both are refused with one line.
"""
from __future__ import annotations

from collections import deque
from pathlib import Path
from types import SimpleNamespace

import simpy

from sim.assembly import build_engine, engine_run_info, quiet_gc, sample_interval_ns, seed_for
from sim.cluster.autoscale import Fleet
from sim.cluster.results import ClusterResults, cluster_results
from sim.cluster.spec import ClusterSpec
from sim.config import Scenario
from sim.core.costs import NEVER, NS, load_profile
from sim.core.errors import ScenarioError
from sim.core.loop import replica_loop
from sim.routers import counts_router, make_router
from sim.tables import serving_groups


# ---- the layout both sides share ----------------------------------------------------------------
def replica_layout(spec: ClusterSpec) -> list[tuple[int, int]]:
    """(global replica index, group index) of every replica, in index order (as the one-clock
    cluster builds them: ``sim.cluster.driver._add_replicas``)."""
    out = []
    for gi, g in enumerate(spec.groups):
        for _ in range(g.slots):
            out.append((len(out), gi))
    return out


def group_scenarios(sc: Scenario, spec: ClusterSpec) -> dict[str, Scenario]:
    """Each group's scenario: the cluster's with the group's engine and policy."""
    return {g.name: sc.model_copy(update={"engine": g.engine, "policy": g.policy, "cluster": None})
            for g in spec.groups}


def split(n: int, workers: int) -> list[list[int]]:
    """Replica indices ``0..n-1`` in ``workers`` contiguous parts of near-equal size."""
    workers = max(1, min(workers, n))
    q, r = divmod(n, workers)
    out, i = [], 0
    for w in range(workers):
        k = q + (1 if w < r else 0)
        out.append(list(range(i, i + k)))
        i += k
    return out


# ---- a worker: some replicas on their own clock -------------------------------------------------
class _Slot:
    """One replica in a partition: its engine, and the source its ``replica_loop`` reads (the
    requests routed to it, each due at its arrival instant)."""

    __slots__ = ("index", "group", "engine", "trace", "pending", "part", "routed", "info")

    def __init__(self, index: int, group: str, engine, trace, part: "Partition") -> None:
        self.index, self.group, self.engine, self.trace, self.part = index, group, engine, trace, part
        self.pending: deque = deque()  # (arrival ns, request), in arrival order
        self.routed = 0
        self.info: dict | None = None

    def pop_due(self, now_ns: int) -> list:
        p = self.pending
        out = []
        while p and p[0][0] <= now_ns:
            out.append(p.popleft()[1])
        return out

    def next_arrival_ns(self) -> int:
        # (nothing not routed yet can arrive before the window's end: a lower bound)
        return self.pending[0][0] if self.pending else self.part.until

    def view(self) -> tuple:
        """(index, outstanding, running, waiting, kv_used, waiting_by_class) now."""
        e = self.engine
        running = len(e.queues.running)
        waiting = len(e.queues.waiting) + len(self.pending)
        wbc = [n for n in e.queues.waiting_count]
        for _, r in self.pending:
            wbc[r.cls_idx] += 1
        p = e.pool
        return (self.index, running + waiting, running, waiting, (p.total - p.free) / p.total, wbc)


class Partition:
    """Some replicas of ``sc``'s cluster (``indices``), each built as the one-clock cluster
    builds it, on a SimPy clock of their own, advanced a window at a time."""

    def __init__(self, sc: Scenario, spec: ClusterSpec, indices: list[int], *, trace_iterations: bool = False,
                 check_invariants: bool = False, on_end=None) -> None:
        self.env = env = simpy.Environment()
        self.until = 0  # the end of the window being advanced (NEVER: no more arrivals)
        stop_ns = NEVER if sc.drain else int(round(sc.horizon_s * NS))
        interval_ns = sample_interval_ns(sc)
        scs = group_scenarios(sc, spec)
        want = set(indices)
        priced: dict = {}
        self.slots: list[_Slot] = []
        for i, gi in replica_layout(spec):
            if i not in want:
                continue
            g = spec.groups[gi]
            costs = priced.get(g.name)
            if costs is None:
                costs = priced[g.name] = load_profile(g.engine.profile, _base(sc), overhead=g.engine.overhead,
                                                      host_cpu=g.engine.host_cpu, entrypoint=g.engine.entrypoint,
                                                      scale=g.engine.cost_scale)
            trace = [] if trace_iterations else None
            eng = build_engine(scs[g.name], env, costs, trace=trace, seed_tag=f"/replica{i}")
            if on_end is not None:
                eng.on_request_end = on_end
            slot = _Slot(i, g.name, eng, trace, self)
            self.slots.append(slot)
            env.process(replica_loop(env, eng, slot, stop_ns, interval_ns, check_invariants, None))
        self.by_index = {s.index: s for s in self.slots}

    def snapshot(self) -> list[tuple]:
        return [s.view() for s in self.slots]

    def advance(self, batch: list[tuple[int, int, object]], until_ns: int) -> list[tuple]:
        """Take ``batch`` ((replica index, arrival ns, request), routed in this order), run every
        replica to ``until_ns`` (its events before that instant) and return the snapshot there.
        ``until_ns = NEVER``: no more arrivals; run to the end (the snapshot is then [])."""
        by = self.by_index
        for i, t, req in batch:
            s = by[i]
            s.pending.append((t, req))
            s.routed += 1
        self.until = until_ns
        with quiet_gc():
            if until_ns >= NEVER:
                self.env.run()
                return []
            self.env.run(until=until_ns)
        return self.snapshot()

    def end_ns(self) -> int:
        return int(self.env.now)

    def finish(self, end_ns: int, per_replica: bool) -> list:
        """Close every replica at ``end_ns`` (the run's end, over every partition) and return
        them with their run facts (``info``)."""
        with quiet_gc():
            for s in self.slots:
                s.engine.close(end_ns, also=[r for _, r in s.pending])
                s.pending.clear()
                s.info = engine_run_info(s.engine, end_ns, reports=per_replica)
        return self.slots

    def finish_remote(self, end_ns: int, per_replica: bool) -> list:
        """:meth:`finish` for another process: what the results read of each replica (its
        telemetry, run facts and trace; not the engine with its clock)."""
        return [SimpleNamespace(index=s.index, group=s.group, routed=s.routed, trace=s.trace, info=s.info,
                                engine=SimpleNamespace(tel=s.engine.tel, costs=None))
                for s in self.finish(end_ns, per_replica)]


def _base(sc: Scenario) -> Path:
    return Path(sc.base_dir)


# ---- the coordinator ------------------------------------------------------------------------------
class _View:
    """What the router reads of one replica: the snapshot at the window's start plus what it
    routed there since (:class:`policies.contracts.ReplicaView`)."""

    __slots__ = ("index", "group", "outstanding", "running", "waiting", "kv_used", "_wbc", "_names")

    def __init__(self, index: int, group: str, names: list[str]) -> None:
        self.index, self.group, self._names = index, group, names
        self.outstanding = self.running = self.waiting = 0
        self.kv_used = 0.0
        self._wbc = [0] * len(names)

    @property
    def waiting_by_class(self) -> dict[str, int]:
        return dict(zip(self._names, self._wbc))


def check_windowed(sc: Scenario, spec: ClusterSpec, closed: bool) -> None:
    """One line for what a windowed run cannot do yet."""
    if closed:
        raise ScenarioError(f"{sc.source}: cluster.router.refresh_s: not available with closed-loop users "
                            f"(expected open arrivals only; docs/distributed.md)")
    if spec.autoscaled:
        raise ScenarioError(f"{sc.source}: cluster.router.refresh_s: not available with an autoscaler yet "
                            f"(expected no 'autoscale'; docs/distributed.md)")


def simulate_windows(sc: Scenario, spec: ClusterSpec, setup, executor, *, per_replica: bool = True,
                     trace_iterations: bool = False) -> ClusterResults:
    """Run the cluster in windows of ``spec.refresh_s``: route each window's arrivals from the
    snapshot at its start, let ``executor`` (:mod:`sim.cluster.executors`) advance its
    partitions to the window's end, and merge the replicas' results in index order."""
    check_windowed(sc, spec, setup.closed_loop)
    router = make_router(spec.router, **spec.router_params)
    router.bind(spec.slots, seed_for(sc.seed, "router"))
    names = list(sc.class_names)
    layout = replica_layout(spec)
    views = [_View(i, spec.groups[gi].name, names) for i, gi in layout]
    if router.class_aware:
        cands = []
        for c in names:
            gs = set(serving_groups(sc.cluster, c))
            cands.append([v for v, (_, gi) in zip(views, layout) if gi in gs])
    else:
        cands = [list(views) for _ in names]
    allowed = [{v.index for v in c} for c in cands]
    route_counts = counts_router(router)
    by_counts = [route_counts is not None and len(c) > 1 and c == views for c in cands]
    outs = [0] * len(views)
    owner = executor.owner  # replica index -> partition number
    assign: dict[int, int] = {}
    routed = [0] * len(views)
    source = setup.source
    stop = setup.stop_ns
    R = max(int(round(spec.refresh_s * NS)), 1)
    windows = 0
    t = 0
    while True:
        nxt = source.next_arrival_ns()
        if nxt >= NEVER or nxt > stop:
            break
        start = (nxt // R) * R
        if start > t or windows == 0:  # (no arrival before it: the snapshot at its start)
            snap = executor.advance([[] for _ in executor.parts], start) if start > t else executor.snapshot()
            windows += start > t
            for i, out, run, wait, kv, wbc in snap:
                v = views[i]
                v.outstanding = outs[i] = out
                v.running, v.waiting, v.kv_used, v._wbc = run, wait, kv, wbc
        end = start + R
        j = source.i
        due = source.pop_due(min(end - 1, stop))
        vis = source.vis_ns
        batches: list[list] = [[] for _ in executor.parts]
        for k, req in enumerate(due):
            ci = req.cls_idx
            if by_counts[ci]:
                v = views[route_counts(outs)]  # type: ignore[misc]
            else:
                c = cands[ci]
                v = router.route(req, c, vis[j + k]) if len(c) > 1 else c[0]
                if v.index not in allowed[ci]:
                    raise RuntimeError(f"router {type(router).__name__} sent request {req.request_id} of class "
                                       f"{req.cls!r} to replica {v.index}, not one of its candidates")
            i = v.index
            v.outstanding += 1
            outs[i] += 1
            v.waiting += 1
            v._wbc[ci] += 1
            routed[i] += 1
            assign[req.request_id] = i
            batches[owner[i]].append((i, vis[j + k], req))
        snap = executor.advance(batches, end)
        windows += 1
        for i, out, run, wait, kv, wbc in snap:
            v = views[i]
            v.outstanding = outs[i] = out
            v.running, v.waiting, v.kv_used, v._wbc = run, wait, kv, wbc
        t = end
    executor.advance([[] for _ in executor.parts], NEVER)
    end_ns = executor.end_ns()
    reps = executor.finish(end_ns, per_replica)
    reps.sort(key=lambda r: r.index)
    costs: dict = {}
    for r in reps:
        r.routed = routed[r.index]
        if r.engine.costs is None:  # (from another process: the cost model is made again here)
            g = next(g for g in spec.groups if g.name == r.group)
            if g.name not in costs:
                costs[g.name] = load_profile(g.engine.profile, _base(sc), overhead=g.engine.overhead,
                                             host_cpu=g.engine.host_cpu, entrypoint=g.engine.entrypoint,
                                             scale=g.engine.cost_scale)
            r.engine.costs = costs[g.name]
    # (a fixed fleet: its replicas serve from 0 to the end, reported as the one-clock run does)
    fleet = Fleet(SimpleNamespace(env=SimpleNamespace(now=0), replicas=reps, tick_ns=NEVER), spec, [])
    fleet.close(end_ns)
    executor.windows = windows  # (for the speed-up model: docs/distributed.md)
    facts = {**setup.timing(), "workload": setup.workload.meta}
    with quiet_gc():
        return cluster_results(sc, spec, reps, assign, group_scenarios(sc, spec), router, end_ns,
                               setup.interval_ns, facts, per_replica=per_replica,
                               trace_iterations=trace_iterations, fleet=fleet)
