"""Planning a step: which running requests take how many tokens, who is admitted, who is preempted.

Order, as in vLLM's V1 scheduler:
  1. running requests in rank order (most urgent first) take their tokens — a decode takes one,
     a prefill (or recompute) chunk takes ``min(remaining, budget, max_prefill_chunk)``; when a
     request needs a block and none is available, the lowest-ranked running request is
     preempted (possibly itself);
  2. if no request was preempted in this step, waiting requests are admitted in rank order while
     slots, budget, blocks (above the watermark) allow; the first that does not fit stops
     admission (strict order, no bypass), unless ``preempt_for_waiting`` lets it evict
     lower-ranked running requests.

That is ``engine.batching = "mixed"``. With ``"prefill_first"`` (:func:`plan_prefill_first`) the
same two steps run for prefill work alone first, and a step that takes any holds nothing else;
only when none can be taken do the decoders (and swapped-out waiters swapping in) run.

The lazily-advanced cohort of steady decoders (:mod:`sim.core.cohort`) takes its tokens first,
as one count, when that changes nothing any other request gets (:func:`cohort_step_blocks`);
when the budget cuts a request some members rank below, those members leave it (they get
nothing in this step); otherwise it dissolves into ordinary running requests. :func:`plan`
mutates blocks and the running set; the step is then priced and applied (:mod:`sim.core.apply`).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Final

from sim.core.cohort import NOT_MEMBER
from sim.core.costs import NEVER, NS
from sim.core.parts import EngineParts as Engine
from sim.core.plan import Scheduled, StepPlan, admitted, rank
from sim.core.preemption import PrefixAware, eligible_unordered, eligible_victims, preempt, victim_for
from sim.core.request import Request, State

# (an enum member read from its class costs about 8 times a module global's read, in Python 3.11)
SWAPPED: Final = State.SWAPPED
RUNNING: Final = State.RUNNING


#: Whether a waiting request can be admitted now, and what admitting it takes: ``(fits, tokens,
#: blocks, hit)``: this step's tokens (0: the budget cannot take it), new device blocks (after
#: those of cached prefix groups it reuses), cached prefix groups it would reuse. (A plain
#: tuple: the compiled build keeps it unboxed; a NamedTuple is made by a Python call.)
Fit = tuple[bool, int, int, int]
NO_FIT: Final[Fit] = (False, 0, 0, 0)


def budget_left(eng: Engine, scheduled: dict, cohort: int = 0) -> int:
    """Token budget left in the step being planned (after a preemption gave tokens back),
    with ``cohort`` decoders of the cohort in it."""
    return eng.limits.max_batched_tokens - cohort - sum(s.tokens for s in scheduled.values())


# ---- the cohort's share of a step ------------------------------------------------------------
def cohort_step_blocks(eng: Engine) -> tuple[list[int] | None, Request | None]:
    """Can the cohort's decoders all take their token in the next step without changing what
    any other running request gets, and with no preemption? Returns the KV blocks per class
    the cohort needs for it (and None), or None and, when members ranked below it are what
    stops it, the first explicit request whose share the budget cuts (else None).

    Yes when, with the cohort's D tokens taken first, every running request whose share the
    budget cuts (a chunk shortened, a decoder left without its token) ranks below every
    member, and every block the step needs (cohort and others) is available to the least
    favoured class present. Then the rank-order walk gives every running request exactly
    what this walk gives it, wherever the cohort's members sit in the order: everyone ranked
    above the first cut request gets its whole share either way, and that one and those
    below it see the same budget left.
    """
    coh = eng.cohort
    assert coh is not None
    lim = eng.limits
    budget = lim.max_batched_tokens - len(coh.members)
    if budget < 0:
        return None, None
    need = coh.next_step_blocks()
    blocks = sum(need)
    explicit = eng.queues.ranked_running()
    if not explicit and not blocks:
        return need, None
    # the least favoured class present has the fewest blocks available (reservations of
    # every more urgent class are held back from it)
    if not explicit:  # (most plans: every running request is a member)
        pool = eng.pool  # (a plain pool offers every class all its free blocks)
        avail = pool.free if pool.plain else pool.available_for(coh.least_urgent())
        return (need, None) if blocks <= avail else (None, None)
    worst = coh.least_urgent()
    used = [0] * len(lim.class_prefill_cap)
    bs = eng.bs
    grows = eng.grows_blocks
    last_member = None
    for req in explicit:
        if req.tokens - req.computed == 1:
            n = 1 if budget >= 1 else 0
            cut = n == 0
        else:
            n = lim.chunk(req, budget, used)
            cut = n < lim.chunk(req, NEVER, used)
            used[req.cls_idx] += n
        if cut:
            # the budget cuts this share: the walk gives it the same only when every
            # member ranks above it (their tokens come before it either way)
            if last_member is None:
                q = eng.queues
                last_member = q.walk_key(max(coh.members.values(), key=admitted) if q.by_admission
                                         else coh.last_member())
            if eng.queues.walk_key(req) < last_member:
                return None, req
        if grows:
            new = -(-(req.computed + n) // bs) - req.blocks - req.base_blocks
            if new > 0:
                blocks += new
        budget -= n
        if req.priority > worst:
            worst = req.priority
    if blocks <= 0 or blocks <= eng.pool.available_for(worst):
        return need, None
    return None, None


def dissolve_cohort(eng: Engine) -> None:
    """Make every cohort member an ordinary running request again (synced)."""
    assert eng.cohort is not None
    eng.cohort.dissolve()
    eng.queues.rank_order = None


def _cohort_share(eng: Engine, plan: StepPlan) -> None:
    """The cohort joins the step as one count when it can (its blocks taken), else dissolves.
    When the budget cuts a request that members rank below, those members (who get nothing
    after it in the walk) leave the cohort alone and the rest take the step when they can."""
    coh = eng.cohort
    if coh is None or not coh.members:
        return
    need, cut = cohort_step_blocks(eng)
    if cut is not None:
        walk_key = eng.queues.walk_key
        at = walk_key(cut)
        below = [m for m in coh.members.values() if walk_key(m) > at]
        if len(below) < len(coh):
            coh.leave_all(below)
            for m in below:
                eng.queues.ordered_in(m)
            need, cut = cohort_step_blocks(eng)
    if need is None:
        dissolve_cohort(eng)
        return
    plan.cohort = len(coh.members)
    eng.pool.allocate_each(need)
    coh.steps_allocated = coh.steps + 1


# ---- the step ----------------------------------------------------------------------------------
#: which work a walk of the running set or an admission takes: all of it (``engine.batching =
#: "mixed"``), or, planning a ``"prefill_first"`` step, prefill work only or decode work only
ALL: Final = 0
PREFILLS: Final = 1
DECODES: Final = 2


def plan(eng: Engine, now_ns: int) -> StepPlan:
    """Decide the next step (see the module docstring); with SGLang's admission estimate its
    reserve hears of the step (:meth:`sim.core.reserve.SglangReserve.after_plan`)."""
    p = plan_prefill_first(eng, now_ns) if eng.limits.prefill_first else plan_mixed(eng, now_ns)
    if eng.reserve is not None:
        eng.reserve.after_plan(eng, p)
    return p


def plan_mixed(eng: Engine, now_ns: int) -> StepPlan:
    """Decide the next step with decodes and prompt chunks together (``engine.batching =
    "mixed"``; see the module docstring)."""
    lim = eng.limits
    plan = StepPlan()
    scheduled: dict[int, Scheduled] = {}
    lim.new_step()
    _cohort_share(eng, plan)
    budget = run_running(eng, plan, scheduled, lim.max_batched_tokens - plan.cohort, now_ns, ALL)
    if plan.preempted == 0:
        admit_waiting(eng, plan, scheduled, budget, now_ns)
    plan.items = list(scheduled.values())
    return plan


def plan_prefill_first(eng: Engine, now_ns: int) -> StepPlan:
    """Decide the next step with prefill steps apart from decode steps (``engine.batching =
    "prefill_first"``: vLLM V0's ``_schedule_default`` without chunked prefill, SGLang's
    ``get_next_batch_to_run`` without mixed chunks).

    First the prefill work, under the same rules as a mixed step: running requests whose prompt
    (or recompute) has chunks left, in rank order (a chunk that needs blocks preempts as in a
    mixed step), then, when nobody was preempted, waiting requests whose admission step is a
    prefill, in rank order (the first one that does not fit, or whose admission would be a
    decode, a swapped-out request's, stops admission). When that takes any tokens, the step is
    that alone: the running decoders get no token in it. Otherwise it is a decode step: the
    running decoders (the cohort among them), then, when nobody was preempted, waiting requests
    whose admission is a decode (swapped-out ones swapping in) in rank order, up to the first
    prefill among them.
    """
    plan = StepPlan()
    scheduled: dict[int, Scheduled] = {}
    lim = eng.limits
    lim.new_step()
    q = eng.queues
    coh = eng.cohort
    chunks = False
    for r in q.ranked_running():  # (the cohort's members all decode)
        if r.tokens - r.computed > 1:
            chunks = True
            break
    if chunks or q.waiting:
        if chunks and coh is not None and coh.members:
            # a chunk that needs blocks may preempt a member: the cohort, which takes no
            # part in a prefill step, leaves the walk to ordinary running requests
            dissolve_cohort(eng)
        budget = lim.max_batched_tokens
        if chunks:
            budget = run_running(eng, plan, scheduled, budget, now_ns, PREFILLS)
        if plan.preempted == 0:
            admit_waiting(eng, plan, scheduled, budget, now_ns, PREFILLS)
        if scheduled or plan.preempted:
            if coh is not None and coh.members and plan.preempted:
                dissolve_cohort(eng)  # (a victim may have been one of them)
            # (else its members sit this step out: they stay in the cohort, which counts the
            # step into the gap before their next token, Cohort.sit_out)
            if scheduled:
                plan.items = list(scheduled.values())
                return plan
    _cohort_share(eng, plan)
    budget = run_running(eng, plan, scheduled, lim.max_batched_tokens - plan.cohort, now_ns, DECODES)
    if plan.preempted == 0:
        admit_waiting(eng, plan, scheduled, budget, now_ns, DECODES)
    plan.items = list(scheduled.values())
    return plan


def run_running(eng: Engine, plan: StepPlan, scheduled: dict, budget: int, now_ns: int, only: int) -> int:
    """Running requests in rank order take their tokens (step 1 of the module docstring);
    ``only``: :data:`ALL`, or :data:`PREFILLS` / :data:`DECODES` to walk past the others.
    Returns the budget left."""
    lim = eng.limits
    counting = lim.counting_prefill
    pool = eng.pool
    bs = eng.bs
    grows = eng.grows_blocks
    spec = eng.spec
    for req in list(eng.queues.ranked_running()):  # a copy: preemption edits the order
        if req.state is not RUNNING:
            continue  # preempted earlier in this loop
        decode = req.tokens - req.computed == 1
        if only and decode != (only == DECODES):
            continue  # (a prefill_first step: work of the other kind waits)
        if decode:
            if budget < 1:
                continue
            # with speculation a decoder verifies k drafts + 1 token (when the budget allows)
            n = spec.tokens(req.cls_idx, budget) if spec is not None else 1
        else:
            n = lim.chunk(req, budget)
            if n == 0:
                continue
        if grows:
            new_blocks = -(-(req.computed + n) // bs) - req.blocks - req.base_blocks
            if new_blocks > 0:
                if new_blocks > pool.available_for(req.priority):
                    while new_blocks > pool.available_for(req.priority):
                        victim = victim_for(eng, req, new_blocks - pool.available_for(req.priority))
                        preempt(eng, victim, plan, scheduled, now_ns)
                        plan.retracted += 1
                        if victim is req:
                            break
                    if req.state is not RUNNING:
                        # its own victim: the walk ends, as vLLM V1's does (walked by rank, every
                        # request after it ranks below it, and it was the lowest); SGLang's
                        # retraction order is not the walk's, so the others still decode
                        if eng.victim_rule.walk_ends_at_self:
                            break
                        continue
                    # victims scheduled earlier in this step gave their tokens back, for those
                    # after it; its own share stays what the blocks were freed for (as vLLM V1
                    # keeps ``num_new_tokens`` while it preempts: a larger chunk would need more)
                    budget = budget_left(eng, scheduled, plan.cohort)
                pool.grow(req, new_blocks)
        scheduled[req.request_id] = Scheduled(req, n, req.computed, decode)
        budget -= n
        if counting and not decode:
            lim.took_prefill(req.cls_idx, n)
    return budget


# ---- admission ---------------------------------------------------------------------------------
def admit_waiting(eng: Engine, plan: StepPlan, scheduled: dict, budget: int, now_ns: int, only: int = ALL) -> int:
    """Admit waiting requests in rank order while they fit; returns the budget left. ``only``
    (:data:`PREFILLS` / :data:`DECODES`, a prefill_first step): the first waiter whose admission
    step would be of the other kind stops admission too (strict order, as a misfit does)."""
    q = eng.queues
    if not q.waiting or budget <= 0:
        return budget  # (most events: nobody waits)
    lim = eng.limits
    res = eng.reserve
    if res is not None and res.paused:
        return budget  # (SGLang tries no admission until a running request leaves)
    throttled: list = []  # waiters whose class used up its prefill cap this step: skipped, kept
    held: list[int] = []  # ... per class (made at the first)
    caps = lim.class_prefill_cap
    while q.waiting and budget > 0:
        w = q.waiting[0][2]
        if only and (w.tokens - w.computed == 1) != (only == DECODES):
            break
        fit, n, need_blocks, hit = fits(eng, w, budget)
        if not fit and lim.class_capped(w):
            throttled.append(q.pop_entry())
            if not held:
                held = [0] * len(caps)
            held[w.cls_idx] += 1
            if eng.pool.cache is None:
                # every waiter left is a prefill of a class whose cap is used up: each would
                # be skipped in turn (without a prefix cache nothing makes one shorter)
                used = lim.class_prefill
                capped = sum(q.waiting_prefills[c] - held[c] for c in range(len(caps))
                             if caps[c] and used[c] >= caps[c])
                if capped == len(q.waiting):
                    break
            continue
        if not fit:
            after = preempt_for(eng, w, plan, scheduled, budget, now_ns)
            if after is None:
                break
            budget = budget_left(eng, scheduled, plan.cohort)
            if q.waiting[0][2] is not w:
                continue  # a victim re-keyed on preemption now heads the queue: re-decide
            fit, n, need_blocks, hit = after  # (what fits says now, taken after the last eviction)
            if not fit:
                break
        if res is not None and not res.room(eng, w, need_blocks, hit, _available(eng, w, hit), scheduled):
            res.paused = True  # (SGLang's NO_TOKEN: the batch counts as full)
            break
        q.pop_entry()
        _admit(eng, w, n, need_blocks, hit, plan, scheduled, now_ns)
        budget -= n
        if res is not None:
            res.admitted(scheduled[w.request_id])
            if res.used_up(eng.pool.available_for(w.priority) - lim.watermark_blocks):
                res.paused = True  # (its reserve took what was left: SGLang stops here too)
                break
    for entry in throttled:
        q.push_entry(entry)
    return budget


def _admit(eng: Engine, w: Request, n: int, need_blocks: int, hit: int, plan: StepPlan, scheduled: dict,
           now_ns: int) -> None:
    """Waiting request ``w`` (popped) joins the running set with ``n`` tokens in this step, on
    ``hit`` cached prefix groups, holding ``need_blocks`` device blocks (swapped in first)."""
    pool = eng.pool
    q = eng.queues
    q.take(w)
    if hit:
        pool.acquire_prefix(w, hit)
    elif w.hash_ids and w.computed == 0 and pool.cache is not None:  # (no group left: each one a miss)
        pool.count_misses(w, 0)
    if w.state is SWAPPED:
        blocks = pool.swap_in_request(w)
        plan.swap_in_blocks += blocks
        plan.swapped_in.append((w, blocks))
        eng.tel.on_swap(w, blocks)
    grow = need_blocks - w.blocks
    if grow > 0:
        pool.grow(w, grow)
    w.state = RUNNING
    w.admitted_s = now_ns / NS
    if w.first_admit_ns < 0:
        w.first_admit_ns = now_ns
    q.add_running(w)
    q.ordered_in(w)  # (the rank order kept without re-sorting)
    decode = w.tokens - w.computed == 1
    scheduled[w.request_id] = Scheduled(w, n, w.computed, decode, True)
    plan.admitted += 1
    if not decode:
        eng.limits.took_prefill(w.cls_idx, n)


def admit_alone(eng: Engine, w: Request, now_ns: int) -> Scheduled:
    """Take arriving request ``w`` in at ``now_ns`` as the plan there admits it when nobody else
    waits and its whole prompt fits (checked by the caller: a request that joined a held run,
    :meth:`sim.cluster.replicas.Replica.join`): gated and queued (:meth:`Engine.admit_arrival`),
    then admitted with its prompt in one chunk. Returns its share of that step."""
    taken = eng.admit_arrival(w, now_ns)
    entry = eng.queues.pop_entry()
    assert taken and entry[2] is w and not eng.queues.waiting
    n, need, hit = admission(eng, w, eng.limits.max_batched_tokens)
    scheduled: dict[int, Scheduled] = {}
    _admit(eng, w, n, need, hit, StepPlan(), scheduled, now_ns)
    return scheduled[w.request_id]


def admission(eng: Engine, w: Request, budget: int) -> tuple[int, int, int]:
    """What admitting waiting request ``w`` now takes: (tokens this step, new device blocks,
    cached prefix groups it would reuse). Tokens 0 means the budget cannot take it."""
    cache = eng.pool.cache
    hit = 0
    if cache is not None and w.computed == 0 and w.hash_ids and w.state is not SWAPPED:
        hit = cache.hit_groups(w.prompt_tokens, w.hash_ids)
    if hit:
        cached = hit * cache.group_tokens
        w.computed = cached  # peek: restored below
        n = eng.limits.chunk(w, budget)
        w.computed = 0
        total = cached + n if eng.grows_blocks else w.prompt_tokens + w.max_tokens
        need = eng.pool.blocks_for(total) - hit * cache.group_blocks
        return n, need, hit
    n = eng.limits.chunk(w, budget)
    if not eng.grows_blocks:
        need = eng.pool.blocks_for(w.prompt_tokens + w.max_tokens)
    elif w.state is SWAPPED:
        need = max(w.host_blocks, eng.pool.blocks_for(w.computed + n))
    else:
        need = eng.pool.blocks_for(w.computed + n)
    return n, need, 0


def fits(eng: Engine, w: Request, budget: int) -> Fit:
    """Can waiting request ``w`` be admitted now, and what would it take?"""
    lim = eng.limits
    if len(eng.queues.running) >= lim.max_num_seqs:
        return NO_FIT
    n, need, hit = admission(eng, w, budget)
    if n == 0:
        return NO_FIT
    return need <= _available(eng, w, hit), n, need, hit


def _available(eng: Engine, w: Request, hit: int) -> int:
    """KV blocks waiting ``w`` may take now (its class's share, less the watermark), less the
    cached groups among its ``hit`` prefix groups that nothing holds: they count as free while
    evictable, but stop being so once ``w`` holds them."""
    avail = eng.pool.available_for(w.priority) - eng.limits.watermark_blocks
    if hit:
        cache = eng.pool.cache
        avail -= cache.group_blocks * sum(1 for h in w.hash_ids[:hit] if h in cache.lru)
    return avail


def preempt_for(eng: Engine, w: Request, plan: StepPlan, scheduled: dict, budget: int,
                now_ns: int) -> Fit | None:
    """Evict lowest-ranked eligible running requests so that waiting ``w`` fits.

    Evicts only if evicting every eligible victim would make room (all-or-nothing on the
    outcome, as SGLang does; never a pointless eviction), then evicts the fewest needed,
    lowest rank first. Returns None when it evicted nothing, else :func:`fits` of ``w`` after
    the last eviction (with the budget then left).
    """
    coh = eng.cohort
    q = eng.queues
    ordered = isinstance(eng.victim_rule, PrefixAware)  # (else by rank: the first victims are picked as needed)
    if not ordered and eng.waiting_rule.pairwise and q.running:
        first = _enough_alone(eng, w, plan, scheduled, budget)
        if first is not None:
            # the others, when the first is not enough, are found after it left: the same
            # requests as before, each one's eligibility reading only its own fields and w's
            rest = _first_then_rest(first, lambda: eligible_unordered(eng, w))
            return _evict(eng, w, plan, scheduled, now_ns, rest)
    if ordered:
        victims = eligible_victims(eng, w)
        in_cohort = [v for v in victims if v.cohort_base_step != NOT_MEMBER]
        others = [v for v in victims if v.cohort_base_step == NOT_MEMBER] if len(in_cohort) < len(victims) else []
    elif coh is not None and coh.members:
        # the members' victims and the others' apart (those outside the cohort are few, and
        # kept in rank order: the walk of the whole set is not repeated to tell them apart)
        in_cohort = eligible_unordered(eng, w, coh.members.values())
        others = eligible_unordered(eng, w, q.ranked_running())
        victims = in_cohort + others if others else in_cohort
    else:
        in_cohort, others = [], eligible_unordered(eng, w)
        victims = others
    if not victims:
        return None
    tokens, blocks = _freed(eng, plan, scheduled, in_cohort, others)
    if not _room_after(eng, w, budget, len(victims), tokens, blocks):
        return None
    if not ordered:
        # least urgent first: usually the running request ranked last (the engine keeps it),
        # else max finds it (ranks are distinct: admit_seq); the rest are sorted only if needed
        lowest = q.lowest_running()
        first = lowest if lowest in victims else max(victims, key=rank)
        rest = _first_then_rest(first, lambda: [v for v in victims if v is not first])
        return _evict(eng, w, plan, scheduled, now_ns, rest)
    return _evict(eng, w, plan, scheduled, now_ns, victims)


def _freed(eng: Engine, plan: StepPlan, scheduled: dict, in_cohort: list[Request],
           others: list[Request]) -> tuple[int, int]:
    """Step tokens and KV blocks that evicting these victims gives back: the cohort's members
    (each decodes one token in this step when the cohort takes part) and the others (their
    share of this step, if scheduled)."""
    tokens = blocks = 0
    for v in others:
        blocks += v.blocks
        s = scheduled.get(v.request_id)
        if s is not None:
            tokens += s.tokens
    if in_cohort:
        assert eng.cohort is not None
        blocks += eng.cohort.blocks_of(in_cohort)
        if plan.cohort:
            tokens += len(in_cohort)
    return tokens, blocks


def _room_after(eng: Engine, w: Request, budget: int, victims: int, tokens: int, blocks: int) -> int:
    """``w``'s chunk (tokens) if evicting ``victims`` running requests that give back ``tokens``
    of the budget and ``blocks`` KV blocks would make room for it, else 0."""
    lim = eng.limits
    if len(eng.queues.running) - victims >= lim.max_num_seqs:
        return 0
    n, need, hit = admission(eng, w, budget + tokens)
    return n if n > 0 and need <= _available(eng, w, hit) + blocks else 0


def _evict(eng: Engine, w: Request, plan: StepPlan, scheduled: dict, now_ns: int,
           victims: Iterable[Request]) -> Fit:
    """Preempt ``victims`` in their order until waiting ``w`` fits; :func:`fits` after the last."""
    coh = eng.cohort
    now_fits = NO_FIT
    for v in victims:
        if v.cohort_base_step != NOT_MEMBER:
            # it leaves the cohort alone (the others decode on in it), as an ordinary
            # request with this step's token, and gives that back when preempted
            assert coh is not None
            coh.leave(v)
            if plan.cohort:
                plan.cohort -= 1
                scheduled[v.request_id] = Scheduled(v, 1, v.computed, True)
            eng.queues.ordered_in(v)
        preempt(eng, v, plan, scheduled, now_ns)
        now_fits = fits(eng, w, budget_left(eng, scheduled, plan.cohort))
        if now_fits[0]:  # (it fits)
            break
    return now_fits


def _enough_alone(eng: Engine, w: Request, plan: StepPlan, scheduled: dict, budget: int) -> Request | None:
    """The running request ranked last, when it is a victim of ``w`` and evicting it alone makes
    room for ``w``'s whole chunk (a budget that more victims would add could not make the chunk
    longer), else None. Then evicting every victim would make room too (more blocks, more
    slots, the same need): :func:`preempt_for`'s all-or-nothing check passes without the walk
    of every victim, which it needs only when the first is not enough. Where a victim's
    eligibility reads only its own fields and the waiter's (the waiting rule is ``pairwise``:
    not ``"policy"``, whose oldest request is exempted)."""
    low = eng.queues.lowest_running()
    if not eligible_unordered(eng, w, (low,)):
        return None
    member = low.cohort_base_step != NOT_MEMBER
    tokens, blocks = _freed(eng, plan, scheduled, [low] if member else [], [] if member else [low])
    n = _room_after(eng, w, budget, 1, tokens, blocks)
    return low if n and n == admission(eng, w, NEVER)[0] else None


def _first_then_rest(first: Request, rest: Callable[[], list[Request]]) -> Iterator[Request]:
    """``first``, then (only when asked: it was not enough) the victims ``rest()`` gives, by
    rank, last-ranked first."""
    yield first
    others = rest()
    others.sort(key=rank, reverse=True)
    yield from others
