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

import math
from typing import Any

import simpy

from policies.base import RankingContext
from sim.core import apply as _apply
from sim.core import observe, planner
from sim.core.binding import BoundPolicy
from sim.core.cohort import DecodeCohort
from sim.core.costs import NEVER, NS, CostModel
from sim.core.errors import ScenarioError
from sim.core.kvpool import KVPool
from sim.core.limits import StepLimits
from sim.core.parts import EngineParts
from sim.core.plan import StepPlan, StepShape
from sim.core.preemption import make_mode, make_victim_rule, make_waiting_rule
from sim.core.queues import Queues
from sim.core.request import Request, State
from sim.core.reserve import SglangReserve
from sim.core.stepper import make_stepper
from sim.core.speculation import Speculation
from sim.core.telemetry import Telemetry

__all__ = ["Engine", "GateView"]

#: NEVER as a float: a policy's next change at or past it (in ns) is never
NEVER_F = float(NEVER)


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


def emit_sampled_token(tel, req: Request, t_ns: int) -> None:
    """The token a disaggregated prefill replica sampled for ``req`` is emitted at ``t_ns`` (ns),
    outside any step: its first token, or after a re-prefill the next, the gap since its last
    recorded as a single inter-token gap; counted in ``tel``'s tokens."""
    ci = req.cls_idx
    last = req.last_token_ns
    if last < 0:
        req.first_token_ns = t_ns
    else:
        gap = t_ns - last
        tel.itl_scalars[ci].append(gap)
        if gap > req.max_itl_ns:
            req.max_itl_ns = gap
    req.last_token_ns = t_ns
    tel.on_token(t_ns, ci, req.tenant)


class Engine(EngineParts):
    """A replica's scheduler and executor; :func:`sim.core.loop.replica_loop` drives it.

    Args:
        env: the SimPy environment (time unit: nanoseconds).
        cfg: the scenario's EngineConfig.
        costs: the CostModel.
        policy: the ranking policy.
        classes: scenario classes, in declaration order.
        pool: the KV pool.
        telemetry: where records go.
        gate: optional admission gate with ``check(req, now_s, view) -> reason or ''`` and
            ``on_finish(req, now_s)``; ``view`` is the engine's :class:`GateView`.
        trace: a list collecting iteration rows (:func:`sim.core.observe.trace_rows`), or None.
        spec_seed: the seed of speculative decoding's acceptance draws.

    The engine holds its parts, each the one owner of its state: ``queues`` (the waiting and
    running sets, :class:`~sim.core.queues.Queues`), ``pool`` (the KV memory: device blocks,
    prefix cache, host space, :class:`~sim.core.kvpool.KVPool`), ``limits`` (the step's
    slots, budget, chunk caps and watermark, :class:`~sim.core.limits.StepLimits`),
    ``cohort`` (the lazily-advanced decoders, :class:`~sim.core.cohort.DecodeCohort`, or
    None), ``policy`` (the ranking policy as bound, :class:`~sim.core.binding.BoundPolicy`),
    ``preemption`` and ``waiting_rule`` (the preemption mode and the rule for waiters that
    evict, :mod:`sim.core.preemption`), ``spec`` (speculative decoding or None), ``costs``
    and ``tel``. ``next_change_ns`` is when the policy's keys change next (NEVER if not
    declared).
    """

    def __init__(self, env: simpy.Environment, cfg, costs: CostModel, policy, classes, pool: KVPool,
                 telemetry: Telemetry, gate=None, trace=None, spec_seed: int = 0) -> None:
        self.env = env
        self.cfg = cfg
        self.costs = costs
        self.policy = bound = BoundPolicy(policy)
        self.pool = pool
        self.tel = telemetry
        self.gate = gate
        self.trace = trace  # list collecting iteration rows, or None
        self.classes = classes
        self.bs = cfg.block_size
        class_priority = [getattr(c, "priority", 0) for c in classes]
        self.queues = Queues(class_priority, bound.own_queues)
        self.queues.by_admission = cfg.running_order == "admission"
        self.preemption = make_mode(cfg.preemption)
        self.waiting_rule = make_waiting_rule(cfg.preempt_for_waiting, cfg.preempt_threshold)
        self.victim_rule = make_victim_rule(cfg.victim)
        self.grows_blocks = self.preemption.grows_blocks
        # SGLang's conservative admission (engine.admission_estimate): its ratio and full flag
        self.reserve = SglangReserve(self.bs) if cfg.admission_estimate == "sglang" else None
        spec = cfg.speculative
        self.spec = Speculation(spec, classes, spec_seed, cfg.overhead, cfg.cost_scale) if spec is not None else None
        self.spec_k = spec.k if spec is not None else 0
        # KV slots a decode step's drafts take beyond its token (blocks grow only when
        # preemption is on; drafts need a budget above k): counted when sizing requests up
        draft_slots = (self.spec_k if self.spec_k and self.grows_blocks
                       and cfg.max_batched_tokens > self.spec_k else 0)
        self.limits = StepLimits(cfg, [getattr(c, "max_prefill_tokens_per_step", 0) for c in classes],
                                 pool.total, draft_slots)
        self.next_change_ns = NEVER
        self.iterations = 0
        self.events = 0
        self.busy_ns = 0
        self.thrash_ns = 0
        self.guard = observe.ProgressGuard()
        self.stepper = make_stepper(cfg.fast_forward)
        # Steady decoders advance as one cohort unless something must see every request every
        # step: a policy re-keying or keeping books per step, speculation (random tokens per
        # step), or the iteration trace (a row per request per step).
        lazy = (cfg.lazy_batch and not bound.dynamic and bound.on_scheduled is None and not self.spec_k
                and trace is None)
        self.cohort = DecodeCohort(len(classes), self.bs, self.grows_blocks, class_priority) if lazy else None
        # set by the runner when a finish can create no new arrival (no closed-loop users)
        self.through_finishes = False
        self.held: dict[int, Request] = {}  # (disaggregated clusters: EngineParts)
        self.gate_view = GateView(self) if gate is not None else None

    # ---- ranking ---------------------------------------------------------------------------
    def push_waiting(self, req: Request, now_ns: int) -> None:
        """``req`` (new, or preempted) joins the waiting set under the policy's key now."""
        self.queues.push(req, self.policy.key_tuple(req, now_ns / NS))

    def push_waiting_last(self, req: Request, now_ns: int) -> None:
        """``req`` (preempted) joins the waiting set as if it arrived now: the policy's key with
        its arrival (the key's second-to-last part, by the policies' contract) set to now, so
        that under FCFS it waits behind every waiter (SGLang re-queues a retracted request at
        the end of its waiting list)."""
        key = self.policy.key_tuple(req, now_ns / NS)
        if len(key) >= 2:
            key = key[:-2] + (now_ns / NS, key[-1])
        self.queues.push(req, key)

    def idle(self) -> None:
        """Nothing runs, and nothing waiting can be taken in (the loop waits for a change)."""
        if self.reserve is not None:
            self.reserve.idle()

    def _rekey_all(self, now_ns: int) -> None:
        """Recompute every key (waiting and running) and rebuild the waiting heap."""
        if self.cohort is not None:
            self.cohort.sync_all()  # a key may read progress fields
        self.queues.rekey(self.policy.key_tuple, now_ns / NS)
        if self.cohort is not None:
            self.cohort.keys_changed()

    def ranking_context(self, now_ns: int) -> RankingContext:
        """What the policy is told before a re-key: the queue length and, when it declares
        ``needs_prefix_info``, each waiting request's currently cached prefix, in tokens."""
        cached: dict[int, int] = {}
        waiting = self.queues.waiting
        if self.policy.prefix_info:
            cache = self.pool.cache
            for _, _, r in waiting:
                hit = 0
                if cache is not None and r.hash_ids and r.computed == 0:
                    hit = cache.hit_groups(r.prompt_tokens, r.hash_ids) * cache.group_tokens
                cached[r.request_id] = hit
        return RankingContext(now_ns / NS, len(waiting), cached)

    def refresh_ranking(self, now_ns: int) -> None:
        """Before each plan: re-key when the policy is dynamic or the change time it declared
        before the previous step has come; then record its next declared change, which bounds
        fast-forward. (A change caused by the step itself, e.g. a quantum used up in a request's
        first step, is declared then and acted on at the following boundary.)"""
        policy = self.policy
        if policy.static_ranking:
            return  # keys never change on their own (and next_change is always None)
        if policy.dynamic or now_ns >= self.next_change_ns:
            if policy.before_ranking is not None:
                policy.before_ranking(self.ranking_context(now_ns))
            self._rekey_all(now_ns)
        t = policy.next_change(now_ns / NS)
        self.next_change_ns = NEVER if t is None else change_ns(t, now_ns, policy)  # (no call for None)

    # ---- arrivals --------------------------------------------------------------------------
    def size_refusal(self, prompt_tokens: int, max_tokens: int, priority: int) -> str:
        """Why this engine refuses a request of these lengths (tokens) and priority at its
        arrival whatever the load: ``"too_long"`` (over ``max_model_len``, the server's answer),
        ``"too_large"`` (more KV than it could ever hold, drafts included; or more than SGLang's
        admission check could ever let in), ``"too_long_for_step"`` (without chunked prefill,
        more than one step's budget must be prefilled at once); "" when none. The one rule
        arrivals, capacity's count of refusals and a disaggregated cluster's routing read."""
        limits = self.limits
        if prompt_tokens + max_tokens > limits.max_model_len:
            return "too_long"
        need = prompt_tokens + max_tokens + limits.draft_slots
        cap = limits.kv_limit(priority, self.pool)
        if need > cap or (self.reserve is not None and self.reserve.never_fits(prompt_tokens, max_tokens, cap)):
            return "too_large"
        if limits.step_need(prompt_tokens, need, self.grows_blocks) > limits.max_batched_tokens:
            return "too_long_for_step"
        return ""

    def admit_arrival(self, req: Request, now_ns: int) -> bool:
        """Gate a new request at its arrival instant; queue it or record its rejection."""
        req.reveals_output = self.policy.oracle
        why = self.size_refusal(req.prompt_tokens, req.max_tokens, req.priority)
        if why:
            return self._reject(req, why, now_ns)
        if self.gate is not None:
            if self.cohort is not None:
                self.cohort.sync_all()  # a gate may estimate from running requests' progress
            reason = self.gate.check(req, now_ns / NS, self.gate_view)
            if reason:
                return self._reject(req, reason, now_ns)
        if self.policy.on_arrival is not None:
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

    def take_landed(self, req: Request, now_ns: int) -> None:
        """``req``'s KV arrived from a prefill replica into the blocks reserved for it here
        (it is in ``held``, every token it knows computed): at this step boundary it joins the
        running set and the token the prefill replica sampled is emitted (its first, or the
        next after a re-prefill), unless it was sent at the prefill's end
        (``sampled_token_sent``); a request with nothing more to generate finishes at once."""
        del self.held[req.request_id]
        q = self.queues
        req.key = self.policy.key_tuple(req, now_ns / NS)
        req.generated += 1
        req.tokens += 1
        q.take(req)
        req.state = State.RUNNING
        req.admitted_s = now_ns / NS
        q.add_running(req)
        q.ordered_in(req)
        if not self.sampled_token_sent:
            emit_sampled_token(self.tel, req, now_ns)
        if req.generated >= req.hidden_output_tokens:
            _apply.finish(self, req, now_ns)

    # ---- a step: plan, price, run length, apply ----------------------------------------------
    def plan(self, now_ns: int) -> StepPlan:
        """Decide the next step (:func:`sim.core.planner.plan`). Changes the memory and the
        running set only through their owners' calls; the step's time is then priced
        (:meth:`compute_ns`) and applied (:meth:`apply`)."""
        return planner.plan(self, now_ns)

    def step_shape(self, plan: StepPlan) -> StepShape:
        """What the cost model prices of a step (:class:`~sim.core.plan.StepShape`): prefill
        tokens (plus speculative verification tokens), decoders, sum l^2, sum l x c, sum of
        decode contexts, prefill chunks and requests whose prefill starts in the step."""
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
        return StepShape(P, D, l2, lc, ctx, n_pf, n_adm)

    def compute_ns(self, plan: StepPlan) -> int:
        """Engine compute time of a step, ns: the target's forward pass, plus the draft model's
        k sequential steps when speculating (:meth:`Speculation.draft_ns`)."""
        if not plan.items and not plan.cohort:
            return 0
        t = self.costs.price(self.step_shape(plan))
        if self.spec is not None:
            t += self.spec.draft_ns(self.costs, plan.items)
        return t

    def transfer_ns(self, plan: StepPlan) -> int:
        """Swap traffic of a step (out and in), ns."""
        if not plan.swap_out_blocks and not plan.swap_in_blocks:
            return 0
        return self.costs.swap_ns(plan.swap_out_blocks, self.bs) + self.costs.swap_ns(plan.swap_in_blocks, self.bs)

    def apply(self, plan: StepPlan, start_ns: int, durations: list[int], compute_ns: int,
              sample_ns: int = NEVER) -> None:
        """Apply a run of ``len(durations)`` steps of ``plan`` (:func:`sim.core.apply.apply`;
        ``sample_ns``: the next time-series sample instant)."""
        _apply.apply(self, plan, start_ns, durations, compute_ns, sample_ns)

    def trace_run(self, plan: StepPlan, start_ns: int, durations: list[int]) -> None:
        """Append the run's rows to the iteration trace (after ``iterations`` counted it)."""
        assert self.trace is not None  # (called only when tracing)
        self.trace.extend(observe.trace_rows(plan, self.iterations - len(durations), start_ns, durations))

    # ---- the end, and checks -----------------------------------------------------------------
    def close(self, end_ns: int, also=()) -> None:
        """The run is over: whatever is still queued or running (and ``also``: requests routed
        here but never taken in) ends unfinished at ``end_ns``; the pool must balance."""
        if self.cohort is not None:
            self.cohort.dissolve()  # members' fields are brought up to date, their spans end
            self.tel.add_cohort(self.cohort)
        q = self.queues
        for r in q.waiting_requests() + list(q.running.values()) + list(also):
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


class GateView:
    """What an admission gate may read of a replica at an arrival (:mod:`sim.admission`), and
    nothing else: the step limits (``max_num_seqs``, ``max_batched_tokens``,
    ``watermark_blocks``), the cost model, the KV pool (to read, never to change), whether a
    waiter may evict running requests at all (``evicts_for_waiters``) and whether requests
    grow their blocks (``grows_blocks``: False when each reserves prompt + ``max_tokens`` at
    admission), the policy's key, and the requests waiting and running."""

    __slots__ = ("max_num_seqs", "max_batched_tokens", "watermark_blocks", "costs", "pool",
                 "evicts_for_waiters", "grows_blocks", "_eng")

    def __init__(self, eng: Engine) -> None:
        lim = eng.limits
        self.max_num_seqs = lim.max_num_seqs
        self.max_batched_tokens = lim.max_batched_tokens
        self.watermark_blocks = lim.watermark_blocks
        self.costs = eng.costs
        self.pool = eng.pool
        self.grows_blocks = eng.grows_blocks
        self.evicts_for_waiters = eng.waiting_rule.evicts and eng.grows_blocks
        self._eng = eng

    def key(self, req: Request, now_s: float) -> tuple:
        """The policy's key of ``req`` at ``now_s``."""
        return self._eng.policy.key_tuple(req, now_s)

    def waiting(self) -> list[tuple[tuple, Request]]:
        """``(key, request)`` of each waiting request, in no particular order."""
        return [(key, r) for key, _, r in self._eng.queues.waiting]

    def running(self) -> list[Request]:
        """The running requests, in admission order."""
        return list(self._eng.queues.running.values())
