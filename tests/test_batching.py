"""``engine.batching``: what one step holds. ``"mixed"`` (the default) puts prompt chunks beside the
running decoders; ``"prefill_first"`` gives prefill work steps of its own, and the decoders wait
(vLLM V0 without chunked prefill, SGLang without ``--enable-mixed-chunk``; docs/engine-step.md).

The bench (:class:`tests.core_helpers.Bench`) prices a step with the bench's profile: 1 ms a step
plus 1 us a prefill token (``STEP_1MS``); the expected durations below come from the same step
function (:meth:`sim.core.costs.CostModel.step_ns`), so the arithmetic is written out once.
"""
from __future__ import annotations

import pytest

from sim import ScenarioError, scenario_from_dict
from tests.core_helpers import Bench, both_ways  # noqa: F401 - the fixture runs each test twice

#: two requests decoding when the third arrives: 8-token prompts, 10 tokens out
DECODERS = dict(prompt=8, output=10)


def _two_decoding(b: Bench):
    """Requests 0 and 1 admitted together (one step of their two prompts), then one decode
    step: both have emitted two tokens and decode on."""
    a, c = b.add("hi", **DECODERS), b.add("hi", **DECODERS)
    assert b.tokens(b.step()) == {a.request_id: 8, c.request_id: 8}
    assert b.tokens(b.step()) == {a.request_id: 1, c.request_id: 1}
    return a, c


def _ns(b: Bench, prefill: list[tuple[int, int]], decoders: list[int], admitted: int = 0) -> int:
    """A step's duration from the bench's step function: ``prefill`` chunks as (tokens, tokens
    before the chunk), ``decoders`` as each decoder's context (its computed tokens + 1)."""
    P = sum(n for n, _ in prefill)
    return b.eng.costs.step_ns(P, len(decoders), sum(n * n for n, _ in prefill), sum(n * c for n, c in prefill),
                               sum(decoders), len(prefill), admitted)


def test_prefill_first_gives_the_prompt_a_step_alone():
    """Two decoders (contexts 10 and 10 at their next token) and a 20-token prompt arriving:
    with prefill_first the next step holds the prompt alone (priced as 20 prefill tokens and no
    decoder), and the decoders' next token ends the step after it, where the newcomer decodes
    beside them."""
    b = Bench(batching="prefill_first")
    a, c = _two_decoding(b)
    t0 = b.now
    n = b.add("lo", prompt=20, output=5)
    plan = b.step()
    assert b.tokens(plan) == {n.request_id: 20}
    assert b.now - t0 == _ns(b, [(20, 0)], [], admitted=1)
    assert a.last_token_ns == c.last_token_ns == t0  # (they sat the step out)
    t1 = b.now
    assert b.tokens(b.step()) == {a.request_id: 1, c.request_id: 1, n.request_id: 1}
    assert b.now - t1 == _ns(b, [], [11, 11, 21])
    b.eng.cohort.sync_all() if b.eng.cohort is not None else None
    assert a.last_token_ns == c.last_token_ns == b.now
    assert a.generated == c.generated == 3 and n.generated == 2


def test_the_cohort_sits_a_prefill_step_out(both_ways):
    """Under prefill_first the steady decoders stay in the cohort through a step that holds a
    prompt alone: nothing of theirs changes in it, and the gap before their next token is that
    step and the next one together (stepped, each decoder measures it from its last token).
    The newcomer joins only after it has decoded in a step beside them."""
    b = Bench(batching="prefill_first")
    a, c = _two_decoding(b)
    b.step()  # (a second decode step: with the cohort on, both are members by now)
    coh = b.eng.cohort
    if both_ways:
        assert {a.request_id, c.request_id} <= set(coh.members)
    t0 = b.now
    n = b.add("lo", prompt=20, output=5)
    b.step()
    prefill_ns = b.now - t0
    if both_ways:  # (still members, the newcomer not yet one)
        assert {a.request_id, c.request_id} <= set(coh.members) and n.request_id not in coh.members
    b.step()
    decode_ns = b.now - t0 - prefill_ns
    if both_ways:
        assert n.request_id in coh.members
        coh.sync_all()
    assert a.last_token_ns == c.last_token_ns == b.now
    assert a.max_itl_ns == c.max_itl_ns == prefill_ns + decode_ns
    assert a.generated == c.generated == 4 and n.generated == 2


def test_mixed_puts_the_prompt_beside_the_decoders():
    """The same arrival under mixed batching (the default): one step holds the prompt and both
    decoders' tokens, priced as one step of both."""
    b = Bench()
    a, c = _two_decoding(b)
    t0 = b.now
    n = b.add("lo", prompt=20, output=5)
    assert b.tokens(b.step()) == {a.request_id: 1, c.request_id: 1, n.request_id: 20}
    assert b.now - t0 == _ns(b, [(20, 0)], [11, 11], admitted=1)
    b.eng.cohort.sync_all() if b.eng.cohort is not None else None
    assert a.last_token_ns == c.last_token_ns == b.now


def test_chunked_prompt_takes_consecutive_prefill_steps():
    """A 20-token prompt chunked at 8 tokens (``max_prefill_chunk``) runs its chunks 8, 8, 4 in
    three consecutive prefill-only steps; the two decoders then decode beside it (its first
    token ended the third chunk's step)."""
    b = Bench(batching="prefill_first", max_prefill_chunk=8)
    a, c = _two_decoding(b)
    n = b.add("lo", prompt=20, output=5)
    chunks = [b.tokens(b.step()) for _ in range(3)]
    assert chunks == [{n.request_id: 8}, {n.request_id: 8}, {n.request_id: 4}]
    assert n.generated == 1
    assert b.tokens(b.step()) == {a.request_id: 1, c.request_id: 1, n.request_id: 1}


def test_chunked_prompt_mixed_shares_its_steps():
    """The same prompt under mixed batching: each chunk shares its step with both decoders."""
    b = Bench(max_prefill_chunk=8)
    a, c = _two_decoding(b)
    n = b.add("lo", prompt=20, output=5)
    steps = [b.tokens(b.step()) for _ in range(3)]
    assert [s[n.request_id] for s in steps] == [8, 8, 4]
    assert all(s[a.request_id] == s[c.request_id] == 1 for s in steps)


def test_decode_step_when_no_prefill_fits():
    """A waiter that cannot be admitted (every slot taken: ``max_num_seqs`` 2) leaves the step
    to the decoders, as in a mixed step."""
    b = Bench(batching="prefill_first", max_num_seqs=2)
    a, c = _two_decoding(b)
    n = b.add("lo", prompt=20, output=5)
    assert b.tokens(b.step()) == {a.request_id: 1, c.request_id: 1}
    assert b.waiting == [n.request_id]


def test_swapped_request_resumes_in_a_decode_step():
    """A swapped-out request resumes (swaps in) in a decode step beside the decoders, never
    in a prefill step: two 8-token prompts with 12 tokens out each in 6 blocks of 4 tokens
    (20 tokens a request at the end: 5 blocks each) cannot both finish without one being
    swapped out; every step that swaps it back in holds decode work only."""
    b = Bench(batching="prefill_first", kv_blocks=6, preemption="swap", swap_blocks=32)
    lo = b.add("lo", prompt=8, output=12)
    hi = b.add("hi", prompt=8, output=12)
    plans = []
    for _ in range(30):
        if not b.running and not b.waiting:
            break
        plans.append(b.step())
    assert any(how == "swap" for _, how in b.preempted)
    swap_ins = [p for p in plans if p.swapped_in]
    assert swap_ins, "the swapped request came back"
    for p in swap_ins:
        assert all(s.decode for s in p.items)
    assert lo.generated == hi.generated == 12


@pytest.mark.parametrize("engine, expected", [
    ({"batching": "chunky"}, "engine.batching"),
    ({"batching": "prefill_first", "speculative": {"k": 2, "acceptance": 0.6}}, "engine.batching"),
])
def test_bad_batching_is_refused(engine, expected):
    """An unknown mode, and prefill_first with speculative decoding (a prefill-only step has no
    drafts to verify), are refused in one line naming the key."""
    d = {"engine": {"profile": {"kind": "linear", "base_s": 0.01, "prefill_token_s": 1e-5, "decode_token_s": 1e-4,
                                "context_token_s": 0.0}, **engine},
         "classes": [{"name": "a", "priority": 0}],
         "streams": [{"tenant": "t", "class": "a", "arrival": {"process": "poisson", "rate": 1.0}, "prompt_tokens": 10,
                      "output_tokens": 5}]}
    with pytest.raises(ScenarioError) as exc:
        scenario_from_dict(d)
    assert expected in str(exc.value) and "\n" not in str(exc.value)


def test_mixed_is_not_written_into_the_scenario():
    """The default leaves scenario.json as before the key existed; prefill_first is written."""
    d = {"classes": [{"name": "a", "priority": 0}],
         "streams": [{"tenant": "t", "class": "a", "arrival": {"process": "poisson", "rate": 1.0}, "prompt_tokens": 10,
                      "output_tokens": 5}]}
    assert "batching" not in scenario_from_dict(d).engine.as_written()
    d["engine"] = {"batching": "prefill_first"}
    assert scenario_from_dict(d).engine.as_written()["batching"] == "prefill_first"


def test_decode_stretches_stay_fast_and_exact():
    """Under prefill_first the fast paths still run decode stretches in one event (far fewer
    events than steps) and give what stepping gives (the exactness suite draws many more)."""
    from scripts.exactness_fuzz import differences
    from sim import load_scenario, simulate

    over = ['engine.batching="prefill_first"', "horizon_s=10"]
    fast = simulate(load_scenario("chat_vs_batch", overrides=over))
    stepped = simulate(load_scenario("chat_vs_batch", overrides=over + ["engine.fast_forward=false",
                                                                        "engine.lazy_batch=false"]))
    assert not differences(fast, stepped)
    run = fast.summary_dict["run"]
    assert run["engine_events"] * 3 < run["iterations"]


def test_a_chunking_prompt_is_not_fast_forwarded_under_prefill_first():
    """A step that prefills a short prompt whole (4 tokens) and a long one's first chunk (8 of
    20, ``max_prefill_chunk``) holds every running request, and nobody waits: under mixed
    batching fast-forward runs on from it (the long prompt chunking beside the new decoder), but
    under prefill_first the next step is the long prompt's chunk alone, so the plan is the
    planned step alone (``sim.core.fastforward.start_run``)."""
    from sim.core.costs import NEVER
    from sim.core.fastforward import start_run

    for batching, runs in (("mixed", True), ("prefill_first", False)):
        b = Bench(batching=batching, max_prefill_chunk=8, fast_forward=True, lazy_batch=False)
        short, long = b.add("hi", prompt=4, output=10), b.add("hi", prompt=20, output=10)
        plan = b.plan()
        assert b.tokens(plan) == {short.request_id: 4, long.request_id: 8}
        run = start_run(b.eng, plan, b.now, NEVER, b.eng.compute_ns(plan))
        assert (run is not None) is runs
    b.apply(plan)
    assert b.tokens(b.step()) == {long.request_id: 8}
