"""Fast-forward: advance a run of identical-shape steps at once, exactly.

When every running request decodes after the planned step and nothing else can change (an
arrival, a block shortage, the policy's next ranking change, a telemetry sample, the horizon),
:func:`run_length` computes how many steps ``k`` can run and the exact duration of each; the
engine then advances them as one event. The run may start with an admission and last prefill
chunks, and go on past requests' last tokens, when nobody waits and the policy never re-ranks.
A prompt chunked by its caps (``max_prefill_chunk``, its class's ``max_prefill_tokens_per_step``)
or, when it ranks last, by the budget the decoders leave goes on chunking in the run's next
steps beside the decoders (:func:`_chunking`), and a prefill may open a run while others wait
if no waiter could be taken in at its boundaries (every slot taken, or every waiter held back
by the cap or the budget the chunks use up: :func:`_capped_out`, :func:`_takes_budget`).
Durations are integer nanoseconds from one cost function, evaluated step by step, so the
result is identical to stepping one iteration at a time (``engine.fast_forward = false``),
which the tests assert. Speculative steps emit a random number of tokens and are never
fast-forwarded.

With ``engine.batching = "prefill_first"`` a run is a plan followed by decode steps of every
running request just the same: a decode plan (nobody's prefill could be taken: the later
steps' plans are decode steps too until an event the run stops at, since a waiter that did not
fit a whole step's budget at the start fits no better as the decoders grow), or a prefill step
that holds every running request and ends every prompt in it with nobody left to admit (the
conditions above). A prompt chunking on (:func:`_chunking`) would take its next chunks beside
the decoders, which that mode never does: such a plan is the planned step alone. So is every
plan of a policy told who ran in each step (``on_scheduled``, e.g. MLFQ): it may declare its
next change from the requests the last step served, and a prefill step left the decoders out.
"""
from __future__ import annotations

from bisect import bisect_left, insort

from sim.core.costs import NEVER, NS
from sim.core.parts import EngineParts as Engine
from sim.core.plan import NO_PRIORITY, Scheduled, StepPlan, StepShape, least_urgent
from sim.core.request import Request

# A fast-forwarded run prices millions of steps as ``round((a + b * ctx) * NS)``. Its loop
# computes that in floats throughout (context and NS as floats: float-by-float arithmetic is
# ~12 % fewer instructions a step than converting the ints at every step) and rounds with
# what ``round`` calls for a float, called directly (half the time of ``round(x)``, which
# first looks the method up). Exactly the same numbers: Python converts an int operand of
# float arithmetic to the same double, and contexts (token counts) and NS are integers far
# below 2**53, held exactly, as are integer cost terms.
_round_float = float.__round__
_NS_F = float(NS)


def run_length(eng: Engine, plan: StepPlan, now_ns: int, next_event_ns: int, dur0: int) -> list[int]:
    """Durations (ns) of the steps to take for this plan: one, or the planned step followed
    by k-1 pure decode steps of every running request.

    A run may start with prefills (last chunks, so that every running request decodes from
    step 2 on) and admissions when no request waits (a waiter could be admitted once the
    prefill's budget is free again)."""
    run = start_run(eng, plan, now_ns, next_event_ns, dur0)
    if run is None:
        return [dur0]
    run.extend(NEVER)
    return run.durs


def start_run(eng: Engine, plan: StepPlan, now_ns: int, next_event_ns: int, dur0: int) -> OpenRun | None:
    """The run of this plan (:class:`OpenRun`, not priced yet beyond its first step), whose
    steps start before ``next_event_ns`` (and the policy's next change); None when it is the
    planned step alone."""
    # Step i (0-based) starts at now + sum of durations 0..i-1; it belongs to the run only
    # if it starts before the next event (an arrival at a step's start is seen by it).
    limit = eng.next_change_ns
    if next_event_ns < limit:  # (not min(): a call, once per event)
        limit = next_event_ns
    if now_ns + dur0 >= limit:
        return None  # (often: an arrival comes during an admission's prefill step)
    ok, pf = _chunking(eng, plan)
    if eng.limits.prefill_first and (pf is not None or eng.policy.on_scheduled is not None):
        return None  # (see the module docstring)
    if not ok or not _may_run(eng, plan, pf):
        return None
    if not eng.policy.static_ranking and _unheard(plan, now_ns, eng.policy.on_scheduled is not None):
        # a decoder taken in at this boundary (a disaggregated decode replica's landed copy), or
        # one the step that ended here left out (a walk in admission order stopped by a
        # preemption): the policy hears of its next step only at that step's end
        # (``on_scheduled``), and may then declare a change of its key (a quantum), as for an
        # admitted prefill; the change it declared here knew only the requests that ran
        return None
    c = m = 0  # the chunking item's (pf's) chunk, and the steps after the first it prefills in
    if pf is not None:
        c = chunk_of(eng, pf)
        m = -(-prompt_left(pf) // c)
    # at most up to the first running request's last token; or, when nothing else could
    # change at those instants (:func:`through_finishes`), past every request's last token
    # until the last one's (each leaves the batch at its own)
    coh = eng.cohort if plan.cohort else None
    if through_finishes(eng):
        k = coh.steps_to_empty() if coh is not None else 0
        for s in plan.items:
            r = s.req
            left = r.hidden_output_tokens - r.generated + (m if s is pf else 0)  # (its steps)
            if left > k:
                k = left
    else:
        k = coh.steps_to_last_token() if coh is not None else NEVER
        for s in plan.items:
            r = s.req
            left = r.hidden_output_tokens - r.generated + (m if s is pf else 0)
            if left < k:
                k = left
    q = eng.queues
    if pf is not None and _takes_budget(eng, pf):
        # its chunk is what the budget leaves it beside the decoders: one more when a decoder
        # leaves, so the run ends with the first last token before its prompt's end
        first = coh.steps_to_last_token() if coh is not None else NEVER
        for s in plan.items:
            if s is not pf:
                left = s.req.hidden_output_tokens - s.req.generated
                if left < first:
                    first = left
        if first <= m and first < k:
            k = first
    if pf is not None and q.waiting and len(q.running) < eng.limits.max_num_seqs:
        # (_capped_out, _takes_budget: the waiters are held back while its chunks take the
        # whole cap or budget; the run ends before a step where it takes less, or after its
        # last chunk)
        last = m + 1 if prompt_left(pf) % c == 0 else m
        if last < k:
            k = last
    if pf is not None and k > 1:
        pf.chunk, pf.chunk_steps = c, m  # (its steps: m of prefill, then its output's)
    return OpenRun(eng, plan, now_ns, dur0, k, limit) if k > 1 else None


class OpenRun:
    """A fast-forwarded run of a plan: the planned step, then up to ``k - 1`` decode steps of
    every running request (and the chunking item's next chunks: ``entries``) with no transfers
    (preemptions and swaps, the only sources of transfers, are excluded) that start before
    ``limit``, as far as their KV blocks allow.
    Requests drop out of the batch after their last token (cohort members, and explicit items
    whose last token comes before the run's ``k``-th step: :func:`item_steps`).

    Its steps are priced a stretch at a time (:meth:`extend`): a cluster replica's run is
    likely cut short by a request routed to it soon, so it prices steps only as the clock
    reaches them. Priced at once (``extend(NEVER)``) it is :func:`run_length`'s run; cut
    anywhere, a run equals stepping, so where the stretches end changes nothing.

    ``durs``: the durations (ns) priced so far, the planned step's first; ``ends``: when each
    of those steps ends (ns); ``gone_ns``: for each
    member whose last token ends a step of the run before the last priced one, when that step
    ends (ascending; a router no longer counts it from then on).

    A cluster replica may also let a request routed to it join the run (:meth:`join`): it is
    admitted at a step boundary inside the run, prefills its whole prompt in that step beside
    the decoders, and decodes in the run's steps after it (``entries``), as a new run started at
    that boundary would have had it (:mod:`sim.cluster.replicas` says when that is exact).
    """

    __slots__ = ("eng", "plan", "durs", "ends", "gone_ns", "k", "limit", "done", "avail", "n_exp", "ctx_exp",
                 "g", "fin", "fi", "ifin", "ii", "i_item", "ctx_off", "d_coh", "start",
                 "entries", "ei", "all_leave", "chunking", "through")

    def __init__(self, eng: Engine, plan: StepPlan, now_ns: int, dur0: int, k: int, limit: int) -> None:
        self.eng = eng
        self.plan = plan
        self.durs = [dur0]
        self.ends = [now_ns + dur0]
        self.gone_ns: list[int] = []
        self.k = k
        self.limit = limit
        self.done = False  # True: priced to its end (k, the limit or the KV blocks)
        # KV blocks the run may take (counted at its start, before it takes any of them; with
        # a plain pool that is every free block, read without block_avail's call)
        pool = eng.pool
        self.avail = (pool.free if pool.plain else block_avail(eng, plan, k)) if eng.grows_blocks else 0
        # the pricing's state before the next step (the loop in ``extend`` reads and writes it)
        items = plan.items
        coh = eng.cohort if plan.cohort else None
        n_exp = len(items)
        ctx_exp = 0  # decode contexts of step 1, less n_exp
        ifin = []  # (step before which it is gone, its share of ctx_exp) of items leaving inside
        # steps with a prefill beside the decoders, by step: (step, prefill tokens, their sum
        # l^2 and l x c, requests admitted, the context offset from which it decodes after it or
        # None, request); the chunking item's next chunks, and requests that joined (``join``)
        self.entries: list[tuple] = []
        self.chunking = False
        for s in items:
            if s.chunk:  # (it decodes only after its prefill's last chunk: entries)
                self.entries = chunk_entries(s)
                self.chunking = True
                n_exp -= 1
                continue
            c = s.computed_before + s.tokens
            ctx_exp += c
            r = s.req
            if r.hidden_output_tokens - r.generated < k:
                ifin.append((r.hidden_output_tokens - r.generated, c))
        if len(ifin) > 1:
            ifin.sort()
        self.ifin = ifin
        self.ii = 0  # items gone so far
        self.i_item = ifin[0][0] if ifin else NEVER  # the step before which the next item is gone
        self.n_exp = n_exp
        self.ctx_exp = ctx_exp
        self.g = coh.steps if coh is not None else 0
        self.fin: list[tuple[int, int, Request]] = coh.finish if coh is not None else []
        self.fi = 0  # members gone so far
        self.ctx_off = coh.ctx_off if coh is not None else 0
        self.d_coh = plan.cohort
        self.start = now_ns + dur0  # of the next step
        self.ei = 0  # entries priced so far
        self.all_leave = False  # every item's last token in ``ifin`` (made at the first join)
        self.through = through_finishes(eng)  # (k: to the last request's last token, not the first's)

    def extend(self, bound_ns: int) -> bool:
        """Price the steps that start before ``bound_ns`` (within the run's own caps); False
        when none could be added."""
        if self.done:
            return False
        eng, durs = self.eng, self.durs
        n = len(durs)
        limit = self.limit
        if bound_ns >= limit:
            self.done = True  # (priced up to where the next step would start at or after the limit)
        else:
            limit = bound_ns
        costs = eng.costs
        g, fin, fi, n_exp, ctx_exp = self.g, self.fin, self.fi, self.n_exp, self.ctx_exp
        ctx_off, d_coh, start = self.ctx_off, self.d_coh, self.start
        ifin, ii, i_item = self.ifin, self.ii, self.i_item
        entries, ei = self.entries, self.ei
        i_enter = entries[ei][0] if ei < len(entries) else NEVER  # the next joined request's step
        D = n_exp + d_coh
        # the decode contexts of the next step (step n), and the cost line of its batch size:
        # derived from the counts kept (those gone before step n still counted, as they are)
        ctx = ctx_exp + n_exp * n + ctx_off + d_coh * (g + n + 1)
        line = costs.decode_line(D)
        # the step before which the next requests are gone (their last token ended the one
        # before), members or items; NEVER when none is left
        i_gone = fin[fi][0] - g if fi < len(fin) else NEVER
        if i_item < i_gone:
            i_gone = i_item
        a, b = line if line is not None else (0.0, 0.0)
        rnd, ns = _round_float, _NS_F
        k = self.k
        gone_ns = self.gone_ns
        ends = self.ends
        i = n
        while i < k and start < limit:
            if i == i_gone:  # requests whose last token ended step i-1 (at ``start``) are gone
                while fi < len(fin) and fin[fi][0] == g + i:
                    m = fin[fi][2]
                    ctx_off -= m.computed - m.cohort_base_step
                    d_coh -= 1
                    fi += 1
                    gone_ns.append(start)
                i_gone = fin[fi][0] - g if fi < len(fin) else NEVER
                if i_item == i:
                    while ii < len(ifin) and ifin[ii][0] == i:
                        ctx_exp -= ifin[ii][1]
                        n_exp -= 1
                        ii += 1
                        gone_ns.append(start)
                    i_item = ifin[ii][0] if ii < len(ifin) else NEVER
                if i_item < i_gone:
                    i_gone = i_item
                D = n_exp + d_coh
                ctx = ctx_exp + n_exp * i + ctx_off + d_coh * (g + i + 1)
                line = costs.decode_line(D)
                a, b = line if line is not None else (0.0, 0.0)
            if i == i_enter:
                _, n_tok, l2, lc, n_adm, add, r = entries[ei]
                ei += 1
                if not n_tok:
                    # a decoder whose KV landed (:meth:`land`) decodes from step i on, with
                    # context ``add + i'`` at step i': the batch's shape is worked out again
                    n_exp += 1
                    ctx_exp += add
                    insort(ifin, (_leaves(i, n_tok, r), add), lo=ii)
                    i_item = ifin[ii][0]
                    i_enter = entries[ei][0] if ei < len(entries) else NEVER
                    i_gone = i
                    continue
                # a prefill beside the decoders, priced as :meth:`Engine.compute_ns` prices the
                # plan of that step: a joined request's whole prompt, or the chunking item's next
                # chunk; one that ends its prompt decodes from the next step on, with context
                # ``add + i'`` at step i' (n + (i' - i) for a prompt of n ending at step i)
                d = costs.price(StepShape(n_tok, D, l2, lc, ctx, 1, n_adm))
                durs.append(d)
                start += d
                ends.append(start)
                if r.generated:  # a recompute's chunk: its share of the step is lost to preemption
                    plan = self.plan
                    if plan.recompute_steps is None:
                        plan.recompute_steps = []
                    plan.recompute_steps.append((i, n_tok, D + n_tok, r.cls_idx))
                if add is not None:
                    n_exp += 1
                    ctx_exp += add
                    insort(ifin, (_leaves(i, n_tok, r), add), lo=ii)
                    i_item = ifin[ii][0]
                i += 1
                i_enter = entries[ei][0] if ei < len(entries) else NEVER
                i_gone = i  # (the batch's shape is worked out again at the next step, as after a leave)
                continue
            # the steps before the next last tokens have one batch size and cost line:
            # priced in a loop that checks neither (runs go through ~6 steps between finishes)
            seg = i_gone if i < i_gone < k else k
            if i < i_enter < seg:
                seg = i_enter
            if line is None:
                while i < seg and start < limit:
                    d = costs.step_ns(0, D, 0, 0, ctx)
                    durs.append(d)
                    start += d
                    ends.append(start)
                    ctx += D
                    i += 1
            else:
                i0, c, dc = i, float(ctx), float(D)  # (see _round_float)
                while i < seg and start < limit:
                    d = rnd((a + b * c) * ns)  # (>= 1 ns: see CostModel.decode_line)
                    durs.append(d)
                    start += d
                    ends.append(start)
                    c += dc
                    i += 1
                ctx += D * (i - i0)
        self.fi, self.ctx_off, self.d_coh, self.start = fi, ctx_off, d_coh, start
        if ifin:
            self.ii, self.i_item, self.n_exp, self.ctx_exp = ii, i_item, n_exp, ctx_exp
        self.ei = ei
        m_ = len(durs)
        if m_ >= k:
            self.done = True
        if m_ > n and eng.grows_blocks:
            kb = block_limited(eng, self.plan, m_, self.avail, n)
            if kb < m_:
                del durs[kb:]
                del ends[kb:]
                self.done = True
                # (and the leaves priced in the steps cut off, or at the new last step's end)
                while gone_ns and gone_ns[-1] >= ends[-1]:
                    gone_ns.pop()
        return len(durs) > n


    def join(self, j: int, r: Request) -> None:
        """``r`` (fresh, its output two tokens or more) joins the run at step ``j`` (1 <= j <=
        steps priced, after the last entry's): it prefills its whole prompt in step j and decodes
        from step j+1 to its last token, and the run may go on to it. The steps from ``j`` on are
        priced again (:meth:`extend`)."""
        self._all_leave()
        self.rewind(j)
        n = r.tokens - r.computed
        self.entries.append((j, n, n * n, 0, 1, n - j, r))
        left = j + r.hidden_output_tokens - r.generated
        if left > self.k:
            self.k = left
        self.done = False

    def _all_leave(self) -> None:
        """Every item now leaves at its last token: the run's k bounded the items' steps so far,
        and a joiner can make the run longer (those at or past k were left out of ``ifin``)."""
        if self.all_leave:
            return
        self.all_leave = True
        k, ifin = self.k, self.ifin
        for s in self.plan.items:
            if s.at:
                continue  # (a landed decoder's is its entry's)
            left = s.req.hidden_output_tokens - s.req.generated
            if left >= k:
                insort(ifin, (left, s.computed_before + s.tokens), lo=self.ii)

    def land(self, j: int, r: Request) -> None:
        """``r``, whose KV landed here from a prefill replica (a disaggregated decode replica's
        :meth:`sim.cluster.disagg.PDReplica.land`), joins the run's batch at the boundary before
        step ``j`` (1 <= j <= steps priced, at or after the last entry's), where the token its
        prefill sampled is emitted, and decodes from step j to its last token (two or more
        left). A run that goes past last tokens (``through``) may go on to its; any other ends
        there at the latest. The steps from ``j`` on are priced again."""
        last = _leaves(j, 0, r)
        if self.through:
            self._all_leave()
            if last > self.k:
                self.k = last
        elif last < self.k:
            self.k = last
        self.rewind(j)
        self.entries.append((j, 0, 0, 0, 0, r.computed + 1 - j, r))
        self.done = False

    def unjoin_landed(self, j: int, k: int) -> None:
        """Undo the last :meth:`land` (at step ``j``; ``k``: the run's k before it): the steps
        from ``j`` on are forgotten (the caller's cut ends the run there)."""
        self.rewind(j)
        self.entries.pop()
        self.k = k
        self.done = True

    def unjoin(self, k: int) -> None:
        """Undo the last :meth:`join` (its request is admitted at that boundary with another
        instead): the run ends with the step before it; ``k``: the run's k before the join."""
        j = self.entries[-1][0]
        self.rewind(j)
        self.entries.pop()
        self.k = k
        self.done = True

    def rewind(self, j: int) -> None:
        """Keep the first ``j`` priced steps and bring the pricing's state back to the start of
        step ``j``: what :meth:`extend` did at steps j and later is undone (the requests gone
        before them counted again, the entries at them taken out)."""
        durs, ends, gone = self.durs, self.ends, self.gone_ns
        del durs[j:]
        del ends[j:]
        b = ends[j - 1]
        del gone[bisect_left(gone, b):]  # (those gone before step j left at an earlier step's end)
        fin, g = self.fin, self.g
        fi, ctx_off, d_coh = self.fi, self.ctx_off, self.d_coh
        while fi and fin[fi - 1][0] - g >= j:
            fi -= 1
            m = fin[fi][2]
            ctx_off += m.computed - m.cohort_base_step
            d_coh += 1
        ifin, ii, n_exp, ctx_exp = self.ifin, self.ii, self.n_exp, self.ctx_exp
        while ii and ifin[ii - 1][0] >= j:
            ii -= 1
            ctx_exp += ifin[ii][1]
            n_exp += 1
        entries, ei = self.entries, self.ei
        while ei and entries[ei - 1][0] >= j:
            ei -= 1
            step, _, _, _, _, add, r = entries[ei]
            if add is not None:
                n_exp -= 1
                ctx_exp -= add
                ifin.remove((_leaves(step, entries[ei][1], r), add))
        self.fi, self.ctx_off, self.d_coh, self.ii, self.ei = fi, ctx_off, d_coh, ii, ei
        self.n_exp, self.ctx_exp = n_exp, ctx_exp
        self.i_item = ifin[ii][0] if ii < len(ifin) else NEVER
        self.start = b
        self.done = len(durs) >= self.k


def landed_steps_left(r: Request) -> int:
    """Steps a landed decoder (:meth:`OpenRun.land`) still takes, to its last token: its first
    token came when its KV landed, at the boundary before it joined, and its ``generated``
    does not count that one until the replica takes it in."""
    return r.hidden_output_tokens - r.generated - 1


def _leaves(step: int, n_tok: int, r: Request) -> int:
    """The step before which a request entering a run at ``step`` (an ``OpenRun.entries``
    entry) is gone: after its last token. A prefill's (``n_tok`` tokens) first token ends
    ``step``; a landed decoder's (``n_tok`` 0) steps are :func:`landed_steps_left`."""
    return step + (r.hidden_output_tokens - r.generated if n_tok else landed_steps_left(r))


def item_steps(s: Scheduled, k: int) -> int:
    """Steps an explicit item takes part in, of a run of ``k``: up to its last token (the run
    goes on past it only when :func:`through_finishes`; else ``k`` is at most this)."""
    left = s.req.remaining_output + s.chunk_steps
    return left if left < k else k


def held_after(s: Scheduled, k: int) -> int:
    """Tokens whose KV an item of the plan holds after the run's first ``k`` steps: one more
    a step to its last token; the chunking item's chunks first (:func:`chunk_entries`)."""
    left = s.req.hidden_output_tokens - s.req.generated
    m = s.chunk_steps
    steps = k - s.at  # (an item that joined inside the run takes part from step ``at`` on)
    if steps > left + m:
        steps = left + m
    if steps - 1 <= m and s.chunk:  # (still prefilling, or its last chunk)
        done = s.computed_before + s.tokens + (steps - 1) * s.chunk
        return done if done < s.req.tokens else s.req.tokens
    return s.computed_before + s.tokens + steps - 1 if not s.chunk else s.req.tokens + steps - 1 - m


def prompt_left(s: Scheduled) -> int:
    """Prompt tokens (a recompute's: its prompt and output so far) an item has left to prefill
    after its share of the plan's step."""
    return s.req.tokens - s.computed_before - s.tokens


def chunk_entries(s: Scheduled) -> list[tuple]:
    """The chunking item's prefill steps after the run's first (``OpenRun.entries``): a chunk of
    ``s.chunk`` tokens a step, what is left in the last (``s.chunk_steps``), after which it
    decodes (its first token ends that step)."""
    r = s.req
    total = r.tokens
    pre = s.computed_before + s.tokens
    out = []
    for i in range(1, s.chunk_steps + 1):
        c = total - pre if total - pre < s.chunk else s.chunk
        out.append((i, c, c * c, c * pre, 0, total - i if i == s.chunk_steps else None, r))
        pre += c
    return out


def _may_run(eng: Engine, plan: StepPlan, pf: Scheduled | None) -> bool:
    """Can the steps after this plan's be decode steps of every running request (beside the
    chunks of ``pf``, the plan's chunking item, :func:`_chunking`) that no event inside the run
    would have changed?"""
    if (not eng.cfg.fast_forward or plan.preempted or plan.swap_in_blocks or plan.swap_out_blocks
            or eng.spec_k):  # speculative steps emit a random number of tokens: one at a time
        return False
    q, lim, policy = eng.queues, eng.limits, eng.policy
    items = plan.items
    D = len(items) + plan.cohort
    if not D or D != len(q.running) or D > lim.max_batched_tokens:
        return False
    prefills = plan.admitted > 0
    for s in items:
        if not s.decode:
            prefills = True
    if prefills:
        # the policy would see the new decoders only at the next boundary
        if not policy.static_ranking:
            return False
        if q.waiting and D < lim.max_num_seqs and not (pf is not None and (_capped_out(eng, pf)
                                                                            or _takes_budget(eng, pf))):
            # the prefill's budget is free again at the next step, where a waiter could fit;
            # not while every slot is taken (nobody leaves inside a run while others wait), nor
            # while a chunking prefill uses up the per-step cap of the only class waiting, or
            # the whole budget
            return False
        if eng.pool.cache is not None:
            for s in items:
                if not s.decode and s.req.hash_ids:
                    # a prefill publishes its prompt to the prefix cache at the step's end, which
                    # moves blocks out of its class's count and can shrink what others may take
                    return False
    if q.waiting and eng.reserve is not None and not eng.reserve.paused:
        # SGLang's estimate: the ratio decays at every decode step, and a waiter held back at
        # this step may fit at the next (while admission is paused, none is tried before a
        # request leaves, and the run ends at the first last token)
        return False
    if q.waiting and policy.dynamic:
        # the policy re-ranks before every step (e.g. by what the prefix cache holds now):
        # another waiter could head the queue, and fit, at the next boundary
        return False
    if q.waiting and eng.waiting_rule.evicts and eng.grows_blocks:
        # a waiter that outranks a running request could evict it once victims grow
        if q.waiting[0][0] < q.lowest_running().key:  # (kept by the queues, not a walk)
            return False
    return True


def _unheard(plan: StepPlan, now_ns: int, told: bool) -> bool:
    """Does the plan decode a request that joined the running set at ``now_ns`` without a
    prefill here (a landed copy, :meth:`~sim.core.engine.Engine.take_landed`), or, when the
    policy is told who ran in each step (``told``), one that took no part in the step that
    ended at ``now_ns``?"""
    now_s = now_ns / NS
    for s in plan.items:
        if s.decode:
            r = s.req
            if r.admitted_s == now_s or (told and r.last_scheduled_s != now_s):
                return True
    return False


def _chunking(eng: Engine, plan: StepPlan) -> tuple[bool, Scheduled | None]:
    """May the run go on with the plan's prefill that does not end its prompt in this step (it
    then takes a chunk of :func:`chunk_size` tokens a step beside the decoders to its prompt's
    end), and which it is: ``(True, None)`` when every prefill ends its prompt.

    It may when it is the only such prefill and the planner gives it the same chunk at every
    step (:func:`chunk_of`) and the decoders their token, with no trace, policy books or
    speculation asking for steps one by one: when its caps are what limit its chunks (its
    class's cap is its own, the budget holds every decoder and the chunk), or when the budget
    does and it is the running request ranked last (the planner walks the running requests in
    rank order, the cohort first, so each decoder takes its token and it takes what is left;
    the run ends before a decoder leaves, :func:`start_run`)."""
    pf = None
    for s in plan.items:
        if not s.decode and s.computed_before + s.tokens != s.req.tokens:
            if pf is not None:
                return False, None
            pf = s
    if pf is None:
        return True, None
    lim = eng.limits
    if not lim.chunked_prefill or eng.trace is not None or eng.policy.on_scheduled is not None:
        return False, None
    if eng.reserve is not None:
        return False, None  # (a step with a chunk is no decode step: its ratio does not decay)
    if _takes_budget(eng, pf) and eng.queues.lowest_running() is not pf.req:
        return False, None  # (a decoder ranked after it would get no token while it chunks)
    c = chunk_of(eng, pf)
    if c < 2 or prompt_left(pf) % c == 1:
        return False, None  # (a last chunk of one token is planned, and priced, as a decode)
    return True, pf


def chunk_of(eng: Engine, pf: Scheduled) -> int:
    """The chunk the chunking item ``pf`` takes in each step after the plan's, while no running
    request leaves: its caps' (:meth:`~sim.core.limits.StepLimits.chunk_size`), or less where
    the budget left beside every other running request's token is less."""
    c = eng.limits.chunk_size(pf.req)
    share = eng.limits.max_batched_tokens - (len(eng.queues.running) - 1)
    return share if share < c else c


def _takes_budget(eng: Engine, pf: Scheduled) -> bool:
    """Do the chunking item's chunks take the whole budget of each step after the plan's, so
    that no waiter is taken in at its boundaries until its prompt's last, shorter chunk (the
    run then ends before it: :func:`start_run`)?"""
    return chunk_of(eng, pf) < eng.limits.chunk_size(pf.req)


def _capped_out(eng: Engine, pf: Scheduled) -> bool:
    """Does the chunking item ``pf``, chunking at its class's per-step cap, hold back every
    waiter at every step of its prompt but the last? When every waiter is a prefill of that
    class (no prefix cache to shorten one), the planner skips each (``planner.class_capped``)
    while the chunk takes the whole cap; the run then ends before the step where it takes less
    (:func:`start_run`)."""
    ci = pf.req.cls_idx
    lim, q = eng.limits, eng.queues
    cap = lim.class_prefill_cap[ci]
    return (eng.pool.cache is None and 0 < cap <= lim.chunk_cap
            and q.waiting_prefills[ci] == len(q.waiting))


def through_finishes(eng: Engine) -> bool:
    """May a fast-forwarded run go on past running requests' last tokens? Only when a finish
    changes nothing but the batch: nobody waits to take the freed slot or blocks, the policy
    never re-ranks, and no closed-loop user sends a new request when its answer arrives."""
    return eng.through_finishes and not eng.queues.waiting and eng.policy.static_ranking


def run_need(eng: Engine, plan: StepPlan, k: int) -> int:
    """Blocks steps 2..k of a run take (each request up to its last token)."""
    bs = eng.bs
    n = sum(_landed_need(s, k, bs) if s.at and s.decode else
            -(-held_after(s, k) // bs) - -(-(s.computed_before + s.tokens) // bs) for s in plan.items)
    if plan.cohort:
        assert eng.cohort is not None
        n += sum(eng.cohort.run_blocks(k))  # (members finishing inside the run take none after)
    return n


def _landed_need(s: Scheduled, k: int, bs: int) -> int:
    """Blocks a landed decoder (:meth:`OpenRun.land`) takes in the run's first ``k`` steps: its
    blocks hold its context when it lands, and grow by a token a step from step ``s.at``."""
    steps = k - s.at
    left = landed_steps_left(s.req)
    if steps > left:
        steps = left
    return -(-(s.computed_before + steps) // bs) - -(-s.computed_before // bs) if steps > 0 else 0


def block_avail(eng: Engine, plan: StepPlan, k: int) -> int:
    """KV blocks a run of ``k`` steps of this plan may take after its first step (counted
    before any).

    The run takes those blocks up front. With a prefix cache that is the same as taking them
    step by step only if no cached group is evicted for them while a request waits (an
    eviction can change what the waiter would reuse, and so whether it fits) or while
    requests finishing inside the run release groups (which reorders the LRU): then the run
    stays within the free blocks."""
    coh = eng.cohort if plan.cohort else None
    pool = eng.pool
    top = NO_PRIORITY  # the least urgent priority running
    if pool.reserves:  # (else every priority may take the same blocks)
        for s in plan.items:
            if s.req.priority > top:
                top = s.req.priority
        if coh is not None:
            top = least_urgent(eng.queues.class_priority, coh.n_cls, top)
    avail = pool.available_for(top)
    through = through_finishes(eng) and (coh is not None or any(item_steps(s, k) < k for s in plan.items))
    if eng.pool.cache is not None and (through or eng.queues.waiting):
        avail = min(avail, pool.free)
    return avail


def block_limited(eng: Engine, plan: StepPlan, k: int, avail: int, lo: int = 1) -> int:
    """Largest k' <= k such that steps 2..k' of the run can allocate their blocks within
    ``avail`` (:func:`block_avail`); steps 2..lo are known to."""
    bs = eng.bs
    D = len(eng.queues.running) + plan.landed
    prompts = 0  # (blocks of the chunking item's prompt left: a loop, not a generator, once a run)
    for s in plan.items:
        if s.chunk:
            prompts += -(-prompt_left(s) // bs)
    if D * ((k + bs - 1) // bs + 1) + prompts <= avail:
        return k
    hi = k
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if run_need(eng, plan, mid) <= avail:
            lo = mid
        else:
            hi = mid - 1
    return lo


def allocate_run(eng: Engine, plan: StepPlan, k: int, done: int = 1,
                 done_cohort: list[int] | None = None) -> list[int] | None:
    """Allocate the blocks steps done+1..k of a fast-forwarded run need (steps 1..done have
    theirs: a cluster replica allocates a run piecewise, as far as a router reads it). Returns
    the cohort's blocks for steps 1..k (``Cohort.run_blocks(k)``, None without a cohort), which
    the next piece may pass as ``done_cohort`` (the cohort does not change inside a run)."""
    if k <= done or not eng.grows_blocks:
        return done_cohort
    pool = eng.pool
    # every class's blocks in one allocate_each call (the same blocks, and the same cached
    # groups evicted, as class by class)
    coh = eng.cohort if plan.cohort else None
    at_k: list[int] | None = None
    if coh is not None:
        at_k = coh.run_blocks(k)
        need = at_k[:]
        if done > 1:
            for ci, n in enumerate(done_cohort if done_cohort is not None else coh.run_blocks(done)):
                need[ci] -= n
    else:
        need = [0] * len(pool.used)
    for s in plan.items:
        r = s.req
        if s.chunk:
            target = pool.blocks_for(held_after(s, k)) - r.base_blocks
        else:
            # (held_after, inline: the allocation is hot)
            left = landed_steps_left(r) if s.at and s.decode else r.hidden_output_tokens - r.generated
            steps = k - s.at  # (an item that joined inside the run takes part from step ``at`` on)
            target = pool.blocks_for(s.computed_before + s.tokens + (left if left < steps else steps) - 1) - r.base_blocks
        extra = target - r.blocks
        if extra > 0:
            need[r.cls_idx] += extra
            r.blocks = target
    pool.allocate_each(need)
    if coh is not None:
        coh.steps_allocated = coh.steps + k
    return at_k
