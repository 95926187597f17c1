"""Unit tests of applying a plan (sim/core/apply.py), one rule a test: tokens advance, the first
token ends the prefill, a request ends with its last token and frees its blocks, steady decoders
join the cohort. Built on :class:`tests.core_helpers.Bench` (4-token blocks, one step an event);
the planner's rules are in tests/test_planner.py.
"""
from __future__ import annotations

from sim.core.cohort import NOT_MEMBER
from sim.core.request import State
from tests.core_helpers import Bench, both_ways  # noqa: F401  (each test stepped, then with the cohort)


def test_the_first_token_ends_the_last_prefill_chunk():
    """A prefill chunk that leaves part of the prompt emits nothing; the chunk that completes it
    emits the first output token at the end of its step (engine.max_prefill_chunk = 4, an 8-token
    prompt: nothing after step 1, the first token at the end of step 2)."""
    b = Bench(max_prefill_chunk=4)
    r = b.add("lo", prompt=8, output=4)
    b.step()
    assert r.computed == 4 and r.generated == 0 and r.first_token_ns == -1
    b.step()
    assert r.computed == 8 and r.generated == 1 and r.tokens == 9
    assert r.first_token_ns == b.now


def test_a_request_ends_with_its_last_token_and_frees_its_blocks():
    """A request ends at the end of the step that emits its last token (output 2: the first ends
    its prefill in step 1, the second step 2): finished then, its blocks back in the pool (2
    after the 8-token prefill, 3 once its decode computes a 9th token), its one slot free for
    the next plan."""
    b = Bench(kv_blocks=16, max_num_seqs=1)
    r = b.add("lo", prompt=8, output=2)
    b.add("lo", prompt=8, output=2)
    b.step()
    assert b.free == 14
    b.step()
    assert r.state is State.FINISHED and r.finish_ns == b.now and r.generated == 2
    assert r.blocks == 0 and b.free == 16 and b.running == []
    assert b.admitted(b.plan()) == [1]


def test_steady_decoders_join_the_cohort(both_ways):
    """engine.lazy_batch: a request that emitted a token at the end of a step and decodes one a
    step joins the cohort when the step is applied, and leaves the plan's items for its count."""
    b = Bench()
    r = b.add("lo", prompt=8, output=8)
    b.step()  # the prefill emits the first token: a steady decoder from now on
    plan = b.plan()
    assert b.tokens(plan) == {0: 1}
    if both_ways:
        assert r.cohort_base_step != NOT_MEMBER and plan.items == [] and plan.cohort == 1
    else:
        assert r.cohort_base_step == NOT_MEMBER and plan.cohort == 0
