"""Unit tests of the planner's rules (sim/core/planner.py, sim/core/limits.py), one rule a test.

Each test builds an engine from a few ``[engine]`` keys (:class:`tests.core_helpers.Bench`:
4-token blocks, 64 blocks, 8 slots, a 256-token budget, one step an event; each test runs with
every request stepped, then with the decode cohort), adds a
few requests by hand (ids 0, 1, ... in the order added) and asserts on the plan: who is admitted,
how many tokens each takes, the blocks held after it. The docstring names the rule and writes the
block arithmetic out. Preemption's rules are in tests/test_preemption_rules.py.
"""
from __future__ import annotations

from tests.core_helpers import Bench, both_ways  # noqa: F401  (each test stepped, then with the cohort)

CAPPED_LO = ({"name": "hi", "priority": 0}, {"name": "lo", "priority": 1, "max_prefill_tokens_per_step": 8})


# ---- slots and the token budget --------------------------------------------------------------
def test_max_num_seqs_caps_the_running_set():
    """engine.max_num_seqs: two slots, three waiters. The first two in rank order are admitted and
    the third waits; it is admitted in the step after the first two finish (their last tokens
    end step 2, and a finish frees its slot when the step is applied, after planning)."""
    b = Bench(max_num_seqs=2)
    for _ in range(3):
        b.add("lo", prompt=8, output=2)
    assert b.admitted(b.step()) == [0, 1]
    assert b.waiting == [2]
    assert b.tokens(b.step()) == {0: 1, 1: 1}
    assert b.waiting == [2] and b.running == []
    assert b.admitted(b.step()) == [2]


def test_token_budget_chunks_the_last_prompt_that_fits():
    """engine.max_batched_tokens with chunked prefill: a 20-token budget and two 16-token
    prompts. The first takes 16, the second the 4 left; in the next step the first decodes (1)
    and the second prefills its other 12."""
    b = Bench(max_batched_tokens=20)
    b.add("lo", prompt=16, output=4)
    b.add("lo", prompt=16, output=4)
    assert b.tokens(b.step()) == {0: 16, 1: 4}
    assert b.tokens(b.step()) == {0: 1, 1: 12}


def test_without_chunked_prefill_a_prompt_past_the_budget_waits_and_blocks_the_rest():
    """engine.chunked_prefill = false, and admission in strict order: a 20-token budget. The first
    16-token prompt is admitted; the second does not fit the 4 left whole, and the 2-token prompt
    behind it, which would fit, is not admitted either (no bypass)."""
    b = Bench(max_batched_tokens=20, chunked_prefill=False)
    b.add("lo", prompt=16, output=4)
    b.add("lo", prompt=16, output=4)
    b.add("lo", prompt=2, output=4)
    assert b.tokens(b.plan()) == {0: 16}
    assert b.waiting == [1, 2]


def test_max_prefill_chunk_caps_each_prompt_per_step():
    """engine.max_prefill_chunk = 8: a 20-token prompt is prefilled 8 + 8 + 4 over three steps, and
    a 12-token prompt beside it 8 + 4 (then it decodes)."""
    b = Bench(max_prefill_chunk=8)
    b.add("lo", prompt=20, output=2)
    b.add("lo", prompt=12, output=2)
    assert [b.tokens(p) for p in b.steps(3)] == [{0: 8, 1: 8}, {0: 8, 1: 4}, {0: 4, 1: 1}]


def test_class_prefill_cap_throttles_its_class_and_lets_others_pass():
    """classes[].max_prefill_tokens_per_step: "lo" may prefill 8 tokens a step. FCFS: two lo
    prompts of 16 arrive, then a hi one. The first lo takes 8; the second lo is held back by its
    class's cap (skipped, not a blocker: it stays first in line), so the hi prompt behind it is
    admitted in the same step. Next step the first lo takes its other 8; the step after, the
    second lo gets its first 8."""
    b = Bench(classes=CAPPED_LO, policy="fcfs")
    b.add("lo", prompt=16, output=4)
    b.add("lo", prompt=16, output=4)
    b.add("hi", prompt=16, output=4)
    plan = b.step()
    assert b.tokens(plan) == {0: 8, 2: 16}
    assert b.waiting == [1]
    assert b.tokens(b.step()) == {0: 8, 2: 1}
    assert b.tokens(b.step()) == {0: 1, 2: 1, 1: 8}


def test_without_chunking_a_prompt_past_its_class_cap_goes_alone():
    """classes[].max_prefill_tokens_per_step without chunked prefill: a lo prompt of 16, longer than
    the cap of 8, is prefilled whole (else it never could be), but then no other lo prompt
    prefills in that step: the second waits for the next."""
    b = Bench(classes=CAPPED_LO, chunked_prefill=False)
    b.add("lo", prompt=16, output=4)
    b.add("lo", prompt=16, output=4)
    assert b.tokens(b.step()) == {0: 16}
    assert b.tokens(b.step()) == {0: 1, 1: 16}


def test_class_prefill_cap_counts_re_prefill_tokens():
    """classes[].max_prefill_tokens_per_step caps a recomputed request's re-prefill too: 8
    blocks, hi H (14 tokens, 4 blocks) and lo L (16 tokens, cap 8: two chunks). In step 3 L's
    first decode needs a 5th block with none free; L ranks last and preempts itself. Re-admitted
    in step 4 it re-prefills its 16 + 1 tokens 8 at a time."""
    b = Bench(classes=CAPPED_LO, kv_blocks=8)
    b.add("hi", prompt=14, output=16)
    lo = b.add("lo", prompt=16, output=4)
    assert [b.tokens(p) for p in b.steps(3)] == [{0: 14, 1: 8}, {0: 1, 1: 8}, {0: 1}]
    assert b.preempted == [(1, "recompute")] and lo.tokens == 17
    plan = b.plan()
    assert b.admitted(plan) == [1] and b.tokens(plan) == {0: 1, 1: 8}


# ---- KV blocks at admission ------------------------------------------------------------------
def test_watermark_keeps_blocks_free_at_admission():
    """engine.watermark = 0.5 of 10 blocks keeps ceil(5) = 5 free at admission. A 12-token prompt
    takes 3 blocks (3 <= 10 - 5); the second needs 3 more, but 7 free - 5 = 2: it waits, though
    7 blocks are free."""
    b = Bench(kv_blocks=10, watermark=0.5)
    b.add("lo", prompt=12, output=4)
    b.add("lo", prompt=12, output=4)
    assert b.tokens(b.plan()) == {0: 12}
    assert b.free == 7 and b.waiting == [1]


def test_watermark_does_not_hold_back_running_requests():
    """The watermark is an admission rule only: running requests grow into the blocks it keeps
    free. 10 blocks, watermark 0.3 keeps 3 free at admission: A (12-token prompt, 3 blocks:
    3 <= 10 - 3) and B (4 tokens, 1 block: 1 <= 7 - 3) are admitted, 6 free. In their last step
    (12 outputs each) they hold ceil(23 / 4) = 6 and ceil(15 / 4) = 4 blocks: all 10, none
    free, below the watermark's 3, and nobody was preempted."""
    b = Bench(kv_blocks=10, watermark=0.3)
    b.add("lo", prompt=12, output=12)
    b.add("lo", prompt=4, output=12)
    assert b.admitted(b.step()) == [0, 1]
    assert b.free == 6 and b.eng.limits.watermark_blocks == 3
    b.steps(10)
    assert b.tokens(b.plan()) == {0: 1, 1: 1}
    assert b.free == 0 and b.preempted == [] and b.running == [0, 1]


def test_a_waiter_short_of_blocks_stops_admission():
    """Strict admission order applies to blocks too: 8 blocks. Running A holds 7 (a 24-token
    prompt, 25 tokens once decoding); hi B needs 3 blocks (12 tokens) with 1 free: it waits, and
    lo C behind it (4 tokens, 1 block) waits too, though it would fit."""
    b = Bench(kv_blocks=8)
    b.add("lo", prompt=24, output=8)
    b.step()
    b.add("hi", prompt=12, output=4)
    b.add("lo", prompt=4, output=4)
    assert b.tokens(b.plan()) == {0: 1}
    assert b.free == 1 and b.waiting == [1, 2]


def test_reserved_blocks_are_kept_for_their_class():
    """classes[].reserved_blocks: of 8 blocks hi reserves 4, so lo may use 8 - 4 = 4. lo A (12
    tokens, 3 blocks) is admitted; lo B (8 tokens, 2 blocks) waits with 5 free (5 - 4 reserved =
    1 < 2). hi C (12 tokens, 3 blocks) is admitted in the next step into the reservation (A's
    decode took a 4th block: 4 free)."""
    classes = ({"name": "hi", "priority": 0, "reserved_blocks": 4}, {"name": "lo", "priority": 1})
    b = Bench(classes=classes, kv_blocks=8)
    b.add("lo", prompt=12, output=4)
    b.add("lo", prompt=8, output=4)
    assert b.admitted(b.step()) == [0]
    assert b.free == 5 and b.waiting == [1]
    b.add("hi", prompt=12, output=4)
    plan = b.plan()
    assert b.admitted(plan) == [2]
    assert b.free == 1 and b.waiting == [1]


def test_a_request_that_could_never_fit_is_rejected_at_arrival():
    """A request whose prompt + max_tokens exceed the blocks its class could ever hold (4 blocks x
    4 tokens = 16) is rejected as too_large when it arrives; one of exactly 16 is taken in."""
    b = Bench(kv_blocks=4)
    assert not b.arrive(b.request("lo", prompt=12, output=2, max_tokens=5))
    assert b.arrive(b.request("lo", prompt=12, output=2, max_tokens=4))
    assert b.waiting == [1]


# ---- order ---------------------------------------------------------------------------------
def test_strict_priority_admits_the_urgent_class_first():
    """Admission follows the policy's rank: "priority" ranks by class, so with one slot the hi
    request is admitted though the lo one arrived first."""
    b = Bench(max_num_seqs=1)
    b.add("lo", prompt=8, output=4)
    b.now = 10
    b.add("hi", prompt=8, output=4)
    assert b.admitted(b.plan()) == [1]


def test_the_policy_not_the_class_orders_admission():
    """Admission follows the policy's rank: under "fcfs" the lo request that arrived first takes
    the one slot."""
    b = Bench(max_num_seqs=1, policy="fcfs")
    b.add("lo", prompt=8, output=4)
    b.now = 10
    b.add("hi", prompt=8, output=4)
    assert b.admitted(b.plan()) == [0]


def test_ties_in_class_break_by_arrival_then_id():
    """Every key ends in (arrival, id): three hi requests, id 2 arrived first, ids 0 and 1 at the
    same instant after it: admitted 2, 0, 1."""
    b = Bench()
    b.now = 100
    b.add("hi", prompt=8, output=4)
    b.add("hi", prompt=8, output=4)
    b.add("hi", prompt=8, output=4, at_ns=50)
    assert b.admitted(b.plan()) == [2, 0, 1]


def test_running_requests_take_their_tokens_before_new_prefills():
    """Running requests first (vLLM V1): a 16-token budget. lo A is decoding and takes its token;
    the waiting hi prompt of 16, though it outranks A, gets the 15 left."""
    b = Bench(max_batched_tokens=16)
    b.add("lo", prompt=8, output=8)
    b.step()
    b.add("hi", prompt=16, output=4)
    plan = b.plan()
    assert b.tokens(plan) == {0: 1, 1: 15}
    assert b.admitted(plan) == [1]


def test_running_requests_are_served_in_rank_order():
    """The running walk goes most urgent first, and the budget cuts the least urgent: a 16-token
    budget, lo A decoding and hi B prefilling a 40-token prompt (15 tokens in, 25 to go). B's
    chunk takes all 16 and A gets no token this step (it stays running, not preempted)."""
    b = Bench(max_batched_tokens=16)
    b.add("lo", prompt=8, output=8)
    b.step()
    b.add("hi", prompt=40, output=4)
    assert b.tokens(b.step()) == {0: 1, 1: 15}
    assert b.tokens(b.plan()) == {1: 16}
    assert b.running == [0, 1] and b.preempted == []


# ---- prefix cache --------------------------------------------------------------------------
def test_a_cached_prefix_is_not_prefilled_again():
    """engine.prefix_caching, groups of 8 tokens (2 blocks). A (20 tokens, hash ids [7, 8])
    prefills and publishes both groups. B, the same 20-token prefix, reuses the 2 groups (16
    tokens): it prefills 4 and takes ceil(20 / 4) - 4 = 1 block of its own."""
    b = Bench(prefix_caching=True, prefix_block_tokens=8)
    b.add("lo", prompt=20, output=4, hash_ids=[7, 8])
    b.step()
    r = b.add("lo", prompt=20, output=4, hash_ids=[7, 8])
    plan = b.plan()
    assert b.tokens(plan) == {0: 1, 1: 4}
    assert r.prefix_hit_tokens == 16 and r.shared == (7, 8)
    assert r.blocks == 1 and r.base_blocks == 4


def test_a_cached_prompt_still_prefills_its_last_group():
    """At least one prompt token is prefilled (the model needs the last position's logits): a
    16-token prompt whose both groups are cached reuses the first only (full groups leaving a
    token: (16 - 1) // 8 = 1) and prefills 8."""
    b = Bench(prefix_caching=True, prefix_block_tokens=8)
    b.add("lo", prompt=20, output=4, hash_ids=[7, 8])
    b.step()
    r = b.add("lo", prompt=16, output=4, hash_ids=[7, 8])
    assert b.tokens(b.plan())[r.request_id] == 8
    assert r.prefix_hit_tokens == 8


# ---- preemption off: whole reservations --------------------------------------------------
def test_with_preemption_off_admission_reserves_prompt_and_max_tokens():
    """engine.preemption = "off": a request takes blocks for its prompt + max_tokens when admitted
    and never grows. 8 blocks: A (8 + 16 = 24 tokens, 6 blocks) takes 6; B (4 + 8 = 12 tokens, 3
    blocks) waits with 2 free, though its prompt alone needs 1. A's blocks stay 6 as it decodes."""
    b = Bench(kv_blocks=8, preemption="off")
    b.add("lo", prompt=8, output=16)
    b.add("lo", prompt=4, output=8)
    assert b.admitted(b.step()) == [0]
    assert b.free == 2 and b.waiting == [1]
    b.steps(5)
    assert b.eng.queues.running[0].blocks == 6 and b.free == 2


# ---- speculative decoding ----------------------------------------------------------------
SPEC = {"k": 3, "acceptance": 0.0}  # no draft accepted: no random draw decides a token


def test_a_speculative_decoder_takes_its_drafts_and_their_blocks():
    """engine.speculative, k = 3: a decoder takes 1 + 3 tokens of the budget, and blocks for them
    (8 computed + 4 = 12 tokens: 3 blocks, one more); a class with speculate = false takes 1."""
    classes = ({"name": "hi", "priority": 0}, {"name": "lo", "priority": 1, "speculate": False})
    b = Bench(classes=classes, speculative=SPEC)
    hi = b.add("hi", prompt=8, output=8)
    b.add("lo", prompt=8, output=8)
    b.step()
    assert b.tokens(b.plan()) == {0: 4, 1: 1}
    assert hi.blocks == 3


def test_a_decoder_drafts_only_when_the_budget_left_exceeds_k():
    """engine.speculative, k = 3, a 7-token budget: the first decoder drafts (7 > 3: 4 tokens),
    the second has 3 left (not more than k) and takes its own token only."""
    b = Bench(speculative=SPEC, max_batched_tokens=7)
    b.add("hi", prompt=3, output=8)
    b.add("hi", prompt=3, output=8)
    b.step()
    assert b.tokens(b.plan()) == {0: 4, 1: 1}


def test_draft_slots_count_toward_too_large():
    """With speculation a request may hold prompt + max_tokens + k tokens: 4 blocks (16 tokens)
    take 12 + 2 with k = 2 (16) but not 12 + 3 (17)."""
    b = Bench(kv_blocks=4, speculative={"k": 2, "acceptance": 0.0})
    assert b.arrive(b.request("lo", prompt=12, output=2))
    assert not b.arrive(b.request("lo", prompt=12, output=3))


def test_the_cohort_leaves_the_plan_unchanged(both_ways):
    """engine.lazy_batch: steady decoders advance as one cohort (a count in the plan, not items),
    and the step takes the same tokens: three decoders and a 6-token prompt in a 9-token budget:
    3 decode tokens, the prompt's 6."""
    b = Bench(max_batched_tokens=9)
    for _ in range(3):
        b.add("lo", prompt=4, output=8)
    b.steps(2)
    b.add("lo", prompt=6, output=8)
    plan = b.plan()
    assert b.tokens(plan) == {0: 1, 1: 1, 2: 1, 3: 6}
    assert plan.cohort == (3 if both_ways else 0)
