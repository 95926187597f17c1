"""Prefix caching: shared, reference-counted blocks; eviction; conservation with caching on;
the Mooncake trace's reuse rate."""
from __future__ import annotations

import copy
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.base import BasePolicy, RankingContext
from sim import load_scenario, scenario_from_dict, simulate
from sim.core.prefix_cache import PrefixCache
from tests.conftest import small_scenario



def test_cache_refcounts_and_tail_first_eviction():
    c = PrefixCache(64, 16)
    for h in (1, 2, 3):
        assert c.publish(h)
    assert not c.publish(2)  # already cached: the offering request keeps its own copy
    held = c.acquire((1, 2, 3, 9), 3)
    assert held == (1, 2, 3) and c.refs == {1: 2, 2: 2, 3: 2}
    c.release(held)
    c.release((1, 2, 3))  # the publishers' references
    assert list(c.lru) == [3, 2, 1]  # tail released first, so evicted first
    assert c.evictable_blocks == 3 * 4
    assert c.evict_one() == 4 and 3 not in c.refs
    assert c.hit_groups(64 * 4 + 1, (1, 2, 3, 4)) == 2  # 3 was evicted: the chain stops
    assert c.missed_after_eviction(64 * 4 + 1, (1, 2, 3, 4), 2) == 1
    with pytest.raises(AssertionError):
        c.release((2,))  # its count is already 0


def _prefix_scenario(**eng):
    sc = small_scenario(horizon_s=10.0)
    sc["engine"].update({"prefix_caching": True, "prefix_block_tokens": 32, "kv_blocks": 200, **eng})
    for s in sc["streams"]:
        s["prefix"] = {"system_tokens": 64, "conversations": 4, "block_tokens": 32}
    return sc


def test_shared_prefix_is_not_prefilled_again(run):
    res = run(_prefix_scenario(), trace_iterations=True)
    r = res.requests
    assert r["prefix_hit_tokens"].sum() > 0
    it = res.iterations
    first = it[it.kind == "prefill"].groupby("request_id")["tokens"].sum()
    joined = r.set_index("request_id").loc[first.index]
    # every request prefilled exactly its prompt minus what it found cached
    assert (first == joined["prompt_tokens"] - joined["prefix_hit_tokens"]).all()
    assert res.summary_dict["classes"]["hi"]["prefix_hit_rate"] > 0


def test_prefix_caching_off_changes_nothing_else(run):
    sc = _prefix_scenario()
    sc["engine"]["prefix_caching"] = False
    res = run(sc)
    assert res.requests["prefix_hit_tokens"].sum() == 0


@pytest.mark.parametrize("preemption", ["recompute", "auto"])
def test_prefix_aware_victims_are_chosen_alike_with_the_cohort(run, preemption):
    """``engine.victim = "prefix_aware"`` prices each candidate by its progress and blocks; a
    waiter's candidates include the decode cohort's members, whose fields are brought up to date
    before they are priced, so the cohort (and fast-forward) choose the victims stepping does
    (without the sync they read the progress of the member's last sync: other victims, other
    preemption counts)."""
    sc = small_scenario(seed=45, horizon_s=20.0, policy={"name": "priority"})
    sc["engine"].update(max_num_seqs=4, max_batched_tokens=128, kv_blocks=128, preemption=preemption,
                        victim="prefix_aware", timeseries_interval_s=3.0)
    sc["streams"][0]["arrival"]["rate"] = 4.0
    stepped = copy.deepcopy(sc)
    stepped["engine"].update(fast_forward=False, lazy_batch=False)
    ref = run(stepped)
    assert ref.requests["preemptions"].sum() > 0
    for ff, lazy in ((True, True), (False, True)):
        sc["engine"].update(fast_forward=ff, lazy_batch=lazy)
        pd.testing.assert_frame_equal(ref.requests, run(sc).requests)


@settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 1000), kv_blocks=st.integers(30, 150),
       preemption=st.sampled_from(["recompute", "swap", "auto", "off"]),
       pfw=st.sampled_from(["never", "strict", "priority"]), convs=st.integers(0, 5),
       max_num_seqs=st.integers(1, 10), victim=st.sampled_from(["rank", "prefix_aware"]))
def test_block_pool_invariants_with_shared_blocks(seed, kv_blocks, preemption, pfw, convs, max_num_seqs, victim):
    """Reference counts never negative, a shared block never freed while referenced (the
    engine's check compares every group's count with its holders after every event), and
    free + owned + cached == total."""
    sc = _prefix_scenario(kv_blocks=kv_blocks, preemption=preemption, preempt_for_waiting=pfw,
                          max_num_seqs=max_num_seqs, victim=victim)
    sc["seed"] = seed
    for s in sc["streams"]:
        s["prefix"]["conversations"] = convs
    res = simulate(scenario_from_dict(sc), check_invariants=True)
    r = res.requests
    fin = r[r.status == "finished"]
    assert (fin.generated_tokens == fin.output_tokens).all()
    assert (r.status != "unfinished").all()


@pytest.mark.slow
def test_mooncake_unbounded_hit_rate_matches_trace():
    """With a pool that never evicts, the prefix hit rate is the trace's reuse: 37.4 % of
    prompt tokens (workloads/data/README.md), within 2 points."""
    res = simulate(load_scenario("mooncake_prefix", overrides=["engine.kv_blocks=10000000", "horizon_s=3600.0"]))
    rate = res.summary_dict["classes"]["chat"]["prefix_hit_rate"]
    assert abs(rate - 0.374) < 0.02, rate
    assert res.summary_dict["run"]["prefix_evictions"] == 0


def test_mooncake_under_pressure_reports_evicted_recompute():
    res = simulate(load_scenario("mooncake_prefix", overrides=["horizon_s=300.0", "engine.kv_blocks=20000"]))
    c = res.summary_dict["classes"]["chat"]
    assert res.summary_dict["run"]["prefix_evictions"] > 0
    assert c["evicted_miss_tokens"] > 0 and c["evicted_miss_prefill_s"] > 0


def test_lpm_trades_order_for_hit_rate(run):
    """Longest-prefix-match (SGLang) on a queue of conversations sharing prefixes reuses more of
    the cache than strict priority does, while keeping class priority first."""
    rates = {}
    for pol in ("priority", "lpm"):
        sc = small_scenario(horizon_s=60.0)
        sc["engine"].update({"prefix_caching": True, "prefix_block_tokens": 32, "kv_blocks": 120, "max_num_seqs": 4})
        sc["policy"] = {"name": pol}
        for s in sc["streams"]:
            s["prefix"] = {"system_tokens": 0, "conversations": 6, "block_tokens": 32}
            s["arrival"]["rate"] *= 1.5
        res = run(sc)
        r = res.requests
        rates[pol] = r["prefix_hit_tokens"].sum() / r.loc[r.admitted_s.notna(), "prompt_tokens"].sum()
    assert rates["lpm"] > rates["priority"] + 0.1, rates


class PrefixSpy(BasePolicy):
    """A user's prefix-aware policy: FCFS keys; reports what the engine told it."""

    name = "prefix_spy"
    dynamic = True
    needs_prefix_info = True

    def __init__(self) -> None:
        super().__init__()
        self.told: list = []  # (queue_len, {request id: cached tokens}) per re-key
        self.wrote: list = []  # request ids whose policy-visible ``predicted`` was filled

    def before_ranking(self, ctx: RankingContext) -> None:
        self.told.append((ctx.queue_len, dict(ctx.cached_prefix_tokens)))

    def key(self, req, now: float) -> tuple:
        if req.predicted:
            self.wrote.append(req.request_id)
        return (req.arrival_s, req.request_id)

    def report(self) -> dict:
        return {"told": self.told, "wrote": self.wrote}


def test_prefix_aware_policy_is_told_through_the_ranking_context(run):
    """Before each re-key the engine passes the policy a RankingContext: the queue length and
    every waiting request's cached prefix (some of them hit the shared system prompt); it writes
    nothing into the policy-visible ``predicted`` dict."""
    sc = _prefix_scenario()
    sc["policy"] = {"name": "tests.test_prefix:PrefixSpy"}
    rep = run(sc).summary_dict["run"]["policy"]
    told = rep["told"]
    assert told and all(n == len(cached) for n, cached in told)
    assert any(v > 0 and v % 32 == 0 for _, cached in told for v in cached.values())
    assert rep["wrote"] == []

def test_older_prefix_policies_still_read_queue_len():
    """A policy written before the ranking context (needs_prefix_info, reads ``self.queue_len``)
    keeps working: BasePolicy's default before_ranking sets it."""
    class Older(BasePolicy):
        name = "older"
        needs_prefix_info = True

    p = Older()
    p.before_ranking(RankingContext(1.0, 7, {3: 64}))
    assert p.queue_len == 7


def test_prefix_aware_policy_under_the_fairness_accountant_is_told_too(run):
    """Wrapped by the fairness accountant (the scenario has tenants), a prefix-aware policy is
    told the same ranking context as unwrapped."""
    sc = _prefix_scenario()
    sc["policy"] = {"name": "tests.test_prefix:PrefixSpy"}
    sc["fairness"] = {"enabled": True}
    rep = run(sc).summary_dict["run"]["policy"]
    assert "fairness" in rep
    told = rep["told"]
    assert told and all(n == len(cached) for n, cached in told)
    assert any(v > 0 and v % 32 == 0 for _, cached in told for v in cached.values())
