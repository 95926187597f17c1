"""A disaggregated cluster: prefill replicas and decode replicas (and co-located ones) on one clock.

A group's ``role`` (docs/disaggregation.md) says what its replicas do: ``"both"`` (the default:
co-located, as in an ordinary cluster), ``"prefill"`` or ``"decode"``. A request of a class served
by a prefill group goes:

1. **Prefill.** The router (the cluster's ``router``) sends it to a prefill replica, where it is
   an ordinary request of one output token (its *prefill leg*: the prompt, or after a decode-side
   recompute the prompt and every token generated so far), ranked by that replica's policy,
   chunked under its token budget, gated by its admission gate. Its first token is sampled there;
   its KV stays in the prefill replica's memory (held, counted, until it has been sent).
2. **Decode admission.** The decode router (``decode_router``, e.g. ``least_kv``) picks a decode
   replica; the request waits there, ranked by that replica's policy (class priority first), for
   blocks for its KV and a running slot (strictly in rank order, above the watermark, as vLLM
   admits). This is the declared choice of where a request waits when the decode side is full:
   in the decode replica's queue, its KV held in the prefill replica's memory (vLLM's KV
   connectors free a prefill's blocks only once the decode side has read them).
3. **Transfer.** With blocks reserved, its KV is copied over the link (:mod:`sim.link`);
   the prefill replica frees its blocks when the copy lands.
4. **Decode.** At the decode replica's first step boundary after the copy lands, the request
   joins the running batch and the token sampled by the prefill is emitted: that is its first
   token (TTFT = prefill queue + prefill + decode-admission wait + transfer + the wait for that
   boundary), as vLLM's KV connectors, SGLang and Dynamo stream it. With ``cluster.first_token =
   "prefill"`` (DistServe's engine) that token reaches the client at the prefill's end instead
   (TTFT = prefill queue + prefill; the rest is the gap before the second token). It then
   decodes there, and may be preempted: by swap (its KV to that replica's host
   memory, as ever), or by recompute, when it goes back through a prefill replica (a new leg of
   its prompt and generated tokens; counted in ``prefill_passes``) and is transferred again.

Exactness. Every replica is an ordinary :class:`~sim.core.engine.Engine` run by
:func:`sim.core.loop.replica_loop` and fast-forwarded as far as nothing can reach it. What
crosses between replicas is a message, delivered at a known instant by one urgent SimPy event
(before any replica's step boundary at that instant) and taken in by the receiver at its first
step boundary at or after it: a finished prefill (delivered 1 ns after the prefill's step
ended, so the order in which same-instant processes run never matters), a copy that lands
(to the decode replica), a recompute victim (1 ns after the decode step boundary that
preempted it). The one exception: the prefill replica frees a copied leg's blocks at the
instant the copy lands, between its boundaries. Each replica's run stops at a lower bound of
the next message it could receive, or of the next release while requests wait there for
blocks (:meth:`PDReplica.next_arrival_ns`),
and everything a router reads (running and waiting counts, KV blocks allocated through the step
in progress) is the same whether the replicas step one iteration at a time or fast-forward, so
the two give the same bytes (``tests/test_disagg.py``).

Closed-loop users: a request's user hears of its end 1 ns after it (as any message is
delivered), then thinks and sends its next request. Ends come only at a replica's step
boundary, so a prefill or co-located replica's run also stops at a lower bound of the next end
anywhere else (:meth:`DisaggCluster.end_bound`), and a decode replica's run stops at its
requests' last tokens (it does not go on past them) so that each end is told at its instant.

Not yet available with disaggregation (refused in one line): an autoscaler, the router's
``refresh_s`` (windowed or distributed runs).
"""
from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from heapq import heappop, heappush
from operator import itemgetter
from typing import Any, Callable, ClassVar

import simpy

from sim.link import Links
from sim.core.costs import NEVER, NS
from sim.core.engine import Engine, emit_sampled_token
from sim.core.fastforward import OpenRun, allocate_run, block_limited, landed_steps_left
from sim.core.loop import replica_loop
from sim.core.plan import Scheduled, StepPlan, rank
from sim.core.preemption import count_preempted, drop_progress
from sim.core.request import Request, State
from sim.core.simpy_adapter import (after, armed, call_at, clock_ns, drop_dead_events, hand_over, trigger,
                                    trigger_urgent)
from sim.core.source import RequestSource
from sim.core.telemetry import Telemetry
from sim.routers import kv_bounds_router

PREFILL, DECODE, BOTH = "prefill", "decode", "both"

_KEY_SEQ = itemgetter(0, 1)  # (key, admit_seq) of a (key, admit_seq, request) triple: its rank

# message kinds, delivered to a replica's mail (taken in at its next step boundary)
HANDOFF, LAND, LEG = 0, 1, 2


def _room(eng: Engine, r: Request, need: int, gone: tuple[int, int] = (0, 0)) -> bool:
    """Whether decode engine ``eng`` has a running slot and ``need`` blocks above its watermark
    for ``r`` now (its running requests and the KV reserved or arriving count; ``gone``: the
    requests, and their blocks, that ended inside the run in flight before now)."""
    lim = eng.limits
    return (len(eng.queues.running) + len(eng.held) - gone[0] < lim.max_num_seqs
            and eng.pool.available_for(r.priority) + gone[1] - need >= lim.watermark_blocks)


class PDReplica:
    """One replica of a disaggregated cluster: its engine, role and mail; the per-replica source
    its ``replica_loop`` reads (``pop_due``, ``next_arrival_ns``, ``wakeup``, ``finished``,
    ``on_run``); and the view a router reads (:class:`policies.contracts.ReplicaView`)."""

    def __init__(self, index: int, group: str, role: str, gpus: int, engine: Engine, cluster: "DisaggCluster",
                 trace) -> None:
        self.index = index
        self.group = group
        self.role = role
        self.gpus = gpus
        self.engine = engine
        self.cluster = cluster
        self.trace = trace
        self.routed = 0
        self.exited = False
        self.inbox: deque = deque()  # requests routed here (prefill legs, co-located requests)
        self.mail: list = []  # delivered messages: (kind, request), in delivery order
        self.handoffs_in_mail = 0  # of them, HANDOFF (a decode replica's outstanding counts these)
        self.incoming: list[int] = []  # heap: instants of messages posted here, not yet delivered
        self.pending: list = []  # decode: (key, seq, request) waiting here for blocks and a slot
        self.unsent: dict[int, Request] = {}  # prefill: finished legs whose copy has not started
        # ... and the shortest their copies could take (``DisaggCluster.min_transfer_ns``), ns
        self.unsent_ns: dict[int, int] = {}
        # prefill: per class, the most links side by side a copy from here can use (to the decode
        # replica of the class that offers the most; ``DisaggCluster.start``)
        self.copy_lanes: list[int] = []
        self.step_end_lb = 0  # a lower bound of when this replica next ends a step (ns)
        self.idle = False  # asleep with nothing to do (``wakeup``)
        self._wake: simpy.Event | None = None
        self._tick: simpy.Event | None = None  # what the loop last waited on (``sleep``)
        self._stop_armed = False  # the horizon's wake-up is in SimPy's queue (``_stop_alarm``)
        # a decode replica holds its runs open (``hold``): priced a stretch at a time, cut short
        # when a message is delivered here (``cut``), their KV blocks allocated as far as read
        self._plan: StepPlan | None = None
        self._durs: list[int] = []
        self._ends: list[int] = []
        self._alloc_k = 1
        self._run_ev: simpy.Event | None = None
        self._run: OpenRun | None = None  # the run in flight while it may be priced further
        self._open: OpenRun | None = None  # the run in flight, or None for a single step
        # the instant the run in flight is next priced at (NEVER: none), and the instants of
        # the pricing events in the queue (one a instant; one that comes sooner than the run
        # needs, re-priced meanwhile, is armed again at that instant: ``_arm_pricing``)
        self._price_at = NEVER
        self._price_armed: set[int] = set()
        self._price_spares: list[simpy.Event] = []  # pricing events processed, to be armed again
        # the last run's end event and the last wake-up, each processed before the next is
        # asked for (the loop waits on one event at a time): armed again, not made anew
        self._run_spare: simpy.Event | None = None
        self._woken: simpy.Event | None = None
        self._span = 0  # the least time a stretch prices ahead, ns
        # decoders whose KV landed while the run was in flight and that joined it (``land``):
        # (request, boundary ns, step, the run's k before, its plan item), in order
        self._lands: list[tuple[Request, int, int, int, Scheduled]] = []
        self.landable = False
        self._through = False  # the run in flight goes past its requests' last tokens
        self._reset_gone()
        self._coh_blocks: list[int] | None = None  # the cohort's blocks to step _alloc_k (allocate_run)
        if role == DECODE:
            self.hold = self._hold
            e = engine
            pol = e.policy
            self.landable = (pol.static_ranking and pol.on_scheduled is None and pol.on_arrival is None
                             and pol.own_queues is None and e.spec is None and e.trace is None and e.gate is None
                             and e.pool.plain and e.grows_blocks and not e.limits.counting_prefill
                             and e.cfg.fast_forward and e.costs.overhead.overlap_schedule != 1
                             and not e.limits.prefill_first)

    # -- the router's view --
    @property
    def running(self) -> int:
        n = len(self.engine.queues.running)
        if self._run_ev is not None:  # (as stepping shows it now)
            now = clock_ns(self.cluster.env)
            n += sum(1 for x in self._lands if x[1] < now) - self.gone(now)[0]
        return n

    @property
    def waiting(self) -> int:
        return len(self.engine.queues.waiting) + len(self.inbox) + len(self.pending)

    @property
    def outstanding(self) -> int:
        q = self.engine.queues
        n = len(q.running) + len(q.waiting) + len(self.inbox) + len(self.pending)
        if self.role != DECODE:  # (its mail stays empty: only a decode replica's has any)
            return n
        # a decode replica's also: KV on its way here (``held``, with a landed decoder that
        # joined the run in flight, until the run ends), or handed off and not yet taken in
        if self._run_ev is not None:
            n -= self.gone(clock_ns(self.cluster.env))[0]
        return n + len(self.engine.held) + self.handoffs_in_mail

    @property
    def kv_used(self) -> float:
        p = self.engine.pool
        if self._run_ev is not None:  # (the blocks a stepped run would hold by now)
            now = clock_ns(self.cluster.env)
            self._allocate_through(self._steps_before(now))
            return (p.total - p.free - self.gone(now)[1]) / p.total
        return (p.total - p.free) / p.total

    def kv_used_bounds(self, now: int) -> tuple[float, float]:
        """``kv_used`` at ``now`` (the clock, ns) lies in ``[lo, hi]``, known without allocating
        the KV blocks of the steps its run in flight has begun since they were last allocated
        (what reading ``kv_used`` does): they are at most :meth:`unallocated_at_most`. Exact
        (``lo == hi``) where no such bound is kept (then read as ``kv_used``)."""
        if self._run_ev is None:
            u = self.kv_used
            return u, u
        ahead = self.unallocated_at_most(now)
        if ahead >= NEVER:
            u = self.kv_used
            return u, u
        p = self.engine.pool
        used = p.total - p.free - self.gone(now)[1]  # (the blocks allocated so far, less those gone)
        return used / p.total, (used + ahead) / p.total

    def unallocated_at_most(self, t_ns: int) -> int:
        """At most how many KV blocks the steps of the run in flight that begin before ``t_ns``
        take beyond those allocated so far (``_allocate_through``); NEVER where no bound is
        kept. Kept where a run takes one token a step per request after its first step
        (``landable``: no speculation or prefix cache; no prefill chunks): each request in it
        takes at most one block in any ``block_size`` steps in a row (when its context reaches
        a multiple of it)."""
        ends = self._ends
        steps = min(bisect_left(ends, t_ns) + 1, len(ends)) - self._alloc_k  # (those begun: _steps_before)
        if steps <= 0:
            return 0
        run = self._open
        if not self.landable or run is None or run.chunking:
            return NEVER
        plan = self._plan
        assert plan is not None
        n = len(self.engine.queues.running) + plan.landed  # (the requests in the run: as block_limited counts)
        return n * -(-steps // self.engine.bs)

    @property
    def waiting_by_class(self) -> dict[str, int]:
        e = self.engine
        counts = {c.name: n for c, n in zip(e.classes, e.queues.waiting_count)}
        for r in self.inbox:
            counts[r.cls] += 1
        for _, _, r in self.pending:
            counts[r.cls] += 1
        return counts

    # -- the source replica_loop reads --
    def on_run(self, now_ns: int, durations: list[int]) -> None:
        self.step_end_lb = now_ns + sum(durations)

    # -- a decode replica's runs: held open, cut by what reaches it --
    # A decode replica's run is not bounded by every finished prefill in the cluster (one of
    # which may be routed here): it is priced to its own end and cut short when a message is
    # delivered here, ending with the first step that does not start before the delivery, where
    # a stepped replica would take the message in. What a router reads of it meanwhile is what
    # stepping shows: the running and waiting sets do not change inside a run (a run stops at
    # a request's last token), and the KV blocks of the steps begun by then are allocated when
    # read (``kv_used``).
    # A run is priced a stretch at a time: at least STRETCH steps' worth of time, or up to the
    # next instant a message could be delivered here (a finished prefill anywhere, a copy
    # landing here), and on from there when that instant comes without a cut (a decoder that
    # lands and joins the run re-prices it from its step only as far as it was priced); where a
    # stretch ends changes nothing in the results (only how many steps are priced and then cut off).
    STRETCH: ClassVar[int] = 16

    def _hold(self, now_ns: int, plan: StepPlan, dur0: int, run: OpenRun | None) -> simpy.Event:
        self._plan, self._alloc_k, self._open = plan, 1, run
        self._through = run is not None and run.through
        self._reset_gone()
        self._coh_blocks = None
        ev = self._run_ev = armed(self.cluster.env, self._run_spare, [])
        self._run_spare = None
        if run is not None:
            self._run = run
            self._durs, self._ends = run.durs, run.ends
            self._span = self.STRETCH * dur0
            self._price(now_ns)
        else:
            self._durs, self._ends = [dur0], [now_ns + dur0]
            self.step_end_lb = now_ns + dur0
            trigger(ev, dur0)
        return ev

    def _price(self, now_ns: int) -> None:
        """Price the run in flight a stretch on from ``now_ns`` (see above)."""
        floor = now_ns + self._span
        bound = self.cluster.handoff_bound(floor)
        if self.incoming and self.incoming[0] < bound:
            bound = self.incoming[0]
        if bound < floor:
            bound = floor
        self._price_to(bound, now_ns)

    def _price_to(self, bound: int, now_ns: int) -> None:
        """Price the run in flight's steps that start before ``bound`` (ns); its end is
        scheduled when that prices it to its end, else a pricing event comes at ``bound``.
        Priced no further than the next copy to land here: its delivery prices the run on from
        there (``land``) or cuts it, and a landing that joins would price again what lies beyond.
        (Not where ``bound`` reaches the run's limit: priced to its end then, no pricing event is
        left past the limit, which could outlast the simulation and move its clock.)"""
        run = self._run
        assert run is not None and self._run_ev is not None
        inc = self.incoming
        run.extend(inc[0] if inc and inc[0] < bound < run.limit else bound)
        if run.done:
            self._run = None
            self._price_at = NEVER
            self.step_end_lb = end = self._ends[-1]
            trigger(self._run_ev, end - now_ns)
        else:
            self._price_at = bound
            self._arm_pricing(now_ns)

    def _arm_pricing(self, now_ns: int) -> None:
        """Make sure a pricing event comes at ``_price_at`` or sooner: one in the queue already
        (a landing re-prices the run every few steps, each time to a later instant: the event
        armed for the first comes, and is armed again for the last, rather than one for each),
        or a new one there."""
        at = self._price_at
        for t in self._price_armed:
            if t <= at:
                return
        self._price_armed.add(at)
        spares = self._price_spares
        pev = armed(self.cluster.env, spares.pop() if spares else None, [self._price_on])
        trigger_urgent(pev, at - now_ns)

    def _price_on(self, pev) -> None:
        now = clock_ns(self.cluster.env)
        self._price_armed.discard(now)
        self._price_spares.append(pev)
        if self._run is None:
            return  # (priced to its end, or cut, since)
        if now == self._price_at:
            self._price(now)
        elif now < self._price_at:
            self._arm_pricing(now)  # (re-priced further meanwhile)

    def held(self) -> list[int]:
        """The durations of the run that just ended (its blocks all allocated; the decoders that
        landed and joined it taken in, each at its boundary, and in its plan from its step on)."""
        self._allocate_through(len(self._durs))  # (before the landed are taken in: their counts then)
        if self._lands:
            eng = self.engine
            for r, b, _, _, _ in self._lands:
                self._take_in(r, b)
            self._lands = []
        self._run_spare = self._run_ev  # (it just fired: the one the loop waited on)
        self._plan = self._run_ev = self._open = None
        self._through = False
        return self._durs

    # A run that goes past last tokens (``_through``) keeps its requests until it ends; stepping,
    # each would have ended at its last token, its blocks freed. ``gone`` says how many had by an
    # instant, and their blocks, for what a router or a reservation reads then. Reads come at
    # instants that never go back within a run, and the steps that ended before one are never
    # priced again (a landing re-prices from a later step, a cut ends later), so the count is
    # kept as cursors: through the explicit items' last steps (sorted, made at the first read)
    # and through the cohort's members in their finish order.
    def _reset_gone(self) -> None:
        self._g_items: list[tuple[int, int]] | None = None  # (last step, blocks) of the items, sorted
        self._g_ii = self._g_fi = self._g_done = self._g_n = self._g_blocks = 0

    def _item_end(self, s: Scheduled) -> tuple[int, int]:
        """(the run's step its last token ends, the blocks it holds then) of plan item ``s``."""
        r = s.req
        if s.at:  # (a landed decoder: from step at, after the token emitted when it landed)
            left = landed_steps_left(r)
            return s.at + left - 1, self.engine.pool.blocks_for(s.computed_before + left) - r.base_blocks
        left = r.hidden_output_tokens - r.generated  # (its steps, to its last token)
        return left - 1, self.engine.pool.blocks_for(s.computed_before + s.tokens + left - 1) - r.base_blocks

    def gone(self, t_ns: int) -> tuple[int, int]:
        """The requests of the run in flight whose last token ended a step before ``t_ns`` (above),
        and the blocks they hold: ``(count, blocks)``."""
        if not self._through:
            return 0, 0
        done = bisect_left(self._ends, t_ns)  # (steps that ended before t)
        if done <= self._g_done:
            return self._g_n, self._g_blocks
        self._g_done = done
        plan = self._plan
        assert plan is not None
        items = self._g_items
        if items is None:
            items = self._g_items = sorted(self._item_end(s) for s in plan.items)
        n, blocks, i = self._g_n, self._g_blocks, self._g_ii
        while i < len(items) and items[i][0] < done:
            n += 1
            blocks += items[i][1]
            i += 1
        self._g_ii = i
        if plan.cohort:
            coh = self.engine.cohort
            run = self._open
            assert coh is not None and run is not None
            fin = coh.finish  # (members by the cohort step they are gone at)
            last = run.g + done  # (gone before step done: their cohort step count at most this)
            blocks_for = self.engine.pool.blocks_for
            f = self._g_fi
            while f < len(fin) and fin[f][0] <= last:
                m = fin[f][2]
                n += 1
                blocks += blocks_for(m.prompt_tokens + m.hidden_output_tokens - 1) - m.base_blocks
                f += 1
            self._g_fi = f
        self._g_n, self._g_blocks = n, blocks
        return n, blocks

    def _steps_before(self, t_ns: int) -> int:
        """Steps of the run in flight that start before ``t_ns`` (at least the first)."""
        return min(bisect_left(self._ends, t_ns) + 1, len(self._ends))

    def _allocate_through(self, k: int) -> None:
        if k > self._alloc_k:
            assert self._plan is not None
            self._coh_blocks = allocate_run(self.engine, self._plan, k, self._alloc_k, self._coh_blocks)
            self._alloc_k = k

    def next_boundary_lb(self, now_ns: int) -> int:
        """A lower bound of this replica's next step boundary: a run in flight ends at the end of
        the step in progress at the earliest (a cut ends it there)."""
        if self._run_ev is not None:
            ends = self._ends
            i = bisect_left(ends, now_ns)
            return ends[i] if i < len(ends) else ends[-1]  # (compared: min() is a call)
        return self.step_end_lb

    def cut(self, t_ns: int) -> None:
        """A message is delivered here at ``t_ns``: the run in flight ends with the first step
        that does not start before it (the decoders that landed and joined it at that step's
        end are taken in there with the message instead, in their order)."""
        if self._run_ev is not None:
            self.end_at(bisect_left(self._ends, t_ns) + 1)

    def end_at(self, k: int) -> None:
        """The run in flight ends with its ``k``-th step (no later than it was to); the decoders
        that landed and joined it at that step's end are taken in there instead, first."""
        while self._lands and self._lands[-1][2] >= k:
            self._unland()
        self._end_after(k)

    # -- decoders that land while a run is in flight --
    # A request whose KV lands here joins the running batch at the replica's next step boundary
    # b (the end of the first step that does not end before the landing). Without this the run
    # would end at b (a cut) and a new run start there with it. Where nothing else can happen at
    # b, it joins the run in flight instead (``OpenRun.land``): the run prices the steps from b
    # with it, as the new run would, and the replica takes it in when the run ends (``held``),
    # as the boundary would have (its token emitted at b). Nothing else can happen at b when:
    # no message waits here and nobody waits for blocks or a slot (``pending``) or in the
    # engine's queue, the engine's plan has nothing else to decide (``landable``: a fixed
    # ranking, no policy books, gate, speculation, trace, prefix cache or reservations, prefill
    # caps or overlap scheduling), b is before the run's limit (a sample, the horizon), it has
    # two tokens or more left (a last token at b would end it there), and no KV block limit
    # can bind in the run either way (an upper bound of every running request's blocks to its
    # end within the blocks the run may take). What a router reads is what the boundary shows:
    # it counts as running from b (``running``), its blocks are its plan item's (``kv_used``).
    # A message delivered here that cuts the run at b (or before) undoes the joins at b
    # (``_unland``): they are taken in there, before that message, as delivered.
    LAND: ClassVar[bool] = True  # (a switch for the tests: False cuts the run at every landing)

    def land(self, r: Request, t_ns: int) -> bool:
        """Let ``r``, whose KV landed here at ``t_ns``, join the run in flight if that is exact
        (above); False when it must wait for the run's next boundary as usual."""
        run = self._open
        e = self.engine
        if (not self.LAND or run is None or self._run_ev is None or not self.landable or run.chunking or self.mail
                or self.pending or e.queues.waiting or r.hidden_output_tokens - r.generated < 2):
            return False
        ends = self._ends
        j = bisect_left(ends, t_ns) + 1  # the steps up to the first that does not end before t
        if j == len(ends) and self._run is None:
            return False  # (the run ends at that boundary anyway)
        b = ends[j - 1]
        if b >= run.limit:
            return False
        bs = e.bs
        last = j + landed_steps_left(r)
        k = max(run.k, last) if run.through else min(run.k, last)
        n = len(e.queues.running) + len(self._lands) + 1
        if n * ((k + bs - 1) // bs + 1) + e.limits.watermark_blocks > run.avail:
            return False
        plan = self._plan
        assert plan is not None
        item = Scheduled(r, 1, r.computed, True, at=j)
        self._lands.append((r, b, j, run.k, item))
        plan.items.append(item)
        plan.landed += 1
        if self._g_items is not None:
            insort(self._g_items, self._item_end(item), lo=self._g_ii)
        run.land(j, r)
        at = self._price_at if self._run is not None else NEVER  # (before _reopen forgets it)
        self._reopen()
        if at < NEVER:
            # priced again only as far as before, where its pricing event is armed: stretched
            # from each landing, the next landing (a few steps on) would undo most of it
            self._price_to(at, t_ns)
        else:
            self._price(t_ns)
        return True

    def lands_after(self, t_ns: int) -> bool:
        """Has a decoder joined the run in flight at a boundary not before ``t_ns`` (stepping, its
        landing would still be in the mail at ``t_ns``)?"""
        return bool(self._lands) and self._lands[-1][1] >= t_ns

    def _unland(self) -> None:
        """Undo the last :meth:`land`: the run ends at its boundary (the caller's cut), where
        the request is taken in first of what is in the mail."""
        r, _, j, k, item = self._lands.pop()
        run, plan = self._open, self._plan
        assert run is not None and plan is not None
        run.unjoin_landed(j, k)
        plan.items.pop()  # (its item, the last)
        plan.landed -= 1
        if self._g_items is not None:
            self._g_items.remove(self._item_end(item))
        self.mail.insert(0, (LAND, r))
        self._reopen()

    def _reopen(self) -> None:
        """The run in flight is priced again from a step inside it: its end, if scheduled, is
        not known any more (a new event takes over the old one's waiter)."""
        if self._run is None:
            ev = self._run_ev
            assert ev is not None
            self._run_ev = hand_over(ev)
            self._run = self._open
        self._price_at = NEVER

    def _end_after(self, k: int) -> None:
        """The run in flight ends with its ``k``-th step (no later than it was to)."""
        ev = self._run_ev
        assert ev is not None
        ends = self._ends
        if self._run is not None:  # (its end not scheduled yet: it is now)
            self._run = None
            self._price_at = NEVER
            del self._durs[k:]
            del ends[k:]
            self.step_end_lb = ends[-1]
            trigger(ev, ends[-1] - clock_ns(self.cluster.env))
        elif k < len(ends):
            del self._durs[k:]
            del ends[k:]
            self.step_end_lb = ends[-1]
            ev = self._run_ev = hand_over(ev)
            trigger(ev, ends[-1] - clock_ns(self.cluster.env))

    def _take_in(self, r: Request, b_ns: int) -> None:
        """``r``, whose KV landed, joins the running batch at the boundary ``b_ns`` (ns)."""
        self.engine.take_landed(r, b_ns)
        ph = self.cluster.phases[r.request_id]
        if ph[5] < 0:
            ph[5] = b_ns

    def pop_due(self, now_ns: int) -> list:
        self.idle = False
        cl = self.cluster
        eng = self.engine
        if self.mail:
            mail, self.mail = self.mail, []
            self.handoffs_in_mail = 0
            for kind, r in mail:
                if kind == LAND:  # (decode) its KV is here: it joins the batch
                    self._take_in(r, now_ns)
                elif kind == HANDOFF:  # (decode) it waits here for blocks and a slot
                    if eng.policy.on_arrival is not None:
                        eng.policy.on_arrival(r, now_ns / NS)
                    cl.seq += 1
                    cl.tried[r.request_id] = now_ns
                    r.key = eng.policy.key_tuple(r, now_ns / NS)
                    heappush(self.pending, (r.key, cl.seq, r))
                else:  # LEG: a re-prefill routed here
                    self.inbox.append(r)
        if self.pending:
            cl.reserve(self, now_ns)
        if self.landable:
            # a run may go past last tokens only while nobody waits here for the blocks and the
            # slot a finish frees (stepping, the boundary at the finish would reserve them), and
            # no closed-loop user waits for a finish to send its next request
            eng.through_finishes = not self.pending and not cl.closed
        if not self.inbox:
            return []
        out = list(self.inbox)
        self.inbox.clear()
        return out

    def next_arrival_ns(self) -> int:
        """A lower bound of when the next message or request could reach this replica (see the
        module docstring): a run stops there, as at an arrival."""
        cl = self.cluster
        now = clock_ns(cl.env)
        if self.role != DECODE:
            # a copy that lands frees blocks here (:meth:`DisaggCluster.release`), which only a
            # request waiting here could take: without one, a run goes on past it
            waiters = bool(self.engine.queues.waiting)
            t = self.incoming[0] if self.incoming and waiters else NEVER
            a = cl.source.next_arrival_ns()
            if a < t:
                t = a
            copies = self.unsent and waiters
            victims = self.role == PREFILL and cl.victims_to_prefill
            if copies or victims:
                b = cl.decode_boundary_lb(now)  # (the two below read it; one look at the replicas)
                if copies:  # a copy not started yet could land, and free blocks, this soon
                    u = cl.copy_start_bound(now, b) + min(self.unsent_ns.values())
                    if u < t:
                        t = u
                if victims:
                    v = cl.victim_bound(b)
                    if v < t:
                        t = v
            if cl.closed:  # (a request that ends elsewhere sends its user's next one)
                v = cl.end_bound(self)
                if v < t:
                    t = v
        else:
            t = self.incoming[0] if self.incoming else NEVER
            h = cl.handoff_bound()
            if h < t:
                t = h
        # provisional: if nothing can run, replica_loop waits until this (on_run corrects it)
        self.step_end_lb = min(t, self.engine.next_change_ns, cl.stop_ns)
        return t

    def sleep(self, delay_ns: int) -> simpy.Event:
        """What the replica loop waits on for ``delay_ns``: its one event, armed again (a prefill
        replica waits out every step so, not in a held run)."""
        ev = self._tick = after(self.cluster.env, self._tick, delay_ns)
        return ev

    def wakeup(self, until_ns: int):
        """Fires when something is delivered or routed here, or at the horizon."""
        ev = self._wake = self._woken = armed(self.cluster.env, self._woken, [])
        self.idle = True
        self.step_end_lb = NEVER
        self._stop_alarm()
        return ev

    def _stop_alarm(self) -> None:
        """The horizon's wake-up, armed once (as a co-located replica's:
        :meth:`sim.cluster.replicas.Replica._stop_alarm`)."""
        if not self._stop_armed and self.cluster.stop_ns < NEVER:
            self._stop_armed = True
            call_at(self.cluster.env, self.cluster.stop_ns, self._at_stop)

    def _at_stop(self, _ev) -> None:
        if self._wake is not None:
            self._fire(self._wake)

    def _fire(self, ev) -> None:
        if self._wake is ev:
            self._wake = None
        if not ev.triggered:
            self.idle = False
            self.step_end_lb = clock_ns(self.cluster.env)
            trigger(ev, 0)

    def notify(self) -> None:
        """Something was routed or delivered here now: wake the replica if it sleeps, or cut
        its run in flight."""
        if self._wake is not None:
            self._fire(self._wake)
        elif self._run_ev is not None:
            self.cut(clock_ns(self.cluster.env))

    def finished(self) -> bool:
        return self.cluster.finished()


class DisaggCluster:
    """The replicas, their routers, the link and the messages between them (see the module
    docstring). ``prefill_cands[c]`` / ``decode_cands[c]``: the replicas that may take class
    ``c``'s requests first (prefill or co-located) and the decode replicas it may go to."""

    def __init__(self, env, source: RequestSource, router, decode_router, links: Links, stop_ns: int,
                 front_tel: Telemetry, first_token: str = DECODE) -> None:
        self.env = env
        self.source = source
        self.router = router
        self.decode_router = decode_router
        # the decode router's choice from bounds of the candidates' KV use (least_kv's), or None
        self.decode_by_bounds = kv_bounds_router(decode_router)
        self.links = links
        self.stop_ns = stop_ns
        self.front_tel = front_tel  # requests that end outside a decode or co-located replica
        # the token a prefill leg samples reaches the client at the leg's end (DistServe), not
        # when the KV lands at the decode replica (vLLM, SGLang, Dynamo)
        self.sampled_sent_at_prefill = first_token == PREFILL
        self.replicas: list[PDReplica] = []
        self.prefill_cands: list[list[PDReplica]] = []
        self.decode_cands: list[list[PDReplica]] = []
        self.decode_askers: list[list[PDReplica]] = []  # per class, one decode replica of each group (``start``)
        self.prefills: list[PDReplica] = []
        self.decodes: list[PDReplica] = []
        self.assign: dict[int, int] = {}  # request id -> the replica it ended on (or was last at)
        self.origin: dict[int, Request] = {}  # request id -> the request, while its prefill leg runs
        self.at_prefill: dict[int, int] = {}  # request id -> the prefill replica holding its KV
        self.live = 0  # requests arrived and not ended
        self.seq = 0
        self.victims_to_prefill = False  # a decode replica may send recompute victims back
        self.closed = bool(source.closed)  # closed-loop users send a request when one ends
        self.on_end: Callable[[Any, int], None] | None = None
        # per request id: [prefill start, prefill end (first pass), reserved, landed, passes,
        # taken in at the decode replica] ns
        self.phases: dict[int, list[int]] = {}
        self.tried: dict[int, int] = {}  # request id -> when a decode replica first ranked it for room
        self.recompute_legs = 0
        self.too_large = 0
        # the post office: (instant, seq, kind, request, replica) messages not yet delivered, and
        # the one urgent event armed for the first of them (or the next arrival); the instants
        # of those still to be routed: finished prefills, recompute victims
        self._posts: list[tuple[int, int, int, Request, PDReplica | None]] = []
        self.handoffs_due: list[int] = []
        self.copies: dict[int, tuple[Request, PDReplica]] = {}  # request id -> (its leg, the sender), copying
        self.victims_due: list[int] = []
        self._at = NEVER  # the next delivery's instant (NEVER: none armed)
        self._armed: set[int] = set()  # instants of delivery events in the queue (one a instant)
        self._spares: list[simpy.Event] = []  # delivery events processed, to be armed again
        self.bytes_per_token = 0
        self.layers = 1
        # per prefill group, per class index: prompt tokens its replicas computed (for its cost)
        self.prefill_work: dict[str, list[int]] = {}

    # -- delivery --
    def post(self, t_ns: int, kind: int, r: Request, rep: PDReplica | None) -> None:
        """Deliver ``(kind, r)`` to ``rep`` at ``t_ns`` (before any step boundary then); with
        ``rep`` None, route it then (a finished prefill, a recompute victim)."""
        self.seq += 1
        heappush(self._posts, (t_ns, self.seq, kind, r, rep))
        if rep is not None:
            heappush(rep.incoming, t_ns)
        else:
            heappush(self.handoffs_due if kind == HANDOFF else self.victims_due, t_ns)
        if t_ns < self._at:
            self._arm(t_ns, clock_ns(self.env))

    def _arm(self, t_ns: int, now: int) -> None:
        """Deliver at ``t_ns`` (``now``, the clock, at the earliest) unless a delivery comes
        sooner. An event of an instant armed before and superseded is still in the queue: it
        serves again."""
        if t_ns < now:
            t_ns = now
        if t_ns < self._at:
            self._at = t_ns
            if t_ns not in self._armed:
                self._armed.add(t_ns)
                spares = self._spares
                ev = armed(self.env, spares.pop() if spares else None, [self._deliver])
                trigger_urgent(ev, t_ns - now)

    def start(self) -> None:
        for p in self.prefills:  # (what min_transfer_ns reads, once)
            p.copy_lanes = [max((min(p.gpus, d.gpus) for d in cands), default=1) for cands in self.decode_cands]
        self.decode_askers = [list({d.group: d for d in cands}.values()) for cands in self.decode_cands]
        self._arm(min(self.source.next_arrival_ns(), self.stop_ns), clock_ns(self.env))

    def _deliver(self, ev) -> None:
        now = clock_ns(self.env)
        self._armed.discard(now)
        self._spares.append(ev)  # (processed: an instant armed later may use it again)
        if now != self._at:
            return  # (superseded by an earlier one, or not armed again yet)
        self._at = NEVER
        if self.source.next_arrival_ns() <= now:  # (most deliveries are a finished prefill's or a landing's)
            self.route_until(now)
        posts = self._posts
        while posts and posts[0][0] <= now:
            _, _, kind, r, rep = heappop(posts)
            if rep is None:
                if kind == HANDOFF:  # a finished prefill
                    heappop(self.handoffs_due)
                    self.hand_off(r, now)
                else:  # a recompute victim
                    heappop(self.victims_due)
                    self.reprefill(r, now)
            else:
                heappop(rep.incoming)
                if kind != LAND or not rep.land(r, now):  # (landed: it joined the decode replica's run in flight)
                    rep.mail.append((kind, r))
                    rep.notify()
                if kind == LAND:  # (then the prefill replica that sent it frees the leg's blocks)
                    leg, src = self.copies.pop(r.request_id)
                    heappop(src.incoming)
                    self.release(src, leg)
        nxt = self.source.next_arrival_ns()
        if posts and posts[0][0] < nxt:
            nxt = posts[0][0]
        if nxt < NEVER and now < self.stop_ns:
            self._arm(nxt if nxt < self.stop_ns else self.stop_ns, now)

    def release(self, rep: PDReplica, leg: Request) -> None:
        """``leg``'s KV has landed at its decode replica: prefill replica ``rep`` frees its blocks
        now, between its step boundaries (a copy completes beside the steps, and the blocks are
        only read by the next plan, by a router and by a request waiting there, whose replica
        stops its run at this instant: :meth:`PDReplica.next_arrival_ns`)."""
        eng = rep.engine
        del eng.held[leg.request_id]
        eng.pool.release_request(leg)

    # -- routing --
    def route_until(self, now_ns: int) -> None:
        """Route the arrivals due now: each to a prefill or co-located replica."""
        r: Request
        rep: PDReplica
        for r in self.source.pop_due(min(now_ns, self.stop_ns)):
            self.live += 1
            cands = self.prefill_cands[r.cls_idx]
            rep = self.router.route(r, cands, now_ns) if len(cands) > 1 else cands[0]
            if rep.role == PREFILL:
                refused = self._decode_refuses(r)
                if refused:
                    self._end_here(r, State.REJECTED, r.arrival_ns, refused, rep)
                    continue
                self.phases[r.request_id] = [-1, -1, -1, -1, 0, -1]
                r = self._leg(r, r.arrival_ns)
            self.assign[r.request_id] = rep.index
            rep.routed += 1
            rep.inbox.append(r)
            rep.notify()

    def _decode_refuses(self, r: Request) -> str:
        """Why no decode replica could take ``r`` whole, as its engine would answer the request at
        its arrival (``Engine.size_refusal``; its prefill leg asks for one token, so the prefill
        replica cannot): the first candidate's reason when every one refuses, or "" when some
        can. (One replica of each group is asked: a group's replicas have one engine's settings,
        and so one answer.)"""
        why = ""
        for d in self.decode_askers[r.cls_idx]:
            why = d.engine.size_refusal(r.prompt_tokens, r.max_tokens, r.priority)
            if not why:
                return ""
        return why

    def _leg(self, r: Request, now_ns: int) -> Request:
        """The prefill leg of ``r``: every token it knows, to prefill and sample one more."""
        leg = Request(r.request_id, now_ns, r.tenant, r.cls, r.cls_idx, r.priority, r.tokens, 1, 1, r.deadline_s,
                      r.stream, r.user, r.features, r.hash_ids)
        leg.predicted = r.predicted
        self.origin[r.request_id] = r
        self.phases[r.request_id][4] += 1
        return leg

    def on_leg_end(self, leg: Request, now_ns: int) -> None:
        """A prefill replica's leg ended: prefilled (hand the request to the decode side), or
        refused by its admission gate (the request ends so)."""
        r = self.origin.pop(leg.request_id)
        rep = self.replicas[self.assign[leg.request_id]]
        self._count_work(rep, leg)
        if leg.state is not State.FINISHED:  # (rejected at arrival: an answer in the front)
            self._end_here(r, leg.state, leg.finish_ns, leg.reject_reason, rep)
            return
        ph = self.phases[r.request_id]
        if ph[0] < 0:
            ph[0], ph[1] = leg.first_admit_ns, now_ns
            r.first_admit_ns = leg.first_admit_ns
        r.computed = r.tokens  # its KV: every token it knows (the leg's prompt)
        r.attained_ns += leg.attained_ns
        r.evicted_miss_tokens += leg.evicted_miss_tokens
        if r.prefix_hit_tokens == 0:
            r.prefix_hit_tokens = leg.prefix_hit_tokens
        if self.sampled_sent_at_prefill:
            self._send_sampled(r, now_ns)
            if r.generated + 1 >= r.hidden_output_tokens:  # (its answer is whole: nothing to decode)
                self._finish_at_prefill(r, rep, leg, now_ns)
                return
        self.at_prefill[r.request_id] = rep.index
        rep.unsent[r.request_id] = leg
        rep.unsent_ns[r.request_id] = self.min_transfer_ns(leg, rep)
        self.post(now_ns + 1, HANDOFF, r, None)

    def _count_work(self, rep: PDReplica, leg: Request) -> None:
        """Count the prompt tokens prefill replica ``rep`` computed for ``leg`` (ended, or cut
        by the horizon): those not found in the prefix cache at its admission, and those
        computed again after a preemption there."""
        work = self.prefill_work.get(rep.group)
        if work is None:
            work = self.prefill_work[rep.group] = [0] * len(self.front_tel.class_names)
        work[leg.cls_idx] += max(leg.computed - leg.prefix_hit_tokens, 0) + leg.recomputed_tokens

    def _finish_at_prefill(self, r: Request, rep: PDReplica, leg: Request, now_ns: int) -> None:
        """(``first_token = "prefill"``) The token ``r``'s prefill leg sampled was its last: it
        ends on prefill replica ``rep`` now, its KV freed there and never copied (DistServe
        migrates only requests with more to generate)."""
        self.release(rep, leg)
        r.generated += 1
        r.tokens += 1
        self._end_here(r, State.FINISHED, now_ns, "", rep)

    def _send_sampled(self, r: Request, now_ns: int) -> None:
        """(``first_token = "prefill"``) The token ``r``'s prefill leg sampled reaches the client
        now (its decode replica takes it in without emitting it: ``Engine.sampled_token_sent``)."""
        emit_sampled_token(self.front_tel, r, now_ns)

    def hand_off(self, r: Request, now_ns: int) -> None:
        """Route a prefilled request to a decode replica: its blocks are reserved there at once
        when that is sure to change nothing else (:meth:`reserve_now`), else it waits there
        for room, taken in at the replica's next step boundary."""
        cands = self.decode_cands[r.cls_idx]
        d = self._route_decode(r, cands, now_ns) if len(cands) > 1 else cands[0]
        self.assign[r.request_id] = d.index
        d.routed += 1
        r.reveals_output = d.engine.policy.oracle  # (as an arrival there: an oracle policy reads it)
        if not d.pending and not d.mail and not d.lands_after(now_ns) and self.reserve_now(d, r, now_ns):
            return
        d.mail.append((HANDOFF, r))
        d.handoffs_in_mail += 1
        d.notify()

    def _route_decode(self, r: Request, cands: list[PDReplica], now_ns: int) -> PDReplica:
        """The decode router's choice among ``cands`` for ``r``: from bounds of their KV use
        where the router chooses so and they settle it (``route_kv_bounds``: least_kv's, most
        of the time), the same choice as from the values (``route``), which read the blocks of
        every candidate's run in flight up to now (``kv_used``) and are asked otherwise."""
        by_bounds = self.decode_by_bounds
        if by_bounds is not None:
            bounds = [c.kv_used_bounds(now_ns) for c in cands]
            i = by_bounds(bounds)
            if i is None:
                # the values, one candidate at a time (the widest bounds first), until the rest
                # settle it: each read allocates the blocks of that candidate's run begun by now,
                # which are read alike later or, allocated later, counted the same (kv_used_bounds)
                for j in sorted(range(len(cands)), key=lambda j: bounds[j][0] - bounds[j][1]):
                    lo, hi = bounds[j]
                    if lo == hi:
                        break  # (the rest are exact too: sorted widest first)
                    u = cands[j].kv_used
                    bounds[j] = (u, u)
                    i = by_bounds(bounds)
                    if i is not None:
                        break
            if i is not None:
                return cands[i]
        d: PDReplica = self.decode_router.route(r, cands, now_ns)
        return d

    def reserve_now(self, d: PDReplica, r: Request, now_ns: int) -> bool:
        """Reserve ``r``'s blocks at decode replica ``d`` now, between its step boundaries, and
        start its copy; True when done. Only where that is what the replica's next boundary
        would decide and changes nothing it does meanwhile: nobody waits there for room, its
        pool is plain (no class reservations, no prefix cache), and the run in flight keeps
        every block it is priced to take (the blocks it may take from now on shrink by these);
        else False, and the request waits for the replica's next boundary as usual. Decided
        the same way whether the replica steps or fast-forwards, on the blocks it holds by now."""
        eng = d.engine
        pool = eng.pool
        if not pool.plain or not eng.grows_blocks:
            return False
        if eng.policy.on_arrival is not None:
            return False  # (a policy told of it at the boundary, in its order there)
        run = d._open
        need = pool.blocks_for(r.computed)
        if d._run_ev is not None and pool.free - d.unallocated_at_most(now_ns) - need < eng.limits.watermark_blocks:
            # whether r fits may depend on the blocks of the steps begun by now: allocated, to
            # count them. Else r fits above the watermark however many they are, even with no
            # block of the requests gone freed, and they are allocated later: a plain pool's
            # counts come out the same in either order, never below the watermark, and the
            # checks below answer alike (block_limited finds the run's steps allocated so far
            # within its blocks either way, so the step it starts its search from is moot)
            d._allocate_through(d._steps_before(now_ns))
        gone = d.gone(now_ns) if d._run_ev is not None else (0, 0)
        if not _room(eng, r, need, gone):
            return False
        if eng.queues.waiting:
            return False  # (a waiter there could be admitted with these blocks at its next boundary)
        if run is not None:
            # the run's blocks from now on shrink by these: it ends where they run out, as a
            # stepped replica would find at that step's boundary
            run.avail -= need
            assert d._plan is not None
            kb = block_limited(eng, d._plan, len(d._durs), run.avail, d._alloc_k)
            if kb < len(d._durs):
                d.end_at(kb)
                run.done = True
        self._start_copy(d, r, now_ns, first_try=True, freeing=gone[1])
        return True

    def reprefill(self, r: Request, now_ns: int) -> None:
        """A decode replica's recompute victim goes back through a prefill replica."""
        cands = [c for c in self.prefill_cands[r.cls_idx] if c.role == PREFILL]
        rep: PDReplica = self.router.route(r, cands, now_ns) if len(cands) > 1 else cands[0]
        self.recompute_legs += 1
        leg = self._leg(r, now_ns)
        self.assign[r.request_id] = rep.index
        rep.routed += 1
        rep.inbox.append(leg)
        rep.notify()

    def on_recompute(self, r: Request, now_ns: int) -> None:
        """(A decode engine's ``on_recompute``.) Its progress dropped, ``r`` leaves the replica."""
        self.post(now_ns + 1, LEG, r, None)

    # -- decode admission and the copy --
    def reserve(self, d: PDReplica, now_ns: int) -> None:
        """At decode replica ``d``'s step boundary: reserve blocks for the requests waiting there,
        in rank order while they fit (a slot free and blocks above the watermark), and start
        each one's copy."""
        eng = d.engine
        pending = d.pending
        while pending:
            r = pending[0][2]
            need = eng.pool.blocks_for(r.computed)
            if not _room(eng, r, need) and not self._evict_for(d, r, need, now_ns):
                return
            heappop(pending)
            self._start_copy(d, r, now_ns, self.tried.pop(r.request_id, -1) == now_ns)

    def _evict_for(self, d: PDReplica, w: Request, need: int, now_ns: int) -> bool:
        """Make room at decode replica ``d`` for ``w`` (waiting there, ``need`` blocks) by evicting
        running requests that ``engine.preempt_for_waiting`` lets it evict (ranked below it;
        under a policy whose keys change, those of a less urgent class), the lowest ranked
        first, as few as make it fit; none when even all of them would not.
        An evicted request goes back through a prefill replica (recompute), counted as a
        preemption: a swap's copy would need a step of this replica to carry it. A replica
        whose ``engine.preemption`` is ``"swap"`` evicts none for a waiting request (it waits
        for room; its own preemptions swap). True when ``w`` fits now."""
        eng = d.engine
        rule, pool, lim, q = eng.waiting_rule, eng.pool, eng.limits, eng.queues
        if not (rule.evicts and eng.grows_blocks and pool.plain) or eng.on_recompute is None:
            return False
        static = eng.policy.static_ranking
        if static:
            victims = rule.victims(w, q.running.values(), q)  # (ranked below, once they are enough)
        elif q.top > w.priority:  # (keys that change with time or service: by class priority alone)
            # ranked by their keys now, as a plan here would rank them (the running requests'
            # keys are those of the replica's last plan, a step ago stepping, a run ago
            # fast-forwarding)
            now_s = now_ns / NS
            key = eng.policy.key_tuple
            victims = sorted(((key(v, now_s), v.admit_seq, v) for v in q.running.values() if v.priority > w.priority),
                             key=_KEY_SEQ, reverse=True)
            victims = [v for _, _, v in victims]
        else:
            return False
        if not victims:
            return False
        coh = eng.cohort
        if coh is not None and coh.members:
            coh.sync_all()  # (its members' blocks brought up to date: they may be victims)
        slots = len(q.running) + len(eng.held) - lim.max_num_seqs + 1  # victims needed for a slot
        short = need + lim.watermark_blocks - pool.free  # blocks still missing
        if len(victims) < slots or sum(v.blocks for v in victims) < short:
            return False
        if static:
            victims.sort(key=rank, reverse=True)
        if coh is not None and coh.members:
            coh.dissolve()  # (victims leave the running set as explicit requests)
        q.rank_order = None  # (the kept rank order is rebuilt without the victims)
        for v in victims:
            if slots <= 0 and short <= 0:
                break
            short -= v.blocks
            slots -= 1
            drop_progress(eng, v)  # (its blocks freed, its computed tokens dropped)
            q.remove_running(v)
            count_preempted(eng, v, "recompute", now_ns)  # (on to eng.on_recompute)
        return True

    def _start_copy(self, d: PDReplica, r: Request, now_ns: int, first_try: bool, freeing: int = 0) -> None:
        """Take ``r``'s blocks at decode replica ``d`` (checked; ``freeing``: blocks of requests
        that ended inside its run in flight, not yet freed) and send its KV from the prefill
        replica that holds it; it lands, and the prefill's blocks are freed, when the copy ends."""
        eng = d.engine
        need = eng.pool.blocks_for(r.computed)
        if freeing:
            eng.pool.allocate_ahead(r.cls_idx, need, freeing)
        else:
            eng.pool.allocate(r.cls_idx, need)
        r.blocks = need
        eng.held[r.request_id] = r
        src = self.replicas[self.at_prefill.pop(r.request_id)]
        leg = src.unsent.pop(r.request_id)
        del src.unsent_ns[r.request_id]
        ph = self.phases[r.request_id]
        prefill_ns = 0
        if self.links.spec.pipelined and first_try and ph[2] < 0:
            # room was there at once: the copy overlapped the prefill (its first pass only)
            prefill_ns = max(ph[1] - ph[0], 0)
        _, land = self.links.send(src.index, d.index, now_ns, r.computed * self.bytes_per_token,
                                  min(src.gpus, d.gpus), prefill_ns, self.layers)
        if ph[2] < 0:
            ph[2], ph[3] = now_ns, land
        self.post(land, LAND, r, d)
        self.copies[r.request_id] = (leg, src)  # (freed at src as it lands: one message for both)
        heappush(src.incoming, land)

    def min_transfer_ns(self, leg: Request, src: PDReplica) -> int:
        """The shortest the copy of ``leg``'s KV from ``src`` could take: to the decode replica it
        could go to that offers the most links side by side."""
        return self.links.min_transfer_ns(leg.prompt_tokens * self.bytes_per_token, src.copy_lanes[leg.cls_idx],
                                          self.layers)

    # -- the bounds replicas' runs stop at --
    def handoff_bound(self, floor: int = -1) -> int:
        """A lower bound of the next finished prefill's delivery (to any decode replica), ns.
        Where that is ``floor`` or sooner, any value not after ``floor`` (a caller that takes
        the later of the two needs no more; most often a prefill replica's step ends sooner)."""
        t = self.handoffs_due[0] if self.handoffs_due else NEVER
        if t <= floor:
            return t
        idle = False
        for p in self.prefills:
            if p.idle:
                idle = True
            elif p.step_end_lb + 1 < t:
                t = p.step_end_lb + 1
                if t <= floor:
                    return t
        if idle:  # (an idle prefill replica starts when a request or a message reaches it)
            w = min(self.source.next_arrival_ns(), min((p.incoming[0] for p in self.prefills if p.incoming),
                                                       default=NEVER))
            if self.victims_to_prefill and w + 1 > floor:
                w = min(w, self.victim_bound())
            if w + 1 < t:
                t = w + 1
        return t

    def copy_start_bound(self, now_ns: int, decode_lb: int) -> int:
        """A lower bound, not before ``now_ns``, of when a copy not started yet could start: a
        copy starts where a finished prefill is delivered (its blocks reserved at once) or at
        a decode replica's step boundary (reserved for a request waiting there; ``decode_lb``:
        :meth:`decode_boundary_lb` now). (Without this a prefill replica whose waiters need
        the blocks of copies the decode side has no room for would wake every shortest copy's
        time to find nothing changed.)"""
        t = self.handoffs_due[0] if self.handoffs_due else NEVER
        if decode_lb < t:
            t = decode_lb
        return t if t > now_ns else now_ns

    def victim_bound(self, decode_lb: int | None = None) -> int:
        """A lower bound of the next recompute victim's delivery (from any decode replica): 1 ns
        after a decode step boundary (``decode_lb``: :meth:`decode_boundary_lb` now, where the
        caller has it)."""
        t = self.victims_due[0] if self.victims_due else NEVER
        if decode_lb is None:
            decode_lb = self.decode_boundary_lb(clock_ns(self.env))
        b = decode_lb + 1
        return b if b < t else t

    def decode_boundary_lb(self, now_ns: int) -> int:
        """A lower bound of the next step boundary of any decode replica: an idle one's comes
        with the next message to it, a landing (its ``incoming``) or a handoff (which a caller
        counts where it matters: an idle replica has nothing running to preempt)."""
        t = NEVER
        for d in self.decodes:
            if d.idle:
                if d.incoming and d.incoming[0] < t:
                    t = d.incoming[0]
            else:
                b = d.next_boundary_lb(now_ns)
                if b < t:
                    t = b
        return t

    def end_bound(self, rep: PDReplica) -> int:
        """A lower bound of when a closed-loop user could next hear of an end anywhere but at
        ``rep`` (its own ends come at its runs' ends; a caller's bound has the next arrival
        already). A request ends at a decode or co-located replica's step boundary: 1 ns after
        the next boundary of one with requests running; one with none ends a request only after
        one lands (decode: not before its first landing or handoff still to come) or arrives
        (co-located). A prefill replica ends one only by refusing a leg it takes in, an arrival
        or a recompute victim, which come after those; with ``first_token = "prefill"`` also at
        its step boundaries (a one-token answer ends there): 1 ns after the next one of a prefill
        replica that runs, after its next release (a blocked one resumes then) or now (an idle
        one with legs just routed to it), and after the next recompute victim's routing.
        Blocked replicas' own wake times are not read, so that no two blocked replicas bound
        each other a nanosecond at a time."""
        t = NEVER
        now = clock_ns(self.env)
        ends_at_prefill = self.sampled_sent_at_prefill
        if ends_at_prefill and self.victims_due:
            t = self.victims_due[0] + 1
        for o in self.replicas:
            if o is rep:
                continue
            if o.role == PREFILL:
                if not ends_at_prefill:
                    continue
                if o.engine.queues.running or o._run_ev is not None:
                    b = o.next_boundary_lb(now) + 1  # (legs in its inbox start at that boundary)
                else:
                    b = now + 1 if o.inbox else NEVER  # (idle: it takes them in now)
                if o.incoming and o.incoming[0] + 1 < b:
                    b = o.incoming[0] + 1
            elif o.engine.queues.running or o._run_ev is not None:
                b = o.next_boundary_lb(now) + 1
            elif o.role == DECODE:
                b = min(o.incoming[0] if o.incoming else NEVER,
                        self.handoffs_due[0] if self.handoffs_due else NEVER) + 1
            else:
                continue
            if b < t:
                t = b
        return t

    # -- ends --
    def on_request_end(self, r: Request, now_ns: int) -> None:
        """(A decode or co-located engine's ``on_request_end``.) A closed-loop user hears of
        it 1 ns later (as of any message: the order of same-instant processes never matters)."""
        self.live -= 1
        if self.on_end is not None:
            self.on_end(r, now_ns)
        if self.closed:
            self.source.on_request_end(r, now_ns + 1)
            nxt = self.source.next_arrival_ns()
            if nxt < NEVER and now_ns < self.stop_ns:
                self._arm(min(nxt, self.stop_ns), clock_ns(self.env))  # (now_ns: when it ended, maybe before)
        if self.live == 0:
            for rep in self.replicas:
                rep.notify()

    def _end_here(self, r: Request, state: State, t_ns: int, reason: str, rep: PDReplica) -> None:
        """``r`` ends before it reaches a decode replica: refused at its arrival (``reason``), or
        finished at its prefill (``first_token = "prefill"``, a one-token answer)."""
        r.state = state
        r.reject_reason = reason
        r.finish_ns = t_ns
        if reason == "too_large":
            self.too_large += 1
        self.assign[r.request_id] = rep.index
        self.front_tel.on_end(r)
        self.on_request_end(r, t_ns)

    def finished(self) -> bool:
        s = self.source
        return s.next_arrival_ns() >= NEVER and self.live == 0 and not self._posts

    def close(self, end_ns: int) -> None:
        """The run is over: every replica's engine closes (its queues end unfinished), and
        every request that is elsewhere (its prefill leg still running, waiting for decode room,
        its KV on the way) ends unfinished at ``end_ns`` in the front's table."""
        for rep in self.prefills:  # (legs cut by the horizon: the work done on them counts)
            q = rep.engine.queues
            for leg in q.waiting_requests() + list(q.running.values()):
                self._count_work(rep, leg)
        for rep in self.replicas:
            also = list(rep.inbox) if rep.role == BOTH else []
            rep.engine.close(end_ns, also=also)
            rep.inbox.clear()
        ended = (State.FINISHED, State.REJECTED, State.UNFINISHED)
        for rep in self.decodes:
            for r in [x[2] for x in rep.pending] + list(rep.engine.held.values()) + [m[1] for m in rep.mail]:
                if r.state not in ended:
                    self._unfinished(r, end_ns)
        for r in list(self.origin.values()) + [p[3] for p in self._posts if p[4] is None]:
            if r.state not in ended:
                self._unfinished(r, end_ns)

    def _unfinished(self, r: Request, end_ns: int) -> None:
        r.state = State.UNFINISHED
        r.finish_ns = end_ns
        self.front_tel.on_end(r)

    def replica_proc(self, rep: PDReplica, interval_ns: int, check_invariants: bool, on_boundary):
        yield from replica_loop(self.env, rep.engine, rep, self.stop_ns, interval_ns, check_invariants, on_boundary)
        rep.exited = True
        rep.step_end_lb = NEVER
        rep.idle = True
        for o in self.replicas:
            o.notify()
        if all(o.exited for o in self.replicas):
            drop_dead_events(self.env)
