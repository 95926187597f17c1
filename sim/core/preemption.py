"""Preemption: whom the engine evicts when KV blocks run short, and how a victim gives them up.

Two questions, answered apart:

* **Who** (:func:`victim_for`, :func:`eligible_victims`): a running request that needs a block
  takes it from the running request its :class:`VictimRule` names (``engine.victim``): the
  lowest-ranked (vLLM), the cheapest among that one's class (``"prefix_aware"``) or SGLang's
  retraction order (``"sglang"``); a waiting request may evict lower-ranked running requests as
  ``engine.preempt_for_waiting`` allows (:class:`WaitingRule`, one small class per value).
* **How** (:class:`PreemptionMode`, one small class per ``engine.preemption`` value): recompute
  (blocks freed, progress dropped, re-prefilled later), swap (blocks copied to host space,
  progress kept, both copies charged), auto (whichever is cheaper now), off (each request
  reserves its whole prompt + ``max_tokens`` at admission, so nothing is ever preempted).

:func:`preempt` is the one place a victim leaves the running set (its contract is written there).
All are open registries (:data:`PREEMPTION_MODES`, :data:`WAITING_RULES`, :data:`VICTIM_RULES`): a new mode or rule
is one class in one file, named in the scenario by its dotted path (``engine.preemption =
"my_modes:Halve"``) or registered under a name; the scenario's validation reads the registries.
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from typing import ClassVar

from plumbing.registry import Registry
from sim.core.class_options import mypyc_attr
from sim.core.costs import NS
from sim.core.parts import EngineParts as Engine
from sim.core.plan import StepPlan, age, rank
from sim.core.request import Request, State


# ---- how a victim gives up its blocks ---------------------------------------------------------
# (a user's own mode or rule, one file named by its dotted path, subclasses these: the compiled
# build lets interpreted classes do so only where a class says it may)
@mypyc_attr(allow_interpreted_subclasses=True)
class PreemptionMode:
    """How a preempted request gives up its KV blocks, and what that is expected to cost.

    ``grows_blocks``: True when a running request takes KV blocks as its tokens are computed (a
    pool that runs short then preempts); False when each request reserves its prompt +
    ``max_tokens`` whole at admission and nothing is preempted. ``host_space``: True when the
    mode may copy victims to host space (``engine.swap_blocks`` is then the host pool).
    A mode decides :meth:`how` a victim is released; :meth:`release` and :meth:`cost_ns` follow
    from that answer (override them for a release of a new kind).
    """

    name: ClassVar[str] = ""
    grows_blocks: ClassVar[bool] = True
    host_space: ClassVar[bool] = False

    def how(self, eng: Engine, v: Request) -> str:
        """How running request ``v`` would give up its blocks now, as recorded per preemption:
        ``"recompute"``, ``"swap"``, or ``"fallback"`` (a swap the host space cannot take,
        done by recompute)."""
        raise NotImplementedError

    def release(self, eng: Engine, v: Request, plan: StepPlan) -> str:
        """Free victim ``v``'s device blocks (it is still in the running set); returns :meth:`how`."""
        how = self.how(eng, v)
        if how == "swap":
            swap_out(eng, v, plan)
        else:
            if how == "fallback":
                v.swap_fallbacks += 1
            drop_progress(eng, v)
        return how

    def cost_ns(self, eng: Engine, v: Request, pinned_tokens: int) -> int:
        """Engine time releasing ``v`` now is expected to cost it, ns: the swap out and in of its
        computed blocks, or the re-prefill of its computed tokens less ``pinned_tokens`` (those in
        cached groups another running request holds, which stay cached)."""
        if self.how(eng, v) == "swap":
            return swap_cost_ns(eng, eng.pool.blocks_for(v.computed))
        return recompute_cost_ns(eng, max(0, v.computed - pinned_tokens), len(eng.queues.running))


class Off(PreemptionMode):
    """Nothing is preempted: a request is admitted only when its prompt + ``max_tokens`` fit."""

    name = "off"
    grows_blocks = False

    def how(self, eng: Engine, v: Request) -> str:
        raise AssertionError("engine.preemption = 'off' preempts nothing")


class Recompute(PreemptionMode):
    """vLLM's default: free the blocks; the victim re-prefills prompt + generated tokens later."""

    name = "recompute"

    def how(self, eng: Engine, v: Request) -> str:
        return "recompute"


class Swap(PreemptionMode):
    """Copy the computed blocks to host space and back (recompute when the host space is full)."""

    name = "swap"
    host_space = True

    def how(self, eng: Engine, v: Request) -> str:
        return "fallback" if eng.pool.blocks_for(v.computed) > eng.pool.host_free else "swap"


class Auto(PreemptionMode):
    """The cheaper now of a swap out + in and the marginal cost of re-prefilling the victim in
    a step with the current batch (recompute when the host space is full)."""

    name = "auto"
    host_space = True

    def how(self, eng: Engine, v: Request) -> str:
        blocks = eng.pool.blocks_for(v.computed)
        if blocks > eng.pool.host_free:
            return "fallback"
        cheaper = swap_cost_ns(eng, blocks) < recompute_cost_ns(eng, v.computed, len(eng.queues.running))
        return "swap" if cheaper else "recompute"


#: ``engine.preemption`` values: name -> :class:`PreemptionMode` subclass (or a dotted path
#: ``pkg.mod:Class`` / ``file.py:Class`` to one, resolved by the registry)
PREEMPTION_MODES = Registry("preemption mode")
for _mode in (Off, Recompute, Swap, Auto):
    PREEMPTION_MODES.register(_mode.name, _mode, (_mode.__doc__ or "").split("\n")[0])


def make_mode(name: str) -> PreemptionMode:
    """The mode ``engine.preemption = name`` selects (a registered name or a dotted path)."""
    mode = PREEMPTION_MODES.resolve(name)()
    if not isinstance(mode, PreemptionMode):
        raise TypeError(f"engine.preemption = {name!r}: {type(mode).__name__} is not a "
                        "sim.core.preemption.PreemptionMode")
    return mode


def swap_cost_ns(eng: Engine, blocks: int) -> int:
    """Swap-out plus swap-in of ``blocks`` blocks, ns."""
    return 2 * eng.costs.swap_ns(blocks, eng.bs)


def recompute_cost_ns(eng: Engine, tokens: int, decoders: int) -> int:
    """Marginal cost of re-prefilling ``tokens`` in a step that decodes ``decoders`` seqs, ns."""
    c = eng.costs
    return c.step_ns(tokens, decoders, tokens * tokens, 0, 0, 1, 1) - c.step_ns(0, decoders, 0, 0, 0)


def swap_out(eng: Engine, v: Request, plan: StepPlan) -> None:
    """Move ``v``'s computed blocks to host space, its progress kept; the copy is charged to this
    step. Only blocks holding computed tokens travel (shared prefix groups are copied too and
    released); those taken for this step's not-yet-computed tokens are released."""
    keep = eng.pool.swap_out_request(v)
    v.swapped_blocks += keep
    plan.swap_out_blocks += keep
    plan.swapped_out.append((v, keep))
    eng.tel.on_swap(v, keep)
    v.state = State.SWAPPED


def drop_progress(eng: Engine, v: Request) -> None:
    """Free ``v``'s blocks and drop its computed tokens: it re-prefills prompt + generated."""
    eng.pool.release_request(v, preempted=True)
    v.recomputed_tokens += v.computed
    v.computed = 0
    v.state = State.WAITING


def preempt(eng: Engine, v: Request, plan: StepPlan, scheduled: dict, now_ns: int) -> None:
    """Preempt running request ``v``.

    Preconditions: ``v`` is RUNNING. Effects: its blocks are released as the mode says (decided
    while it still counts in the running set); it leaves the running set and this step's plan
    (its tokens return to the budget); it rejoins the waiting set with its progress (if kept) and
    a preemption counted, recorded by how it was released. The policy is told. (A victim that
    recomputes is handed to ``eng.on_recompute`` instead, when set: a disaggregated decode
    replica's, which sends it back through a prefill replica.)
    """
    how = eng.preemption.release(eng, v, plan)
    eng.queues.remove_running(v)
    eng.queues.ordered_out(v)
    scheduled.pop(v.request_id, None)
    plan.preempted += 1
    count_preempted(eng, v, how, now_ns)


def count_preempted(eng: Engine, v: Request, how: str, now_ns: int) -> None:
    """Victim ``v`` has given up its blocks (``how``) and left the running set: its preemption is
    counted and recorded, the policy told, and it waits again here, or, recomputing on a
    disaggregated decode replica, goes to ``eng.on_recompute`` (re-prefilled elsewhere)."""
    v.preemptions += 1
    eng.tel.on_preempt(v, how, now_ns)
    eng.policy.on_preempt(v, now_ns / NS)
    if eng.on_recompute is not None and v.state is State.WAITING:
        eng.on_recompute(v, now_ns)
    elif eng.victim_rule.requeue_at_end:
        eng.push_waiting_last(v, now_ns)
    else:
        eng.push_waiting(v, now_ns)


# ---- whom to preempt --------------------------------------------------------------------------
@mypyc_attr(allow_interpreted_subclasses=True)
class VictimRule:
    """Whom a running request short of KV blocks preempts (``engine.victim``).

    :meth:`pick` names the victim; ``walk_ends_at_self``: True when a request that is its own
    victim ends the step's walk of the running set (vLLM: walked by rank, everyone after it
    ranks below it), False when the walk goes on to the others; ``requeue_at_end``: True when
    a victim waits again as if it arrived at its preemption (behind every waiter), False when
    it keeps its place by the policy's key.
    """

    name: ClassVar[str] = ""
    walk_ends_at_self: ClassVar[bool] = True
    requeue_at_end: ClassVar[bool] = False

    def pick(self, eng: Engine, req: Request, short: int) -> Request:
        """The running request to preempt so that running ``req`` gets the ``short`` blocks it
        lacks (may be ``req`` itself)."""
        raise NotImplementedError


class ByRank(VictimRule):
    """The lowest-ranked running request (vLLM)."""

    name = "rank"

    def pick(self, eng: Engine, req: Request, short: int) -> Request:
        return eng.queues.lowest_running()


class PrefixAware(VictimRule):
    """Among those the rank rules allow, the cheapest: its own recompute or swap plus the
    re-prefill it would push onto waiting requests reusing its prefix."""

    name = "prefix_aware"

    def pick(self, eng: Engine, req: Request, short: int) -> Request:
        return cheapest_victim(eng, req, short)


class SglangRetract(VictimRule):
    """SGLang's retraction: the fewest output tokens first, then the longest prompt, then the
    latest admitted; the walk goes on past a request that retracted itself, and a victim waits
    again behind every waiter (``retract_decode``)."""

    name = "sglang"
    walk_ends_at_self = False
    requeue_at_end = True

    def pick(self, eng: Engine, req: Request, short: int) -> Request:
        # (every running request is explicit here: a step whose blocks run short has no cohort)
        return max(eng.queues.running.values(), key=_retract_order)


def _retract_order(r: Request) -> tuple:
    """SGLang's retraction order, the first victim largest: fewest outputs, longest prompt, then
    the last in its running batch (stable sort, popped from the end: the latest admitted)."""
    return (-r.generated, r.prompt_tokens, r.admit_seq)


#: ``engine.victim`` values: name -> :class:`VictimRule` subclass (or a dotted path)
VICTIM_RULES = Registry("victim rule")
for _victim in (ByRank, PrefixAware, SglangRetract):
    VICTIM_RULES.register(_victim.name, _victim, (_victim.__doc__ or "").split("\n")[0])


def make_victim_rule(name: str) -> VictimRule:
    """The rule ``engine.victim = name`` selects (a registered name or a dotted path)."""
    rule = VICTIM_RULES.resolve(name)()
    if not isinstance(rule, VictimRule):
        raise TypeError(f"engine.victim = {name!r}: {type(rule).__name__} is not a sim.core.preemption.VictimRule")
    return rule


def victim_for(eng: Engine, req: Request, short: int) -> Request:
    """Whom to preempt so that running ``req`` gets the ``short`` blocks it lacks: the engine's
    victim rule's choice (``engine.victim``, :class:`VictimRule`)."""
    return eng.victim_rule.pick(eng, req, short)


def cheapest_victim(eng: Engine, req: Request, short: int) -> Request:
    """``engine.victim = "prefix_aware"``: among the running requests of the lowest-ranked one's
    priority class ranked below ``req``, the cheapest to preempt (:func:`victim_cost_ns`) of
    those that free ``short`` blocks; when none does alone, the cheapest per block it frees
    (:func:`victim_score`). Ties go to the lower rank; the lowest-ranked itself when it is
    ``req`` or the only candidate."""
    lowest = eng.queues.lowest_running()  # (largest key; ties: the most recently admitted, as vLLM pops)
    if lowest is req:
        return lowest
    rk = rank(req)
    cands = sorted((r for r in eng.queues.running.values() if r.priority == lowest.priority and rank(r) > rk),
                   key=rank, reverse=True)
    if len(cands) < 2:
        return lowest
    reuse = about_to_reuse(eng, None)
    sole = {r.request_id: sole_groups(eng, r) for r in cands}  # (each candidate's, found once)
    # a victim that frees too little is followed by another preemption
    enough = [r for r in cands if frees_blocks(eng, r, sole[r.request_id]) >= short]
    if enough:
        return min(enough, key=lambda r: victim_cost_ns(eng, r, reuse, sole[r.request_id]))
    return min(cands, key=lambda r: victim_score(eng, r, reuse, sole[r.request_id]))


def about_to_reuse(eng: Engine, exclude: Request | None) -> set:
    """Prefix groups that the next ``max_num_seqs`` waiting requests (by rank) would reuse."""
    cache = eng.pool.cache
    waiting = eng.queues.waiting
    if cache is None or not waiting:
        return set()
    out: set = set()
    for _, _, w in heapq.nsmallest(eng.limits.max_num_seqs, waiting):
        if w is not exclude and w.hash_ids and w.computed == 0:
            out.update(w.hash_ids[:cache.full_groups(w.prompt_tokens, w.hash_ids)])
    return out


def victim_score(eng: Engine, v: Request, reuse: set, sole: list[int] | None = None) -> float:
    """A preemption's cost per KV block it makes available, ns per block: its own blocks
    plus the cached groups only it holds (they become evictable). A victim whose tokens sit
    in groups other running requests pin frees little, and more preemptions would follow.
    ``sole``: :func:`sole_groups` of ``v`` when the caller has them."""
    if sole is None:
        sole = sole_groups(eng, v)
    freed = frees_blocks(eng, v, sole)
    return victim_cost_ns(eng, v, reuse, sole) / freed if freed > 0 else math.inf


def sole_groups(eng: Engine, v: Request) -> list[int]:
    """The cached prefix groups only ``v`` holds (preempting it makes them evictable)."""
    cache = eng.pool.cache
    if cache is None or not v.shared:
        return []
    refs = cache.refs
    return [h for h in v.shared if refs[h] == 1]


def frees_blocks(eng: Engine, v: Request, sole: list[int] | None = None) -> int:
    """Blocks preempting ``v`` makes available: its own, plus the cached groups only it holds
    (they become evictable, which admission counts as available)."""
    cache = eng.pool.cache
    freed = v.blocks
    if cache is not None:
        freed += cache.group_blocks * len(sole_groups(eng, v) if sole is None else sole)
    return freed


def victim_cost_ns(eng: Engine, v: Request, reuse: set, sole: list[int] | None = None) -> int:
    """Engine time a preemption of ``v`` is expected to cost, ns: its own (the mode's
    :meth:`PreemptionMode.cost_ns`; cached groups another running request also holds stay
    pinned, the groups only ``v`` holds become evictable, and a pool short of blocks evicts
    them) plus the re-prefill pushed onto others: the groups only ``v`` holds that a waiting
    request in ``reuse`` is about to use, priced as one re-prefill at the current batch."""
    cache = eng.pool.cache
    if sole is None:
        sole = sole_groups(eng, v)
    pinned = (len(v.shared) - len(sole)) * cache.group_tokens if cache is not None else 0
    own = eng.preemption.cost_ns(eng, v, pinned)
    if cache is None or not reuse:
        return own
    pushed = sum(cache.group_tokens for h in sole if h in reuse)
    return own + (recompute_cost_ns(eng, pushed, len(eng.queues.running)) if pushed else 0)


def eligible_victims(eng: Engine, w: Request) -> list[Request]:
    """Running requests waiting request ``w`` may evict under ``engine.preempt_for_waiting``,
    in the order they go (least urgent first)."""
    ok = eligible_unordered(eng, w)
    ok.sort(key=rank, reverse=True)
    if isinstance(eng.victim_rule, PrefixAware) and len(ok) > 1:
        # least urgent class first, as before; within a class the cheapest preemption per
        # block freed first (stable sort: ties keep the rank order). The costs read each
        # candidate's progress and blocks, which a cohort member's fields hold only once synced
        # (with the blocks of the step being planned: the cohort took them, as every running
        # request has by now when stepping)
        if eng.cohort is not None and eng.cohort.members:
            eng.cohort.sync_all()
        reuse = about_to_reuse(eng, w)
        cost = {r.request_id: victim_score(eng, r, reuse) for r in ok}
        ok.sort(key=lambda r: (-r.priority, cost[r.request_id]))
    return ok


def eligible_unordered(eng: Engine, w: Request, among: Iterable[Request] | None = None) -> list[Request]:
    """:func:`eligible_victims` in the running set's order (for ``engine.victim = "rank"``,
    whose order is the rank's alone: a caller that needs only the first victims picks them as
    it goes rather than sorting them all). ``among``: a part of the running set (e.g. the
    cohort's members) to take only its victims, in its order; default the whole set."""
    rule = eng.waiting_rule
    if not rule.evicts or not eng.grows_blocks:
        return []
    q = eng.queues
    if q.running and rule.none_below(q.top_running_priority(), w):
        return []
    return rule.victims(w, q.running.values() if among is None else among, q)


# ---- which running requests a waiter may evict -------------------------------------------------
@mypyc_attr(allow_interpreted_subclasses=True)
class WaitingRule:
    """Which running requests a waiting request may evict (``engine.preempt_for_waiting``).

    Never one the policy ranks at or above the waiter (``r.key > w.key``), and only as the rule
    allows. ``evicts``: False when no waiter ever evicts (then nothing else is asked);
    ``pairwise``: True when whether ``r`` is a victim of ``w`` reads only their own fields
    (the planner then finds the first victim without walking every running request).
    """

    name: ClassVar[str] = ""
    evicts: ClassVar[bool] = True
    pairwise: ClassVar[bool] = True

    def __init__(self, threshold: int = 0) -> None:
        self.threshold = threshold  # (engine.preempt_threshold: read by the rules that use it)

    def none_below(self, top: int, w: Request) -> bool:
        """A shortcut: is it known from ``top`` (the least urgent priority running) alone that
        ``w`` has no victim? (False: look at the requests.)"""
        return False

    def victims(self, w: Request, running: Iterable[Request], queues) -> list[Request]:
        """The requests of ``running`` that ``w`` may evict, in their order (``queues``: the
        whole running set, for a rule that looks beyond the pair)."""
        raise NotImplementedError


class NeverEvict(WaitingRule):
    """A waiter never evicts a running request (vLLM)."""

    name = "never"
    evicts = False

    def victims(self, w: Request, running: Iterable[Request], queues) -> list[Request]:
        return []


class ByPriority(WaitingRule):
    """A running request of a less urgent class, or of the same class and arrived later."""

    name = "priority"

    def none_below(self, top: int, w: Request) -> bool:
        # a waiter of the least urgent class running (the common head of a full replica's
        # queue) has no victim: the running counts per class say so without building the list
        return top < w.priority

    def victims(self, w: Request, running: Iterable[Request], queues) -> list[Request]:
        wk = w.key
        wo = (w.priority, w.arrival_s, w.request_id)
        return [r for r in running if (r.priority, r.arrival_s, r.request_id) > wo and r.key > wk]


class StrictPriority(WaitingRule):
    """A running request of a strictly less urgent class."""

    name = "strict"

    def none_below(self, top: int, w: Request) -> bool:
        return top <= w.priority

    def victims(self, w: Request, running: Iterable[Request], queues) -> list[Request]:
        wk, wp = w.key, w.priority
        return [r for r in running if r.priority > wp and r.key > wk]


class ByThreshold(WaitingRule):
    """A running request whose priority is more than ``engine.preempt_threshold`` below."""

    name = "threshold"

    def victims(self, w: Request, running: Iterable[Request], queues) -> list[Request]:
        wk, wp, th = w.key, w.priority, self.threshold
        return [r for r in running if r.priority - wp > th and r.key > wk]


class ByPolicy(WaitingRule):
    """Whatever the policy ranks strictly below the waiter, but the oldest running request once
    it has been preempted."""

    name = "policy"
    pairwise = False  # (the oldest running request is exempted: a look at the whole set)

    def victims(self, w: Request, running: Iterable[Request], queues) -> list[Request]:
        wk = w.key
        ok = [r for r in running if r.key > wk]
        # Ranks that change with service (quanta, starvation promotion) can evict every
        # request before it finishes, and by recompute nothing is kept: a livelock (MLFQ
        # promoting starved requests that then evict each other). The oldest running
        # request, once it has been preempted, is not evicted for a waiter again: it runs
        # to its end, then the next oldest, so the run progresses (a first preemption,
        # the policy's ordinary use of this mode, is left alone).
        # (none: also when nothing runs, as a disaggregated prefill replica whose pool is full of
        # KV being sent)
        if not ok:
            return ok
        oldest = min(queues.running.values(), key=age)
        if oldest.preemptions:
            ok = [r for r in ok if r is not oldest]
        return ok


#: ``engine.preempt_for_waiting`` values: name -> :class:`WaitingRule` subclass (or a dotted path)
WAITING_RULES = Registry("waiting preemption rule")
for _rule in (NeverEvict, ByPriority, StrictPriority, ByThreshold, ByPolicy):
    WAITING_RULES.register(_rule.name, _rule, (_rule.__doc__ or "").split("\n")[0])


def make_waiting_rule(name: str, threshold: int = 0) -> WaitingRule:
    """The rule ``engine.preempt_for_waiting = name`` selects (a registered name or a dotted path)."""
    rule = WAITING_RULES.resolve(name)(threshold)
    if not isinstance(rule, WaitingRule):
        raise TypeError(f"engine.preempt_for_waiting = {name!r}: {type(rule).__name__} is not a "
                        "sim.core.preemption.WaitingRule")
    return rule
