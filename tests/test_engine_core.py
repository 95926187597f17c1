"""The engine's core promises: nothing lost, KV conserved, deterministic output, decode steps
priced as the cost function prices them (that fast-forward is exact: tests/test_exactness.py)."""
from __future__ import annotations

import hashlib

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sim import scenario_from_dict, simulate
from tests.conftest import small_scenario
from tests.test_exactness import OVERHEADS


def _check_nothing_lost(res, n_arrivals=None):
    r = res.requests
    assert r["request_id"].is_unique
    assert set(r["status"]) <= {"finished", "rejected", "unfinished"}
    fin = r[r.status == "finished"]
    assert (fin["generated_tokens"] == fin["output_tokens"]).all()
    assert (fin["first_token_s"] >= fin["arrival_s"]).all()
    assert (fin["finish_s"] >= fin["first_token_s"]).all()
    rej = r[r.status == "rejected"]
    assert (rej["reject_reason"] != "").all()
    if n_arrivals is not None:
        assert len(r) == n_arrivals


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    kv_blocks=st.integers(20, 120),
    max_num_seqs=st.integers(1, 12),
    budget=st.integers(32, 600),
    preemption=st.sampled_from(["off", "recompute", "swap", "auto"]),
    pfw=st.sampled_from(["never", "priority", "strict", "threshold"]),
    swap_blocks=st.integers(0, 40),
    chunked=st.booleans(),
    drain=st.booleans(),
    watermark=st.sampled_from([0.0, 0.05]),
    reserved=st.integers(0, 10),
    cap=st.sampled_from([0, 30, 100]),
)
# the cohort's last member evicted for a waiter: a later joiner must not count a step ahead
@example(seed=254, kv_blocks=25, max_num_seqs=1, budget=32, preemption="recompute", pfw="priority",
         swap_blocks=0, chunked=True, drain=False, watermark=0.0, reserved=0, cap=0)
def test_invariants_on_random_scenarios(seed, kv_blocks, max_num_seqs, budget, preemption, pfw,
                                        swap_blocks, chunked, drain, watermark, reserved, cap):
    """Every arrival ends in exactly one status, finished requests got exactly their output
    tokens, KV blocks are conserved after every event (checked inside the run)."""
    sc = small_scenario(seed=seed, horizon_s=8.0, drain=drain)
    e = sc["engine"]
    e.update(kv_blocks=kv_blocks, max_num_seqs=max_num_seqs, max_batched_tokens=budget,
             preemption=preemption, preempt_for_waiting=pfw, swap_blocks=swap_blocks,
             chunked_prefill=chunked, watermark=watermark)
    sc["classes"][0]["reserved_blocks"] = reserved
    sc["classes"][1]["max_prefill_tokens_per_step"] = cap
    res = simulate(scenario_from_dict(sc), check_invariants=True)
    _check_nothing_lost(res)
    if drain:
        assert (res.requests.status != "unfinished").all()
    ts = res.timeseries
    assert (ts["kv_blocks_used"] <= kv_blocks).all()


def _digest(path):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())
            if p.name != "perf.json"}


def test_same_seed_same_bytes(tmp_path):
    sc = small_scenario()
    a = simulate(scenario_from_dict(sc)).save(tmp_path / "a")
    b = simulate(scenario_from_dict(sc)).save(tmp_path / "b")
    assert _digest(a) == _digest(b)
    assert {"requests.parquet", "summary.json", "timeseries.parquet"} <= set(_digest(a))
    c = simulate(scenario_from_dict(small_scenario(seed=4))).save(tmp_path / "c")
    assert _digest(a)["requests.parquet"] != _digest(c)["requests.parquet"]


@pytest.mark.parametrize("over", [{}, {"drain": False, "horizon_s": 12.0},
                                  {"engine__preemption": "swap", "engine__overhead": "vllm-v1-async"}])
def test_a_replica_alone_runs_the_same_on_a_lone_clock_as_on_simpys_queue(monkeypatch, over):
    """A replica alone runs on a LoneClock (its loop's delays, no event queue): the same tables
    as the same loop run as a SimPy process."""
    import pandas as pd

    from sim import run as run_module
    sc = scenario_from_dict(small_scenario(**over))
    lone = simulate(sc)
    monkeypatch.setattr(run_module, "LONE_CLOCK", False)
    queued = simulate(sc)
    pd.testing.assert_frame_equal(lone.requests, queued.requests)
    pd.testing.assert_frame_equal(lone.timeseries, queued.timeseries)
    assert lone.summary_dict["run"]["end_s"] == queued.summary_dict["run"]["end_s"]


def test_a_lone_clock_refuses_a_second_process():
    """Nothing else may schedule on a LoneClock: an event left in its queue is an error."""
    from sim.assembly import LoneClock, Setup

    env = LoneClock()
    env.timeout(5)  # (the replica loop's delay: nothing scheduled)
    env.event().succeed()  # (another process's event: scheduled, never to be processed)
    setup = Setup(env, None, None, None, 0, 1, None, None)
    with pytest.raises(RuntimeError, match="runs one process"):
        setup.run(iter([3, 4]))


def test_too_large_is_rejected_at_arrival(run):
    """A request whose prompt + max_tokens can never fit the pool is rejected, not deadlocked."""
    sc = small_scenario(engine__kv_blocks=20)  # 320 tokens: many lo requests cannot fit
    res = run(sc)
    r = res.requests
    big = (r.prompt_tokens + r.max_tokens) > 320
    assert big.any()
    assert (r.loc[big, "status"] == "rejected").all()
    assert (r.loc[big, "reject_reason"] == "too_large").all()
    assert (r.loc[big, "finish_s"].isna()).all()
    assert (r.loc[~big, "status"] == "finished").all()


def test_preemption_off_never_preempts(run):
    res = run(small_scenario(engine__preemption="off", engine__preempt_for_waiting="never"))
    assert res.requests["preemptions"].sum() == 0
    assert (res.requests.status == "finished").all()


def test_horizon_without_drain_marks_unfinished(run):
    sc = small_scenario(drain=False, horizon_s=5.0)
    sc["streams"][1]["arrival"] = {"process": "poisson", "rate": 20.0}
    res = run(sc)
    assert (res.requests.status == "unfinished").any()
    assert res.summary_dict["run"]["end_s"] <= 5.0 + 1.0  # stops at the first step boundary after it


def test_summary_has_the_promised_metrics(run):
    res = run(small_scenario())
    cls = res.summary_dict["classes"]["hi"]
    for key in ("arrived", "finished", "rejected", "unfinished", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s",
                "e2e_p50_s", "e2e_p99_s", "tpot_p50_s", "tpot_p99_s", "queue_wait_p50_s", "queue_wait_p99_s",
                "output_tokens_per_s", "preemptions", "slo_attainment", "itl_p50_s", "itl_p99_s",
                "itl_std_s", "swap_s", "recompute_s"):
        assert key in cls, key
    assert "overall" in res.summary_dict and "tenants" in res.summary_dict
    for key in ("thrash_ratio", "thrashing", "engine_events", "iterations"):
        assert key in res.summary_dict["run"]
    ts = res.timeseries
    for col in ("t_s", "class", "waiting", "running", "kv_blocks_used", "tokens_per_s", "swap_blocks_used",
                "preemptions"):
        assert col in ts.columns


@pytest.mark.parametrize("overhead", OVERHEADS + ["none"])
def test_decode_line_prices_exactly_like_step_ns(overhead):
    """Fast-forwarded runs price decode steps with a cached line per batch size; it must agree
    with the full cost function to the nanosecond on every shipped profile (analytic, with
    token knots, and measured, whose tables take the slow path)."""
    import random
    from pathlib import Path
    from sim.core.costs import NS, load_profile
    root = Path(__file__).resolve().parents[1]
    paths = sorted((root / "sim" / "core" / "profiles").glob("*.json"))
    rng = random.Random(0)
    for path in paths:
        cm = load_profile(str(path), root, overhead=overhead)
        for _ in range(400):
            D = rng.randint(1, 512)
            ctx = D * rng.randint(1, 32_000)
            line = cm.decode_line(D)
            want = cm.step_ns(0, D, 0, 0, ctx)
            got = cm.step_ns(0, D, 0, 0, ctx) if line is None else round((line[0] + line[1] * ctx) * NS)
            assert got == want, (path.name, D, ctx)


def test_no_decode_line_when_a_step_could_round_below_one_ns():
    """``step_ns`` prices a step at 1 ns at least; a line is offered only when it never rounds
    below that (fast-forwarded runs then need no clamp): a profile whose decode steps cost
    nothing or well under a nanosecond, or whose context term is negative, has none (its runs
    are priced by ``step_ns``)."""
    from dataclasses import replace
    from sim.core.costs import CostModel, StepCoefficients
    free = CostModel(name="free", meta={}, shape=None, step=StepCoefficients())
    assert free.decode_line(4) is None and free.step_ns(0, 4, 0, 0, 100) == 1
    odd = replace(free, step=StepCoefficients(base_s=0.01, decode_ctx_s=-1e-9))
    assert odd.decode_line(4) is None
    tiny = replace(free, step=StepCoefficients(base_s=4e-10, decode_ctx_s=1e-12))
    assert tiny.decode_line(1) is None  # (0.4 ns rounds to 0: step_ns says 1)
    fine = replace(free, step=StepCoefficients(base_s=6e-10, decode_ctx_s=1e-12))
    a, b = fine.decode_line(1)
    assert all(round((a + b * c) * 1e9) == fine.step_ns(0, 1, 0, 0, c) >= 1 for c in (0, 1, 10**6))
