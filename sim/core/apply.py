"""Applying a run of steps: tokens advance and are emitted, requests finish, blocks are freed.

:func:`apply` carries out a planned step (or a fast-forwarded run of ``len(durations)`` steps:
the planned one, then pure decode steps of every running request). Every scheduled request's
computed tokens advance; a request whose computed tokens reach its known tokens emits one token
per step (its first at the end of its prefill); one that reaches its output length finishes at
the end of that step. Steady decoders then join the lazily-advanced cohort
(:mod:`sim.core.cohort`), which advances its members with one counter.
"""
from __future__ import annotations

from array import array
from operator import itemgetter
from typing import TYPE_CHECKING, Final

from sim.core.cohort import NOT_MEMBER
from sim.core.costs import NEVER, NS
from sim.core.parts import EngineParts as Engine
from sim.core.plan import Scheduled, StepPlan
from sim.core.request import Request, State

if TYPE_CHECKING:
    from array import array

FINISHED: Final = State.FINISHED  # (a module global reads about 8 times faster than an enum member, Python 3.11)
RUNNING: Final = State.RUNNING
_STEPS: Final = itemgetter(0)


def apply(eng: Engine, plan: StepPlan, start_ns: int, durations: list[int], compute_ns: int,
          sample_ns: int = NEVER) -> None:
    """Apply a run of ``len(durations)`` steps of ``plan`` (see the module docstring);
    ``compute_ns``: the first step's compute time (the rest of it was transfers). When the
    time-series sample at ``sample_ns`` (ns) falls inside the run (in its last step: a run ends
    with the step that holds the next sample), the state during that step is held for it
    (:meth:`~sim.core.telemetry.Telemetry.hold`): after the requests that left at earlier
    steps' ends, before those whose last token ends the run."""
    total = sum(durations)
    end_ns = start_ns + total
    eng.iterations += len(durations)
    eng.busy_ns += total
    eng.thrash_ns += durations[0] - compute_ns  # transfers: time lost to preemption
    finished = apply_items(eng, plan, start_ns, durations, compute_ns) if plan.items else []
    if plan.cohort:
        assert eng.cohort is not None
        # every member emitted a token at the end of each step up to its last, steadily
        changes = eng.cohort.advance(durations, start_ns)  # (its log feeds telemetry)
        ordered = not finished  # leavers come in time order; ties need sorting
        for _, t, leavers in changes:
            for r in leavers:
                finished.append((t, r, False))  # (not in the rank order)
            ordered = ordered and len(leavers) == 1
    else:
        ordered = False  # (sorted below when two or more finished)
        coh = eng.cohort
        if coh is not None and coh.members:
            coh.sit_out(total)  # (a prefill_first prefill step: its members took no part)
    if eng.trace is not None:
        eng.trace_run(plan, start_ns, durations)
    if not ordered and len(finished) > 1:  # (one alone is in order)
        # the order a step-by-step walk meets them: by time, then running in rank order,
        # then admitted in this step in admission order (at the first step's end: by a
        # later step's, the requests admitted in the first are running)
        first_end = start_ns + durations[0]
        admitted = {s.req.request_id for s in plan.items if s.admitted}
        finished.sort(key=lambda f: (f[0], 1, f[1].admit_seq) if f[1].request_id in admitted and f[0] == first_end
                      else (f[0], 0, f[1].key, f[1].admit_seq))
    res = eng.reserve
    if res is not None:
        # SGLang's ratio decays at each decode step: the run's steps after its first are
        # (the first told the reserve when it was planned); a request that left lets
        # admission try again
        if len(durations) > 1:
            res.decode_steps(len(durations) - 1)
        if finished:
            res.left()
    hold = sample_ns < end_ns
    for t, r, in_order in finished:
        if hold and t == end_ns:  # (in time order: the rest end the run)
            eng.tel.hold(eng)
            hold = False
        finish(eng, r, t, in_order)
    if hold:
        eng.tel.hold(eng)
    coh = eng.cohort
    # steady decoders join the cohort; while its members sit out steps, after its next step
    if coh is not None and plan.items and not coh.pause_ns:
        bs = eng.bs
        grows = eng.grows_blocks
        for s in plan.items:
            r = s.req
            if (r.last_token_ns == end_ns and r.state is RUNNING and r.cohort_base_step == NOT_MEMBER
                    and (not grows or r.blocks + r.base_blocks == -(-r.computed // bs))):
                coh.join(r)
                eng.queues.ordered_out(r)


# (86 lines: one loop over the step's items, the engine's hottest path; a call per item would cost more)
def apply_items(eng: Engine, plan: StepPlan, start_ns: int, durations: list[int], compute_ns: int) -> list:
    """The explicitly scheduled requests' share of :func:`apply`; returns those that
    finished, as ``(time, request, in the rank order)``.

    Inter-token gaps: a request that also emitted at the end of the previous step has gap
    = this step's duration (counted per class, weighted); any other gap (after a stall, a
    preemption, a step it sat out) is recorded individually.

    An item whose last token comes before the run's last step (the run went on past it:
    :func:`sim.core.fastforward.through_finishes`) takes part in the steps up to it only.
    """
    k = len(durations)
    first = durations[0]
    total = first
    inner_max = 0  # largest gap inside a run
    for j in range(1, k):  # (a loop: sum and max are generic calls in the compiled build)
        d = durations[j]
        total += d
        if d > inner_max:
            inner_max = d
    end_ns = start_ns + total
    end_s = end_ns / NS
    finished: list[tuple[int, Request, bool]] = []
    first_end = start_ns + first
    run_max = first if first > inner_max else inner_max  # (compared: max() of two is a call)
    nc = len(eng.queues.running_count)
    emitted = [0] * nc  # requests emitting a token each step, per class
    steady = [0] * nc  # ... of which emitted at the end of the previous step too
    irregular = eng.tel.itl_scalars
    by_tenant: dict[str, int] = {}
    step_tokens = plan.cohort  # tokens of the run's first step
    recompute_tokens = 0
    recompute_by_class: dict[int, int] = {}
    publish = eng.pool.cache is not None
    if eng.trace is not None:  # kinds must be read before the step changes the requests
        plan.kinds = ["decode" if s.decode else ("recompute" if s.req.generated else "prefill")
                      for s in plan.items]
    spec = eng.spec
    extra_tokens = [0] * nc  # tokens beyond one per emitting request (speculation)
    leavers: list[tuple[int, Request]] = []  # (steps taken part in, item) of those leaving inside
    entrants: list[tuple[int, Request]] = []  # (step, item) of those that joined inside the run
    landed: list[tuple[int, Request]] = []  # (step, item) of decoders that landed inside the run
    for s in plan.items:
        r = s.req
        if s.at and s.decode:  # (a disaggregated decode replica's landed decoder)
            if eng.sampled_token_sent:  # (its token before these went out at its prefill's end)
                _apply_landed(s, start_ns, durations, finished, leavers, entrants, irregular[r.cls_idx])
            else:
                _apply_landed(s, start_ns, durations, finished, leavers, landed)
            continue
        if s.at or s.chunk:
            if not s.at:  # the chunking item's first chunk is in the first step
                step_tokens += s.tokens
                if r.generated:
                    recompute_tokens += s.tokens
                    recompute_by_class[r.cls_idx] = recompute_by_class.get(r.cls_idx, 0) + s.tokens
            _apply_entrant(s, start_ns, durations, finished, leavers, entrants, irregular[r.cls_idx])
            continue
        if r.hidden_output_tokens - r.generated < k:  # it leaves at its last token, inside the run
            kk = r.hidden_output_tokens - r.generated  # (its steps: fastforward.item_steps)
            leavers.append((kk, r))
            own = durations[:kk]
            tot = sum(own)
            end = start_ns + tot
            i_max = max(own[1:]) if kk > 1 else 0
            r_max = own[0] if own[0] > i_max else i_max
            es = end / NS
        else:
            kk, tot, end, i_max, r_max, es = k, total, end_ns, inner_max, run_max, end_s
        r.attained_ns += tot
        r.last_scheduled_s = es
        step_tokens += s.tokens
        if not s.decode and r.generated:  # re-prefill after a recompute preemption
            recompute_tokens += s.tokens
            recompute_by_class[r.cls_idx] = recompute_by_class.get(r.cls_idx, 0) + s.tokens
        if s.decode and s.tokens > 1:
            # a speculative step (always k == 1): emits 1 + accepted drafts at its end
            assert spec is not None
            per_step = spec.verify(r, s.tokens - 1)
            r.computed += per_step
            emits = per_step
        else:
            r.computed += s.tokens + (kk - 1)
            if publish and r.hash_ids and not s.decode:
                eng.pool.publish_prompt(r, s.computed_before)
            if r.computed < r.tokens + (kk - 1):
                continue  # a prefill chunk that does not finish the prompt
            per_step = 1  # one token at the end of each of its kk steps
            emits = kk
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
            if r_max > r.max_itl_ns:
                r.max_itl_ns = r_max
        elif last < 0:
            # first token (a 1-token last prefill chunk prices and runs like a decode, so it
            # can open a fast-forwarded run); no gap before it, the run's inner gaps after it
            r.first_token_ns = first_end
            if i_max > r.max_itl_ns:
                r.max_itl_ns = i_max
        else:
            gap = first_end - last
            irregular[ci].append(gap)
            m = gap if gap > i_max else i_max
            if m > r.max_itl_ns:
                r.max_itl_ns = m
        r.last_token_ns = end
        if r.generated >= r.hidden_output_tokens:
            finished.append((end, r, True))
    # re-prefill's share of the first step's compute is engine time lost to preemption
    if recompute_tokens:
        eng.thrash_ns += compute_ns * recompute_tokens // step_tokens
        for ci, toks in recompute_by_class.items():
            eng.tel.recompute_ns_class[ci] += compute_ns * toks // step_tokens
    if plan.recompute_steps is not None:  # (a recompute chunked in the run's later steps)
        for i, toks, st, ci in plan.recompute_steps:
            if i < k:  # (whole compute: a run's later steps move no blocks)
                lost = durations[i] * toks // st
                eng.thrash_ns += lost
                eng.tel.recompute_ns_class[ci] += lost
    _record(eng, plan, start_ns, durations, emitted, steady, extra_tokens, by_tenant, leavers, entrants, landed)
    return finished


def _apply_landed(s: Scheduled, start_ns: int, durations: list[int], finished: list,
                  leavers: list[tuple[int, Request]], landed: list[tuple[int, Request]],
                  gaps: array | None = None) -> None:
    """:func:`apply_items` for a decoder whose KV landed inside the run
    (:meth:`sim.core.fastforward.OpenRun.land`): taken in at the boundary before step ``s.at``
    (:meth:`sim.core.engine.Engine.take_landed`, which emitted its token there), it emits one
    token at the end of each step from ``s.at`` to its last token or the run's end, each a
    steady gap, as stepping would have it. With ``gaps`` (its class's single gaps: the token
    before was sent at its prefill's end, ``Engine.sampled_token_sent``) the first of them
    follows that token, a gap of its own recorded there, and ``landed`` is the run's entrants."""
    r = s.req
    j = s.at
    k = len(durations)
    stop = j + r.hidden_output_tokens - r.generated
    if stop < k:  # (it leaves inside a run that goes past last tokens)
        leavers.append((stop, r))
    else:
        stop = k
    own = durations[j:stop]
    kk = len(own)
    end = start_ns + sum(durations[:stop])
    r.attained_ns += sum(own)
    r.last_scheduled_s = end / NS
    r.computed += kk
    r.generated += kk
    r.tokens += kk
    m = max(own)
    if gaps is not None:
        gap = start_ns + sum(durations[:j + 1]) - r.last_token_ns
        gaps.append(gap)
        if gap > m:
            m = gap
    if m > r.max_itl_ns:
        r.max_itl_ns = m
    r.last_token_ns = end
    landed.append((j, r))
    if r.generated >= r.hidden_output_tokens:
        finished.append((end, r, True))


def _apply_entrant(s: Scheduled, start_ns: int, durations: list[int], finished: list,
                   leavers: list[tuple[int, Request]], entrants: list[tuple[int, Request]],
                   irregular: array) -> None:
    """:func:`apply_items` for an item whose first token comes inside the run: one that joined
    at step ``s.at`` (a held run's newcomer, :meth:`sim.core.fastforward.OpenRun.join`: its whole
    prompt in that step), or the chunking item (``s.chunk``: its prompt's chunks from the first
    step to step ``s.chunk_steps``, :func:`sim.core.fastforward.chunk_entries`). Its first token
    ends that step (after a recompute's, the gap since its last token before the preemption
    goes to ``irregular``, its class's), then one token a step to its last, as stepping would
    have it; a run that ends before that step leaves it prefilling. Its telemetry is logged by
    :func:`_log_segments`."""
    r = s.req
    j = s.at + s.chunk_steps  # the step its first token ends
    k = len(durations)
    left = r.hidden_output_tokens - r.generated
    stop = j + left if j + left < k else k  # (its steps: at .. stop-1)
    if stop <= j:  # still prefilling: every chunk so far a whole one
        own = durations[s.at:stop]
        r.attained_ns += sum(own)
        r.last_scheduled_s = (start_ns + sum(durations[:stop])) / NS
        r.computed += s.tokens + (stop - s.at - 1) * s.chunk
        return
    kk = stop - j  # tokens it emits
    own = durations[j:stop]
    first_end = start_ns + sum(durations[:j + 1])
    end = first_end + sum(own[1:])
    r.attained_ns += sum(durations[s.at:stop])
    r.last_scheduled_s = end / NS
    r.computed = r.tokens + (kk - 1)
    r.generated += kk
    r.tokens += kk
    i_max = max(own[1:]) if kk > 1 else 0
    last = r.last_token_ns
    if last >= 0:  # (a recompute's: the gap since its last token)
        gap = first_end - last
        irregular.append(gap)
        if gap > i_max:
            i_max = gap
    else:
        r.first_token_ns = first_end
    if i_max > r.max_itl_ns:
        r.max_itl_ns = i_max
    r.last_token_ns = end
    entrants.append((j, r))
    if stop < k:
        leavers.append((stop, r))
    if r.generated >= r.hidden_output_tokens:
        finished.append((end, r, True))


def _record(eng: Engine, plan: StepPlan, start_ns: int, durations: list[int], emitted: list[int],
            steady: list[int], extra_tokens: list[int], by_tenant: dict[str, int],
            leavers: list[tuple[int, Request]], entrants: list[tuple[int, Request]],
            landed: list[tuple[int, Request]]) -> None:
    """Telemetry of the run's explicit items (tokens per class and tenant, inter-token gaps)
    and the policy's per-step books. ``leavers``: ``(steps, item)`` of the items that took
    part in the run's first ``steps`` steps only; ``entrants``: ``(step, item)`` of those that
    joined at that step; ``landed``: ``(step, item)`` of decoders that joined the batch at
    the boundary before that step."""
    if eng.spec is not None:
        eng.spec.stats["steps"] += 1
    if eng.tel.keeps:  # (a telemetry that nobody reads is handed no steps)
        if leavers or entrants or landed:
            _log_segments(eng.tel, start_ns, durations, emitted, steady, by_tenant, leavers, entrants, landed)
        else:
            eng.tel.log_run(start_ns, durations, emitted, steady, by_tenant,
                            extra_tokens if eng.spec is not None else None)
    on_scheduled = eng.policy.on_scheduled
    if on_scheduled is not None:
        k = len(durations)
        steps = {r.request_id: kk for kk, r in leavers}  # (the rest take part in all k steps)
        items = [(s.req, s.tokens, steps.get(s.req.request_id, k)) for s in plan.items]
        on_run = eng.policy.on_scheduled_run
        if k > 1 and on_run is not None:  # the policy books a run step by step
            on_run(items, start_ns, durations)
        else:
            for req, tokens, service_s, end_s in run_totals(items, start_ns, durations):
                on_scheduled(req, tokens, service_s, end_s)


def run_totals(items: list, start_ns: int, durations: list[int]):
    """What ``on_scheduled`` is told of a run of ``len(durations)`` steps (ns) from ``start_ns``,
    per item ``(request, tokens of the first step, steps it takes part in)``, in order: ``(request,
    tokens, service seconds, end in seconds)`` of its part of the run, told as one step."""
    k = len(durations)
    total = sum(durations)
    for req, tokens, kk in items:
        own = total if kk == k else sum(durations[:kk])
        yield req, tokens + (kk - 1), own / NS, (start_ns + own) / NS


def _log_segments(tel, start_ns: int, durations: list[int], emitted: list[int], steady: list[int],
                  by_tenant: dict[str, int], leavers: list[tuple[int, Request]],
                  entrants: list[tuple[int, Request]], landed: list[tuple[int, Request]]) -> None:
    """Log a run whose emitting items change inside it (``leavers`` leave after their
    ``steps``, ``entrants`` emit from the end of their step on, ``landed`` too but after a
    token at the boundary before it, so steadily from the first; ``emitted``, ``steady`` and
    ``by_tenant`` describe its first step): one log entry per stretch of steps with the same
    emitters, each request emitting one token a step (no speculation: runs of speculative
    steps are one step). At the start of every stretch after the first, the emitters that
    emitted at the end of the step before too are those that were emitting then and go on
    (``steady``; an entrant's first token has no gap before it); a stretch with no emitter
    is not logged (the cohort's log has its steps)."""
    emitted = emitted[:]
    steady = steady[:]
    by_tenant = dict(by_tenant)
    a, t = 0, start_ns
    changes = sorted([(kk, 0, r) for kk, r in leavers] + [(j, 1, r) for j, r in entrants]
                     + [(j, 2, r) for j, r in landed], key=_STEPS)
    for step, enters, r in changes:
        if step > a:
            seg = durations[a:step]
            if by_tenant:
                tel.log_run(t, seg, emitted, steady, by_tenant)
            t += sum(seg)
            a = step
            steady = emitted[:]  # (those emitting at the end of the step before this one)
        ci = r.cls_idx
        if enters:
            emitted[ci] += 1
            if enters == 2:
                steady[ci] += 1
            by_tenant[r.tenant] = by_tenant.get(r.tenant, 0) + 1
            continue
        emitted[ci] -= 1
        steady[ci] -= 1
        n = by_tenant[r.tenant] - 1
        if n:
            by_tenant[r.tenant] = n
        else:
            del by_tenant[r.tenant]
    if a < len(durations) and by_tenant:
        tel.log_run(t, durations[a:], emitted, steady, by_tenant)


def finish(eng: Engine, r: Request, now_ns: int, in_order: bool = True) -> None:
    """``r`` emitted its last token at ``now_ns``: it leaves, its blocks are freed, all are told."""
    eng.queues.remove_running(r)
    if in_order:  # (cohort members are not in the rank order)
        eng.queues.ordered_out(r)
    if eng.keeps_kv:  # (a prefill replica's: the KV stays until it is sent)
        eng.held[r.request_id] = r
    else:
        eng.pool.release_request(r)
    r.state = FINISHED
    r.finish_ns = now_ns
    now_s = now_ns / NS
    eng.policy.on_finish(r, now_s)
    if eng.gate is not None:
        eng.gate.on_finish(r, now_s)
    eng.tel.on_end(r)
    if eng.on_request_end is not None:
        eng.on_request_end(r, now_ns)
