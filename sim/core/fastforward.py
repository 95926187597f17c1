"""Fast-forward: advance a run of identical-shape steps at once, exactly.

When every running request decodes after the planned step and nothing else can change (an
arrival, a block shortage, the policy's next ranking change, a telemetry sample, the horizon),
:func:`run_length` computes how many steps ``k`` can run and the exact duration of each; the
engine then advances them as one event. The run may start with an admission and last prefill
chunks, and go on past requests' last tokens, when nobody waits and the policy never re-ranks.
Durations are integer nanoseconds from one cost function, evaluated step by step, so the
result is identical to stepping one iteration at a time (``engine.fast_forward = false``),
which the tests assert. Speculative steps emit a random number of tokens and are never
fast-forwarded.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from sim.core.costs import NEVER, NS
from sim.core.plan import StepPlan

if TYPE_CHECKING:
    from sim.core.engine import Engine


def run_length(eng: Engine, plan: StepPlan, now_ns: int, next_event_ns: int, dur0: int) -> list[int]:
    """Durations (ns) of the steps to take for this plan: one, or the planned step followed
    by k-1 pure decode steps of every running request.

    A run may start with prefills (last chunks, so that every running request decodes from
    step 2 on) and admissions when no request waits (a waiter could be admitted once the
    prefill's budget is free again)."""
    # Step i (0-based) starts at now + sum of durations 0..i-1; it belongs to the run only
    # if it starts before the next event (an arrival at a step's start is seen by it).
    limit = min(next_event_ns, eng.next_change_ns)
    if now_ns + dur0 >= limit or not _may_run(eng, plan):
        return [dur0]  # (often: an arrival comes during an admission's prefill step)
    k = min((s.req.hidden_output_tokens - s.req.generated for s in plan.items), default=NEVER)
    coh = eng.cohort if plan.cohort else None
    through = coh is not None and through_finishes(eng)
    if coh is not None:
        # past members' last tokens only when nothing else could change at those instants
        k = min(k, coh.steps_to_empty() if through and not plan.items else
                NEVER if through else coh.steps_to_last_token())
    if k <= 1:
        return [dur0]
    durs = _decode_durations(eng, plan, now_ns, dur0, k, limit)
    k = len(durs)
    if k > 1 and eng.grows_blocks:
        k = block_limited(eng, plan, k, through)
    return durs[:k]


def _may_run(eng: Engine, plan: StepPlan) -> bool:
    """Can the steps after this plan's be pure decode steps of every running request that no
    event inside the run would have changed?"""
    if (not eng.cfg.fast_forward or plan.preempted or plan.swap_in_blocks or plan.swap_out_blocks
            or eng.spec_k):  # speculative steps emit a random number of tokens: one at a time
        return False
    items = plan.items
    D = len(items) + plan.cohort
    if not D or D != len(eng.running) or D > eng.cfg.max_batched_tokens:
        return False
    if plan.admitted or not all(s.decode for s in items):
        # the policy would see the new decoders only at the next boundary
        if eng.waiting or not eng.static_ranking:
            return False
        if not all(s.computed_before + s.tokens == s.req.tokens for s in items):
            return False
        if eng.pool.cache is not None and any(not s.decode and s.req.hash_ids for s in items):
            # a prefill publishes its prompt to the prefix cache at the step's end, which
            # moves blocks out of its class's count and can shrink what others may take
            return False
    if eng.waiting and eng.dynamic:
        # the policy re-ranks before every step (e.g. by what the prefix cache holds now):
        # another waiter could head the queue, and fit, at the next boundary
        return False
    if eng.waiting and eng.cfg.preempt_for_waiting != "never" and eng.grows_blocks:
        # a waiter that outranks a running request could evict it once victims grow
        if eng.waiting[0][0] < eng.lowest_running().key:  # (kept by the engine, not a walk)
            return False
    return True


def _decode_durations(eng: Engine, plan: StepPlan, now_ns: int, dur0: int, k: int, limit: int) -> list[int]:
    """dur0 (this plan's price), then the durations of up to k-1 pure decode steps of every
    running request with no transfers (preemptions and swaps, the only sources of transfers,
    are excluded), those that start before ``limit``; cohort members drop out of the batch
    after their last token."""
    items = plan.items
    coh = eng.cohort if plan.cohort else None
    costs = eng.costs
    n_exp = len(items)
    ctx_exp = sum(s.computed_before + s.tokens for s in items)  # decode contexts of step 1, less n_exp
    ctx_off = coh.ctx_off if coh is not None else 0
    g = coh.steps if coh is not None else 0
    fin = coh.finish if coh is not None else []
    fi = 0
    D_coh = plan.cohort
    durs = [dur0]
    start = now_ns + dur0
    D = n_exp + D_coh
    ctx = ctx_exp + n_exp + ctx_off + D_coh * (g + 2)  # decode contexts of step 1
    line = costs.decode_line(D)
    next_gone = fin[0][0] if fin else -1
    for i in range(1, k):
        if start >= limit:
            break
        if g + i == next_gone:  # members whose last token ended step i-1 are gone
            while fi < len(fin) and fin[fi][0] == next_gone:
                m = fin[fi][2]
                ctx_off -= m.computed - m.cohort_base_step
                D_coh -= 1
                fi += 1
            next_gone = fin[fi][0] if fi < len(fin) else -1
            D = n_exp + D_coh
            ctx = ctx_exp + n_exp * i + ctx_off + D_coh * (g + i + 1)
            line = costs.decode_line(D)
        if line is None:
            d = costs.step_ns(0, D, 0, 0, ctx)
        else:
            d = round((line[0] + line[1] * ctx) * NS)
            if d < 1:
                d = 1
        durs.append(d)
        start += d
        ctx += D
    return durs


def through_finishes(eng: Engine) -> bool:
    """May a fast-forwarded run go on past cohort members' last tokens? Only when a finish
    changes nothing but the batch: nobody waits to take the freed slot or blocks, the policy
    never re-ranks, and no closed-loop user sends a new request when its answer arrives."""
    return eng.through_finishes and not eng.waiting and eng.static_ranking


def run_need(eng: Engine, plan: StepPlan, k: int) -> int:
    """Blocks steps 2..k of a run take, at most."""
    bs = eng.bs
    n = sum(-(-(s.computed_before + s.tokens + k - 1) // bs) - -(-(s.computed_before + s.tokens) // bs)
            for s in plan.items)
    if plan.cohort:
        assert eng.cohort is not None
        n += sum(eng.cohort.blocks_needed(1, k))
    return n


def block_limited(eng: Engine, plan: StepPlan, k: int, through: bool) -> int:
    """Largest k' <= k such that steps 2..k' of the run can allocate their blocks.

    The run takes those blocks up front. With a prefix cache that is the same as taking them
    step by step only if no cached group is evicted for them while a request waits (an
    eviction can change what the waiter would reuse, and so whether it fits) or while
    finishing members release groups (which reorders the LRU): then the run stays within
    the free blocks."""
    bs = eng.bs
    coh = eng.cohort if plan.cohort else None
    prios = [s.req.priority for s in plan.items]
    if coh is not None:
        prios += [p for p, n in zip(eng.class_priority, coh.n_cls) if n]
    avail = eng.pool.available_for(max(prios))
    if eng.pool.cache is not None and (through or eng.waiting):
        avail = min(avail, eng.pool.free)
    D = len(eng.running)
    if D * ((k + bs - 1) // bs + 1) <= avail:
        return k
    lo, hi = 1, k
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if run_need(eng, plan, mid) <= avail:
            lo = mid
        else:
            hi = mid - 1
    return lo


def allocate_run(eng: Engine, plan: StepPlan, k: int, done: int = 1) -> None:
    """Allocate the blocks steps done+1..k of a fast-forwarded run need (steps 1..done have
    theirs: a cluster replica allocates a run piecewise, as far as a router reads it)."""
    if k <= done or not eng.grows_blocks:
        return
    for s in plan.items:
        r = s.req
        target = eng.pool.blocks_for(s.computed_before + s.tokens + k - 1) - r.base_blocks
        extra = target - r.blocks
        if extra > 0:
            eng.pool.allocate(r.cls_idx, extra)
            r.blocks = target
    if plan.cohort:
        coh = eng.cohort
        assert coh is not None
        before = coh.run_blocks(done) if done > 1 else None
        for ci, n in enumerate(coh.run_blocks(k)):
            if before is not None:
                n -= before[ci]
            if n:
                eng.pool.allocate(ci, n)
        coh.steps_allocated = coh.steps + k
