"""A cluster of replicas behind a router, sharing one SimPy clock.

The scenario's ``[cluster]``: N replicas (or several replica groups with their own engine
settings, policy and served classes), each an ordinary :class:`~sim.core.engine.Engine` driven by
:func:`sim.core.loop.replica_loop`, behind a router (:mod:`sim.cluster.routers`). This module is
the machinery (:class:`Replica`, the router process); :func:`sim.cluster.simulate_cluster`
assembles and runs it, :mod:`sim.cluster.results` reports it.

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
"""
from __future__ import annotations

from bisect import bisect_left
from collections import deque
from itertools import accumulate

import simpy

from sim.core.costs import NEVER
from sim.core.loop import replica_loop


# ---- the replicas ---------------------------------------------------------------------------------
class Replica:
    """One replica: its engine and inbox; also the per-replica source its ``replica_loop`` reads
    and the view a router reads (:class:`policies.contracts.ReplicaView`: ``index``, ``group``,
    ``outstanding``, ``running``, ``waiting``, ``kv_used``, ``waiting_by_class``; a router is
    typed against that view and reads nothing else)."""

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

    # -- the router's view (policies.contracts.ReplicaView) --
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

    @property
    def waiting_by_class(self) -> dict[str, int]:
        """Waiting requests (queued here or routed here, not yet taken in) per class name."""
        counts = {c.name: 0 for c in self.engine.classes}
        for _, _, r in self.engine.waiting:
            counts[r.cls] += 1
        for r in self.inbox:
            counts[r.cls] += 1
        return counts

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
                           and coh.finish[0][0] < coh.steps + len(durations))
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
                j = f - coh.steps - 1
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
            self.next_boundary = min(t, e.next_change_ns, cl.stop_ns)
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
    followed by ``succeed`` is two). It sets what ``Event.succeed`` sets, as SimPy's own
    ``Timeout.__init__`` does, and schedules with the delay that ``succeed`` lacks."""
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
