"""Speculative decoding: draft tokens take budget and compute; each step emits 1 + accepted."""
from __future__ import annotations

import pytest

from sim import load_scenario, simulate
from tests.explicit import run_explicit

LIN = {"kind": "linear", "base_s": 0.01, "prefill_token_s": 0.0, "decode_token_s": 0.001, "context_token_s": 0.0}


def test_full_acceptance_emits_k_plus_one_per_step(tmp_path):
    """k = 4, acceptance 1: prefill emits token 1 at 0.01; each decode step verifies 1 + 4
    positions and emits 5 tokens, so 11 tokens need 2 decode steps (5 + 5). A decode step
    costs base 0.01 + 0.001 (one sequence) + 4 verification tokens priced as prefill tokens
    (0 here) + the draft model: 4 x 0.1 x 0.011."""
    eng = {"profile": dict(LIN), "block_size": 4, "kv_blocks": 100,
           "speculative": {"k": 4, "acceptance": 1.0, "draft_cost_fraction": 0.1}}
    res = run_explicit(tmp_path, [(0.0, "c", 8, 11)], [("c", 0)], eng)
    r = res.requests.iloc[0]
    step = 0.01 + 0.001 + 4 * 0.1 * 0.011
    assert r.first_token_s == pytest.approx(0.01)
    assert r.finish_s == pytest.approx(0.01 + 2 * step)
    assert r.generated_tokens == 11
    spec = res.summary_dict["run"]["speculative"]
    assert spec["accepted"] == 8 and spec["emitted"] == 10 and spec["wasted_draft_tokens"] == 0
    # 9 tokens: the second step's last two accepted drafts fall past the output's end: wasted
    res = run_explicit(tmp_path, [(0.0, "c", 8, 9)], [("c", 0)], eng)
    spec = res.summary_dict["run"]["speculative"]
    assert spec["accepted"] == 6 and spec["emitted"] == 8 and spec["wasted_draft_tokens"] == 2


def test_zero_acceptance_is_one_token_per_step(tmp_path):
    eng = {"profile": dict(LIN), "block_size": 4, "kv_blocks": 100,
           "speculative": {"k": 2, "acceptance": 0.0, "draft_cost_fraction": 0.0}}
    res = run_explicit(tmp_path, [(0.0, "c", 8, 5)], [("c", 0)], eng)
    spec = res.summary_dict["run"]["speculative"]
    assert spec["sequence_steps"] == 4 and spec["emitted"] == 4 and spec["wasted_draft_tokens"] == 8


def test_per_class_acceptance_and_validation(tmp_path):
    eng = {"profile": dict(LIN), "block_size": 4, "kv_blocks": 100,
           "speculative": {"k": 3, "acceptance": {"a": 1.0, "b": 0.0}}}
    res = run_explicit(tmp_path, [(0.0, "a", 8, 13), (0.0, "b", 8, 13)], [("a", 0), ("b", 0)], eng)
    r = res.requests.set_index("class")
    assert r.loc["a", "finish_s"] < r.loc["b", "finish_s"]
    from sim import ScenarioError
    from tests.explicit import explicit_scenario
    from sim import scenario_from_dict
    sc = explicit_scenario(tmp_path, [(0.0, "a", 8, 13)], [("a", 0)],
                           dict(eng, speculative={"k": 3, "acceptance": 1.5}))
    with pytest.raises(ScenarioError, match="acceptance"):
        scenario_from_dict(sc, base_dir=tmp_path)


def test_speculation_helps_at_low_load_and_hurts_goodput_at_saturation():
    """Speculation helps at low load and hurts at saturation, on the shipped speculation_load
    scenario (shortened), priced without engine overhead: the claim is about verification compute
    in compute-bound steps. (The default `vllm-v1` preset adds a small host cost per step and
    next to nothing per sequence, and speculation loses goodput here at that pricing too.)"""
    spec = "engine.speculative={k=4,acceptance=0.7,draft_cost_fraction=0.1}"

    def run(rate, on):
        ov = [f"streams.0.arrival.rate={rate}", "horizon_s=40.0", 'engine.overhead="none"'] + ([spec] if on else [])
        return simulate(load_scenario("speculation_load", overrides=ov)).summary_dict["classes"]["chat"]

    low_off, low_on = run(2, False), run(2, True)
    assert low_on["tpot_p50_s"] < 0.7 * low_off["tpot_p50_s"]
    sat_off, sat_on = run(24, False), run(24, True)
    assert sat_on["goodput_rps"] < sat_off["goodput_rps"]


def test_acceptance_distribution_and_draft_profile(tmp_path):
    """acceptance = {dist = "beta", a, b}: each request draws its own rate; a draft profile
    prices the k draft steps with its own decode step (here an inline linear one)."""
    import json

    draft = tmp_path / "draft.json"
    draft.write_text(json.dumps({"kind": "linear", "base_s": 0.002, "prefill_token_s": 0.0, "decode_token_s": 0.0,
                                  "context_token_s": 0.0}))
    eng = {"profile": dict(LIN), "block_size": 4, "kv_blocks": 100,
           "speculative": {"k": 4, "acceptance": 1.0, "draft_profile": str(draft)}}
    res = run_explicit(tmp_path, [(0.0, "c", 8, 11)], [("c", 0)], eng)
    step = 0.01 + 0.001 + 4 * 0.002  # target verify + 4 draft steps at 2 ms
    assert res.requests.iloc[0].finish_s == pytest.approx(0.01 + 2 * step)
    eng["speculative"] = {"k": 4, "acceptance": {"dist": "beta", "a": 2.0, "b": 2.0}}
    res = run_explicit(tmp_path, [(0.0, "c", 8, 200), (0.0, "c", 8, 200)], [("c", 0)], eng)
    spec = res.summary_dict["run"]["speculative"]
    assert 0 < spec["accepted"] < spec["drafted"]
    assert (res.requests.generated_tokens == 200).all()


def test_first_token_from_a_speculative_step_is_recorded(tmp_path):
    """A prompt whose last chunk is one token runs that token as a (speculative) decode step:
    its first token must still be stamped, with no gap counted before it."""
    eng = {"profile": dict(LIN), "block_size": 4, "kv_blocks": 100, "max_batched_tokens": 8,
           "speculative": {"k": 4, "acceptance": 1.0}}
    res = run_explicit(tmp_path, [(0.0, "c", 9, 6)], [("c", 0)], eng)
    r = res.requests.iloc[0]
    it = res.iterations
    assert list(it.tokens[:2]) == [8, 5]  # an 8-token chunk, then 1 prompt token + 4 drafts
    assert r.first_token_s == pytest.approx(it.end_s.iloc[1])
    assert r.generated_tokens == 6 and r.max_itl_s < 0.1


def test_speculation_off_for_every_class_is_no_speculation(run):
    """classes.N.speculate = false: that class's decoders draft nothing (one token a step, no
    draft cost), so with every class off a run is the run without speculation, request by request."""
    from tests.conftest import small_scenario
    sc = small_scenario(horizon_s=5.0)
    base = run(sc)
    sc["engine"]["speculative"] = {"k": 4, "acceptance": 0.8}
    for c in sc["classes"]:
        c["speculate"] = False
    off = run(sc)
    assert off.requests.drop(columns=["max_itl_s"]).equals(base.requests.drop(columns=["max_itl_s"]))
