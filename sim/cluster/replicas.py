"""A cluster of replicas behind a router, sharing one SimPy clock.

``simulate_cluster(scenario)`` runs the scenario's ``[cluster]``: N replicas (or several replica
groups with their own engine settings, policy and served classes), each an ordinary
:class:`~sim.core.engine.Engine` driven by :func:`sim.run.replica_loop`, behind a router
(:mod:`sim.cluster.routers`).

Wiring. One global :class:`~sim.core.source.RequestSource` holds the request stream (open arrivals and
closed-loop users; request ids stay global). A router process wakes at every arrival instant,
takes the requests that are due, asks the router for a replica among the request's candidates and
appends the request to that replica's inbox, waking the replica if it sleeps. Each replica's
``replica_loop`` reads a small per-replica source:

* ``pop_due(now)`` drains its inbox (after routing whatever is due at ``now``, so that the order
  in which SimPy runs same-instant processes never delays an arrival by a step);
* ``next_arrival_ns()`` is a lower bound of the next arrival it could receive: the global next
  arrival, and, with closed-loop users, the next boundary of every other replica that could end
  a request there (a request ending anywhere may send a closed-loop request at once). A lower
  bound only stops fast-forward early, so every replica stays exact;
* ``wakeup(until)`` is an event the router fires when it pushes to the replica (or the horizon);
* ``finished()`` says no request can ever reach it again.

Results. :class:`ClusterResults` is a :class:`~sim.results.Results` for the whole cluster (the
requests table gains ``replica`` and ``group`` columns; percentiles are computed over all requests,
inter-token gaps merged exactly) plus one Results per replica and per group, and a
``summary_dict["cluster"]`` section. ``save`` writes the combined run as an ordinary results
folder (so ``priosim plot``/``compare`` work) with ``replicas/<i>/`` and ``groups/<name>/`` inside.
"""
from __future__ import annotations

import copy
import json
import time
from bisect import bisect_left, bisect_right
from collections import deque
from itertools import accumulate
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import simpy
from pydantic import ValidationError

from sim.config import EngineConfig, PolicyConfig, Scenario
from sim.core.costs import NS, load_profile
from sim.core.engine import NEVER
from sim.core.errors import ScenarioError
from sim.results import Results, atomic_dir
from sim.core.loop import replica_loop
from sim.run import _seed_for, build_engine, build_workload, engine_run_info, run_to_end, sim_seconds_bar
from sim.core.telemetry import Telemetry

CLUSTER_KEYS = ("replicas", "groups", "router")
GROUP_KEYS = ("name", "replicas", "engine", "policy", "classes", "gpus")


# ---- the [cluster] table ------------------------------------------------------------------------
@dataclass(frozen=True)
class GroupSpec:
    name: str
    replicas: int
    engine: EngineConfig
    policy: PolicyConfig
    classes: tuple[str, ...] | None  # None: serves the classes no group lists
    gpus: int = 1  # GPUs per replica (for capacity reports)


@dataclass(frozen=True)
class ClusterSpec:
    groups: tuple[GroupSpec, ...]
    router: str
    router_params: dict = field(default_factory=dict)

    @property
    def n_replicas(self) -> int:
        return sum(g.replicas for g in self.groups)

    @property
    def gpus(self) -> int:
        return sum(g.replicas * g.gpus for g in self.groups)


def _int_ge1(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def parse_cluster(sc: Scenario) -> ClusterSpec:
    """Validate ``sc.cluster``; every problem is one ScenarioError line naming file, key and value."""
    src = sc.source
    c = sc.cluster
    if not isinstance(c, dict) or not c:
        raise ScenarioError(f"{src}: cluster: expected a table with 'replicas' or 'groups' (got {c!r})")
    for k in c:
        if k not in CLUSTER_KEYS:
            raise ScenarioError(f"{src}: cluster.{k}: unknown key (expected one of {', '.join(CLUSTER_KEYS)})")
    if ("replicas" in c) == ("groups" in c):
        raise ScenarioError(f"{src}: cluster: give exactly one of 'replicas = N' or 'groups = [...]' "
                            f"(got {sorted(k for k in c if k in ('replicas', 'groups')) or 'neither'})")
    if "replicas" in c:
        if not _int_ge1(c["replicas"]):
            raise ScenarioError(f"{src}: cluster.replicas: expected an integer >= 1 (got {c['replicas']!r})")
        raw_groups = [{"name": "default", "replicas": c["replicas"]}]
    else:
        raw_groups = c["groups"]
        if not isinstance(raw_groups, list) or not raw_groups:
            raise ScenarioError(f"{src}: cluster.groups: expected a non-empty list of tables (got {raw_groups!r})")
    classes = set(sc.class_names)
    groups: list[GroupSpec] = []
    names: set[str] = set()
    base_engine = sc.engine.model_dump()
    for i, g in enumerate(raw_groups):
        key = f"cluster.groups.{i}"
        if not isinstance(g, dict):
            raise ScenarioError(f"{src}: {key}: expected a table (got {g!r})")
        for k in g:
            if k not in GROUP_KEYS:
                raise ScenarioError(f"{src}: {key}.{k}: unknown key (expected one of {', '.join(GROUP_KEYS)})")
        name = g.get("name", f"g{i}")
        if not isinstance(name, str) or not name or "/" in name:
            raise ScenarioError(f"{src}: {key}.name: expected a non-empty string without '/' (got {name!r})")
        if name in names:
            raise ScenarioError(f"{src}: {key}.name: duplicate group name (got {name!r})")
        names.add(name)
        n = g.get("replicas", 1)
        if not _int_ge1(n):
            raise ScenarioError(f"{src}: {key}.replicas: expected an integer >= 1 (got {n!r})")
        gpus = g.get("gpus", 1)
        if not _int_ge1(gpus):
            raise ScenarioError(f"{src}: {key}.gpus: expected an integer >= 1 (GPUs per replica) (got {gpus!r})")
        over = g.get("engine", {})
        if not isinstance(over, dict):
            raise ScenarioError(f"{src}: {key}.engine: expected a table of engine overrides (got {over!r})")
        try:
            eng = EngineConfig.model_validate({**base_engine, **over})
        except ValidationError as err:
            e = err.errors()[0]
            loc = ".".join(str(x) for x in e["loc"])
            if e["type"] == "extra_forbidden":
                raise ScenarioError(f"{src}: {key}.engine.{loc}: unknown key (see docs/scenario.md)") from None
            raise ScenarioError(f"{src}: {key}.engine.{loc}: {e['msg']} (got {e.get('input')!r})") from None
        if eng.timeseries_interval_s != sc.engine.timeseries_interval_s:
            raise ScenarioError(f"{src}: {key}.engine.timeseries_interval_s: must equal the scenario's "
                                f"engine.timeseries_interval_s={sc.engine.timeseries_interval_s} "
                                f"(got {eng.timeseries_interval_s!r})")
        if "profile" in over or "overhead" in over:
            from sim.core.costs import ProfileError
            try:
                load_profile(eng.profile, Path(sc.base_dir), overhead=eng.overhead)
            except ProfileError as exc:
                raise ScenarioError(f"{src}: {key}.engine.profile: {exc}") from None
        pol = sc.policy
        if "policy" in g:
            p = g["policy"]
            if not isinstance(p, dict) or "name" not in p:
                raise ScenarioError(f"{src}: {key}.policy: expected a table with 'name' (got {p!r})")
            pol = PolicyConfig.model_validate(p)
            from policies import make_policy
            try:
                make_policy(pol.name, **pol.params())
            except (KeyError, ValueError, TypeError) as exc:
                msg = exc.args[0] if exc.args else str(exc)
                raise ScenarioError(f"{src}: {key}.policy: {msg}") from None
        cls = g.get("classes")
        if cls is not None:
            if not isinstance(cls, list) or not cls or not all(isinstance(x, str) for x in cls):
                raise ScenarioError(f"{src}: {key}.classes: expected a non-empty list of class names (got {cls!r})")
            bad = [x for x in cls if x not in classes]
            if bad:
                raise ScenarioError(f"{src}: {key}.classes: unknown class {bad[0]!r} "
                                    f"(expected one of {', '.join(sc.class_names)})")
            cls = tuple(cls)
        groups.append(GroupSpec(name, n, eng, pol, cls, gpus))
    partitioned = any(g.classes is not None for g in groups)
    r = c.get("router", "class_aware" if partitioned else "least_outstanding")
    if isinstance(r, str):
        rname, rparams = r, {}
    elif isinstance(r, dict) and isinstance(r.get("name"), str):
        rname, rparams = r["name"], {k: v for k, v in r.items() if k != "name"}
    else:
        raise ScenarioError(f"{src}: cluster.router: expected a router name or a table with 'name' (got {r!r})")
    from sim.cluster.routers import make_router
    try:
        router = make_router(rname, **rparams)
    except (KeyError, ValueError, TypeError) as exc:
        msg = exc.args[0] if exc.args else str(exc)
        raise ScenarioError(f"{src}: cluster.router: {msg}") from None
    if partitioned and not router.class_aware:
        raise ScenarioError(f"{src}: cluster.router: groups list 'classes', which only the class_aware "
                            f"router honours (got {rname!r})")
    spec = ClusterSpec(tuple(groups), rname, rparams)
    if router.class_aware:
        for cname in sc.class_names:
            if not _serving_groups(spec, cname):
                raise ScenarioError(f"{src}: cluster.groups: no group serves class {cname!r} (expected a "
                                    f"group listing it in 'classes', or a group without 'classes')")
    return spec


def _serving_groups(spec: ClusterSpec, cls: str) -> list[int]:
    """Groups that serve ``cls`` under static partitioning: those listing it, else the catch-alls."""
    listed = [i for i, g in enumerate(spec.groups) if g.classes is not None and cls in g.classes]
    return listed or [i for i, g in enumerate(spec.groups) if g.classes is None]


# ---- the replicas ---------------------------------------------------------------------------------
class Replica:
    """One replica: its engine and inbox; also the per-replica source its ``replica_loop`` reads
    and the view a router sees (``index``, ``group``, ``outstanding``, ``kv_used``)."""

    def __init__(self, index: int, group: str, engine, cluster: "_Cluster", trace) -> None:
        self.index = index
        self.group = group
        self.engine = engine
        self.cluster = cluster
        self.trace = trace
        self.inbox: deque = deque()
        self.routed = 0
        self._wake = None
        self.exited = False
        # closed-loop bound bookkeeping: the time of this replica's next boundary and whether a
        # request could end there (a run is in flight)
        self.next_boundary = 0
        self.in_flight = True
        self.on_run = self.record_run if cluster.closed else None  # replica_loop calls it
        # the run in flight when runs go past arrivals routed elsewhere (see ``hold``)
        self._plan = None
        self._start = 0
        self._durs: list[int] = []
        self._end = NEVER
        self._alloc_k = 1  # steps of the run whose blocks are allocated
        self._run_ev = None
        self._ends: list[int] | None = None
        self._early = False
        self._gone_ts: list[int] | None = None  # see ``_gone``
        self._gone_p = 0
        if cluster.fast:
            self.run_bound_ns = self._run_bound
            self.hold = self._hold

    def record_run(self, now_ns: int, durations: list[int]) -> None:
        """A run of steps starts at ``now_ns``: with closed-loop users, remember when it ends
        (the next boundary, where requests may end and send their next request)."""
        self.next_boundary = now_ns + sum(durations)
        self.in_flight = True

    # -- the router's view --
    @property
    def outstanding(self) -> int:
        e = self.engine
        n = len(e.running) + len(e.waiting) + len(self.inbox)
        # (read for every candidate at every arrival: ``_gone`` is called only when a run in
        # flight has members finishing inside it)
        return n - self._gone() if self._early and self._run_ev is not None else n

    @property
    def running(self) -> int:
        return len(self.engine.running) - self._gone()

    @property
    def waiting(self) -> int:
        return len(self.engine.waiting) + len(self.inbox)

    @property
    def kv_used(self) -> float:
        if self._run_ev is not None:
            self._allocate_through(self._steps_before(int(self.cluster.env.now)))
        p = self.engine.pool
        return (p.total - p.free) / p.total

    # -- runs that go past arrivals routed elsewhere --
    # Without this, every replica's run stops at every arrival anywhere in the cluster (its next
    # possible arrival). Instead a run is planned up to the replica's own next change and cut
    # short only when a request is routed here: it then ends where the stopped run would have,
    # at the end of the first step that does not start before the arrival. That is exact because
    # a fast-forwarded run cut anywhere equals stepping (the engine's guarantee), and because
    # what a router reads is what a stopped run would show: the running and waiting sets change
    # only at a run's end, except for decoders whose last token ends a step inside the run (runs
    # go on past them only when the router does not read KV use), which are not counted from
    # then on; the KV blocks a stopped run would hold by now are allocated when read.
    #: a run is planned at most until this many arrivals per replica have come anywhere (a
    #: request is likely routed here by then, which cuts the run; planning steps further ahead
    #: is wasted work). Where a run ends changes nothing in the results, only the work.
    LOOKAHEAD = 3

    def _run_bound(self) -> int:
        s = self.cluster.source
        j = s.i + self.LOOKAHEAD * len(self.cluster.replicas) - 1
        return s.arr_ns[j] if j < s.n_open else NEVER

    def _hold(self, now_ns: int, plan, durations: list[int]):
        self._plan, self._start, self._durs, self._alloc_k = plan, now_ns, durations, 1
        self._ends = None
        coh = self.engine.cohort
        # members finishing before the run's last step (only in runs that go on past them)
        self._early = bool(plan.cohort and coh is not None and coh.finish
                           and coh.finish[0][0] < coh.g + len(durations))
        self._gone_ts = None
        self._end = end = now_ns + sum(durations)
        # the event the loop waits on is itself scheduled at the run's end (one SimPy event a
        # run); a cut moves the waiting process to an earlier one (``_schedule_end``)
        ev = self._run_ev = simpy.Event(self.cluster.env)
        _trigger(ev, end - now_ns)
        return ev

    def _schedule_end(self, end_ns: int) -> None:
        """The run in flight now ends at ``end_ns`` (earlier than scheduled): a new event there
        takes over the old one's waiter; the old one stays in the queue with none."""
        self._end = end_ns
        old = self._run_ev
        ev = self._run_ev = simpy.Event(old.env)
        ev.callbacks, old.callbacks = old.callbacks, []
        _trigger(ev, end_ns - int(old.env.now))

    def held(self) -> list[int]:
        """The durations of the run that just ended (its blocks all allocated)."""
        self._allocate_through(len(self._durs))
        self._plan = self._run_ev = None
        return self._durs

    def _step_ends(self) -> list[int]:
        if self._ends is None:
            self._ends = list(accumulate(self._durs, initial=self._start))[1:]
        return self._ends

    def _steps_before(self, t_ns: int) -> int:
        """Steps of the run in flight that start before ``t_ns`` (at least the first)."""
        if t_ns >= self._end:
            return len(self._durs)
        return min(bisect_left(self._step_ends(), t_ns) + 1, len(self._durs))

    def _gone(self) -> int:
        """Running requests whose last token ended a step of the run in flight before now
        (applied when the run ends; a stopped run would have applied them already)."""
        if self._run_ev is None or not self._early:
            return 0
        ts = self._gone_ts
        if ts is None:
            # one entry per member finishing inside the run: the end of the step that gives its
            # last token (it is gone once the clock is past it). The clock only moves on and a
            # cut only drops steps that end after it, so a cursor into the list is enough.
            coh = self.engine.cohort
            ends = self._step_ends()
            ts = self._gone_ts = []
            for f, _, _ in coh.finish:
                j = f - coh.g - 1
                if j >= len(ends):
                    break
                ts.append(ends[j])
            self._gone_p = 0
        now = self.cluster.env.now
        p = self._gone_p
        while p < len(ts) and ts[p] < now:
            p += 1
        self._gone_p = p
        return p

    def _allocate_through(self, k: int) -> None:
        if k > self._alloc_k:
            self.engine.allocate_run(self._plan, k, self._alloc_k)
            self._alloc_k = k

    def cut(self, t_ns: int) -> None:
        """A request was routed here at ``t_ns``: the run in flight ends with the first step that
        does not start before it (its next boundary would have been there)."""
        if self._run_ev is None or t_ns >= self._end:
            return
        k = self._steps_before(t_ns)
        if k < len(self._durs):
            self._durs = self._durs[:k]
            if self._ends is not None:
                self._ends = self._ends[:k]
            self._schedule_end(self._start + sum(self._durs))

    # -- the source replica_loop reads --
    def pop_due(self, now_ns: int) -> list:
        self.cluster.route_until(now_ns)
        if not self.inbox:
            return []
        out = list(self.inbox)
        self.inbox.clear()
        return out

    def next_arrival_ns(self) -> int:
        cl = self.cluster
        t = cl.source.next_arrival_ns()
        if cl.closed:
            for o in cl.replicas:
                if o is not self and (o.in_flight or o.inbox) and o.next_boundary < t:
                    t = o.next_boundary
            # provisional: if nothing can run, replica_loop sleeps until exactly this
            e = self.engine
            self.next_boundary = min(t, e._next_change_ns, cl.stop_ns)
            self.in_flight = False
        return t

    def wakeup(self, until_ns: int):
        """Fires when the router pushes a request here, at the horizon, or when another replica
        exits (to re-check ``finished``). ``until_ns`` (the global next arrival) is not needed:
        an idle replica has nothing to do until something is routed to it."""
        env = self.cluster.env
        ev = env.event()
        self._wake = ev
        self.next_boundary = NEVER
        self.in_flight = False
        stop = self.cluster.stop_ns
        if stop < NEVER:
            env.timeout(max(stop - env.now, 0)).callbacks.append(lambda _e, ev=ev: self._fire(ev))
        return ev

    def _fire(self, ev) -> None:
        if not ev.triggered:
            self.next_boundary = self.cluster.env.now
            ev.succeed()

    def notify(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._fire(self._wake)

    def finished(self) -> bool:
        return self.cluster.finished()


def _trigger(ev: simpy.Event, delay: int, priority=simpy.core.NORMAL) -> None:
    """Schedule ``ev`` to succeed ``delay`` ns from now (one SimPy event, where a timeout
    followed by ``succeed`` is two)."""
    ev._ok = True
    ev._value = None
    ev.env.schedule(ev, priority, delay)


def _trigger_urgent(ev: simpy.Event, delay: int = 0) -> None:
    """Trigger ``ev`` ``delay`` ns from now with SimPy's URGENT priority: it is processed before
    the ordinary events of its instant. The router wakes this way, so it routes an instant's
    arrivals before any replica ends a step then, and what it reads does not depend on the order
    in which SimPy runs same-instant processes."""
    _trigger(ev, delay, simpy.core.URGENT)


class _Cluster:
    def __init__(self, env, source, replicas: list[Replica], router, candidates: list[list[Replica]],
                 stop_ns: int, closed: bool, fast: bool = False) -> None:
        self.env = env
        self.fast = fast
        self.source = source
        self.replicas = replicas
        self.router = router
        self.candidates = candidates  # per class index
        self.allowed = [{r.index for r in c} for c in candidates]
        self.stop_ns = stop_ns
        self.closed = closed
        self.assign: dict[int, int] = {}
        self._kick = None
        self._router_until = NEVER

    def route_until(self, now_ns: int) -> None:
        if now_ns > self.stop_ns:
            now_ns = self.stop_ns
        due = self.source.pop_due(now_ns)
        if not due:
            return
        router = self.router
        for req in due:
            cands = self.candidates[req.cls_idx]
            rep = router.route(req, cands, now_ns) if len(cands) > 1 else cands[0]
            if rep.index not in self.allowed[req.cls_idx]:
                raise RuntimeError(f"router {type(router).__name__} sent request {req.request_id} of class "
                                   f"{req.cls!r} to replica {rep.index}, not one of its candidates")
            rep.inbox.append(req)
            rep.cut(now_ns)
            rep.routed += 1
            self.assign[req.request_id] = rep.index
            rep.notify()

    def router_proc(self):
        env = self.env
        while True:
            now = env.now
            self.route_until(now)
            if now >= self.stop_ns:
                return
            t = min(self.source.next_arrival_ns(), self.stop_ns)
            if t >= NEVER and not self.closed:
                return
            k = self._kick = env.event()
            self._router_until = t
            if t < NEVER:
                if self.closed:
                    # a request ending may send one before t, and wake the router earlier
                    w = env.event()
                    w.callbacks.append(lambda _e, k=k: self._wake(k))
                    _trigger_urgent(w, t - now)
                else:  # open arrivals only: nothing can come before t
                    _trigger_urgent(k, t - now)
            yield k

    @staticmethod
    def _wake(k) -> None:
        if not k.triggered:
            _trigger_urgent(k)

    on_end = None  # the caller's hook (simulate_cluster's ``on_end``)

    def on_request_end(self, req, now_ns: int) -> None:
        if self.on_end is not None:
            self.on_end(req, now_ns)
        self.source.on_request_end(req, now_ns)
        k = self._kick
        if k is not None and not k.triggered and self.source.next_arrival_ns() < self._router_until:
            self._wake(k)

    def finished(self) -> bool:
        s = self.source
        if s.i < s.n_open or s.closed_heap:
            return False
        if any(r.inbox for r in self.replicas):
            return False
        if not self.closed:
            return True
        return not any(r.engine.running or r.engine.waiting for r in self.replicas)

    def replica_proc(self, rep: Replica, interval_ns: int, check_invariants: bool, on_boundary):
        yield from replica_loop(self.env, rep.engine, rep, self.stop_ns, interval_ns, check_invariants, on_boundary)
        rep.exited = True
        rep.next_boundary = NEVER
        rep.in_flight = False
        for o in self.replicas:
            o.notify()  # idle replicas re-check finished()


# ---- results --------------------------------------------------------------------------------------
@dataclass
class ClusterResults(Results):
    """Results of the whole cluster plus ``replicas`` (one Results each, index order), ``groups``
    (name -> Results over the group's replicas) and ``cluster`` (the layout)."""

    replicas: list = field(default_factory=list)
    groups: dict = field(default_factory=dict)
    cluster: dict = field(default_factory=dict)

    def replica_table(self) -> pd.DataFrame:
        """One row per replica: group, requests, TTFT p99 per class, output tokens/s, busy time."""
        return pd.DataFrame(self.summary_dict["cluster"]["replicas"])

    def group_table(self) -> pd.DataFrame:
        rows = []
        for name, g in self.summary_dict["cluster"]["groups"].items():
            for cname, m in g["classes"].items():
                if m["arrived"]:
                    rows.append({"group": name, "replicas": g["replicas"], "class": cname, "arrived": m["arrived"],
                                 "finished": m["finished"], "ttft_p99_s": m["ttft_p99_s"],
                                 "tpot_p99_s": m["tpot_p99_s"], "output_tokens_per_s": m["output_tokens_per_s"],
                                 "slo_attainment": m.get("slo_attainment")})
        return pd.DataFrame(rows)

    def save(self, out_dir: str | Path) -> Path:
        """The cluster's files, and each replica's and group's below them, atomically."""
        with atomic_dir(out_dir) as tmp:
            self.write_files(tmp)
            for i, r in enumerate(self.replicas):
                r.save(tmp / "replicas" / str(i))
            for name, r in self.groups.items():
                r.save(tmp / "groups" / name)
        return Path(out_dir)


def _same_run(scg: Scenario, sc: Scenario) -> bool:
    """Whether a group's scenario builds the same Results as the cluster's from the same
    replicas (everything ``Results.build`` reads but the resolved scenario itself)."""
    return scg.engine == sc.engine and scg.policy == sc.policy


def _sum_info(infos: list[dict], end_ns: int) -> dict:
    out = {k: sum(i[k] for i in infos) for k in ("engine_events", "iterations", "busy_s", "thrash_s",
                                                 "idle_with_work_s", "kv_blocks", "swap_blocks",
                                                 "prefix_evictions")}
    modes: dict[str, int] = {}
    for i in infos:
        for k, v in i["preemptions_by_mode"].items():
            modes[k] = modes.get(k, 0) + v
    out.update(end_s=end_ns / NS, preemptions_by_mode=modes, speculative=None, policy={})
    return out


# ---- the simulation -------------------------------------------------------------------------------
def simulate_cluster(scenario: Scenario, *, trace_iterations: bool = False, progress: bool | None = False,
                     load_scale: float = 1.0, check_invariants: bool = False,
                     per_replica: bool = True, fast: bool = True, workload=None,
                     on_end=None) -> ClusterResults:
    """Run ``scenario`` (which has a ``[cluster]`` table) and return a :class:`ClusterResults`.

    ``per_replica=False`` skips the per-replica and per-group Results (faster; the capacity
    search uses it). ``check_invariants`` checks every replica's KV conservation after every
    engine event. ``fast=False`` stops every replica's run at every arrival in the cluster (the
    plain way; same results, more engine events); with closed-loop users runs always stop there.
    ``workload``: the stream to serve, built by the caller (``sim.run.build_workload`` with the
    same ``load_scale``; it is not modified, so several runs may share it). ``on_end(request,
    ns)`` is told of every request that finishes or is rejected; an exception it raises ends the
    run and propagates.
    """
    from sim.cluster.routers import make_router
    from sim.core.source import RequestSource

    wall0, cpu0 = time.perf_counter(), time.process_time()
    sc = scenario
    spec = parse_cluster(sc)
    env = simpy.Environment()
    wl = build_workload(sc, load_scale) if workload is None else workload
    cls_idx = {c.name: i for i, c in enumerate(sc.classes)}
    g0 = spec.groups[0].engine  # the front-end latency of the first group's engine overhead
    fe_s = load_profile(g0.profile, Path(sc.base_dir), overhead=g0.overhead).overhead.frontend_s
    source = RequestSource(wl, cls_idx, [c.priority for c in sc.classes], delay_ns=round(fe_s * NS))
    closed_loop = bool(wl.closed)
    if workload is None:
        wl.open = None  # the source holds the stream in compact arrays; free the DataFrame
    horizon_ns = int(round(sc.horizon_s * NS))
    stop_ns = NEVER if sc.drain else horizon_ns
    router = make_router(spec.router, **spec.router_params)
    router.bind(spec.n_replicas, _seed_for(sc.seed, "router"))
    cl = _Cluster(env, source, [], router, [], stop_ns, closed=closed_loop, fast=fast and not closed_loop)
    cl.on_end = on_end
    group_sc: dict[str, Scenario] = {}
    group_of: list[int] = []
    for gi, g in enumerate(spec.groups):
        scg = sc.model_copy(update={"engine": g.engine, "policy": g.policy, "cluster": {}})
        group_sc[g.name] = scg
        costs = load_profile(g.engine.profile, Path(sc.base_dir), overhead=g.engine.overhead)
        for _ in range(g.replicas):
            i = len(cl.replicas)
            trace = [] if trace_iterations else None
            eng = build_engine(scg, env, costs, trace=trace, engine_cfg=g.engine, seed_tag=f"/replica{i}")
            eng.on_request_end = cl.on_request_end
            # runs may go on past decoders' last tokens (what a router reads is adjusted for
            # them, except KV use, which they would release)
            eng.through_finishes = cl.fast and not getattr(router, "reads_kv", True)
            rep = Replica(i, g.name, eng, cl, trace)
            cl.replicas.append(rep)
            group_of.append(gi)
    if router.class_aware:
        for c in sc.class_names:
            gs = set(_serving_groups(spec, c))
            cl.candidates.append([r for r, gi in zip(cl.replicas, group_of) if gi in gs])
    else:
        cl.candidates = [list(cl.replicas) for _ in sc.class_names]
    cl.allowed = [{r.index for r in c} for c in cl.candidates]

    bar, on_boundary = sim_seconds_bar(progress, sc.horizon_s, f"{sc.name} x{len(cl.replicas)}")
    interval_ns = int(round(sc.engine.timeseries_interval_s * NS))
    env.process(cl.router_proc())
    for rep in cl.replicas:
        env.process(cl.replica_proc(rep, interval_ns, check_invariants, on_boundary))
    run_to_end(env, bar)
    end_ns = int(env.now)
    for rep in cl.replicas:
        # requests routed but never taken in (a replica that stopped at the horizon) too
        rep.engine.close(end_ns, also=rep.inbox)
        rep.inbox.clear()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    infos = [engine_run_info(rep.engine, end_ns) for rep in cl.replicas]

    def build(scx, reps, info, trace=None) -> Results:
        costs = reps[0].engine.costs
        tel = reps[0].engine.tel if len(reps) == 1 else Telemetry.merged(
            [r.engine.tel for r in reps], sc.class_names, interval_ns, costs, scx.engine.block_size)
        info = {**info, "wall_s": wall, "cpu_s": cpu, "workload": wl.meta}
        return Results.build(scx, costs, tel, info, trace)

    rep_res: list[Results] = []
    grp_res: dict[str, Results] = {}
    if per_replica:
        for rep, info in zip(cl.replicas, infos):
            r = build(group_sc[rep.group], [rep], info, rep.trace)
            r.requests.insert(1, "replica", rep.index)
            if r.iterations is not None:
                r.iterations.insert(0, "replica", rep.index)
            rep_res.append(r)
        for g in spec.groups:
            reps = [r for r in cl.replicas if r.group == g.name]
            if len(reps) == len(cl.replicas) and _same_run(group_sc[g.name], sc):
                continue  # one group of every replica: its Results are the cluster's (below)
            grp_res[g.name] = build(group_sc[g.name], reps, _sum_info([infos[r.index] for r in reps], end_ns))
    comb = build(sc, cl.replicas, _sum_info(infos, end_ns))
    if per_replica and len(grp_res) < len(spec.groups):
        g = spec.groups[0]  # the only group: a copy, before the cluster's columns are added
        grp_res[g.name] = Results(comb.requests.copy(), comb.summary.copy(), comb.timeseries.copy(),
                                  copy.deepcopy(comb.summary_dict), group_sc[g.name].to_dict(), None,
                                  dict(comb.manifest))
    req = comb.requests
    rep_col = req["request_id"].map(cl.assign)
    req.insert(1, "replica", rep_col.astype("int64"))
    req.insert(2, "group", [cl.replicas[i].group for i in req["replica"]])
    if per_replica and trace_iterations:
        its = [r.iterations for r in rep_res if r.iterations is not None]
        comb.iterations = pd.concat(its, ignore_index=True) if its else None
    layout = {
        "router": spec.router, "router_params": spec.router_params, "replicas_total": spec.n_replicas,
        "gpus_total": spec.gpus,
        "groups": {}, "replicas": [],
    }
    for g in spec.groups:
        reps = [r for r in cl.replicas if r.group == g.name]
        entry = {"replicas": g.replicas, "gpus_per_replica": g.gpus, "classes": list(g.classes) if g.classes else None,
                 "first_replica": reps[0].index, "busy_s": sum(infos[r.index]["busy_s"] for r in reps)}
        if g.name in grp_res:
            sd = grp_res[g.name].summary_dict
            entry["classes"] = {k: {kk: vv for kk, vv in v.items() if not isinstance(vv, dict)}
                                for k, v in sd["classes"].items()}
            entry["served_classes"] = list(g.classes) if g.classes else None
            entry["overall"] = {k: v for k, v in sd["overall"].items() if not isinstance(v, dict)}
        layout["groups"][g.name] = entry
    span = max(end_ns / NS, 1e-9)
    for rep, info in zip(cl.replicas, infos):
        row = {"replica": rep.index, "group": rep.group, "routed": rep.routed, "busy_s": info["busy_s"],
               "utilisation": info["busy_s"] / span, "engine_events": info["engine_events"],
               "kv_blocks": info["kv_blocks"]}
        if per_replica:
            s = rep_res[rep.index].summary_dict
            row["finished"] = s["overall"]["finished"]
            row["output_tokens_per_s"] = s["overall"]["output_tokens_per_s"]
            for cname, m in s["classes"].items():
                row[f"ttft_p99_s[{cname}]"] = m["ttft_p99_s"]
        layout["replicas"].append(row)
    layout["router_report"] = router.report()
    comb.summary_dict["cluster"] = layout
    comb.manifest["cluster"] = {"router": spec.router, "replicas": spec.n_replicas}
    return ClusterResults(comb.requests, comb.summary, comb.timeseries, comb.summary_dict, comb.scenario,
                          comb.iterations, comb.manifest, replicas=rep_res, groups=grp_res, cluster=layout)


def cluster_json(res: ClusterResults) -> str:
    return json.dumps(res.cluster, indent=1, default=str)
