"""A cluster of replicas behind a router, sharing one SimPy clock.

The scenario's ``[cluster]``: N replicas (or several replica groups with their own engine
settings, policy and served classes), each an ordinary :class:`~sim.core.engine.Engine` driven by
:func:`sim.core.loop.replica_loop`, behind a router (:mod:`sim.routers`). This module is
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
from heapq import heappop, heappush
from typing import Any, Callable, ClassVar

import simpy

from sim.core.costs import NEVER
from sim.core.engine import Engine
from sim.core.fastforward import OpenRun, allocate_run
from sim.core.loop import replica_loop
from sim.core.planner import admit_alone
from sim.core.simpy_adapter import (armed, call_at, clock_ns, drop_dead_events, hand_over, next_event_ns, rearm,
                                    trigger, trigger_urgent)
from sim.routers import counts_router


# ---- the replicas ---------------------------------------------------------------------------------
class Replica:
    """One replica: its engine and inbox; also the per-replica source its ``replica_loop`` reads
    and the view a router reads (:class:`policies.contracts.ReplicaView`: ``index``, ``group``,
    ``outstanding``, ``running``, ``waiting``, ``kv_used``, ``waiting_by_class``; a router is
    typed against that view and reads nothing else)."""

    def __init__(self, index: int, group: str, engine: Engine, cluster: "_Cluster", trace) -> None:
        self.index = index
        self.group = group
        self.engine = engine
        self.cluster = cluster
        self.trace = trace
        self.inbox: deque = deque()
        self.routed = 0
        self._wake: simpy.Event | None = None
        self._stop_armed = False  # the horizon's wake-up is in SimPy's queue (``_stop_alarm``)
        self.exited = False
        # closed-loop bound bookkeeping: the time of this replica's next boundary and whether a
        # request could end there (a run is in flight)
        self.next_boundary = 0
        self.in_flight = True
        self.on_run = self.record_run if cluster.closed else None  # replica_loop calls it
        # the run in flight when runs go past arrivals routed elsewhere (see ``hold``)
        self._plan: Any = None
        self._run: OpenRun | None = None  # while it may be priced further (not cut)
        self._start = 0
        self._durs: list[int] = []
        self._end = NEVER  # when the run in flight ends; NEVER while that is not known yet
        self._bound = NEVER  # the run is priced through the steps that start before this
        self._alloc_k = 1  # steps of the run whose blocks are allocated
        self._run_ev: simpy.Event | None = None
        self._spare: simpy.Event | None = None  # the last run's end event, processed: the next run's (``_hold``)
        self._ends: list[int] = []  # when each step of ``_durs`` ends
        # requests that joined the run in flight (``join``): (request, boundary ns, step, the
        # run's k before), in order; and that run (kept after it is priced to its end or cut)
        self._joins: list[tuple[Any, int, int, int]] = []
        self._open: OpenRun | None = None
        self._join_blocks = 0
        self.joinable = False  # may a request routed here join its runs (``_Cluster.routing_ready``)
        # The router's view, kept up to date by the cluster (``_Cluster.refresh_views``) rather
        # than recounted for every candidate at every arrival: ``outstanding`` is ``_base``
        # (running + waiting + routed here, counted when the replica last changed, plus what
        # was routed here since) less the members of the run in flight whose last token ended
        # a step before now (``_gone_p`` of them, a cursor into the run's ``gone_ns``; the next
        # such instant, ``_next_gone``, waits in the cluster's heap).
        self.outstanding = 0
        self._outs = cluster.outs  # (every replica's ``outstanding``, by index: kept alike)
        self._base = 0
        self._dirty = False  # the replica changed since its view was counted
        self._gone_ns: list[int] = []  # the run in flight's (``OpenRun.gone_ns``)
        self._gone_p = 0
        self._next_gone = NEVER
        # told when the replica's process goes idle (the fleet's: a draining replica leaves then)
        self.on_idle: Callable[[Any], None] | None = None
        if cluster.fast:
            self.hold = self._hold

    def record_run(self, now_ns: int, durations: list[int]) -> None:
        """A run of steps starts at ``now_ns``: with closed-loop users, remember when it ends
        (the next boundary, where requests may end and send their next request)."""
        self.next_boundary = now_ns + sum(durations)
        self.in_flight = True

    # -- the router's view (policies.contracts.ReplicaView) --
    # ``outstanding`` is a plain attribute (above), exact whenever a router runs.
    # (read at the routing instant, ``route_ns``: the router may route ahead of the clock)
    @property
    def running(self) -> int:
        self._count(self.cluster.route_ns)
        return len(self.engine.queues.running) - self._gone_p

    @property
    def waiting(self) -> int:
        return len(self.engine.queues.waiting) + len(self.inbox)

    @property
    def kv_used(self) -> float:
        if self._run_ev is not None:
            self._allocate_through(self._steps_before(self.cluster.route_ns))
        p = self.engine.pool
        return (p.total - p.free) / p.total

    @property
    def waiting_by_class(self) -> dict[str, int]:
        """Waiting requests (queued here or routed here, not yet taken in) per class name."""
        e = self.engine
        counts = {c.name: n for c, n in zip(e.classes, e.queues.waiting_count)}  # (kept by the engine)
        for r in self.inbox:
            counts[r.cls] += 1
        return counts

    def _count(self, now_ns: int) -> None:
        """Bring ``outstanding`` up to ``now_ns``."""
        if self._dirty:
            e = self.engine
            self._dirty = False
            self._base = len(e.queues.running) + len(e.queues.waiting) + len(self.inbox)
            self._gone_p = 0
        self._pass_gone(now_ns)

    def _pass_gone(self, now_ns: int) -> None:
        """Move the cursor past the run's members whose last token ended a step before
        ``now_ns`` (applied when the run ends; a stopped run would have applied them already)
        and put the next such instant into the cluster's heap."""
        p = self._gone_p
        nxt = NEVER
        ts = self._gone_ns
        if p < len(ts) and self._run_ev is not None:
            # (after a cut, instants past the run's new end stay listed: they are never before
            # now while it is in flight, and the replica is recounted when it ends)
            while p < len(ts):
                t = ts[p]
                if t >= now_ns:
                    nxt = t
                    break
                p += 1
        self._gone_p = p
        self.outstanding = self._outs[self.index] = self._base - p
        if nxt != self._next_gone:
            self._next_gone = nxt
            if nxt < NEVER:
                cl = self.cluster
                heappush(cl.gone, (nxt << cl.shift) | self.index)

    # -- runs that go past arrivals routed elsewhere --
    # Without this, every replica's run stops at every arrival anywhere in the cluster (its next
    # possible arrival). Instead a run is bounded by the replica's own next change and cut
    # short only when a request is routed here: it then ends where the stopped run would have,
    # at the end of the first step that does not start before the arrival. That is exact because
    # a fast-forwarded run cut anywhere equals stepping (the engine's guarantee), and because
    # what a router reads is what a stopped run would show: the running and waiting sets change
    # only at a run's end, except for decoders whose last token ends a step inside the run (runs
    # go on past them only when the router does not read KV use), which are not counted from
    # then on; the KV blocks a stopped run would hold by now are allocated when read.
    # A run is priced a stretch at a time (``OpenRun``): as far as the next LOOKAHEAD arrivals
    # per replica anywhere (a request is likely routed here by then, which cuts the run; pricing
    # steps further ahead would be wasted work), and on from there when the router reaches that
    # arrival without a cut (``_Cluster.price_on``). Where a stretch ends changes nothing in the
    # results. The event the replica's process waits on is scheduled once the run's end is
    # known: when a cut ends it, or when it is priced to its end. (A router reads the run only
    # at arrival instants, never past the arrival its stretch reaches, and the steps that start
    # before an instant are what a cut or a view needs there.) So a run costs one SimPy event,
    # with no event per stretch, and a cut leaves one in the queue only for a run that was
    # priced to its end (``_schedule_end``).
    LOOKAHEAD: ClassVar[float] = 1  # (a class attribute: the compiled build keeps it one)

    def _hold(self, now_ns: int, plan, dur0: int, run: OpenRun | None):
        self._plan, self._start, self._alloc_k, self._run, self._open = plan, now_ns, 1, run, run
        self._join_blocks = 0  # the prompts' blocks of the requests that joined it
        # (the view is recounted before the next routing: ``pop_due`` marked the replica)
        # the event the loop waits on is itself scheduled at the run's end (one SimPy event a
        # run), once that is known
        # (the spare re-armed as a new event: it has fired and left the queue; cheaper than a new one)
        ev = self._run_ev = armed(self.cluster.env, self._spare, [])
        self._spare = None
        if run is not None:
            # (the same lists: a stretch appends to them, a cut truncates them)
            self._durs, self._ends, self._gone_ns = run.durs, run.ends, run.gone_ns
            self._price()
        else:
            self._durs, self._ends, self._gone_ns = [dur0], [now_ns + dur0], []
            self._end = now_ns + dur0
            trigger(ev, dur0)
        return ev

    def _price(self) -> None:
        """Price the run in flight on to its next bound (from its last bound, or its start),
        and schedule its end if that is now known, else come back at the bound. The bound: when
        the router routes the open arrival ``ahead`` after the next (NEVER if none)."""
        run = self._run
        ev = self._run_ev
        assert run is not None and ev is not None  # (a run in flight, priced on)
        cl = self.cluster
        s = cl.source
        j = s.i + cl.ahead
        bound = s.vis_ns[j] if j < s.n_open else NEVER
        run.extend(bound)
        if run.done:
            self._run = None
            self._end = end = self._ends[-1]
            trigger(ev, end - clock_ns(cl.env))  # (the clock: the router may price ahead of it)
        else:
            self._end = NEVER
            self._bound = bound
            heappush(cl.pricing, (bound << cl.shift) | self.index)

    def _schedule_end(self, end_ns: int) -> None:
        """The run in flight now ends at ``end_ns`` (earlier than scheduled): a new event there
        takes over the old one's waiter; the old one stays in the queue with none (a dead event:
        ``next_event_ns`` and, once every replica has exited, ``drop_dead_events`` drop it)."""
        self._end = end_ns
        ev = self._renew_event()
        trigger(ev, end_ns - clock_ns(ev.env))

    def _renew_event(self) -> simpy.Event:
        """A new event for the run in flight, taking over the old one's waiter (the old one, if
        scheduled, stays in the queue with none: a dead event)."""
        old = self._run_ev
        assert old is not None  # (a run in flight)
        ev = self._run_ev = hand_over(old)
        return ev

    def held(self) -> list[int]:
        """The durations of the run that just ended (its blocks all allocated; the requests that
        joined it admitted, each at its boundary, and in its plan from its step on)."""
        if self._joins:
            for req, b_ns, j, _ in self._joins:
                s = admit_alone(self.engine, req, b_ns)
                s.at = j
                self._plan.items.append(s)
            # (waiting from their arrival: in the samples before the run, where a front end
            # held them back past its start)
            self.engine.tel.taken_in([x[0] for x in self._joins])
            self._joins = []
        self._allocate_through(len(self._durs))
        self._spare = self._run_ev  # (it just fired: ``_schedule_end``'s replaced ones never do)
        self._plan = self._run_ev = self._run = self._open = None
        return self._durs

    # -- requests that join a run in flight --
    # A request routed to a replica whose run is in flight is admitted at the run's next boundary
    # b (the end of the first step that does not start before it): the run ends there, the plan at
    # b admits it, and a new run starts. Where nothing else can happen at b, the request joins
    # the run instead (``OpenRun.join``): the run prices the step at b as that plan's (its whole
    # prompt beside the decoders) and goes on with it as the new run would, and the replica takes
    # it in when the run ends (``held``), as the plan at b would have. Nothing else can happen at
    # b when: nobody waits or was routed here since the run started (the plan at b would admit it
    # alone), its prompt fits the step's budget, a slot and the KV blocks however the run goes
    # (counted with an upper bound of every request's blocks to the run's end, so no block limit
    # binds either way), it answers with two tokens or more (a first token that is also the last
    # ends it in its admission step), b is before the run's limit (no time-series sample, horizon
    # or policy change there), and the engine's plan has nothing else to decide: a fixed ranking,
    # no admission gate, policy books, speculation, prefix cache, KV reservations, prefill caps or
    # overlap scheduling (``_Cluster.routing_ready``). Routers must choose from the counts alone
    # (a ``route_counts``: ``outstanding`` counts the request from its routing, while the runs'
    # other views would show the replica as it is before the run ends). If another request is routed here at or
    # before b, the join is undone (``undo_join``): both are taken in by the plan at b.
    JOIN: ClassVar[bool] = True  # (a switch for the tests: False cuts every run as before)

    def join(self, req, t_ns: int) -> bool:
        """Let ``req``, routed here at ``t_ns``, join the run in flight if that is exact (above);
        False when it must wait for the run's next boundary as usual."""
        run = self._open
        e = self.engine
        if run is None or t_ns >= self._end or self.inbox or e.queues.waiting or run.chunking:
            return False  # (a chunking prefill would share the step at b with it)
        if req.computed or req.generated or req.hidden_output_tokens < 2:
            return False  # (a first token that is also the last ends it in its admission step)
        ends = self._ends
        j = bisect_left(ends, t_ns) + 1  # the steps up to the first that does not end before t
        b = ends[j - 1]
        if b >= run.limit:
            return False
        n = req.tokens  # its prompt, all in the step at b (one token would be priced as a decode)
        if n < 2:
            return False
        lim = e.limits
        running = len(e.queues.running) + len(self._joins)  # (an upper bound of those running at b)
        if running >= lim.max_num_seqs or n > lim.max_batched_tokens - running or n > lim.chunk_cap:
            return False
        if e.size_refusal(req.prompt_tokens, req.max_tokens, req.priority):
            return False  # (rejected at its arrival)
        pool, bs = e.pool, e.bs
        k = max(run.k, j + req.hidden_output_tokens)
        prefill = self._join_blocks + pool.blocks_for(n)
        if prefill + (running + 1) * ((k + bs - 1) // bs + 1) + lim.watermark_blocks > run.avail:
            return False
        self._join_blocks = prefill
        self._joins.append((req, b, j, run.k))
        run.join(j, req)
        ev = self._run_ev
        assert ev is not None
        if ev.triggered:  # (its end was scheduled there: the run now goes past it)
            self._renew_event()
        self._run = run
        self._end = NEVER
        self._price()
        self._pass_gone(self.cluster.route_ns)
        return True

    def undo_join(self) -> None:
        """Another request was routed here at or before the last join's boundary: that joiner
        goes to the inbox (both are taken in by the plan there) and the run ends at the boundary."""
        req, b_ns, _, k = self._joins.pop()
        run = self._open
        assert run is not None
        self.cut(b_ns)  # (the run ends at that boundary, as any request routed here makes it)
        run.unjoin(k)  # (and its pricing forgets the joiner)
        self._join_blocks -= self.engine.pool.blocks_for(req.tokens)
        self.inbox.append(req)
        self._pass_gone(self.cluster.route_ns)

    def _steps_before(self, t_ns: int) -> int:
        """Steps of the run in flight that start before ``t_ns`` (at least the first)."""
        if t_ns >= self._end:
            return len(self._durs)
        return bisect_left(self._ends, t_ns) + 1

    def _allocate_through(self, k: int) -> None:
        if k > self._alloc_k:
            allocate_run(self.engine, self._plan, k, self._alloc_k)
            self._alloc_k = k

    def cut(self, t_ns: int) -> None:
        """A request was routed here at ``t_ns``: the run in flight ends with the first step that
        does not start before it (its next boundary would have been there)."""
        ev = self._run_ev
        if ev is None:
            return
        self._run = None  # priced no further
        if t_ns >= self._end:
            return
        # (t_ns < the run's end: the steps up to the first that ends at or after it; they are
        # priced, as every step that starts before the run's bound, and t_ns <= the bound)
        ends = self._ends
        k = bisect_left(ends, t_ns) + 1
        if self._end >= NEVER:  # (its end was not known: schedule it now)
            if k < len(ends):
                del self._durs[k:]
                del ends[k:]
            self._end = end = ends[-1]
            trigger(ev, end - clock_ns(self.cluster.env))
        elif k < len(ends):
            del self._durs[k:]
            del ends[k:]
            self._schedule_end(ends[-1])

    # -- the source replica_loop reads --
    def pop_due(self, now_ns: int) -> list:
        # The replica's process runs (its engine may change): recount its view before the next
        # routing decision. (Only its own process changes its engine, and every step of that
        # process passes through here.)
        cl = self.cluster
        if not self._dirty:
            self._dirty = True
            cl.dirty.append(self)
        # (with open arrivals only, the router has always routed this instant's arrivals first:
        # it wakes before any replica at an arrival instant; the check skips the call then)
        if cl.closed or cl.next_open_ns <= now_ns:
            cl.route_until(now_ns)
            if not self._dirty:  # (routing just counted it; it goes on changing: admissions, rejections)
                self._dirty = True
                cl.dirty.append(self)
        if not self.inbox:
            return []
        out = list(self.inbox)
        self.inbox.clear()
        return out

    def next_arrival_ns(self) -> int:
        cl = self.cluster
        t = cl.source.next_arrival_ns()
        if cl.tick_ns < t:
            q = self.engine.queues
            if q.running or q.waiting:
                # an autoscaler's tick: a run stops there as at an arrival, so the state it
                # reads (KV blocks allocated through the step in flight) is what stepping shows
                t = cl.tick_ns
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
        if self.on_idle is not None:
            self.on_idle(self)
        env = self.cluster.env
        ev = env.event()
        self._wake = ev
        self.next_boundary = NEVER
        self.in_flight = False
        self._stop_alarm()
        return ev

    def _stop_alarm(self) -> None:
        """One event at the horizon wakes the replica if it sleeps then (armed at its first
        sleep, not at every one: a replica that sleeps between most requests would leave one
        timeout per sleep in SimPy's queue, to fire in vain at the horizon)."""
        if not self._stop_armed and self.cluster.stop_ns < NEVER:
            self._stop_armed = True
            call_at(self.cluster.env, self.cluster.stop_ns, self._at_stop)

    def _at_stop(self, _ev) -> None:
        if self._wake is not None:
            self._fire(self._wake)

    def _fire(self, ev, delay_ns: int = 0) -> None:
        """Wake the replica ``delay_ns`` from now (later than now when the router routes ahead)."""
        if self._wake is ev:
            self._wake = None  # (fired: ``notify`` has nothing to do until the next ``wakeup``)
        if not ev.triggered:
            self.next_boundary = clock_ns(self.cluster.env) + delay_ns
            trigger(ev, delay_ns)  # (``ev.succeed()`` with a delay)

    def notify(self, now_ns: int | None = None) -> None:
        """A request was routed here at ``now_ns`` (default: now): wake the replica then if it sleeps."""
        if self._wake is not None:
            self._fire(self._wake, 0 if now_ns is None else now_ns - clock_ns(self.cluster.env))

    def finished(self) -> bool:
        return self.cluster.finished()


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
        # every replica's ``outstanding`` by index, for a router that chooses from those counts
        # alone (``routers.counts_router``); ``by_counts[c]``: whether requests of class c are
        # routed so (their candidates are every replica, in order). Set by ``routing_ready``.
        self.outs: list[int] = []
        self.by_counts: list[bool] = []
        self.route_counts: Callable[[list[int]], int] | None = None
        # the routers' views: replicas changed since counted, and (instant, version, replica)
        # of the next member finishing inside a replica's run (``Replica._pass_gone``)
        self.dirty: list[Replica] = []
        self.ahead = 0  # a run is priced up to the arrival this many after the next (``Replica._price``)
        # Two heaps of (instant, replica) as one int each, ``instant << shift | replica`` (cheaper
        # to push, pop and compare than tuples; set by ``routing_ready``): runs priced up to an
        # arrival instant, and each replica's next member finishing inside its run (an entry is
        # current while it is the replica's ``_bound`` / ``_next_gone``; one left over from an
        # earlier run that happens to be equal only repeats a call that then does nothing).
        self.shift = 0
        self.pricing: list[int] = []
        self.gone: list[int] = []
        # open arrivals only: the source's next arrival, kept by ``route_until`` (only routing
        # pops the source, and with no closed-loop users nothing else changes its next arrival)
        self.next_open_ns = 0
        self._kick: simpy.Event | None = None
        self._router_until = NEVER
        self.route_ns = 0  # the instant the router routes at (the clock's, or later: ``_route_open``)
        self.on_all_exited: Callable[[], None] | None = None  # (the fleet's: no more ticks)
        self.tick_ns = NEVER  # the next autoscaler tick (``sim.cluster.autoscale``; NEVER: none)

    def route_until(self, now_ns: int) -> None:
        """Route the arrivals due at ``now_ns``: the clock's instant, or a later one at which
        ``_route_open`` routes ahead of the clock (nothing else happens before it)."""
        view_ns = now_ns
        if now_ns > self.stop_ns:
            now_ns = self.stop_ns
        due = self.source.pop_due(now_ns)
        if not due:
            return
        self.route_ns = view_ns
        if not self.closed:
            self.next_open_ns = self.source.next_arrival_ns()
        gone = self.gone
        if self.dirty or (gone and gone[0] < view_ns << self.shift):  # (often nothing changed since the last arrival)
            self.refresh_views(view_ns)
        router = self.router
        outs, by_counts, route_counts = self.outs, self.by_counts, self.route_counts
        for req in due:
            ci = req.cls_idx
            if by_counts[ci]:
                i = route_counts(outs)  # type: ignore[misc]  # (set wherever by_counts is: routing_ready)
                rep = self.replicas[i]
            else:
                cands = self.candidates[ci]
                rep = router.route(req, cands, now_ns) if len(cands) > 1 else cands[0]
                i = rep.index
                if i not in self.allowed[ci]:
                    raise RuntimeError(f"router {type(router).__name__} sent request {req.request_id} of class "
                                       f"{req.cls!r} to replica {i}, not one of its candidates")
            rep._base += 1
            rep.outstanding += 1
            outs[i] += 1
            if rep._joins and rep._joins[-1][1] >= now_ns:
                rep.undo_join()  # (both are taken in at that boundary)
            if not (rep.joinable and rep.join(req, now_ns)):
                rep.inbox.append(req)
                rep.cut(now_ns)
            rep.routed += 1
            self.assign[req.request_id] = rep.index
            if rep._wake is not None:  # (it sleeps: seldom, under load)
                rep.notify(view_ns)

    def routing_ready(self) -> None:
        """The replicas and each class's candidates are final: set up routing by counts."""
        self.outs[:] = [r.outstanding for r in self.replicas]
        self.shift = max(len(self.replicas) - 1, 1).bit_length()
        self.route_counts = counts_router(self.router)
        self.by_counts = [self.route_counts is not None and len(c) > 1 and c == self.replicas
                          for c in self.candidates]
        # requests may join runs in flight (``Replica.join``) where routing reads nothing else
        # and the engine's plan at a boundary would only admit them
        counts_only = bool(self.by_counts) and all(self.by_counts) and self.fast and not self.closed
        for r in self.replicas:
            e = r.engine
            pol = e.policy
            r.joinable = (counts_only and Replica.JOIN and e.cohort is not None and pol.static_ranking
                          and pol.on_scheduled is None and pol.on_arrival is None and e.spec is None
                          and e.trace is None and e.gate is None and pol.own_queues is None and e.pool.plain
                          and e.grows_blocks and not e.limits.counting_prefill and e.through_finishes
                          and e.cfg.fast_forward and e.costs.overhead.overlap_schedule != 1
                          and not e.limits.prefill_first  # (a joiner prefills beside the decoders)
                          and e.reserve is None)  # (SGLang's estimate: its ratio counts decode steps)

    def refresh_views(self, now_ns: int) -> None:
        """Bring every replica's ``outstanding`` up to ``now_ns``: recount those that changed,
        and pass members that finished inside runs in flight."""
        dirty = self.dirty
        if dirty:
            for r in dirty:
                if r._dirty:
                    r._count(now_ns)
            dirty.clear()
        heap = self.gone
        shift = self.shift
        lim = now_ns << shift  # (entries of instants before now_ns)
        while heap and heap[0] < lim:
            x = heappop(heap)
            r = self.replicas[x & ((1 << shift) - 1)]
            if r._next_gone == x >> shift:
                r._pass_gone(now_ns)

    def price_on(self, now_ns: int) -> None:
        """Price on the runs in flight whose stretch reaches this arrival instant (after its
        arrivals were routed: a run cut now needs no more steps)."""
        heap = self.pricing
        shift = self.shift
        lim = (now_ns + 1) << shift  # (entries of instants up to now_ns)
        while heap and heap[0] < lim:
            x = heappop(heap)
            r = self.replicas[x & ((1 << shift) - 1)]
            if r._run is not None and r._bound == x >> shift:  # (else cut, or an older run's entry)
                r._price()
                if r._next_gone >= NEVER and not r._dirty:
                    r._pass_gone(now_ns)  # a member may finish in the new steps

    def start_router(self) -> None:
        """Route each arrival at its instant: with closed-loop users a process (a request ending
        may wake it early); with open arrivals only a callback of one event per arrival instant,
        or fewer (``_route_open``: the same order of events, without resuming a process)."""
        if self.closed:
            self.env.process(self.router_proc())
        else:
            self.next_open_ns = self.source.next_arrival_ns()
            ev = self.env.event()
            ev.callbacks.append(self._route_open)
            trigger_urgent(ev)

    def _route_open(self, ev) -> None:
        """Open arrivals only (nothing can come before the next one): route what is due now, and
        come back at the next arrival (as ``router_proc`` does); or route that arrival at once
        when no other event comes before it.

        Routing ahead is exact: nothing runs between now and the next arrival, so what the
        router reads then is what it reads now, brought to that instant (the views are counted
        at the routing instant, ``route_ns``), and what it schedules (a cut run's end, a
        replica's wakeup) it schedules at the same instants, in the same order, as the router
        event at that arrival would. It saves an event per arrival routed ahead. (A held run whose
        end is not scheduled yet ends at or after the arrival its stretch reaches, where this
        loop prices it on: ``price_on``.)"""
        env = self.env
        now = clock_ns(env)
        stop = self.stop_ns
        while True:
            self.route_until(now)
            if self.pricing and self.pricing[0] < (now + 1) << self.shift:
                self.price_on(now)
            if now >= stop:
                return
            t = min(self.next_open_ns, stop)
            if t >= NEVER:
                return
            if t >= next_event_ns(env):
                break
            now = t
        # (the event that called this, re-armed: it has fired and left the queue)
        rearm(ev, [self._route_open])
        trigger_urgent(ev, t - clock_ns(env))

    def router_proc(self):
        env = self.env
        while True:
            now = clock_ns(env)
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
                    trigger_urgent(w, t - now)
                else:  # open arrivals only: nothing can come before t
                    trigger_urgent(k, t - now)
            yield k

    @staticmethod
    def _wake(k) -> None:
        if not k.triggered:
            trigger_urgent(k)

    on_end: Callable[[Any, int], None] | None = None  # the caller's hook (simulate_cluster's ``on_end``)

    def on_request_end(self, req, now_ns: int) -> None:
        if self.on_end is not None:
            self.on_end(req, now_ns)
        self.source.on_request_end(req, now_ns)
        k = self._kick
        if k is not None and not k.triggered and self.source.next_arrival_ns() < self._router_until:
            self._wake(k)

    def finished(self) -> bool:
        s = self.source
        if s.i < s.n_open or s.closed_pending:
            return False
        if any(r.inbox for r in self.replicas):
            return False
        if not self.closed:
            return True
        return not any(r.engine.queues.running or r.engine.queues.waiting for r in self.replicas)

    def replica_proc(self, rep: Replica, interval_ns: int, check_invariants: bool, on_boundary):
        yield from replica_loop(self.env, rep.engine, rep, self.stop_ns, interval_ns, check_invariants, on_boundary)
        rep.exited = True
        rep.next_boundary = NEVER
        rep.in_flight = False
        for o in self.replicas:
            o.notify()  # idle replicas re-check finished()
        if all(o.exited for o in self.replicas):
            if self.on_all_exited is not None:
                self.on_all_exited()
            drop_dead_events(self.env)
