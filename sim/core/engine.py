"""The engine: a vLLM-style continuous-batching replica, one step at a time on the SimPy clock.

Each iteration the scheduler *plans* a step (which running requests get how many tokens, who is
admitted, who is preempted: :mod:`sim.core.planner`), the cost model prices it, SimPy advances
the clock by that duration, and the step is *applied* (tokens emitted, requests finished,
blocks freed: :mod:`sim.core.apply`). :func:`sim.core.loop.replica_loop` drives it.

The parts, one module each: ranking and arrival gating (here), planning and admission
(:mod:`sim.core.planner`), preemption, its modes as strategy objects
(:mod:`sim.core.preemption`), speculative decoding (:mod:`sim.core.speculation`), applying a
run (:mod:`sim.core.apply`), fast-forward over runs of identical steps
(:mod:`sim.core.fastforward`), invariants, the progress guarantee and the iteration trace
(:mod:`sim.core.observe`).

Events, not ticks: when nothing can change for a while the engine advances a run of ``k`` steps
at once with their exact per-step durations (integer ns from one cost function), so results are
identical to stepping one iteration at a time (``engine.fast_forward = false``), which the tests
assert. Steady decoders live in a lazily-advanced cohort (:mod:`sim.core.cohort`): a step costs
the engine O(classes x block_size) work for them, not O(batch); ``engine.lazy_batch = false``
updates every request every step instead (same results, asserted by the tests).
"""
from __future__ import annotations

import heapq
import math
from bisect import bisect_left, insort
from collections.abc import Callable
from typing import Any

import simpy

from policies.base import BasePolicy, RankingContext, listens_before_ranking
from sim.core import apply as _apply
from sim.core import fastforward, observe, planner
from sim.core.cohort import DecodeCohort
from sim.core.costs import NEVER, NS, CostModel
from sim.core.errors import ScenarioError
from sim.core.kvpool import KVPool
from sim.core.plan import NO_PRIORITY, StepPlan, least_urgent, rank
from sim.core.preemption import make_mode
from sim.core.request import Request, State
from sim.core.speculation import Speculation
from sim.core.telemetry import Telemetry

__all__ = ["Engine"]

#: NEVER as a float: a policy's next change at or past it (in ns) is never
NEVER_F = float(NEVER)

#: how many of the least urgent running requests :meth:`Engine.lowest_running` finds at once
#: (preemptions take them one by one; a few more cost little in the same walk)
LEAST_KEPT = 8


def change_ns(t: Any, now_ns: int, policy: Any) -> int:
    """A policy's next change ``t`` (s, None: not declared) as the engine's integer ns: at least
    the next nanosecond (a time already past is acted on at the next boundary); NEVER for None,
    inf or a time past the integer-ns range (a float there would not convert, or would overflow
    the times it is compared with); NaN is refused in one line naming the policy."""
    if t is None:
        return NEVER
    t_ns = t * NS
    if -NEVER_F < t_ns < NEVER_F:  # (False for inf and NaN: their int conversion raises)
        return max(int(math.ceil(t_ns)), now_ns + 1)
    if t_ns >= NEVER_F:
        return NEVER
    if t_ns < 0:
        return now_ns + 1  # -inf: past, as any earlier time
    raise ScenarioError(f"policy '{getattr(policy, 'name', policy)}': next_change({now_ns / NS:.9g}) returned "
                        f"{t!r}: expected None (no change declared) or a time in seconds >= 0 (NaN is not a time)")


class Engine:
    """A replica's scheduler and executor; :func:`sim.core.loop.replica_loop` drives it.

    Args:
        env: the SimPy environment (time unit: nanoseconds).
        cfg: the scenario's EngineConfig.
        costs: the CostModel.
        policy: the ranking policy.
        classes: scenario classes, in declaration order.
        pool: the KV pool.
        telemetry: where records go.
        gate: optional admission gate with ``check(req, now_s, engine) -> reason or ''`` and
            ``on_finish(req, now_s)``.
        trace: a list collecting iteration rows (:func:`sim.core.observe.trace_rows`), or None.
        spec_seed: the seed of speculative decoding's acceptance draws.

    What the engine's parts read (public, documented here): ``waiting`` (a heap of ``(key,
    seq, request)``, or the policy's own structure ``own_queues`` with the same reads),
    ``running``, ``rank_order`` (running requests outside the cohort in rank order, None when
    stale), ``next_change_ns`` (when the policy's keys change next, NEVER if not declared),
    ``grows_blocks`` (the preemption mode's: False when each request reserves its whole KV at
    admission), ``spec`` / ``spec_k`` (speculative decoding, None / 0 when off).
    """

    # (71 lines: the engine's state, one field at a time, each with why it is kept)
    def __init__(self, env: simpy.Environment, cfg, costs: CostModel, policy, classes, pool: KVPool,
                 telemetry: Telemetry, gate=None, trace=None, spec_seed: int = 0) -> None:
        self.env = env
        self.cfg = cfg
        self.costs = costs
        self.policy = policy
        self.pool = pool
        self.tel = telemetry
        self.gate = gate
        self.trace = trace  # list collecting iteration rows, or None
        self.classes = classes
        self.bs = cfg.block_size
        # heap of (key, seq, req), or a policy's structure with the same reads (below)
        self.waiting: Any = []
        # a policy may keep the waiting set in its own structure (the fairness accountant's
        # per-tenant queues): then pushes and pops go to it and a re-key is its own
        self._prefix_info = bool(getattr(policy, "needs_prefix_info", False))
        queues = getattr(policy, "waiting_queues", None)
        self.own_queues = queues() if queues is not None and not self._prefix_info else None
        if self.own_queues is not None:
            self.waiting = self.own_queues
        # the running set by request id, in the order its requests were admitted (a dict: a
        # request leaves it in O(1) where a list is searched, and it iterates as the list did)
        self.running: dict[int, Request] = {}
        # requests per class in the waiting and the running set, counted as they enter and leave
        # (the time series reads them every interval: a count, not a walk of the queue)
        self.waiting_count = [0] * len(classes)
        self.running_count = [0] * len(classes)
        # the least urgent running requests (the last-ranked is the first victim), ascending by
        # rank, and every other running request ranks below all of them: kept as requests start
        # and leave (at most 2 x LEAST_KEPT: the most urgent of them are let go), found again
        # (the LEAST_KEPT last-ranked) once all have left. Under KV pressure the last-ranked
        # leaves at every preemption; a walk of the running set each time was a large share of
        # a preempting run.
        self.last_ranked: list[Request] = []
        self._seq = 0
        self.admissions = 0  # requests admitted so far (each admission's sequence number)
        self.dynamic = bool(getattr(policy, "dynamic", False))
        # told before each re-key when it listens (its own hook, or the default that keeps
        # older prefix-aware policies' queue_len)
        hook = getattr(policy, "before_ranking", None)
        self._before_ranking = hook if listens_before_ranking(policy) or (hook is not None and self._prefix_info) else None
        self.next_change_ns = NEVER
        self.rank_order: list[Request] | None = None  # cached rank order of running non-members
        self.iterations = 0
        self.events = 0
        self.busy_ns = 0
        self.thrash_ns = 0
        self.watermark_blocks = int(math.ceil(cfg.watermark * pool.total))
        self.chunk_cap = cfg.max_prefill_chunk or NEVER
        # settings read at every admission (a plain attribute reads faster than the config's)
        self.chunked_prefill = cfg.chunked_prefill
        self.max_num_seqs = cfg.max_num_seqs
        self.class_prefill_cap = [getattr(c, "max_prefill_tokens_per_step", 0) for c in classes]
        self.class_prefill = [0] * len(classes)  # prefill tokens per class in the step being planned
        self.counting_prefill = any(self.class_prefill_cap)
        self.waiting_prefills = [0] * len(classes)  # waiting requests due a prefill, per class
        self.class_priority = [getattr(c, "priority", 0) for c in classes]
        # every running request has its class's priority (as the request source makes them):
        # the least urgent priority running is then read from the class counts
        self.priority_by_class = True
        self._top = NO_PRIORITY  # ... the largest of them (kept while priority_by_class)
        self.preemption = make_mode(cfg.preemption)
        self.grows_blocks = self.preemption.grows_blocks
        self.oracle = bool(getattr(policy, "oracle", False))
        spec = cfg.speculative
        self.spec = Speculation(spec, classes, spec_seed, cfg.overhead, cfg.cost_scale) if spec is not None else None
        self.spec_k = spec.k if spec is not None else 0
        # KV slots a decode step's drafts take beyond its token (blocks grow only when
        # preemption is on; drafts need a budget above k): counted when sizing requests up
        self.draft_slots = (self.spec_k if self.spec_k and self.grows_blocks
                            and cfg.max_batched_tokens > self.spec_k else 0)
        self.guard = observe.ProgressGuard()
        # skip the per-request hooks when the policy keeps no books (most policies)
        self.hooks_scheduled = getattr(type(policy), "on_scheduled", None) is not BasePolicy.on_scheduled
        self.hooks_arrival = getattr(type(policy), "on_arrival", None) is not BasePolicy.on_arrival
        # (optional: a policy that books each step of a fast-forwarded run, not the run's totals)
        self.hook_scheduled_run = getattr(policy, "on_scheduled_run", None) if self.hooks_scheduled else None
        self._need_limits: dict[int, int] = {}  # per priority: the largest request not too large
        # Steady decoders advance as one cohort unless something must see every request every
        # step: a policy re-keying or keeping books per step, speculation (random tokens per
        # step), or the iteration trace (a row per request per step).
        lazy = (cfg.lazy_batch and not self.dynamic and not self.hooks_scheduled and not self.spec_k
                and trace is None)
        self.cohort = DecodeCohort(len(classes), self.bs, self.grows_blocks, self.class_priority) if lazy else None
        # set by the runner when a finish can create no new arrival (no closed-loop users)
        self.through_finishes = False
        # the policy never re-ranks on its own (keys change only when a request's do)
        self.static_ranking = (not self.dynamic
                               and getattr(type(policy), "next_change", None) is BasePolicy.next_change)

    #: set by the runner for closed-loop users: called with (request, end time in ns)
    on_request_end: Callable[[Request, int], None] | None = None

    # ---- ranking ---------------------------------------------------------------------------
    def _key(self, req: Request, now_s: float) -> tuple:
        k = self.policy.key(req, now_s)
        return k if type(k) is tuple else tuple(k)

    def push_waiting(self, req: Request, now_ns: int) -> None:
        req.key = self._key(req, now_ns / NS)
        self._seq += 1
        self.push_entry((req.key, self._seq, req))
        if req.tokens - req.computed > 1:
            self.waiting_prefills[req.cls_idx] += 1

    def push_entry(self, entry: tuple) -> None:
        """Put a ``(key, seq, request)`` entry into the waiting set (the policy's own queues when
        it keeps them, else the heap)."""
        if self.own_queues is not None:
            self.own_queues.push(entry)
        else:
            heapq.heappush(self.waiting, entry)
        self.waiting_count[entry[2].cls_idx] += 1

    def pop_entry(self) -> tuple:
        """Take the first-ranked ``(key, seq, request)`` entry out of the waiting set."""
        entry = self.own_queues.pop() if self.own_queues is not None else heapq.heappop(self.waiting)
        self.waiting_count[entry[2].cls_idx] -= 1
        return entry

    # ---- the running set -------------------------------------------------------------------
    def add_running(self, r: Request) -> None:
        """``r`` (admitted, its ``admit_seq`` the newest) joins the running set."""
        self.running[r.request_id] = r
        self.running_count[r.cls_idx] += 1
        if r.priority != self.class_priority[r.cls_idx]:
            self.priority_by_class = False
        if r.priority > self._top:
            self._top = r.priority
        least = self.last_ranked
        if least and rank(r) > rank(least[0]):
            insort(least, r, key=rank)
            if len(least) > 2 * LEAST_KEPT:  # (the first ones rank above the rest still)
                del least[:LEAST_KEPT]

    def remove_running(self, r: Request) -> None:
        """``r`` leaves the running set (finished or preempted)."""
        del self.running[r.request_id]
        ci = r.cls_idx
        n = self.running_count[ci] - 1
        self.running_count[ci] = n
        if not n and r.priority == self._top:  # its class was the least urgent running
            self._top = least_urgent(self.class_priority, self.running_count)
        least = self.last_ranked
        if least:
            k = rank(r)
            if k >= rank(least[0]):
                i = bisect_left(least, k, key=rank)
                if i < len(least) and least[i] is r:
                    del least[i]

    def lowest_running(self) -> Request:
        """The running request ranked last (largest key; ties: the most recently admitted).
        The running set must not be empty."""
        least = self.last_ranked
        if not least:
            least = self.last_ranked = heapq.nlargest(LEAST_KEPT, self.running.values(), key=rank)
            least.reverse()
        return least[-1]

    def top_running_priority(self) -> int:
        """The least urgent (largest) priority of a running request; the set must not be empty."""
        if not self.priority_by_class:
            return max(r.priority for r in self.running.values())
        return self._top

    def _rekey_all(self, now_ns: int) -> None:
        """Recompute every key (waiting and running) and rebuild the waiting heap."""
        if self.cohort is not None:
            self.cohort.sync_all()  # a key may read progress fields
        now_s = now_ns / NS
        if self.own_queues is not None:
            self.own_queues.rekey()
        else:
            key = self._key
            seq = self._seq
            items = []
            for _, _, r in self.waiting:
                r.key = k = key(r, now_s)
                seq += 1
                items.append((k, seq, r))
            self._seq = seq
            heapq.heapify(items)
            self.waiting = items
        for r in self.running.values():
            r.key = self._key(r, now_s)
        self.rank_order = None
        self.last_ranked = []
        if self.cohort is not None:
            self.cohort.keys_changed()

    def ranking_context(self, now_ns: int) -> RankingContext:
        """What the policy is told before a re-key: the queue length and, when it declares
        ``needs_prefix_info``, each waiting request's currently cached prefix, in tokens."""
        cached: dict[int, int] = {}
        if self._prefix_info:
            cache = self.pool.cache
            for _, _, r in self.waiting:
                hit = 0
                if cache is not None and r.hash_ids and r.computed == 0:
                    hit = cache.hit_groups(r.prompt_tokens, r.hash_ids) * cache.group_tokens
                cached[r.request_id] = hit
        return RankingContext(now_ns / NS, len(self.waiting), cached)

    def refresh_ranking(self, now_ns: int) -> None:
        """Before each plan: re-key when the policy is dynamic or the change time it declared
        before the previous step has come; then record its next declared change, which bounds
        fast-forward. (A change caused by the step itself, e.g. a quantum used up in a request's
        first step, is declared then and acted on at the following boundary.)"""
        if self.static_ranking:
            return  # keys never change on their own (and next_change is always None)
        if self.dynamic or now_ns >= self.next_change_ns:
            if self._before_ranking is not None:
                self._before_ranking(self.ranking_context(now_ns))
            self._rekey_all(now_ns)
        t = self.policy.next_change(now_ns / NS)
        self.next_change_ns = NEVER if t is None else change_ns(t, now_ns, self.policy)  # (no call for None)

    # ---- arrivals --------------------------------------------------------------------------
    def admit_arrival(self, req: Request, now_ns: int) -> bool:
        """Gate a new request at its arrival instant; queue it or record its rejection."""
        req.reveals_output = self.oracle
        # the most it can ever hold: prompt + output, plus k draft slots in a speculative step
        need = req.prompt_tokens + req.max_tokens + self.draft_slots
        if need > self.need_limit(req.priority):
            return self._reject(req, "too_large", now_ns)
        if self.gate is not None:
            if self.cohort is not None:
                self.cohort.sync_all()  # a gate may estimate from running requests' progress
            reason = self.gate.check(req, now_ns / NS, self)
            if reason:
                return self._reject(req, reason, now_ns)
        if self.hooks_arrival:
            self.policy.on_arrival(req, now_ns / NS)
        self.push_waiting(req, now_ns)
        return True

    def need_limit(self, priority: int) -> int:
        """The most tokens (prompt + output + drafts) a request of ``priority`` may need without
        being rejected at its arrival as too large, kept per priority (one lookup an arrival): its
        blocks within what it could ever hold above the watermark (``blocks_for(need) <= C``
        exactly when ``need <= C * block_size``), and without chunked prefill, one step's budget
        (a (re-)prefill must fit one step, as vLLM V0 requires max_num_batched_tokens >=
        max_model_len)."""
        limit = self._need_limits.get(priority)
        if limit is not None:
            return limit
        limit = (self.pool.capacity_for(priority) - self.watermark_blocks) * self.pool.block_size
        if not self.chunked_prefill:
            limit = min(limit, self.cfg.max_batched_tokens)
        self._need_limits[priority] = limit
        return limit

    def _reject(self, req: Request, reason: str, now_ns: int) -> bool:
        # Admission answers at the arrival instant (the gate runs in front of the scheduler);
        # the engine sees an arrival at the first step boundary after it.
        req.state = State.REJECTED
        req.reject_reason = reason
        req.finish_ns = req.arrival_ns
        self.tel.on_end(req)
        if self.on_request_end is not None:
            self.on_request_end(req, req.arrival_ns)  # a closed-loop user has its answer
        return False

    # ---- a step: plan, price, run length, apply ----------------------------------------------
    def plan(self, now_ns: int) -> StepPlan:
        """Decide the next step (:func:`sim.core.planner.plan`). Mutates blocks and the running
        set; the step's time is then priced (:meth:`compute_ns`) and applied (:meth:`apply`)."""
        return planner.plan(self, now_ns)

    def aggregates(self, plan: StepPlan) -> tuple[int, int, int, int, int, int, int]:
        """Step-shape aggregates for the cost model: prefill tokens (plus speculative
        verification tokens), decoders, sum l^2, sum l x c, sum of decode contexts, prefill
        chunks and requests whose prefill starts in the step (the last two: engine overhead)."""
        P = D = l2 = lc = ctx = n_pf = n_adm = 0
        for s in plan.items:
            if s.decode:
                D += 1
                ctx += s.computed_before + 1
                P += s.tokens - 1  # draft positions verified alongside the decode token
            else:
                P += s.tokens
                l2 += s.tokens * s.tokens
                lc += s.tokens * s.computed_before
                n_pf += 1
                n_adm += s.admitted
        if plan.cohort:
            assert self.cohort is not None
            D += plan.cohort
            ctx += self.cohort.context_sum()
        return P, D, l2, lc, ctx, n_pf, n_adm

    def compute_ns(self, plan: StepPlan) -> int:
        """Engine compute time of a step, ns: the target's forward pass, plus the draft model's
        k sequential steps when speculating (:meth:`Speculation.draft_ns`)."""
        if not plan.items and not plan.cohort:
            return 0
        P, D, l2, lc, ctx, n_pf, n_adm = self.aggregates(plan)
        t = self.costs.step_ns(P, D, l2, lc, ctx, n_pf, n_adm)
        if self.spec is not None:
            t += self.spec.draft_ns(self.costs, plan.items)
        return t

    def transfer_ns(self, plan: StepPlan) -> int:
        """Swap traffic of a step (out and in), ns."""
        if not plan.swap_out_blocks and not plan.swap_in_blocks:
            return 0
        return self.costs.swap_ns(plan.swap_out_blocks, self.bs) + self.costs.swap_ns(plan.swap_in_blocks, self.bs)

    def run_length(self, plan: StepPlan, now_ns: int, next_event_ns: int, dur0: int) -> list[int]:
        """Durations (ns) of the steps to take for this plan (:func:`sim.core.fastforward.run_length`)."""
        return fastforward.run_length(self, plan, now_ns, next_event_ns, dur0)

    def allocate_run(self, plan: StepPlan, k: int, done: int = 1) -> None:
        """Allocate the blocks steps done+1..k of a fast-forwarded run need
        (:func:`sim.core.fastforward.allocate_run`)."""
        fastforward.allocate_run(self, plan, k, done)

    def apply(self, plan: StepPlan, start_ns: int, durations: list[int], compute_ns: int) -> None:
        """Apply a run of ``len(durations)`` steps of ``plan`` (:func:`sim.core.apply.apply`)."""
        _apply.apply(self, plan, start_ns, durations, compute_ns)

    def release_blocks(self, r: Request, preempted: bool = False) -> None:
        """Free a request's own blocks and drop its references on shared prefix groups
        (``preempted``: for eviction attribution, see ``sim.core.prefix_cache``)."""
        if r.blocks:
            self.pool.release(r.cls_idx, r.blocks)
        r.blocks = 0
        if r.shared:
            self.pool.cache.release(r.shared, (r.cls_idx, r.tenant, r.request_id), preempted)
            r.shared = ()
            r.base_blocks = 0

    def trace_run(self, plan: StepPlan, start_ns: int, durations: list[int]) -> None:
        """Append the run's rows to the iteration trace (after ``iterations`` counted it)."""
        self.trace.extend(observe.trace_rows(plan, self.iterations - len(durations), start_ns, durations))

    # ---- the end, and checks -----------------------------------------------------------------
    def close(self, end_ns: int, also=()) -> None:
        """The run is over: whatever is still queued or running (and ``also``: requests routed
        here but never taken in) ends unfinished at ``end_ns``; the pool must balance."""
        if self.cohort is not None:
            self.cohort.dissolve()  # members' fields are brought up to date, their spans end
            self.tel.add_cohort(self.cohort)
        for r in [w for _, _, w in self.waiting] + list(self.running.values()) + list(also):
            r.state = State.UNFINISHED
            r.finish_ns = end_ns
            self.tel.on_end(r)
        self.pool.check()

    def check_invariants(self) -> None:
        """KV conservation at this instant (:func:`sim.core.observe.check_invariants`)."""
        observe.check_invariants(self)

    def check_progress(self, now_ns: int) -> None:
        """Called by the loop every PROGRESS_EVERY events: raise StallError when nothing has
        progressed for long (:class:`sim.core.observe.ProgressGuard`)."""
        self.guard.check(self, now_ns)

    def describe_live(self, n: int = 3) -> str:
        """The live requests most involved in a stall, in one phrase."""
        return observe.describe_live(self, n)
