"""SGLang's conservative admission and retraction (``engine.admission_estimate = "sglang"``,
``engine.victim = "sglang"``; sim/core/reserve.py, sim/core/preemption.py), step by step.

Each test builds one engine as SGLang's defaults shape it (1-token blocks, prefill steps apart
from decode steps, the running requests walked as admitted, FCFS), adds requests by hand (ids
0, 1, ... in the order added) and checks who is admitted when, who is retracted and where it
waits, with the arithmetic written out in KV blocks (= tokens here). Each runs with every
request stepped, then with the decode cohort (``both_ways``).
"""
from __future__ import annotations

import pytest

from sim.core.reserve import CLIP_MAX_NEW_TOKENS, DECAY_STEPS, INIT_RATIO, MIN_RATIO_FACTOR, SglangReserve
from tests.core_helpers import Bench, both_ways  # noqa: F401  (each test stepped, then with the cohort)

ONE = ({"name": "c", "priority": 0},)
#: SGLang's shape (sim/engines/sglang.py defaults) on a small pool
SGLANG = dict(block_size=1, max_num_seqs=64, max_batched_tokens=2048, batching="prefill_first",
              running_order="admission", preemption="recompute", admission_estimate="sglang", victim="sglang")


def sglang(kv_blocks: int, **engine) -> Bench:
    return Bench(classes=ONE, policy="fcfs", kv_blocks=kv_blocks, **{**SGLANG, **engine})


def run_until(b: Bench, step: int, arrivals: dict | None = None) -> dict[int, list[int]]:
    """Step until ``step`` (exclusive) from the bench's next step; ``arrivals``: step -> (prompt,
    output) of a request added before that step. Returns step -> ids admitted in it."""
    out = {}
    i = b.eng.iterations
    while i < step:
        if arrivals and i in arrivals:
            b.add("c", *arrivals[i])
        p = b.step()
        if b.admitted(p):
            out[i] = b.admitted(p)
        i += 1
    return out


def test_the_ratio_starts_at_0_7_and_decays_to_its_floor_in_600_steps():
    """The constants as SGLang 0.5 sets them: init 0.7, floor 0.7 x 0.14 = 0.098, reached after
    600 decode steps of (0.7 - 0.098) / 600 each; outputs counted up to 4096 tokens."""
    r = SglangReserve(1)
    assert (INIT_RATIO, MIN_RATIO_FACTOR, DECAY_STEPS, CLIP_MAX_NEW_TOKENS) == (0.7, 0.14, 600, 4096)
    assert r.ratio == 0.7 and r.floor == pytest.approx(0.098)
    r.decode_steps(599)
    assert r.ratio > r.floor
    r.decode_steps(1)
    assert r.ratio == pytest.approx(0.098)
    r.decode_steps(1000)
    assert r.ratio == r.floor
    r.idle()
    assert r.ratio == 0.7


def test_a_waiter_needs_its_prompt_and_output_below_what_is_free_less_the_reserve():
    """Step 0, 100 blocks, A, B, C each a 10-token prompt and 30 output tokens (40 blocks):
    A: 40 < 100 - 0: admitted, its 10 prompt blocks taken, 30 reserved (90 free, 30 reserved);
    B: 40 < 90 - 30 = 60: admitted (80 free, 60 reserved); C: 40 < 80 - 60 = 20 fails: it
    waits, and admission stops (SGLang's batch is "full") until a running request leaves.
    priosim's own check (the prompt's blocks) takes all three."""
    b = sglang(100)
    for _ in range(3):
        b.add("c", prompt=10, output=30)
    assert b.admitted(b.step()) == [0, 1]
    assert b.waiting == [2] and b.eng.reserve.paused
    # decode steps: nothing is tried while paused, though C would fit now (A and B hold 22
    # blocks; 0.7 x 2 x 29 = 40.6 reserved: 40 < 78 - 40.6)
    assert run_until(b, 30) == {}
    assert b.waiting == [2]
    # A and B end at step 29 (30 tokens each): C is taken in at the next step
    assert run_until(b, 31) == {30: [2]}
    plain = Bench(classes=ONE, policy="fcfs", kv_blocks=100, **{**SGLANG, "admission_estimate": "prompt"})
    for _ in range(3):
        plain.add("c", prompt=10, output=30)
    assert plain.admitted(plain.step()) == [0, 1, 2]


def test_the_decayed_ratio_admits_at_a_departure_what_the_first_would_not():
    """2000 blocks. Step 0: R (100 + 1400) fits (1500 < 2000); S (10 + 300): 310 < 1900 - 1400
    = 500, admitted; W (100 + 900 = 1000) < 1890 - 1700 = 190 fails: paused.
    S's last token ends step 299 (1 from its prefill, 299 decode steps: the ratio is 0.7 - 299
    x 0.0010033 = 0.4000). Step 300: R holds 100 + 299 blocks (1601 free) and has 1100 tokens
    left: 0.4 x 1100 = 440 reserved, and W's 1000 < 1601 - 440 = 1161: admitted. At the
    initial 0.7 it would not have been (0.7 x 1100 = 770: 1000 >= 831)."""
    b = sglang(2000)
    b.add("c", prompt=100, output=1400)
    b.add("c", prompt=10, output=300)
    b.add("c", prompt=100, output=900)
    assert run_until(b, 1) == {0: [0, 1]}
    res = b.eng.reserve
    assert res.paused
    assert run_until(b, 301) == {300: [2]}
    ratio_at_300 = 0.7
    for _ in range(299):
        ratio_at_300 = max(ratio_at_300 - res.decay, res.floor)
    assert res.ratio == ratio_at_300  # (step 300 is a prefill step: no decay in it)
    assert ratio_at_300 == pytest.approx(0.4, abs=1e-5)
    assert 1000 < 1601 - ratio_at_300 * 1100 and not 1000 < 1601 - 0.7 * 1100


def test_a_retraction_takes_the_fewest_outputs_longest_prompt_and_requeues_it_last():
    """The same engine run on: R and W both grow past 2000 blocks (R's 1500 and W's 1000 did
    not fit together: the ratio reserved 40 % of R's rest). At step 1051 R holds 1149 blocks
    (1050 outputs) and W 850 (751), 1 block is free and both need one: W, with the fewer
    outputs, is retracted, and the ratio becomes (1050 + 20 x 1) / (1400 + 1) = 0.7637 (the
    remaining requests' outputs plus 20 steps each, over their max_tokens + 1); step 1052, a
    decode step, takes one decay off it. Y (100 + 900), which arrived at step 1000 and waits
    (admission paused), stays ahead of W: a retracted request waits again as if it arrived at
    its retraction, behind every waiter (FCFS: at the end of SGLang's list)."""
    b = sglang(2000)
    b.add("c", prompt=100, output=1400)
    b.add("c", prompt=10, output=300)
    b.add("c", prompt=100, output=900)
    run_until(b, 1051, arrivals={1000: (100, 900)})
    assert b.preempted == [] and b.waiting == [3]
    run_until(b, 1052)
    assert b.preempted == [(2, "recompute")]
    assert b.eng.reserve.ratio == (1050 + 20) / 1401
    run_until(b, 1053)
    assert b.waiting == [3, 2]  # (Y arrived after W, yet waits ahead of it)
    assert b.eng.reserve.ratio == pytest.approx((1050 + 20) / 1401 - b.eng.reserve.decay)


def test_ties_in_outputs_retract_the_longer_prompt_first():
    """priosim's own admission (all three fit at first), SGLang's retraction order: 80 blocks;
    A (20-token prompt) runs 5 steps before B (10) and C (20) come in together. When the
    pool runs dry B and C have the same outputs: C, the longer prompt, is retracted (not the
    lowest-ranked, B, whose arrival is the same and whose admission came first), and waits
    behind D, which arrived after it."""
    b = Bench(classes=ONE, policy="fcfs", kv_blocks=80, **{**SGLANG, "admission_estimate": "prompt"})
    b.add("c", prompt=20, output=40)
    b.steps(5)
    b.add("c", prompt=10, output=40)
    b.add("c", prompt=20, output=40)
    b.step()
    b.add("c", prompt=30, output=10)
    for _ in range(20):
        b.step()
        if b.preempted:
            break
    assert b.preempted == [(2, "recompute")]
    assert b.waiting == [3, 2]


def test_the_user_trial_one_at_a_time_and_no_retraction():
    """A 1000-block pool and ten requests of 50 prompt + 500 output tokens. priosim's own check
    takes all ten at step 0 (500 blocks of prompts) and then preempts 21 times. SGLang's: the
    first (550 < 1000) reserves 550, the second (550 < 1000 - 50 - 500 = 450) does not fit, and
    the batch counts as full until the first leaves (step 499): each later request finds the
    engine empty and the next one short of its 500-token reserve, so they run one at a time,
    with no retraction (5000 steps where priosim's own took 1824)."""
    def trial(estimate: str, victim: str) -> tuple[list, int, int]:
        b = Bench(classes=ONE, policy="fcfs", kv_blocks=1000, **{**SGLANG, "admission_estimate": estimate,
                                                                 "victim": victim, "max_num_seqs": 4096,
                                                                 "max_batched_tokens": 8192})
        for _ in range(10):
            b.add("c", prompt=50, output=500)
        first = b.admitted(b.step())
        steps = 1
        while b.running or b.waiting:
            b.step()
            steps += 1
        return first, len(b.preempted), steps

    assert trial("prompt", "rank") == (list(range(10)), 21, 1824)  # (priosim's SGLang before)
    assert trial("sglang", "sglang") == ([0], 0, 5000)
