"""Unit tests of preemption's rules (sim/core/preemption.py, and where the planner calls it), one
rule a test: whom a request short of KV blocks evicts, how a victim gives its blocks up (the
modes), and which running requests a waiting request may evict (the waiting rules).

Each test builds an engine from a few ``[engine]`` keys (:class:`tests.core_helpers.Bench`:
4-token blocks, one step an event; each test runs with every request stepped, then with the
decode cohort), adds requests by hand (ids 0, 1, ... in the order added), and asserts on the
plan, the preemptions logged as ``(id, how)`` and the blocks held after. The docstring names
the rule and writes the block arithmetic out. The end-to-end cases (exact times, thrashing,
the shipped profile's crossover) are in tests/test_preemption.py.
"""
from __future__ import annotations

import pytest

from sim.core.preemption import eligible_victims
from sim.core.request import State
from tests.core_helpers import STEP_1MS, Bench, both_ways  # noqa: F401  (each test stepped, then with the cohort)

THREE = ({"name": "p0", "priority": 0}, {"name": "p1", "priority": 1}, {"name": "p2", "priority": 2})


def full_pool(**engine) -> Bench:
    """8 blocks, all taken after one step: hi A (12 tokens, 3 blocks), lo B (8, 2), lo C (12, 3),
    each now decoding with 1 token generated; in the next step A and C need a 4th block (13
    tokens) and B a 3rd (9 tokens)."""
    b = Bench(kv_blocks=8, **engine)
    b.add("hi", prompt=12, output=2)
    b.add("lo", prompt=8, output=2)
    b.add("lo", prompt=12, output=4)
    b.step()
    assert b.free == 0
    return b


# ---- whom a running request short of blocks evicts ----------------------------------------
def test_a_request_short_of_a_block_evicts_the_lowest_ranked():
    """Block shortage: the victim is the lowest-ranked running request, i.e. the least urgent
    class's latest arrival. Full pool: hi A needs a 4th block, none free: lo C (after lo B)
    goes, freeing 3; A takes 1, B its 3rd: 1 free. C's token is not in the plan."""
    b = full_pool()
    plan = b.plan()
    assert b.preempted == [(2, "recompute")]
    assert b.tokens(plan) == {0: 1, 1: 1}
    assert plan.preempted == 1 and b.free == 1


def test_rank_ties_evict_the_most_recently_admitted():
    """Block shortage with equal keys (a policy that ranks everything alike): the victim is the
    running request admitted last (vLLM pops the end of its running queue), whatever its
    arrival: C, added last, arrived first."""

    class Flat:
        name = "flat"

        def key(self, req, now):
            return (0,)

    b = Bench(kv_blocks=8, policy=Flat())
    b.add("lo", prompt=12, output=2, at_ns=30)
    b.add("lo", prompt=8, output=2, at_ns=20)
    b.add("lo", prompt=12, output=4, at_ns=10)
    b.step()
    b.plan()
    assert b.preempted == [(2, "recompute")]


def test_a_request_short_of_several_blocks_evicts_as_many_as_it_takes():
    """Block shortage, repeated: the victims go lowest rank first until the request has its
    blocks. 7 blocks, engine.max_prefill_chunk = 12: hi H (24 tokens) prefilled 12 (3 blocks),
    lo A and B (3 tokens, 1 block each), lo C (8 tokens, 2 blocks): none free. H's second chunk
    needs 3 more blocks: C goes (2 free), then B (3 free); A (3 -> 4 tokens: no new block)
    decodes."""
    b = Bench(kv_blocks=7, max_prefill_chunk=12)
    b.add("hi", prompt=24, output=4)
    for prompt in (3, 3, 8):
        b.add("lo", prompt=prompt, output=4)
    b.step()
    assert b.free == 0
    plan = b.plan()
    assert b.preempted == [(3, "recompute"), (2, "recompute")]
    assert b.tokens(plan) == {0: 12, 1: 1} and b.free == 0


def test_the_requester_evicts_itself_when_it_ranks_last():
    """Block shortage where the request short of a block is itself the lowest-ranked: it is the
    victim. 8 blocks: hi A (14 tokens, 4 blocks; 15 still fit them) and lo B (16 tokens, 4
    blocks; 17 need a 5th): B is preempted, A decodes."""
    b = Bench(kv_blocks=8)
    b.add("hi", prompt=14, output=4)
    b.add("lo", prompt=16, output=4)
    b.step()
    plan = b.plan()
    assert b.preempted == [(1, "recompute")]
    assert b.tokens(plan) == {0: 1}
    assert b.free == 4


def test_no_waiter_is_admitted_in_a_step_that_preempted():
    """A step whose running walk preempted admits nobody (vLLM V1): full pool, C is evicted and
    1 block is left, but waiting hi D (4 tokens, 1 block) is not admitted until the next step
    (then D first, and C back in behind it: A and B have finished)."""
    b = full_pool()
    b.add("hi", prompt=4, output=2)
    plan = b.step()
    assert b.admitted(plan) == [] and b.preempted == [(2, "recompute")]
    assert 3 in b.waiting
    assert b.admitted(b.plan()) == [3, 2]


@pytest.mark.parametrize("victim, evicted", [("rank", 2), ("prefix_aware", 1)])
def test_prefix_aware_victim_is_the_cheapest_of_the_lowest_class(victim, evicted):
    """engine.victim: 10 blocks, hi A (12 tokens, 3 blocks), lo B (4 tokens, 1 block), lo C (23
    tokens, 6 blocks). A's decode needs a 4th block. "rank" evicts the last-ranked, C;
    "prefix_aware" the cheapest in C's class that frees the 1 block: B (re-prefilling 4 tokens,
    not 23)."""
    b = Bench(kv_blocks=10, victim=victim)
    b.add("hi", prompt=12, output=4)
    b.add("lo", prompt=4, output=4)
    b.add("lo", prompt=23, output=4)
    b.step()
    b.plan()
    assert b.preempted == [(evicted, "recompute")]


# ---- how a victim gives its blocks up ------------------------------------------------------
def test_recompute_drops_progress_and_re_prefills_prompt_and_output():
    """engine.preemption = "recompute": the victim's blocks are freed and its computed tokens
    dropped (counted as recomputed); back in, it re-prefills its prompt and the token it had
    generated (12 + 1 = 13) in one chunk."""
    b = full_pool()
    c = b.eng.queues.running[2]
    b.step()  # C evicted; A and B decode their last tokens and finish
    assert c.state is State.WAITING and c.computed == 0 and c.blocks == 0
    assert c.recomputed_tokens == 12 and c.preemptions == 1
    plan = b.plan()
    assert b.tokens(plan) == {2: 13} and b.admitted(plan) == [2]


def test_swap_keeps_progress_on_the_host_and_swaps_back_in():
    """engine.preemption = "swap": the victim's computed blocks (12 tokens: 3) are copied to host
    space, its progress kept; when it is admitted again they come back (3 in, then 1 more for
    its 13th token) and it decodes rather than re-prefills."""
    b = full_pool(preemption="swap", swap_blocks=16)
    c = b.eng.queues.running[2]
    plan = b.step()
    assert b.preempted == [(2, "swap")]
    assert plan.swap_out_blocks == 3 and plan.swapped_out == [(c, 3)]
    assert c.state is State.SWAPPED and c.computed == 12 and b.eng.pool.host_used == 3
    plan = b.plan()
    assert plan.swap_in_blocks == 3 and plan.swapped_in == [(c, 3)]
    assert b.tokens(plan) == {2: 1}
    assert c.blocks == 4 and b.eng.pool.host_used == 0


@pytest.mark.parametrize("mode", ["swap", "auto"])
def test_swap_falls_back_to_recompute_when_the_host_is_full(mode):
    """engine.preemption = "swap" or "auto" with 2 host blocks: the victim's 3 do not fit, so it
    is recomputed instead, logged as "fallback" and counted on the request."""
    b = full_pool(preemption=mode, swap_blocks=2)
    c = b.eng.queues.running[2]
    b.plan()
    assert b.preempted == [(2, "fallback")]
    assert c.swap_fallbacks == 1 and c.computed == 0 and b.eng.pool.host_used == 0


@pytest.mark.parametrize("swap_block_s, how", [(1e-6, "swap"), (1e-5, "recompute")])
def test_auto_picks_the_cheaper_release_now(swap_block_s, how):
    """engine.preemption = "auto": swap when 2 x 3 blocks x swap_block_s is below the marginal
    re-prefill of the victim's 12 tokens (12 x 1 us = 12 us): 6 us swaps, 60 us recomputes."""
    b = full_pool(preemption="auto", swap_blocks=16, profile={**STEP_1MS, "swap_block_s": swap_block_s})
    b.plan()
    assert b.preempted == [(2, how)]


def test_preemption_off_never_preempts():
    """engine.preemption = "off": requests reserve prompt + max_tokens, so none ever runs short.
    8 blocks: A and B (8 + 8 tokens, 4 blocks each) fill the pool and run to their end; C waits
    for a finish."""
    b = Bench(kv_blocks=8, preemption="off")
    for _ in range(3):
        b.add("lo", prompt=8, output=8)
    assert b.admitted(b.step()) == [0, 1] and b.free == 0
    b.steps(8)
    assert b.preempted == [] and b.running == [2]


# ---- which running requests a waiting request may evict ------------------------------------
def waiter_and_two_lo(rule: str, waiter: str = "hi", waiter_at: int | None = None, **engine) -> tuple[Bench, int]:
    """8 blocks: lo A and lo B (12 tokens each, 3 blocks) run and, decoding, take a 4th block
    each: none free. Then waiter W (12 tokens, 3 blocks) arrives; returns the bench and W's id."""
    b = Bench(kv_blocks=8, preempt_for_waiting=rule, **engine)
    b.add("lo", prompt=12, output=8)
    b.now = 10
    b.add("lo", prompt=12, output=8)
    b.step()
    w = b.add(waiter, prompt=12, output=4, at_ns=waiter_at)
    return b, w.request_id


def test_never_a_waiter_does_not_evict():
    """engine.preempt_for_waiting = "never" (vLLM V1): hi W finds no block and waits; lo A and B
    decode."""
    b, w = waiter_and_two_lo("never")
    plan = b.plan()
    assert b.preempted == [] and b.tokens(plan) == {0: 1, 1: 1} and b.waiting == [w]


def test_strict_a_more_urgent_waiter_evicts_the_fewest_lowest_ranked():
    """engine.preempt_for_waiting = "strict": hi W may evict lo A and B; the fewest needed go,
    lowest rank first: B (the later) frees 4 blocks, enough for W's 3; A keeps running. B's
    token leaves the plan; 1 block is left."""
    b, w = waiter_and_two_lo("strict")
    plan = b.plan()
    assert b.preempted == [(1, "recompute")]
    assert b.tokens(plan) == {0: 1, w: 12} and b.admitted(plan) == [w]
    assert b.free == 1


def test_strict_a_waiter_of_the_same_class_does_not_evict():
    """engine.preempt_for_waiting = "strict": only a strictly more urgent class evicts (no
    ping-pong between equals): lo W waits, though it arrived before B."""
    b, w = waiter_and_two_lo("strict", waiter="lo", waiter_at=5)
    b.plan()
    assert b.preempted == [] and b.waiting == [w]


def test_priority_a_waiter_evicts_a_later_arrival_of_its_own_class():
    """engine.preempt_for_waiting = "priority" (vLLM V0): a running request with a larger
    (priority, arrival) is a victim: lo W arrived (t=5) after A (0), before B (10): B goes."""
    b, w = waiter_and_two_lo("priority", waiter="lo", waiter_at=5)
    plan = b.plan()
    assert b.preempted == [(1, "recompute")] and b.admitted(plan) == [w]


@pytest.mark.parametrize("rule, evicts", [("never", False), ("strict", True)])
def test_a_more_urgent_waiter_evicts_for_a_slot(rule, evicts):
    """A waiting rule applies to slots as to blocks: engine.max_num_seqs = 2, both taken by lo A
    and B, memory plenty. Under "strict" hi W evicts B (the lower-ranked) for its slot; under
    "never" it waits."""
    b = Bench(max_num_seqs=2, preempt_for_waiting=rule)
    b.add("lo", prompt=8, output=8)
    b.add("lo", prompt=8, output=8)
    b.step()
    b.add("hi", prompt=8, output=4)
    plan = b.plan()
    assert b.preempted == ([(1, "recompute")] if evicts else [])
    assert b.admitted(plan) == ([2] if evicts else [])


@pytest.mark.parametrize("threshold, evicts", [(0, True), (1, False)])
def test_threshold_the_priority_gap_must_exceed_it(threshold, evicts):
    """engine.preempt_for_waiting = "threshold" (SGLang): a p0 waiter evicts p1 running requests
    when their gap, 1, exceeds engine.preempt_threshold: with 0 it evicts B, with 1 nobody."""
    b = Bench(classes=THREE, kv_blocks=8, preempt_for_waiting="threshold", preempt_threshold=threshold)
    b.add("p1", prompt=12, output=8)
    b.add("p1", prompt=12, output=8)
    b.step()
    b.add("p0", prompt=12, output=4)
    b.plan()
    assert b.preempted == ([(1, "recompute")] if evicts else [])


@pytest.mark.parametrize("preempted_before, evicted", [(0, True), (1, False)])
def test_policy_evicts_what_ranks_below_but_not_a_preempted_oldest(preempted_before, evicted):
    """engine.preempt_for_waiting = "policy": a waiter evicts any running request the policy
    ranks strictly below it, its own class included (FCFS: W, arrived at t=5, outranks A,
    arrived at 10); but the oldest running request, once preempted, is not evicted for a waiter
    again (the livelock guard). 8 blocks: A holds 7 (25 tokens), W needs 3."""
    b = Bench(kv_blocks=8, preempt_for_waiting="policy", policy="fcfs")
    b.now = 10
    a = b.add("lo", prompt=24, output=8)
    b.step()
    a.preemptions = preempted_before  # (set by hand: a past preemption the guard reads)
    b.add("lo", prompt=12, output=4, at_ns=5)
    b.plan()
    assert b.preempted == ([(0, "recompute")] if evicted else [])


def test_a_waiter_evicts_nobody_when_evicting_everyone_eligible_would_not_make_room():
    """All or nothing (never a pointless eviction): 8 blocks, hi A (16 tokens -> 5 blocks) and lo
    B (8 -> 3 blocks) decoding, none free. hi W (16 tokens) needs 4 blocks; its only eligible
    victim under "strict" is B, whose 3 are not enough: nobody is evicted and W waits."""
    b = Bench(kv_blocks=8, preempt_for_waiting="strict")
    b.add("hi", prompt=16, output=8)
    b.add("lo", prompt=8, output=8)
    b.step()
    b.add("hi", prompt=16, output=4)
    plan = b.plan()
    assert b.preempted == [] and b.tokens(plan) == {0: 1, 1: 1} and b.waiting == [2]


@pytest.mark.parametrize("rule, waiter, expected", [
    ("never", "p0", []),
    ("strict", "p0", [3, 2, 1]),  # p1 and p2, least urgent first
    ("strict", "p1", [3]),
    ("priority", "p1", [3, 2]),  # p2, and the p1 that arrived after the waiter
    ("threshold", "p0", [3]),  # threshold 1: only a gap of 2
    ("policy", "p1", [3, 2]),
])
def test_eligible_victims_per_rule(rule, waiter, expected):
    """sim.core.preemption.eligible_victims, per rule, in eviction order. Running: p0 (id 0,
    t=0), p1 (id 1, t=0), p1 (id 2, t=20), p2 (id 3, t=20); the waiter (id 4) arrived at t=10."""
    b = Bench(classes=THREE, preempt_for_waiting=rule, preempt_threshold=1)
    b.add("p0", prompt=4, output=8)
    b.add("p1", prompt=4, output=8)
    b.now = 20
    b.add("p1", prompt=4, output=8)
    b.add("p2", prompt=4, output=8)
    b.step()
    w = b.add(waiter, prompt=4, output=8, at_ns=10)
    assert [r.request_id for r in eligible_victims(b.eng, w)] == expected


def test_no_pointless_eviction_for_a_waiter_that_reuses_cached_groups():
    """All or nothing with a prefix cache: a waiter's cached groups stop being evictable once it
    holds them, so they cannot make room for it. 7 blocks, groups of 8 tokens (2 blocks): A
    (20 tokens, hash ids [7, 8]) ran and ended, leaving its 2 groups (4 blocks) cached and
    unused; hi H (5 tokens, 2 blocks) and lo B (3 tokens, 1 block) run; none free. hi W (21
    tokens, ids [7, 8]) reuses both groups and needs ceil(21 / 4) - 4 = 2 blocks of its own.
    Evicting B, its only victim under "strict", frees 1: not enough, so B should keep running.
    Today _room_after counts W's own 4 cached blocks as room (need 2 <= 4 evictable + 1), B is
    evicted, W still does not fit, and B waits behind it with its progress lost."""
    b = Bench(kv_blocks=7, prefix_caching=True, prefix_block_tokens=8, preempt_for_waiting="strict")
    b.add("lo", prompt=20, output=1, hash_ids=[7, 8])
    b.add("hi", prompt=5, output=20)
    b.step()  # A prefills and ends: its groups stay cached, unreferenced
    b.add("lo", prompt=3, output=20)
    b.step()
    assert b.free == 0 and b.eng.pool.cache.evictable_blocks == 4 and b.running == [1, 2]
    w = b.add("hi", prompt=21, output=2, hash_ids=[7, 8])
    plan = b.plan()
    assert b.admitted(plan) == [] and b.waiting == [w.request_id]
    assert b.preempted == []
