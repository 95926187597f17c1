"""The engine: one SimPy process that runs a vLLM-style continuous-batching replica.

Each iteration the scheduler *plans* a step (which running requests get how many tokens, who is
admitted, who is preempted), the cost model prices it, SimPy advances the clock by that duration,
and the step is *applied* (tokens emitted, requests finished, blocks freed).

Planning order, as in vLLM's V1 scheduler:
  1. running requests in rank order (most urgent first) take their tokens — a decode takes one,
     a prefill (or recompute) chunk takes ``min(remaining, budget, max_prefill_chunk)``; when a
     request needs a block and none is available, the lowest-ranked running request is
     preempted (possibly itself);
  2. if no request was preempted in this step, waiting requests are admitted in rank order while
     slots, budget, blocks (above the watermark) allow; the first that does not fit stops
     admission (strict order, no bypass), unless ``preempt_for_waiting`` lets it evict
     lower-ranked running requests.

Events, not ticks: when every running request decodes after the planned step and nothing else
can change (an arrival, a block shortage, the policy's next ranking change, a telemetry sample,
the horizon), the engine computes how many steps ``k`` can run and advances them at once with
the exact per-step durations. The run may start with an admission and last prefill chunks, and
go on past requests' last tokens, when nobody waits and the policy never re-ranks. Durations are
integer nanoseconds from one cost function, evaluated step by step, so the result is identical
to stepping one iteration at a time (``engine.fast_forward = false``), which the tests assert.
Speculative decoding emits a random number of tokens per step and is always stepped singly.

Steady decoders live in a lazily-advanced cohort (:mod:`sim.core.cohort`): a step costs the engine
O(classes x block_size) work for them, not O(batch); ``engine.lazy_batch = false`` updates
every request every step instead (same results, asserted by the tests).
"""
from __future__ import annotations

import heapq
import math
from bisect import insort
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import numpy as np
import simpy

from policies.base import BasePolicy
from sim.core.cohort import NOT_MEMBER, DecodeCohort
from sim.core.errors import StallError
from sim.core.costs import NS, CostModel
from sim.core.kvpool import KVPool
from sim.core.request import Request, State
from sim.core.telemetry import Telemetry

NEVER = 2**62  # "no such time", in ns
# Progress guarantee: every PROGRESS_EVERY engine events the loop asks whether any token was
# emitted or any request ended since the last progress; with none over a stretch of at least
# STALL_MIN events (and twice the tokens all live requests hold, the most a progressing
# schedule could spend re-prefilling them), the run stops with a StallError.
PROGRESS_EVERY = 8192
STALL_MIN = 65536


def _age(r: Request) -> tuple:
    """Arrival order (earliest first)."""
    return (r.arrival_ns, r.request_id)


_priority = attrgetter("priority")
_key = attrgetter("key")


def _rank(r: Request) -> tuple:
    """Rank order of running requests: policy key, then admission order."""
    return (r.key, r.admit_seq)


@dataclass(slots=True)
class Scheduled:
    """One request's share of a step."""

    req: Request
    tokens: int
    prefix: int  # tokens already computed before this chunk
    decode: bool
    admitted: bool = False  # taken from the waiting set in this step


@dataclass
class StepPlan:
    items: list[Scheduled] = field(default_factory=list)
    admitted: int = 0
    preempted: int = 0
    swap_out_blocks: int = 0
    swap_in_blocks: int = 0
    swapped_out: list = field(default_factory=list)  # (request, blocks)
    swapped_in: list = field(default_factory=list)
    cohort: int = 0  # decoders of the lazily-advanced cohort in this step (beyond ``items``)
    kinds: list = field(default_factory=list)  # items' kinds, for the iteration trace

    @property
    def empty(self) -> bool:
        return not self.items and not self.cohort and not self.swap_out_blocks


class Engine:
    """A replica's scheduler and executor; ``sim.run.replica_loop`` drives it on the SimPy clock.

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
    """

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
        queues = getattr(policy, "waiting_queues", None)
        self._queues = queues() if queues is not None and not getattr(policy, "needs_prefix_info", False) else None
        if self._queues is not None:
            self.waiting = self._queues
        self.running: list[Request] = []
        self._seq = 0
        self._admit_seq = 0
        self._dynamic = bool(getattr(policy, "dynamic", False))
        self._prefix_info = bool(getattr(policy, "needs_prefix_info", False))
        self._next_change_ns = NEVER
        self._order: list[Request] | None = None  # cached rank order of self.running
        self.iterations = 0
        self.events = 0
        self.busy_ns = 0
        self.thrash_ns = 0
        self.watermark_blocks = int(math.ceil(cfg.watermark * pool.total))
        self.chunk_cap = cfg.max_prefill_chunk or NEVER
        self.class_prefill_cap = [getattr(c, "max_prefill_tokens_per_step", 0) for c in classes]
        self._class_prefill = [0] * len(classes)  # prefill tokens per class in the step being planned
        self._counting_prefill = any(self.class_prefill_cap)
        self._waiting_prefills = [0] * len(classes)  # waiting requests due a prefill, per class
        self._cls_prio = [getattr(c, "priority", 0) for c in classes]
        self.off = cfg.preemption == "off"
        if not cfg.chunked_prefill:
            self.chunk_cap = NEVER
        self.oracle = bool(getattr(policy, "oracle", False))
        spec = cfg.speculative
        self.spec_k = spec.k if spec is not None else 0
        self._spec_cls = [bool(getattr(c, "speculate", True)) for c in classes]  # classes that draft
        # KV slots a decode step's drafts take beyond its token (blocks grow only when
        # preemption is on; drafts need a budget above k): counted when sizing requests up
        self._draft_slots = (self.spec_k if self.spec_k and not self.off and cfg.max_batched_tokens > self.spec_k
                             else 0)
        self._last_progress: tuple | None = None  # (mark, events, preemptions, t) at the last progress
        self.spec_stats = {"steps": 0, "sequence_steps": 0, "drafted": 0, "accepted": 0, "emitted": 0}
        self._spec_rng = np.random.default_rng(spec_seed) if spec is not None else None
        self.draft_costs = None
        if spec is not None and spec.draft_profile:
            from sim.core.costs import load_profile
            self.draft_costs = load_profile(spec.draft_profile, where="engine.speculative.draft_profile",
                                            overhead=cfg.overhead)
        # skip the per-request hook when the policy keeps no books (most policies)
        self._hooks_scheduled = getattr(type(policy), "on_scheduled", None) is not BasePolicy.on_scheduled
        # Steady decoders advance as one cohort unless something must see every request every
        # step: a policy re-keying or keeping books per step, speculation (random tokens per
        # step), or the iteration trace (a row per request per step).
        lazy = (cfg.lazy_batch and not self._dynamic and not self._hooks_scheduled and not self.spec_k
                and trace is None)
        self.cohort = DecodeCohort(len(classes), self.bs, not self.off) if lazy else None
        # set by the runner when a finish can create no new arrival (no closed-loop users)
        self.through_finishes = False
        # the policy never re-ranks on its own (keys change only when a request's do)
        self._static_ranking = (not self._dynamic
                                and getattr(type(policy), "next_change", None) is BasePolicy.next_change)

    # ---- ranking ---------------------------------------------------------------------------
    def _key(self, req: Request, now_s: float) -> tuple:
        k = self.policy.key(req, now_s)
        return k if type(k) is tuple else tuple(k)

    def push_waiting(self, req: Request, now_ns: int) -> None:
        req.key = self._key(req, now_ns / NS)
        self._seq += 1
        if self._queues is not None:
            self._queues.push((req.key, self._seq, req))
        else:
            heapq.heappush(self.waiting, (req.key, self._seq, req))
        if req.tokens - req.computed > 1:
            self._waiting_prefills[req.cls_idx] += 1

    def _rekey_all(self, now_ns: int) -> None:
        """Recompute every key (waiting and running) and rebuild the waiting heap."""
        if self.cohort is not None:
            self.cohort.sync_all()  # a key may read progress fields
        now_s = now_ns / NS
        if self._queues is not None:
            self._queues.rekey()
            for r in self.running:
                r.key = self._key(r, now_s)
            self._order = None
            return
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
        for r in self.running:
            r.key = self._key(r, now_s)
        self._order = None

    def _tell_prefixes(self) -> None:
        """For cache-aware policies: each waiting request's currently cached prefix, in tokens."""
        cache = self.pool.cache
        self.policy.queue_len = len(self.waiting)
        for _, _, r in self.waiting:
            hit = 0
            if cache is not None and r.hash_ids and r.computed == 0:
                hit = cache.hit_groups(r.prompt_tokens, r.hash_ids) * cache.group_tokens
            r.predicted["cached_prefix_tokens"] = hit

    def refresh_ranking(self, now_ns: int) -> None:
        """Before each plan: re-key when the policy is dynamic or the change time it declared
        before the previous step has come; then record its next declared change, which bounds
        fast-forward. (A change caused by the step itself, e.g. a quantum used up in a request's
        first step, is declared then and acted on at the following boundary.)"""
        if self._static_ranking:
            return  # keys never change on their own (and next_change is always None)
        if self._dynamic or now_ns >= self._next_change_ns:
            if self._prefix_info:
                self._tell_prefixes()
            self._rekey_all(now_ns)
        t = self.policy.next_change(now_ns / NS)
        self._next_change_ns = NEVER if t is None else max(int(math.ceil(t * NS)), now_ns + 1)

    # ---- arrivals --------------------------------------------------------------------------
    def admit_arrival(self, req: Request, now_ns: int) -> bool:
        """Gate a new request at its arrival instant; queue it or record its rejection."""
        req._oracle_ok = self.oracle
        # the most it can ever hold: prompt + output, plus k draft slots in a speculative step
        need = req.prompt_tokens + req.max_tokens + self._draft_slots
        if self.pool.blocks_for(need) > self.pool.capacity_for(req.priority) - self.watermark_blocks:
            return self._reject(req, "too_large", now_ns)
        if not self.cfg.chunked_prefill and need > self.cfg.max_batched_tokens:
            # without chunking a (re-)prefill must fit one step's budget (as vLLM V0 requires
            # max_num_batched_tokens >= max_model_len)
            return self._reject(req, "too_large", now_ns)
        if self.gate is not None:
            if self.cohort is not None:
                self.cohort.sync_all()  # a gate may estimate from running requests' progress
            reason = self.gate.check(req, now_ns / NS, self)
            if reason:
                return self._reject(req, reason, now_ns)
        self.policy.on_arrival(req, now_ns / NS)
        self.push_waiting(req, now_ns)
        return True

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

    # ---- planning --------------------------------------------------------------------------
    def _chunk(self, req: Request, budget: int, class_prefill: list[int] | None = None) -> int:
        """Tokens ``req`` may take this step: 1 for a decode; for a prefill, what is left of the
        budget, the per-request chunk cap and its class's per-step prefill cap allow (prefill
        tokens already taken per class: ``class_prefill``, default this step's)."""
        need = req.tokens - req.computed
        if need <= 1:
            return 1 if budget >= 1 else 0
        cap = self.class_prefill_cap[req.cls_idx]
        if cap:
            used = (self._class_prefill if class_prefill is None else class_prefill)[req.cls_idx]
            if self.cfg.chunked_prefill or used:
                budget = min(budget, cap - used)
            # unchunked prompts longer than the cap go one per step (else they never could)
        if self.cfg.chunked_prefill:
            return max(0, min(need, budget, self.chunk_cap))
        return need if need <= budget else 0

    def _ranked_running(self) -> list[Request]:
        """Running requests outside the cohort, most urgent first (cached until the set or the
        keys change)."""
        if self._order is None:
            self._order = sorted((r for r in self.running if r.cohort_g0 == NOT_MEMBER), key=_rank)
        return self._order

    # ---- the cohort's share of a step --------------------------------------------------------
    def _cohort_step_blocks(self) -> list[int] | None:
        """Can the cohort's decoders all take their token in the next step without changing what
        any other running request gets, and with no preemption? Returns the KV blocks per class
        the cohort needs for it, or None when it cannot.

        Yes when, with the cohort's D tokens taken first, no running request's chunk is cut by
        the budget and every block the step needs (cohort and others) is available to the least
        favoured class present. Then the rank-order walk gives every running request exactly
        what this walk gives it, wherever the cohort's members sit in the order.
        """
        coh = self.cohort
        assert coh is not None
        budget = self.cfg.max_batched_tokens - len(coh)
        if budget < 0:
            return None
        need = coh.next_step_blocks()
        blocks = sum(need)
        explicit = self._ranked_running()
        if not explicit and not blocks:
            return need
        used = [0] * len(self.classes)
        # the least favoured class present has the fewest blocks available (reservations of
        # every more urgent class are held back from it)
        worst = max(p for p, n in zip(self._cls_prio, coh.n_cls) if n)
        bs = self.bs
        last_member = None
        for req in explicit:
            if req.tokens - req.computed == 1:
                if budget < 1:
                    return None
                n = 1
            else:
                n = self._chunk(req, budget, used)
                if n < self._chunk(req, NEVER, used):
                    # the budget cuts this chunk: the walk gives it the same only when every
                    # member ranks above it (their tokens come before it either way)
                    if last_member is None:
                        last_member = max(_rank(m) for m in coh.members.values())
                    if _rank(req) < last_member:
                        return None
                used[req.cls_idx] += n
            if not self.off:
                new = -(-(req.computed + n) // bs) - req.blocks - req.base_blocks
                if new > 0:
                    blocks += new
            budget -= n
            if req.priority > worst:
                worst = req.priority
        return need if blocks <= 0 or blocks <= self.pool.available_for(worst) else None

    def _dissolve_cohort(self, plan: StepPlan | None = None, scheduled: dict | None = None) -> None:
        """Make every cohort member an ordinary running request again (synced). Inside a plan
        whose step the cohort already joined, each gets its decode item for that step."""
        assert self.cohort is not None
        members = self.cohort.dissolve()
        self._order = None
        if plan is not None and plan.cohort:
            assert scheduled is not None
            plan.cohort = 0
            for r in sorted(members, key=_rank):
                scheduled[r.request_id] = Scheduled(r, 1, r.computed, True)

    def plan(self, now_ns: int) -> StepPlan:
        """Decide the next step (see module docstring). Mutates blocks and the running set;
        the step's time is then priced from :meth:`aggregates` and applied by :meth:`apply`."""
        plan = StepPlan()
        budget = self.cfg.max_batched_tokens
        scheduled: dict[int, Scheduled] = {}
        counting = self._counting_prefill
        if counting:
            self._class_prefill = [0] * len(self.classes)
        pool = self.pool
        bs = self.bs
        off = self.off
        coh = self.cohort
        if coh is not None and coh.members:
            need = self._cohort_step_blocks()
            if need is not None:
                plan.cohort = len(coh)
                budget -= plan.cohort
                for ci, n in enumerate(need):
                    if n:
                        pool.allocate(ci, n)
                coh.alloc_g = coh.g + 1
            else:
                self._dissolve_cohort()
        for req in list(self._ranked_running()):  # a copy: preemption edits the order
            if req.state is not State.RUNNING:
                continue  # preempted earlier in this loop
            decode = req.tokens - req.computed == 1
            if decode:
                if budget < 1:
                    continue
                # with speculation a decoder verifies k drafts + 1 token (when the budget allows)
                n = 1 + self.spec_k if budget > self.spec_k and self._spec_cls[req.cls_idx] else 1
            else:
                n = self._chunk(req, budget)
                if n == 0:
                    continue
            if not off:
                new_blocks = -(-(req.computed + n) // bs) - req.blocks - req.base_blocks
                if new_blocks > 0:
                    if new_blocks > pool.available_for(req.priority):
                        while new_blocks > pool.available_for(req.priority):
                            victim = self._victim_for(req, new_blocks - pool.available_for(req.priority))
                            self._preempt(victim, plan, scheduled, now_ns)
                            if victim is req:
                                break
                        if req.state is not State.RUNNING:
                            continue
                        # victims scheduled earlier in this step gave their tokens back
                        budget = self._budget_left(scheduled)
                        if not decode:
                            n = self._chunk(req, budget)
                        if n == 0 or budget < 1:
                            continue
                        new_blocks = -(-(req.computed + n) // bs) - req.blocks - req.base_blocks
                    pool.allocate(req.cls_idx, new_blocks)
                    req.blocks += new_blocks
            scheduled[req.request_id] = Scheduled(req, n, req.computed, decode)
            budget -= n
            if counting and not decode:
                self._class_prefill[req.cls_idx] += n
        if plan.preempted == 0:
            budget = self._admit_waiting(plan, scheduled, budget, now_ns)
        plan.items = list(scheduled.values())
        return plan

    def _budget_left(self, scheduled: dict, cohort: int = 0) -> int:
        """Token budget left in the step being planned (after a preemption gave tokens back),
        with ``cohort`` decoders of the cohort in it."""
        return self.cfg.max_batched_tokens - cohort - sum(s.tokens for s in scheduled.values())

    def _lowest_running(self) -> Request:
        # Lowest rank = largest key; ties: most recently admitted (vLLM pops the newest).
        return max(self.running, key=_rank)

    def _victim_for(self, req: Request, short: int) -> Request:
        """Whom to preempt so that running ``req`` gets the ``short`` blocks it lacks.
        ``engine.victim = "rank"``: the lowest-ranked running request (vLLM; may be ``req``
        itself). ``"prefix_aware"``: among the running requests of that one's priority class
        ranked below ``req``, the cheapest to preempt (:meth:`victim_cost_ns`) of those that free
        ``short`` blocks; when none does alone, the cheapest per block it frees
        (:meth:`victim_score`). Ties go to the lower rank."""
        lowest = self._lowest_running()
        if self.cfg.victim == "rank" or lowest is req:
            return lowest
        rk = _rank(req)
        cands = sorted((r for r in self.running if r.priority == lowest.priority and _rank(r) > rk),
                       key=_rank, reverse=True)
        if len(cands) < 2:
            return lowest
        reuse = self._about_to_reuse(None)
        # a victim that frees too little is followed by another preemption
        enough = [r for r in cands if self.frees_blocks(r) >= short]
        if enough:
            return min(enough, key=lambda r: self.victim_cost_ns(r, reuse))
        return min(cands, key=lambda r: self.victim_score(r, reuse))

    def _about_to_reuse(self, exclude: Request | None) -> set:
        """Prefix groups that the next ``max_num_seqs`` waiting requests (by rank) would reuse."""
        cache = self.pool.cache
        if cache is None or not self.waiting:
            return set()
        out: set = set()
        for _, _, w in heapq.nsmallest(self.cfg.max_num_seqs, self.waiting):
            if w is not exclude and w.hash_ids and w.computed == 0:
                out.update(w.hash_ids[:cache.full_groups(w.prompt_tokens, w.hash_ids)])
        return out

    def victim_score(self, v: Request, reuse: set) -> float:
        """A preemption's cost per KV block it makes available, ns per block: its own blocks
        plus the cached groups only it holds (they become evictable). A victim whose tokens sit
        in groups other running requests pin frees little, and more preemptions would follow."""
        freed = self.frees_blocks(v)
        return self.victim_cost_ns(v, reuse) / freed if freed > 0 else math.inf

    def frees_blocks(self, v: Request) -> int:
        """Blocks preempting ``v`` makes available: its own, plus the cached groups only it holds
        (they become evictable, which admission counts as available)."""
        cache = self.pool.cache
        freed = v.blocks
        if cache is not None:
            freed += cache.group_blocks * sum(1 for h in v.shared if cache.refs[h] == 1)
        return freed

    def victim_cost_ns(self, v: Request, reuse: set) -> int:
        """Engine time a preemption of ``v`` is expected to cost, ns: its own (swap out and in of
        its computed blocks, or the re-prefill of its computed tokens except the cached groups
        another running request also holds: those stay pinned; the groups only ``v`` holds become
        evictable, and a pool short of blocks evicts them) plus the re-prefill pushed onto others:
        the groups only ``v`` holds that a waiting request in ``reuse`` is about to use, priced as
        one re-prefill at the current batch."""
        cache = self.pool.cache
        d = len(self.running)
        sole = [h for h in v.shared if cache.refs[h] == 1] if cache is not None else []
        if self._choose_mode(v) == "swap":
            own = self.swap_cost_ns(self.pool.blocks_for(v.computed))
        else:
            pinned = (len(v.shared) - len(sole)) * cache.group_tokens if cache is not None else 0
            own = self.recompute_cost_ns(max(0, v.computed - pinned), d)
        if cache is None or not reuse:
            return own
        pushed = sum(cache.group_tokens for h in sole if h in reuse)
        return own + (self.recompute_cost_ns(pushed, d) if pushed else 0)

    def _admit_waiting(self, plan: StepPlan, scheduled: dict, budget: int, now_ns: int) -> int:
        pool = self.pool
        throttled = []  # waiters whose class used up its prefill cap this step: skipped, kept
        held = [0] * len(self.classes)  # ... per class
        caps = self.class_prefill_cap
        while self.waiting and budget > 0:
            key, _, w = self.waiting[0]
            fits, n, need_blocks, hit = self._fits(w, budget)
            if not fits and self._class_capped(w):
                throttled.append(self._pop_waiting())
                held[w.cls_idx] += 1
                if self.pool.cache is None:
                    # every waiter left is a prefill of a class whose cap is used up: each would
                    # be skipped in turn (without a prefix cache nothing makes one shorter)
                    used = self._class_prefill
                    capped = sum(self._waiting_prefills[c] - held[c] for c in range(len(caps))
                                 if caps[c] and used[c] >= caps[c])
                    if capped == len(self.waiting):
                        break
                continue
            if not fits:
                if not self._preempt_for(w, plan, scheduled, budget, now_ns):
                    break
                budget = self._budget_left(scheduled, plan.cohort)
                if self.waiting[0][2] is not w:
                    continue  # a victim re-keyed on preemption now heads the queue: re-decide
                fits, n, need_blocks, hit = self._fits(w, budget)
                if not fits:
                    break
            self._pop_waiting()
            if w.tokens - w.computed > 1:
                self._waiting_prefills[w.cls_idx] -= 1
            if hit:
                self._use_prefix(w, hit)
            if w.state is State.SWAPPED:
                pool.swap_in(w.cls_idx, w.host_blocks)
                plan.swap_in_blocks += w.host_blocks
                plan.swapped_in.append((w, w.host_blocks))
                self.tel.on_swap(w, w.host_blocks)
                w.blocks = w.host_blocks
                w.host_blocks = 0
            grow = need_blocks - w.blocks
            if grow > 0:
                pool.allocate(w.cls_idx, grow)
                w.blocks += grow
            w.state = State.RUNNING
            self._admit_seq += 1
            w.admit_seq = self._admit_seq
            w.admitted_s = now_ns / NS
            if w.first_admit_ns < 0:
                w.first_admit_ns = now_ns
            self.running.append(w)
            if self._order is not None:  # keep the rank order without re-sorting
                insort(self._order, w, key=_rank)
            decode = w.tokens - w.computed == 1
            scheduled[w.request_id] = Scheduled(w, n, w.computed, decode, True)
            plan.admitted += 1
            budget -= n
            if not decode:
                self._class_prefill[w.cls_idx] += n
        for entry in throttled:
            if self._queues is not None:
                self._queues.push(entry)
            else:
                heapq.heappush(self.waiting, entry)
        return budget

    def _pop_waiting(self) -> tuple:
        return self._queues.pop() if self._queues is not None else heapq.heappop(self.waiting)

    def _class_capped(self, w: Request) -> bool:
        """Is ``w`` (a prefill) held back only by its class's per-step prefill cap?"""
        cap = self.class_prefill_cap[w.cls_idx]
        used = self._class_prefill[w.cls_idx]
        if not cap or w.tokens - w.computed <= 1 or not used:
            return False
        return used >= cap or (not self.cfg.chunked_prefill and used + w.tokens - w.computed > cap)

    def _admission(self, w: Request, budget: int) -> tuple[int, int, int]:
        """What admitting waiting request ``w`` now takes: (tokens this step, new device blocks,
        cached prefix groups it would reuse). Tokens 0 means the budget cannot take it."""
        cache = self.pool.cache
        hit = 0
        if cache is not None and w.computed == 0 and w.hash_ids and w.state is not State.SWAPPED:
            hit = cache.hit_groups(w.prompt_tokens, w.hash_ids)
        if hit:
            cached = hit * cache.group_tokens
            w.computed = cached  # peek: restored below
            n = self._chunk(w, budget)
            w.computed = 0
            total = w.prompt_tokens + w.max_tokens if self.off else cached + n
            need = self.pool.blocks_for(total) - hit * cache.group_blocks
            return n, need, hit
        n = self._chunk(w, budget)
        if self.off:
            need = self.pool.blocks_for(w.prompt_tokens + w.max_tokens)
        elif w.state is State.SWAPPED:
            need = max(w.host_blocks, self.pool.blocks_for(w.computed + n))
        else:
            need = self.pool.blocks_for(w.computed + n)
        return n, need, 0

    def _fits(self, w: Request, budget: int) -> tuple[bool, int, int, int]:
        """Can waiting request ``w`` be admitted now? (fits, tokens, device blocks, hit groups)."""
        if len(self.running) >= self.cfg.max_num_seqs:
            return False, 0, 0, 0
        n, need, hit = self._admission(w, budget)
        if n == 0:
            return False, 0, 0, 0
        avail = self.pool.available_for(w.priority) - self.watermark_blocks
        if hit:  # groups it reuses stop being evictable once it holds them
            cache = self.pool.cache
            avail -= cache.group_blocks * sum(1 for h in w.hash_ids[:hit] if h in cache.lru)
        return need <= avail, n, need, hit

    def _use_prefix(self, w: Request, hit: int) -> None:
        """Admit ``w`` on top of its ``hit`` cached prefix groups."""
        cache = self.pool.cache
        w.shared = cache.acquire(w.hash_ids, hit)
        w.base_blocks = hit * cache.group_blocks
        w.computed = hit * cache.group_tokens
        if w.first_admit_ns < 0:
            w.prefix_hit_tokens = w.computed
        missed = cache.missed_after_eviction(w.prompt_tokens, w.hash_ids, hit, w.request_id)
        w.evicted_miss_tokens += missed * cache.group_tokens

    def _release_blocks(self, r: Request, preempted: bool = False) -> None:
        """Free a request's own blocks and drop its references on shared prefix groups
        (``preempted``: for eviction attribution, see ``sim.core.prefix_cache``)."""
        if r.blocks:
            self.pool.release(r.cls_idx, r.blocks)
        r.blocks = 0
        if r.shared:
            self.pool.cache.release(r.shared, (r.cls_idx, r.tenant, r.request_id), preempted)
            r.shared = ()
            r.base_blocks = 0

    def _publish_prefix(self, r: Request, before: int) -> None:
        """Offer the prompt groups that this step's prefill completed to the prefix cache."""
        cache = self.pool.cache
        g = cache.group_tokens
        n_full = cache.full_groups(r.prompt_tokens, r.hash_ids)
        lo, hi = before // g, min(r.computed // g, n_full)
        if lo >= hi or len(r.shared) != lo:
            return  # only extend an unbroken shared chain
        for j in range(lo, hi):
            h = r.hash_ids[j]
            if not cache.publish(h):
                return
            self.pool.publish(r.cls_idx, cache.group_blocks)
            r.blocks -= cache.group_blocks
            r.base_blocks += cache.group_blocks
            r.shared = (*r.shared, h)

    def _eligible_victims(self, w: Request) -> list[Request]:
        mode = self.cfg.preempt_for_waiting
        if mode == "never" or self.off:
            return []
        if mode in ("priority", "strict") and self.running:
            # a waiter of the least urgent class running (the common head of a full replica's
            # queue) has no victim: the max, a loop in C, says so without building the list
            top = max(map(_priority, self.running))
            if top < w.priority or (top == w.priority and mode == "strict"):
                return []
        if mode == "priority":
            ok = [r for r in self.running if (r.priority, r.arrival_s, r.request_id) > (w.priority, w.arrival_s, w.request_id)]
        elif mode == "strict":
            ok = [r for r in self.running if r.priority > w.priority]
        elif mode == "policy":
            ok = list(self.running)  # whatever the policy ranks strictly below the waiter
        else:  # threshold
            ok = [r for r in self.running if r.priority - w.priority > self.cfg.preempt_threshold]
        # never a request the policy ranks at or above the waiter
        ok = [r for r in ok if r.key > w.key]
        if mode == "policy":
            # Ranks that change with service (quanta, starvation promotion) can evict every
            # request before it finishes, and by recompute nothing is kept: a livelock (MLFQ
            # promoting starved requests that then evict each other). The oldest running
            # request, once it has been preempted, is not evicted for a waiter again: it runs
            # to its end, then the next oldest, so the run progresses (a first preemption,
            # the policy's ordinary use of this mode, is left alone).
            oldest = min(self.running, key=_age)
            if oldest.preemptions:
                ok = [r for r in ok if r is not oldest]
        ok.sort(key=_rank, reverse=True)
        if self.cfg.victim == "prefix_aware" and len(ok) > 1:
            # least urgent class first, as before; within a class the cheapest preemption per
            # block freed first (stable sort: ties keep the rank order)
            reuse = self._about_to_reuse(w)
            cost = {r.request_id: self.victim_score(r, reuse) for r in ok}
            ok.sort(key=lambda r: (-r.priority, cost[r.request_id]))
        return ok

    def _preempt_for(self, w: Request, plan: StepPlan, scheduled: dict, budget: int, now_ns: int) -> bool:
        """Evict lowest-ranked eligible running requests so that ``w`` fits.

        Evicts only if evicting every eligible victim would make room (all-or-nothing on the
        outcome, as SGLang does; never a pointless eviction), then evicts the fewest needed,
        lowest rank first.
        """
        victims = self._eligible_victims(w)
        if not victims:
            return False
        coh = self.cohort
        members = coh is not None and bool(coh.members)
        freed_tokens = freed_blocks = 0
        for v in victims:
            if members and v.cohort_g0 != NOT_MEMBER:
                assert coh is not None
                freed_blocks += coh.blocks_of(v)  # it decodes one token in this step
                freed_tokens += 1 if plan.cohort else 0
            else:
                freed_blocks += v.blocks
                if v.request_id in scheduled:
                    freed_tokens += scheduled[v.request_id].tokens
        slots_ok = len(self.running) - len(victims) < self.cfg.max_num_seqs
        b = budget + freed_tokens
        n, need, _ = self._admission(w, b)
        avail = self.pool.available_for(w.priority) - self.watermark_blocks + freed_blocks
        if not (slots_ok and n > 0 and need <= avail):
            return False
        for v in victims:
            if members and v.cohort_g0 != NOT_MEMBER:
                # it leaves the cohort alone (the others decode on in it), as an ordinary
                # request with this step's token, and gives that back when preempted
                assert coh is not None
                coh.leave(v)
                if plan.cohort:
                    plan.cohort -= 1
                    scheduled[v.request_id] = Scheduled(v, 1, v.computed, True)
                if self._order is not None:
                    insort(self._order, v, key=_rank)
            self._preempt(v, plan, scheduled, now_ns)
            if self._fits(w, self._budget_left(scheduled, plan.cohort))[0]:
                break
        return True

    # ---- preemption ------------------------------------------------------------------------
    def _choose_mode(self, v: Request) -> str:
        mode = self.cfg.preemption
        if mode == "recompute":
            return "recompute"
        blocks = self.pool.blocks_for(v.computed)
        if blocks > self.pool.host_free:
            return "fallback"
        if mode == "swap":
            return "swap"
        # auto: the cheaper of swap-out + swap-in and the marginal cost of re-prefilling it now
        return "swap" if self.swap_cost_ns(blocks) < self.recompute_cost_ns(v.computed, len(self.running)) else "recompute"

    def swap_cost_ns(self, blocks: int) -> int:
        """Swap-out plus swap-in of ``blocks`` blocks, ns."""
        return 2 * self.costs.swap_ns(blocks, self.bs)

    def recompute_cost_ns(self, tokens: int, decoders: int) -> int:
        """Marginal cost of re-prefilling ``tokens`` in a step that decodes ``decoders`` seqs."""
        c = self.costs
        return c.step_ns(tokens, decoders, tokens * tokens, 0, 0, 1, 1) - c.step_ns(0, decoders, 0, 0, 0)

    def _preempt(self, v: Request, plan: StepPlan, scheduled: dict, now_ns: int) -> None:
        """Preempt running request ``v``.

        Preconditions: ``v`` is RUNNING. Effects: removed from the running set and from this
        step's plan (its tokens return to the budget); by recompute its blocks are freed and its
        computed tokens dropped (it will re-prefill prompt + generated); by swap its blocks move
        to host space and its progress is kept (the swap-out is charged to this step); when swap
        space is full a swap falls back to recompute and is counted. It rejoins the waiting set
        with its progress and a preemption counted. The policy is told.
        """
        mode = self._choose_mode(v)
        self.running.remove(v)
        if self._order is not None:
            self._order.remove(v)
        scheduled.pop(v.request_id, None)
        v.preemptions += 1
        plan.preempted += 1
        if mode == "swap":
            # only blocks holding computed tokens travel (shared prefix groups are copied too
            # and released); those taken for this step's not-yet-computed tokens are released
            keep = self.pool.blocks_for(v.computed)
            self._release_blocks(v, preempted=True)
            self.pool.to_host(keep)
            v.host_blocks = keep
            v.swapped_blocks += keep
            plan.swap_out_blocks += keep
            plan.swapped_out.append((v, keep))
            self.tel.on_swap(v, keep)
            v.state = State.SWAPPED
        else:
            if mode == "fallback":
                v.swap_fallbacks += 1
            self._release_blocks(v, preempted=True)
            v.recomputed_tokens += v.computed
            v.computed = 0
            v.state = State.WAITING
        self.tel.on_preempt(v, mode, now_ns)
        self.policy.on_preempt(v, now_ns / NS)
        self.push_waiting(v, now_ns)

    # ---- pricing and applying --------------------------------------------------------------
    def aggregates(self, plan: StepPlan) -> tuple[int, int, int, int, int, int, int]:
        """Step-shape aggregates for the cost model: prefill tokens (plus speculative
        verification tokens), decoders, sum l^2, sum l x c, sum of decode contexts, prefill
        chunks and requests whose prefill starts in the step (the last two: engine overhead)."""
        P = D = l2 = lc = ctx = n_pf = n_adm = 0
        for s in plan.items:
            if s.decode:
                D += 1
                ctx += s.prefix + 1
                P += s.tokens - 1  # draft positions verified alongside the decode token
            else:
                P += s.tokens
                l2 += s.tokens * s.tokens
                lc += s.tokens * s.prefix
                n_pf += 1
                n_adm += s.admitted
        if plan.cohort:
            assert self.cohort is not None
            D += plan.cohort
            ctx += self.cohort.context_sum()
        return P, D, l2, lc, ctx, n_pf, n_adm

    def compute_ns(self, plan: StepPlan) -> int:
        """Engine compute time of a step, ns: the target's forward pass, plus the draft model's
        k sequential steps when speculating (each ``draft_cost_fraction`` of a target decode
        step over the same sequences)."""
        if not plan.items and not plan.cohort:
            return 0
        P, D, l2, lc, ctx, n_pf, n_adm = self.aggregates(plan)
        t = self.costs.step_ns(P, D, l2, lc, ctx, n_pf, n_adm)
        if self.spec_k:
            drafting = [s for s in plan.items if s.decode and s.tokens > 1]
            if drafting:
                dctx = sum(s.prefix + 1 for s in drafting)
                if self.draft_costs is not None:  # the draft model's own profile, k decode steps
                    t += self.spec_k * self.draft_costs.step_ns(0, len(drafting), 0, 0, dctx)
                else:
                    one = self.costs.step_ns(0, len(drafting), 0, 0, dctx)
                    t += int(round(self.spec_k * self.cfg.speculative.draft_cost_fraction * one))
        return t

    def _acceptance(self, r: Request) -> float:
        """This request's per-token draft acceptance probability."""
        acc = self.cfg.speculative.acceptance
        if isinstance(acc, dict):
            if "dist" in acc:  # each request draws its own rate once (Beta(a, b))
                if "_spec_acceptance" not in r.predicted:
                    assert self._spec_rng is not None
                    r.predicted["_spec_acceptance"] = float(self._spec_rng.beta(acc["a"], acc["b"]))
                return r.predicted["_spec_acceptance"]
            for name in (r.cls, r.tenant):  # a table by class or tenant name
                if name in acc:
                    return float(acc[name])
            return 0.0
        return acc

    def _accepted(self, r: Request, k: int) -> int:
        """Draft tokens accepted: leading successes of k Bernoulli(acceptance) trials."""
        acc = self._acceptance(r)
        if acc >= 1.0:
            return k
        if acc <= 0.0:
            return 0
        assert self._spec_rng is not None
        return min(k, int(self._spec_rng.geometric(1.0 - acc)) - 1)

    def transfer_ns(self, plan: StepPlan) -> int:
        if not plan.swap_out_blocks and not plan.swap_in_blocks:
            return 0
        return self.costs.swap_ns(plan.swap_out_blocks, self.bs) + self.costs.swap_ns(plan.swap_in_blocks, self.bs)

    def apply(self, plan: StepPlan, start_ns: int, durations: list[int], compute_ns: int) -> None:
        """Apply a run of ``len(durations)`` steps of ``plan``: the planned step, then (k > 1)
        pure decode steps of every running request.

        Every scheduled request's computed tokens advance; a request whose computed tokens reach
        its known tokens emits one token per step (first token at the end of its prefill).
        Requests that reach their output length finish at the end of that step; steady decoders
        then join the cohort.
        """
        total = sum(durations)
        end_ns = start_ns + total
        self.iterations += len(durations)
        self.busy_ns += total
        self.thrash_ns += durations[0] - compute_ns  # transfers: time lost to preemption
        finished = self._apply_items(plan, start_ns, durations, compute_ns) if plan.items else []
        if plan.cohort:
            assert self.cohort is not None
            # every member emitted a token at the end of each step up to its last, steadily
            changes = self.cohort.advance(durations, start_ns)  # (its log feeds telemetry)
            ordered = not finished  # leavers come in time order; ties need sorting
            for _, t, leavers in changes:
                finished += [(t, r, False) for r in leavers]  # (not in the rank order)
                ordered = ordered and len(leavers) == 1
        else:
            ordered = len(finished) <= 1
        if self.trace is not None:
            self._trace(plan, start_ns, durations)
        if not ordered:
            # the order a step-by-step walk meets them: by time, then running in rank order,
            # then admitted in this step in admission order
            admitted = {s.req.request_id for s in plan.items if s.admitted}
            finished.sort(key=lambda f: (f[0], 1, f[1].admit_seq) if f[1].request_id in admitted
                          else (f[0], 0, f[1].key, f[1].admit_seq))
        for t, r, in_order in finished:
            self._finish(r, t, in_order)
        coh = self.cohort
        if coh is not None and plan.items:  # steady decoders join the cohort
            bs = self.bs
            for s in plan.items:
                r = s.req
                if (r.last_token_ns == end_ns and r.state is State.RUNNING and r.cohort_g0 == NOT_MEMBER
                        and (self.off or r.blocks + r.base_blocks == -(-r.computed // bs))):
                    coh.join(r)
                    if self._order is not None:
                        self._order.remove(r)

    def _apply_items(self, plan: StepPlan, start_ns: int, durations: list[int], compute_ns: int) -> list:
        """The explicitly scheduled requests' share of :meth:`apply`; returns those that
        finished, as ``(time, request, in the rank order)``.

        Inter-token gaps: a request that also emitted at the end of the previous step has gap
        = this step's duration (counted per class, weighted); any other gap (after a stall, a
        preemption, a step it sat out) is recorded individually.
        """
        k = len(durations)
        total = sum(durations)
        end_ns = start_ns + total
        end_s = end_ns / NS
        tel = self.tel
        finished = []
        first_end = start_ns + durations[0]
        inner_max = max(durations[1:]) if k > 1 else 0  # largest gap inside a run
        run_max = max(durations[0], inner_max)
        nc = len(self.classes)
        emitted = [0] * nc  # requests emitting a token each step, per class
        steady = [0] * nc  # ... of which emitted at the end of the previous step too
        irregular = tel.itl_scalars
        by_tenant: dict[str, int] = {}
        step_tokens = plan.cohort  # tokens of the run's first step
        recompute_tokens = 0
        recompute_by_class: dict[int, int] = {}
        publish = self.pool.cache is not None
        if self.trace is not None:  # kinds must be read before the step changes the requests
            plan.kinds = ["decode" if s.decode else ("recompute" if s.req.generated else "prefill")
                          for s in plan.items]
        spec = self.spec_stats
        extra_tokens = [0] * nc  # tokens beyond one per emitting request (speculation)
        for s in plan.items:
            r = s.req
            r.attained_ns += total
            r.last_scheduled_s = end_s
            step_tokens += s.tokens
            if not s.decode and r.generated:  # re-prefill after a recompute preemption
                recompute_tokens += s.tokens
                recompute_by_class[r.cls_idx] = recompute_by_class.get(r.cls_idx, 0) + s.tokens
            if s.decode and s.tokens > 1:
                # a speculative step (always k == 1): emits 1 + accepted drafts at its end
                a = self._accepted(r, s.tokens - 1)
                per_step = min(1 + a, r._output - r.generated)
                spec["sequence_steps"] += 1
                spec["drafted"] += s.tokens - 1
                spec["accepted"] += a
                spec["emitted"] += per_step
                r.computed += per_step
                emits = per_step
            else:
                r.computed += s.tokens + (k - 1)
                if publish and r.hash_ids and not s.decode:
                    self._publish_prefix(r, s.prefix)
                if r.computed < r.tokens + (k - 1):
                    continue  # a prefill chunk that does not finish the prompt
                per_step = 1  # one token at the end of each of the k steps
                emits = k
            r.generated += emits
            r.tokens += emits
            ci = r.cls_idx
            emitted[ci] += 1
            extra_tokens[ci] += per_step - 1
            t = r.tenant
            by_tenant[t] = by_tenant.get(t, 0) + per_step
            last = r.last_token_ns
            if last == start_ns:
                steady[ci] += 1
                if run_max > r.max_itl_ns:
                    r.max_itl_ns = run_max
            elif last < 0:
                # first token (a 1-token last prefill chunk prices and runs like a decode, so it
                # can open a fast-forwarded run); no gap before it, the run's inner gaps after it
                r.first_token_ns = first_end
                if inner_max > r.max_itl_ns:
                    r.max_itl_ns = inner_max
            else:
                gap = first_end - last
                irregular[ci].append(gap)
                m = max(gap, inner_max)
                if m > r.max_itl_ns:
                    r.max_itl_ns = m
            r.last_token_ns = end_ns
            if r.generated >= r._output:
                finished.append((end_ns, r, True))
        # re-prefill's share of the first step's compute is engine time lost to preemption
        if recompute_tokens:
            self.thrash_ns += compute_ns * recompute_tokens // step_tokens
            for ci, toks in recompute_by_class.items():
                tel.recompute_ns_class[ci] += compute_ns * toks // step_tokens
        tel.itl_steps(emitted, steady, durations)
        if self.spec_k:
            spec["steps"] += 1
            emitted = [m + x for m, x in zip(emitted, extra_tokens)]
        tel.on_step(start_ns, durations, emitted, by_tenant)
        if self._hooks_scheduled:
            service_s = total / NS
            for s in plan.items:
                self.policy.on_scheduled(s.req, s.tokens + (k - 1), service_s, end_s)
        return finished

    def _finish(self, r: Request, now_ns: int, in_order: bool = True) -> None:
        self.running.remove(r)
        if in_order and self._order is not None:  # (cohort members are not in it)
            self._order.remove(r)
        self._release_blocks(r)
        r.state = State.FINISHED
        r.finish_ns = now_ns
        self.policy.on_finish(r, now_ns / NS)
        if self.gate is not None:
            self.gate.on_finish(r, now_ns / NS)
        self.tel.on_end(r)
        if self.on_request_end is not None:
            self.on_request_end(r, now_ns)

    #: set by the runner for closed-loop users: called with (request, end time in ns)
    on_request_end: Callable[[Request, int], None] | None = None

    def close(self, end_ns: int, also=()) -> None:
        """The run is over: whatever is still queued or running (and ``also``: requests routed
        here but never taken in) ends unfinished at ``end_ns``; the pool must balance."""
        if self.cohort is not None:
            self.cohort.dissolve()  # members' fields are brought up to date, their spans end
            self.tel.add_cohort(self.cohort)
        for r in [w for _, _, w in self.waiting] + list(self.running) + list(also):
            r.state = State.UNFINISHED
            r.finish_ns = end_ns
            self.tel.on_end(r)
        self.pool.check()

    def _trace(self, plan: StepPlan, start_ns: int, durations: list[int]) -> None:
        """Append one row per request per iteration (fast-forwarded runs expanded)."""
        ends = start_ns + np.cumsum(np.array(durations, dtype=np.int64))
        starts = ends - durations
        base = self.iterations - len(durations)
        t0, t1 = int(starts[0]), int(ends[0])
        for r, blocks in plan.swapped_out:
            self.trace.append((base, t0, t1, r.request_id, "swap_out", blocks))
        for r, blocks in plan.swapped_in:
            self.trace.append((base, t0, t1, r.request_id, "swap_in", blocks))
        for s, kind in zip(plan.items, plan.kinds):
            self.trace.append((base, t0, t1, s.req.request_id, kind, s.tokens))
        # the run's later steps decode every running request, taken in rank order
        later = sorted((s.req for s in plan.items), key=_rank)
        for i in range(1, len(durations)):
            for r in later:
                self.trace.append((base + i, int(starts[i]), int(ends[i]), r.request_id, "decode", 1))

    def check_invariants(self) -> None:
        """KV conservation at this instant: pool counts match what requests hold."""
        if self.cohort is not None:
            self.cohort.sync_all()
        self.pool.check()
        used = [0] * len(self.classes)
        refs: dict[int, int] = {}
        for r in self.running:
            used[r.cls_idx] += r.blocks
            for h in r.shared:
                refs[h] = refs.get(h, 0) + 1
            if not self.off and r.blocks + r.base_blocks < self.pool.blocks_for(r.computed):
                raise AssertionError(f"request {r.request_id} holds {r.blocks} blocks for {r.computed} tokens")
        host = 0
        for _, _, r in self.waiting:
            if r.blocks:
                raise AssertionError(f"waiting request {r.request_id} holds {r.blocks} device blocks")
            host += r.host_blocks
        cache = self.pool.cache
        if cache is not None:
            live = {h: c for h, c in cache.refs.items() if c}
            if live != refs or any(c < 0 for c in cache.refs.values()):
                raise AssertionError(f"prefix reference counts {live} != holders {refs}")
            if set(cache.lru) != {h for h, c in cache.refs.items() if c == 0}:
                raise AssertionError("prefix LRU list out of step with reference counts")
        if used != self.pool.used or host != self.pool.host_used:
            raise AssertionError(f"KV not conserved: requests hold {used} (host {host}), pool says "
                                 f"{self.pool.used} (host {self.pool.host_used})")

    # ---- progress guarantee -----------------------------------------------------------------
    def _progress_mark(self) -> tuple:
        """What only grows when the run progresses: requests ended, tokens emitted by explicit
        steps, cohort steps (each emits a token per member)."""
        tel = self.tel
        coh = len(self.cohort.log_durs) if self.cohort is not None else 0
        return (len(tel._rows) + len(tel.cols["request_id"]), sum(tel.tokens_bin.values()), coh)

    def check_progress(self, now_ns: int) -> None:
        """Called by the loop every PROGRESS_EVERY events: raise StallError when no token was
        emitted and no request ended over a long stretch of events while work exists. Runs
        that progress are not touched (this reads counters, changes nothing)."""
        mark = self._progress_mark()
        last = self._last_progress
        if last is None or mark != last[0]:
            self._last_progress = (mark, self.events, sum(self.tel.preempt_by_mode.values()), now_ns)
            return
        _, since, preempts0, t0 = last
        live = [w for _, _, w in self.waiting] + self.running
        held = sum(r.prompt_tokens + r.generated + 1 for r in live)
        if self.events - since < max(STALL_MIN, 2 * held):
            return
        if sum(self.tel.preempt_by_mode.values()) > preempts0:
            cause = ("requests are preempted again and again before they emit a token, and preemption "
                     "discards their progress (thrash)")
        else:
            cause = "no step emits a token"
        raise StallError(f"engine.stalled: no token emitted and no request ended in {self.events - since} engine "
                         f"events from t={t0 / NS:.3f}s to t={now_ns / NS:.3f}s: {cause}; "
                         f"{self.describe_live()}")

    def describe_live(self, n: int = 3) -> str:
        """The live requests most involved in a stall, most preempted first, in one phrase."""
        live = sorted([w for _, _, w in self.waiting] + self.running,
                      key=lambda r: (-r.preemptions, r.request_id))
        parts = [f"request {r.request_id} (class {r.cls}, prompt {r.prompt_tokens}, max_tokens {r.max_tokens}, "
                 f"{r.generated} generated, preempted {r.preemptions} times, {r.recomputed_tokens} tokens "
                 f"recomputed)" for r in live[:n]]
        more = f" and {len(live) - n} more" if len(live) > n else ""
        return f"{len(live)} live: " + "; ".join(parts) + more

    # ---- fast-forward ----------------------------------------------------------------------
    def run_length(self, plan: StepPlan, now_ns: int, next_event_ns: int, dur0: int) -> list[int]:
        """Durations (ns) of the steps to take for this plan: one, or the planned step followed
        by k-1 pure decode steps of every running request.

        A run may start with prefills (last chunks, so that every running request decodes from
        step 2 on) and admissions when no request waits (a waiter could be admitted once the
        prefill's budget is free again)."""
        single = [dur0]
        # Step i (0-based) starts at now + sum of durations 0..i-1; it belongs to the run only
        # if it starts before the next event (an arrival at a step's start is seen by it).
        limit = min(next_event_ns, self._next_change_ns)
        if now_ns + dur0 >= limit:
            return single  # (often: an arrival comes during an admission's prefill step)
        if (not self.cfg.fast_forward or plan.preempted or plan.swap_in_blocks or plan.swap_out_blocks
                or self.spec_k):  # speculative steps emit a random number of tokens: one at a time
            return single
        items = plan.items
        D = len(items) + plan.cohort
        if not D or D != len(self.running) or D > self.cfg.max_batched_tokens:
            return single
        if plan.admitted or not all(s.decode for s in items):
            # the policy would see the new decoders only at the next boundary
            if self.waiting or not self._static_ranking:
                return single
            if not all(s.prefix + s.tokens == s.req.tokens for s in items):
                return single
            if self.pool.cache is not None and any(not s.decode and s.req.hash_ids for s in items):
                # a prefill publishes its prompt to the prefix cache at the step's end, which
                # moves blocks out of its class's count and can shrink what others may take
                return single
        if self.waiting and self._dynamic:
            # the policy re-ranks before every step (e.g. by what the prefix cache holds now):
            # another waiter could head the queue, and fit, at the next boundary
            return single
        if self.waiting and self.cfg.preempt_for_waiting != "never" and not self.off:
            # a waiter that outranks a running request could evict it once victims grow
            lowest = max(map(_key, self.running))  # (map: the loop runs in C)
            if self.waiting[0][0] < lowest:
                return single
        k = min((s.req._output - s.req.generated for s in items), default=NEVER)
        coh = self.cohort if plan.cohort else None
        through = coh is not None and self._through_finishes()
        if coh is not None:
            # past members' last tokens only when nothing else could change at those instants
            k = min(k, coh.steps_to_empty() if through and not items else
                    NEVER if through else coh.steps_to_last_token())
        if k <= 1:
            return single
        # dur0 is this plan's price; steps 1.. are pure decode steps of every running request
        # with no transfers (preemptions and swaps, the only sources of transfers, excluded)
        n_exp = len(items)
        ctx_exp = sum(s.prefix + s.tokens for s in items)  # decode contexts of step 1, less n_exp
        ctx_off = coh.ctx_off if coh is not None else 0
        g = coh.g if coh is not None else 0
        fin = coh.finish if coh is not None else []
        fi = 0
        D_coh = plan.cohort
        durs = [dur0]
        start = now_ns + dur0
        D = n_exp + D_coh
        ctx = ctx_exp + n_exp + ctx_off + D_coh * (g + 2)  # decode contexts of step 1
        line = self.costs.decode_line(D)
        next_gone = fin[0][0] if fin else -1
        for i in range(1, k):
            if start >= limit:
                break
            if g + i == next_gone:  # members whose last token ended step i-1 are gone
                while fi < len(fin) and fin[fi][0] == next_gone:
                    m = fin[fi][2]
                    ctx_off -= m.computed - m.cohort_g0
                    D_coh -= 1
                    fi += 1
                next_gone = fin[fi][0] if fi < len(fin) else -1
                D = n_exp + D_coh
                ctx = ctx_exp + n_exp * i + ctx_off + D_coh * (g + i + 1)
                line = self.costs.decode_line(D)
            if line is None:
                d = self.costs.step_ns(0, D, 0, 0, ctx)
            else:
                d = round((line[0] + line[1] * ctx) * NS)
                if d < 1:
                    d = 1
            durs.append(d)
            start += d
            ctx += D
        k = len(durs)
        if k > 1 and not self.off:
            k = self._block_limited(plan, k, through)
        return durs[:k]

    def _through_finishes(self) -> bool:
        """May a fast-forwarded run go on past cohort members' last tokens? Only when a finish
        changes nothing but the batch: nobody waits to take the freed slot or blocks, the policy
        never re-ranks, and no closed-loop user sends a new request when its answer arrives."""
        return self.through_finishes and not self.waiting and self._static_ranking

    def _run_need(self, plan: StepPlan, k: int) -> int:
        """Blocks steps 2..k of a run take, at most."""
        bs = self.bs
        n = sum(-(-(s.prefix + s.tokens + k - 1) // bs) - -(-(s.prefix + s.tokens) // bs) for s in plan.items)
        if plan.cohort:
            assert self.cohort is not None
            n += sum(self.cohort.blocks_needed(1, k))
        return n

    def _block_limited(self, plan: StepPlan, k: int, through: bool) -> int:
        """Largest k' <= k such that steps 2..k' of the run can allocate their blocks.

        The run takes those blocks up front. With a prefix cache that is the same as taking them
        step by step only if no cached group is evicted for them while a request waits (an
        eviction can change what the waiter would reuse, and so whether it fits) or while
        finishing members release groups (which reorders the LRU): then the run stays within
        the free blocks."""
        bs = self.bs
        coh = self.cohort if plan.cohort else None
        prios = [s.req.priority for s in plan.items]
        if coh is not None:
            prios += [p for p, n in zip(self._cls_prio, coh.n_cls) if n]
        avail = self.pool.available_for(max(prios))
        if self.pool.cache is not None and (through or self.waiting):
            avail = min(avail, self.pool.free)
        D = len(self.running)
        if D * ((k + bs - 1) // bs + 1) <= avail:
            return k
        lo, hi = 1, k
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._run_need(plan, mid) <= avail:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def allocate_run(self, plan: StepPlan, k: int, done: int = 1) -> None:
        """Allocate the blocks steps done+1..k of a fast-forwarded run need (steps 1..done have
        theirs: a cluster replica allocates a run piecewise, as far as a router reads it)."""
        if k <= done or self.off:
            return
        for s in plan.items:
            r = s.req
            target = self.pool.blocks_for(s.prefix + s.tokens + k - 1) - r.base_blocks
            extra = target - r.blocks
            if extra > 0:
                self.pool.allocate(r.cls_idx, extra)
                r.blocks = target
        if plan.cohort:
            coh = self.cohort
            assert coh is not None
            before = coh.run_blocks(done) if done > 1 else None
            for ci, n in enumerate(coh.run_blocks(k)):
                if before is not None:
                    n -= before[ci]
                if n:
                    self.pool.allocate(ci, n)
            coh.alloc_g = coh.g + k
