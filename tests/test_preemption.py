"""Preemption mechanics on tiny hand-checked cases, the auto crossover on the shipped profile,
and the chat-vs-batch promise.

Hand cases use a linear profile: every step costs base_s = 0.01 s, moving one KV block one way
costs swap_block_s = 0.001 s; blocks hold 4 tokens; 4 device blocks (16 tokens).

Timeline shared by the recompute and swap cases (low: prio 1, 4-token prompt, 10 output
tokens, arrives at 0; high: prio 0, 12-token prompt, 3 output tokens, arrives at 0.015):
  step 1 [0.00, 0.01]  low prefill 4 tokens (1 block)                  -> low token 1
  step 2 [0.01, 0.02]  low decode (5 tokens -> 2 blocks)                -> low token 2
  step 3 at 0.02       high waits: needs 3 blocks, 2 free; strict priority evicts low
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim import load_scenario, simulate
from sim.core.costs import load_profile
from sim.core.engine import Engine
from sim.core.preemption import recompute_cost_ns, swap_cost_ns
from sim.core.kvpool import KVPool
from sim.core.request import Request
from sim.core.telemetry import Telemetry
from tests.explicit import run_explicit

LIN = {"kind": "linear", "base_s": 0.01, "prefill_token_s": 0.0, "decode_token_s": 0.0, "context_token_s": 0.0,
       "swap_block_s": 0.001}
CLASSES = [("high", 0), ("low", 1)]
CASE = [(0.0, "low", 4, 10), (0.015, "high", 12, 3)]


def _engine(**kw):
    e = {"profile": dict(LIN), "block_size": 4, "kv_blocks": 4, "preempt_for_waiting": "strict"}
    e.update(kw)
    return e


def _by_id(res):
    return res.requests.set_index("request_id")


def test_one_recompute_exact_times(tmp_path):
    """Low is evicted at 0.02 (its 5 computed tokens dropped); high prefills in
    [0.02, 0.03] and decodes to 0.05; low re-prefills 4 + 2 = 6 tokens in [0.05, 0.06]
    (emitting token 3) and decodes 7 more steps to 0.13."""
    res = run_explicit(tmp_path, CASE, CLASSES, _engine(preemption="recompute"))
    r = _by_id(res)
    low, high = 0, 1
    assert r.loc[high, "first_token_s"] == pytest.approx(0.03)
    assert r.loc[high, "finish_s"] == pytest.approx(0.05)
    assert r.loc[low, "first_token_s"] == pytest.approx(0.01)
    assert r.loc[low, "finish_s"] == pytest.approx(0.13)
    assert r.loc[low, "preemptions"] == 1
    assert r.loc[low, "recomputed_tokens"] == 5
    assert r.loc[low, "max_itl_s"] == pytest.approx(0.04)  # token 2 at 0.02, token 3 at 0.06
    it = res.iterations
    rec = it[(it.request_id == low) & (it.kind == "recompute")]
    assert list(rec.tokens) == [6] and rec.start_s.iloc[0] == pytest.approx(0.05)
    assert r.loc[low, "generated_tokens"] == 10


def test_one_swap_pair_exact_times(tmp_path):
    """Swap instead: low's 2 blocks go to host during step 3 (+0.002 s), so high's prefill
    step is [0.02, 0.032] and it finishes at 0.052; low swaps 2 blocks back in (+0.002 s)
    and decodes in the same step [0.052, 0.064], then 7 more steps to 0.134."""
    res = run_explicit(tmp_path, CASE, CLASSES, _engine(preemption="swap", swap_blocks=8))
    r = _by_id(res)
    low, high = 0, 1
    assert r.loc[high, "first_token_s"] == pytest.approx(0.032)
    assert r.loc[high, "finish_s"] == pytest.approx(0.052)
    assert r.loc[low, "finish_s"] == pytest.approx(0.134)
    assert r.loc[low, "swapped_blocks"] == 2 and r.loc[low, "recomputed_tokens"] == 0
    it = res.iterations
    assert list(it[it.kind == "swap_out"].tokens) == [2]
    assert list(it[it.kind == "swap_in"].tokens) == [2]
    assert it[it.kind == "swap_in"].start_s.iloc[0] == pytest.approx(0.052)
    cls = res.summary_dict["classes"]["low"]
    assert cls["swap_s"] == pytest.approx(0.004)
    run = res.summary_dict["run"]
    assert run["thrash_s"] == pytest.approx(0.004)


def test_swap_space_full_falls_back_to_recompute(tmp_path):
    res = run_explicit(tmp_path, CASE, CLASSES, _engine(preemption="swap", swap_blocks=1))
    r = _by_id(res)
    assert r.loc[0, "swap_fallbacks"] == 1 and r.loc[0, "swapped_blocks"] == 0
    assert r.loc[0, "recomputed_tokens"] == 5
    assert r.loc[0, "finish_s"] == pytest.approx(0.13)  # exactly the recompute timeline
    assert res.summary_dict["run"]["preemptions_by_mode"] == {"fallback": 1}


def test_victim_is_lowest_ranked_then_newest(tmp_path):
    """Three low-priority requests run; a high one needs room for one of them: the victim is
    the lowest class, and among equals the most recently admitted."""
    reqs = [(0.0, "mid", 4, 20), (0.0, "low", 4, 20), (0.005, "low", 4, 20), (0.025, "high", 8, 2)]
    res = run_explicit(tmp_path, reqs, [("high", 0), ("mid", 1), ("low", 2)],
                       {"profile": dict(LIN), "block_size": 4, "kv_blocks": 8, "preemption": "recompute",
                        "preempt_for_waiting": "strict", "max_num_seqs": 3})
    it = res.iterations
    # ids: 0 mid, 1 low (arrived 0), 2 low (arrived 0.005, admitted later), 3 high
    assert sorted(it[it.iteration == 2].request_id) == [0, 1, 2]
    assert sorted(it[it.iteration == 3].request_id) == [0, 1, 3]  # the newest low one gave way
    r = _by_id(res)
    assert r.loc[0, "preemptions"] == 0
    assert r.loc[3, "first_token_s"] == pytest.approx(0.04)  # admitted at 0.03, one prefill step


def test_never_preempts_equal_or_higher_rank_for_a_waiter(tmp_path):
    """strict mode: a waiter of the same class never evicts a running request."""
    reqs = [(0.0, "low", 8, 30), (0.005, "low", 8, 3)]
    res = run_explicit(tmp_path, reqs, [("low", 1)],
                       {"profile": dict(LIN), "block_size": 4, "kv_blocks": 20, "preemption": "recompute",
                        "preempt_for_waiting": "strict", "max_num_seqs": 1})
    r = _by_id(res)
    assert r.loc[0, "preemptions"] == 0
    assert r.loc[1, "first_token_s"] > r.loc[0, "finish_s"] - 1e-9


def test_reserved_blocks_let_premium_in_without_preemption(tmp_path):
    """high reserves 3 of 8 blocks: low work can hold at most 5, so high finds memory at once
    even with preemption off."""
    reqs = [(0.0, "low", 8, 4), (0.0, "low", 8, 4), (0.0, "low", 8, 4), (0.005, "high", 8, 2)]
    eng = {"profile": dict(LIN), "block_size": 4, "kv_blocks": 8, "preemption": "off",
           "preempt_for_waiting": "never"}
    res = run_explicit(tmp_path, reqs, [("high", 0, 3), ("low", 1)], eng)
    # each low request needs (8 + 4) / 4 = 3 blocks with preemption off: only one fits in 5
    r = _by_id(res)
    assert r.loc[3, "first_token_s"] == pytest.approx(0.02)  # admitted at the first step after arrival
    ts = res.timeseries
    assert r["preemptions"].sum() == 0
    # without the reservation the same high request waits for a low one to finish
    res2 = run_explicit(tmp_path, reqs, [("high", 0), ("low", 1)], dict(eng, kv_blocks=5))
    assert _by_id(res2).loc[3, "first_token_s"] > 0.02
    assert len(ts)


def test_reservation_enforced_in_pool():
    pool = KVPool(10, 16, [0, 1], [4, 0])
    assert pool.available_for(1) == 6 and pool.available_for(0) == 10
    pool.allocate(1, 6)
    assert pool.available_for(1) == 0 and pool.available_for(0) == 4
    pool.allocate(0, 2)
    assert pool.available_for(1) == 0 and pool.available_for(0) == 2
    pool.release(1, 6)
    assert pool.available_for(1) == 6
    pool.check()


def test_preempted_many_times_ends_with_exact_tokens(tmp_path):
    """14 blocks of 4 tokens; each high request (40-token prompt) needs 10 of them, so every
    arrival evicts the long low request, which still ends with exactly its 40 tokens."""
    reqs = [(0.0, "low", 4, 40)] + [(0.1 + 0.1 * i, "high", 40, 3) for i in range(5)]
    res = run_explicit(tmp_path, reqs, CLASSES, _engine(preemption="recompute", kv_blocks=14))
    r = _by_id(res)
    assert r.loc[0, "preemptions"] >= 3
    assert r.loc[0, "generated_tokens"] == 40 and r.loc[0, "status"] == "finished"


def test_watermark_holds_blocks_back_at_admission(tmp_path):
    reqs = [(0.0, "low", 12, 4), (0.0, "low", 12, 4)]
    eng = {"profile": dict(LIN), "block_size": 4, "kv_blocks": 10, "preemption": "recompute",
           "watermark": 0.5}
    res = run_explicit(tmp_path, reqs, [("low", 1)], eng)
    r = _by_id(res)
    # 5 blocks kept free: the second 3-block prompt cannot join the first at t=0
    assert r.loc[1, "admitted_s"] > 0


# ---- auto: swap vs recompute on the shipped profile -------------------------------------

def _auto_engine(decoders: int = 32):
    costs = load_profile("h200-llama-3-8b", overhead="none")  # (the roofline alone: no engine-overhead preset)
    cfg = load_scenario(None, overrides=["engine.preemption=\"auto\"", "engine.swap_blocks=100000"]).engine
    pool = KVPool(costs.kv_blocks(16), 16, [0], [0], host_total=100000)
    eng = Engine(None, cfg, costs, None, [None], pool, Telemetry(["c"], 10**9))
    eng.queues.running = dict.fromkeys(range(decoders))
    return eng


def _victim(tokens: int) -> Request:
    r = Request(0, 0, "t", "c", 0, 0, tokens, 10_000, 10_000)
    r.computed = tokens
    return r


def test_auto_crossover_on_shipped_profile():
    """On the H200 roofline a short victim's re-prefill rides almost free in a memory-bound
    decode step, so recompute wins; beyond a crossover length the compute-bound re-prefill
    costs more than two PCIe transfers, so swap wins — and auto switches exactly there."""
    eng = _auto_engine(32)
    lengths = np.arange(16, 4096, 16)
    ns = lengths.tolist()  # (plain ints: the compiled engine checks annotated types)
    swap = np.array([swap_cost_ns(eng, eng.pool.blocks_for(n)) for n in ns])
    recompute = np.array([recompute_cost_ns(eng, n, 32) for n in ns])
    swap_wins = swap < recompute
    assert not swap_wins[0] and swap_wins[-1]
    crossover = lengths[np.argmax(swap_wins)]
    assert (swap_wins[lengths >= crossover]).all() and not swap_wins[lengths < crossover].any()
    assert 64 <= crossover <= 1024
    for n in (crossover - 16, crossover):
        expect = "swap" if n >= crossover else "recompute"
        assert eng.preemption.how(eng, _victim(int(n))) == expect
    # a victim that would not fit the host space falls back to recompute
    eng.pool.host_used = eng.pool.host_total
    assert eng.preemption.how(eng, _victim(4000)) == "fallback"


# ---- the end-to-end flow (chat_vs_batch) --------------------------------------------------

@pytest.mark.slow
def test_chat_vs_batch_preemption_cuts_interactive_ttft():
    """Interactive TTFT p99 with preemption is >= 2x lower than with preemption off (about 2.2x
    at the vllm-v1 pricing; how much depends on the preset's step times), batch still all
    finishes, and the engine never idles while work waits."""
    on = simulate(load_scenario("chat_vs_batch"))
    off = simulate(load_scenario("chat_vs_batch", overrides=["engine.preemption=\"off\""]))
    p99_on = on.summary_dict["classes"]["interactive"]["ttft_p99_s"]
    p99_off = off.summary_dict["classes"]["interactive"]["ttft_p99_s"]
    assert p99_off >= 2 * p99_on, (p99_on, p99_off)
    for res in (on, off):
        b = res.summary_dict["classes"]["batch"]
        assert b["finished"] == b["arrived"] == 1000
        assert res.summary_dict["run"]["idle_with_work_s"] == 0.0
    assert on.summary_dict["classes"]["batch"]["preemptions"] > 0


def test_thrash_scenario_flags_and_cures():
    """Optimistic admission under memory pressure: the thrash ratio is flagged, and both cures
    (a watermark, a lower max_num_seqs) remove the preemptions and restore capacity."""
    base = simulate(load_scenario("thrash"))
    run = base.summary_dict["run"]
    assert run["thrashing"] and run["thrash_ratio"] > 0.05
    tok = base.summary_dict["overall"]["output_tokens_per_s"]
    for cure in (["engine.watermark=0.2"], ["engine.max_num_seqs=15"]):
        res = simulate(load_scenario("thrash", overrides=cure))
        assert res.summary_dict["run"]["thrash_ratio"] < 0.01
        assert res.summary_dict["overall"]["output_tokens_per_s"] > tok


def test_the_shipped_modes_and_rules_are_registered():
    """Every preemption mode and waiting rule is one class in its registry, under its name; the
    scenario's validation reads the registries (no second list of allowed values)."""
    from sim.core.preemption import PREEMPTION_MODES, WAITING_RULES, PreemptionMode, WaitingRule
    assert PREEMPTION_MODES.names() == ["auto", "off", "recompute", "swap"]
    assert WAITING_RULES.names() == ["never", "policy", "priority", "strict", "threshold"]
    for registry, base in ((PREEMPTION_MODES, PreemptionMode), (WAITING_RULES, WaitingRule)):
        for name in registry.names():
            cls = registry.resolve(name)
            assert issubclass(cls, base) and cls.name == name
    assert [n for n in PREEMPTION_MODES.names() if not PREEMPTION_MODES.resolve(n).grows_blocks] == ["off"]
    assert [n for n in WAITING_RULES.names() if not WAITING_RULES.resolve(n).evicts] == ["never"]


def test_a_new_preemption_mode_is_one_file():
    """tests/plugins/short_swap.py, named by dotted path, is all a new mode takes: it swaps short
    victims and recomputes long ones, where 'swap' swaps them all."""
    over = ["engine.swap_blocks=100000"]
    swap = simulate(load_scenario("thrash", overrides=over + ['engine.preemption="swap"']))
    mine = simulate(load_scenario("thrash", overrides=over + ['engine.preemption="tests.plugins.short_swap:ShortSwap"']))
    assert set(swap.summary_dict["run"]["preemptions_by_mode"]) == {"swap"}
    modes = mine.summary_dict["run"]["preemptions_by_mode"]
    assert modes.get("swap", 0) > 0 and modes.get("recompute", 0) > 0


def test_a_new_waiting_rule_is_one_file():
    """tests/plugins/any_lower.py, named by dotted path, is all a new waiting rule takes: waiters
    of the urgent class evict batch requests as 'strict' lets them (the same rule,
    written anew)."""
    def batch_preemptions(rule):
        res = simulate(load_scenario("chat_vs_batch", overrides=[f'engine.preempt_for_waiting="{rule}"']))
        return res.summary_dict["classes"]["batch"]["preemptions"]
    mine = batch_preemptions("tests.plugins.any_lower:AnyLower")
    assert mine == batch_preemptions("strict") > 0


def test_a_class_of_the_wrong_kind_is_refused_in_one_line():
    """A dotted path to something that is not a mode is a scenario error naming the key."""
    from sim.core.errors import ScenarioError
    with pytest.raises(ScenarioError, match=r"engine\.preemption: expected a sim\.core\.preemption\.PreemptionMode"):
        load_scenario(None, overrides=['engine.preemption="tests.plugins.any_lower:AnyLower"'])
