"""The fairness accountant: charging, lifting, class order, its bound, and the tenant flood."""
from __future__ import annotations

import pandas as pd
import pytest

from policies import make_policy
from sim import load_scenario, scenario_from_dict, simulate
from sim.core.fairness import FairShare
from sim.core.request import Request

LINEAR = {"kind": "linear", "base_s": 0.005, "prefill_token_s": 1e-5, "decode_token_s": 1e-3,
          "context_token_s": 0.0}


def _req(i, tenant, prio=0, prompt=100, max_tokens=50, t_ns=0):
    return Request(i, t_ns, tenant, "c", 0, prio, prompt, 10, max_tokens)


def _fair(**kw):
    return FairShare(make_policy("priority"), **kw)


def test_charges_prompt_and_output_at_vtc_prices_and_gpu_by_token_share():
    f = _fair(measure="tokens")
    a, b = _req(0, "a"), _req(1, "b")
    f.on_arrival(a, 0.0)
    f.on_arrival(b, 0.0)
    # one step: a prefills its whole prompt (100 tokens, first token out), b a 30-token chunk
    # (told after the step, as the engine tells it: ``computed`` includes the step's tokens)
    a.generated, a.computed, b.computed = 1, 100, 30
    f.on_scheduled(a, 100, 0.4, 0.4)
    f.on_scheduled(b, 30, 0.4, 0.4)
    assert f.counter("a") == 100 * 1 + 1 * 2
    assert f.counter("b") == 30
    assert f.gpu["a"] == pytest.approx(0.4 * 100 / 130) and f.gpu["b"] == pytest.approx(0.4 * 30 / 130)
    # a fast-forwarded run of 5 decode steps: 5 output tokens at price 2
    a.generated, a.computed = 6, 105
    f.on_scheduled(a, 5, 0.05, 0.45)
    assert f.counter("a") == 102 + 10
    # recompute after a preemption re-prefills prompt + generated: not charged again
    f.on_preempt(a, 0.5)
    a.computed = 106
    f.on_scheduled(a, 106, 0.1, 0.6)
    assert f.counter("a") == 112


def test_shares_weight_the_counters():
    f = _fair(shares={"big": 2.0})
    r = _req(0, "big")
    f.on_arrival(r, 0.0)
    r.computed = 100  # (the step's tokens computed, as the engine tells it)
    f.on_scheduled(r, 100, 0.1, 0.1)
    assert f.counter("big") == 50 and f.raw_tok["big"] == 100


def test_returning_tenant_is_lifted_to_min_backlogged_counter():
    f = _fair()
    a1, a2, b1 = _req(0, "a"), _req(1, "a"), _req(2, "b")
    f.on_arrival(a1, 0.0)
    f.on_arrival(a2, 0.0)
    a1.computed = 100
    f.on_scheduled(a1, 100, 0.1, 0.1)  # a1 admitted and charged 100; a2 still waiting
    assert f.counter("a") == 100 and f.waiting_n["a"] == 1  # (books are settled lazily)
    f.on_arrival(b1, 0.2)  # b was idle: lifted to a's counter, banks no credit
    assert f.counter("b") == f.counter("a") == 100
    assert f.lifts == 1


def test_lift_forgives_debt_beyond_the_in_flight_allowance():
    f = _fair(max_num_seqs=2)
    a, b = _req(0, "a", prompt=10, max_tokens=10), _req(1, "b", prompt=10, max_tokens=10)
    f.on_arrival(a, 0.0)
    f.tok["b"] = 1e6  # b consumed a lot long ago
    f.on_arrival(b, 1.0)
    # C = 10 + 2 x 10 = 30 per request, N = 2 in flight: U = 60
    assert f.counter("b") == pytest.approx(f.counter("a") + 60)


def test_lift_forgives_gpu_seconds_debt_beyond_the_in_flight_allowance():
    """The GPU-seconds counters are lifted as the token counters are: at most the backlogged
    minimum plus N_t x the most GPU time one finished request was charged (here 0.3 s)."""
    f = _fair(max_num_seqs=2, measure="gpu_seconds")
    a, b, c = _req(0, "a"), _req(1, "b"), _req(2, "a")
    f.on_arrival(a, 0.0)
    f.on_arrival(b, 0.0)
    a.computed, b.computed = 100, 100
    f.on_scheduled(a, 100, 0.6, 0.6)  # (0.3 s each: split by tokens)
    f.on_scheduled(b, 100, 0.6, 0.6)
    f.on_finish(b, 0.7)
    f.on_arrival(c, 0.8)  # a keeps c waiting: a is backlogged
    f.gpu["b"] = 1e6  # b consumed a lot long ago
    b2 = _req(3, "b")
    f.on_arrival(b2, 1.0)
    assert f.gpu["b"] == pytest.approx(f.gpu["a"] + 2 * 0.3)


def test_class_order_wins_over_counters():
    f = _fair()
    hi, lo = _req(0, "heavy", prio=0), _req(1, "light", prio=1)
    f.on_arrival(hi, 0.0)
    f.on_arrival(lo, 0.0)
    f.tok["heavy"] = 1e9
    assert f.key(hi, 1.0) < f.key(lo, 1.0)
    # inside a class, the under-served tenant first; a tenant's own requests keep inner order
    x, y, z = _req(2, "light"), _req(3, "heavy"), _req(4, "light", t_ns=5)
    assert f.key(x, 1.0) < f.key(y, 1.0) and f.key(x, 1.0) < f.key(z, 1.0)


def _two_tenants(fair: dict, **engine):
    stream = {"class": "i", "arrival": {"process": "poisson", "rate": 40.0},
              "prompt_tokens": 64, "output_tokens": {"dist": "uniform", "low": 5, "high": 40}, "max_tokens": 40}
    d = {"name": "pair", "seed": 3, "horizon_s": 20.0, "drain": False,
         "engine": {"profile": LINEAR, "kv_blocks": 2048, "max_num_seqs": 4, **engine},
         "policy": {"name": "priority"}, "classes": [{"name": "i", "priority": 0}],
         "streams": [{**stream, "tenant": "f"}, {**stream, "tenant": "g", "arrival": {"process": "poisson", "rate": 120.0}}],
         "tenants": [{"name": "f", "share": 1.0}, {"name": "g", "share": 1.0}],
         "fairness": fair}
    return simulate(scenario_from_dict(d))


def test_accountant_bound_holds_and_split_is_fair():
    # both tenants ask far more than the replica serves, so both stay backlogged
    res = _two_tenants({"enabled": True, "window_s": 2.0})
    fr = res.summary_dict["run"]["policy"]["fairness"]
    # C = 64 + 2 x 40 = 144 per request, N = 4 in flight: U = 576, bound 2U = 1152
    assert fr["counter_gap_bound"] == pytest.approx(1152)
    assert 0 < fr["max_counter_gap"] <= fr["counter_gap_bound"]
    # per window (both backlogged throughout): service differs by at most 4U = 2304 tokens
    for w in fr["windows"][1:]:
        assert abs(w["f"] - w["g"]) <= 2 * fr["counter_gap_bound"], w
    t = fr["tenants"]
    assert abs(t["f"]["token_share"] - 0.5) < 0.05
    # without the accountant the 3x heavier tenant takes ~3/4
    off = _two_tenants({"enabled": False})
    assert off.summary_dict["run"]["policy"]["fairness"]["tenants"]["g"]["token_share"] > 0.65


def test_weighted_split_follows_shares():
    stream = {"class": "i", "arrival": {"process": "poisson", "rate": 100.0},
              "prompt_tokens": 64, "output_tokens": 20, "max_tokens": 20}
    d = {"name": "w", "seed": 1, "horizon_s": 15.0, "drain": False,
         "engine": {"profile": LINEAR, "kv_blocks": 2048, "max_num_seqs": 4},
         "classes": [{"name": "i", "priority": 0}], "policy": {"name": "fcfs"},
         "streams": [{**stream, "tenant": "f"}, {**stream, "tenant": "g"}],
         "tenants": [{"name": "f", "share": 2.0}, {"name": "g", "share": 1.0}],
         "fairness": {"enabled": True}}
    fr = simulate(scenario_from_dict(d)).summary_dict["run"]["policy"]["fairness"]["tenants"]
    assert fr["f"]["token_share"] == pytest.approx(2 / 3, abs=0.04)


def test_disabled_accountant_only_keeps_books():
    a = _two_tenants({"enabled": False})
    # the same scenario without [fairness]/[[tenants]]: an identical requests table
    stream = {"class": "i", "arrival": {"process": "poisson", "rate": 40.0},
              "prompt_tokens": 64, "output_tokens": {"dist": "uniform", "low": 5, "high": 40}, "max_tokens": 40}
    plain = {"name": "pair", "seed": 3, "horizon_s": 20.0, "drain": False,
             "engine": {"profile": LINEAR, "kv_blocks": 2048, "max_num_seqs": 4},
             "policy": {"name": "priority"}, "classes": [{"name": "i", "priority": 0}],
             "streams": [{**stream, "tenant": "f"}, {**stream, "tenant": "g", "arrival": {"process": "poisson", "rate": 120.0}}]}
    b = simulate(scenario_from_dict(plain))
    cols = ["request_id", "status", "first_token_s", "finish_s", "generated_tokens"]
    assert a.requests[cols].equals(b.requests[cols])
    ten = a.summary_dict["tenants"]["f"]
    for k in ("token_share", "gpu_s_share", "priced_token_share", "ttft_p50_s", "ttft_p99_s", "rejected"):
        assert k in ten
    assert b.summary_dict["tenants"]["f"]["gpu_s_share"] is None


# ---- the tenant flood --------------------------------------------------------------------------

def _flood(on: bool):
    # priced without engine overhead, the step prices the flood's rates were sized against
    return simulate(load_scenario("tenant_flood", overrides=[f"fairness.enabled={str(on).lower()}", "horizon_s=15",
                                                             'engine.overhead="none"']))


def _share_while_both_backlogged(res) -> float:
    rq = res.requests
    ts = res.timeseries.drop_duplicates("t_s").set_index("t_s")
    both = []
    for t in ts.index:
        ok = True
        for ten in ("small", "flood"):
            g = rq[rq["tenant"] == ten]
            waiting = (g["arrival_s"] <= t) & ~(g["admitted_s"] <= t)  # queued at instant t
            ok &= bool(waiting.any())
        if ok:
            both.append(t)
    assert len(both) >= 0.6 * len(ts)
    a = ts.loc[both, "tenant_tokens_per_s[small]"].sum()
    b = ts.loc[both, "tenant_tokens_per_s[flood]"].sum()
    return a / (a + b)


def test_tenant_flood_fair_split_and_small_tenant_ttft():
    off, on = _flood(False), _flood(True)
    s_off, s_on = _share_while_both_backlogged(off), _share_while_both_backlogged(on)
    assert s_off < 0.2  # the flood takes most of the tokens
    assert abs(s_on - 0.5) <= 0.05, s_on
    p99_off = off.summary_dict["tenants"]["small"]["ttft_p99_s"]
    p99_on = on.summary_dict["tenants"]["small"]["ttft_p99_s"]
    assert p99_off >= 3 * p99_on, (p99_off, p99_on)
    fr = on.summary_dict["run"]["policy"]["fairness"]
    assert fr["max_counter_gap"] <= fr["counter_gap_bound"]


@pytest.mark.parametrize("policy", ["priority", "fcfs", "srpt_oracle", "wfq", "aging"])
@pytest.mark.parametrize("measure", ["tokens", "gpu_seconds"])
def test_tenant_queues_equal_rekeying_every_waiting_request(policy, measure, monkeypatch):
    """Per-(class, tenant) queues with the accountant choosing among their heads give the same
    requests table, time series and books as re-keying every waiting request before each plan:
    three tenants (unequal shares) over two classes, with evictions for waiters."""
    from tests.conftest import small_scenario

    d = small_scenario(seed=5, horizon_s=15.0)
    d["engine"].update(max_num_seqs=6, kv_blocks=48)
    d["policy"] = {"name": policy}
    d["streams"].append({**d["streams"][1], "tenant": "c", "class": "hi",
                         "arrival": {"process": "poisson", "rate": 3.0}})
    d["tenants"] = [{"name": "a", "share": 1.0}, {"name": "b", "share": 2.0}, {"name": "c", "share": 0.5}]
    d["fairness"] = {"enabled": True, "measure": measure}
    a = simulate(scenario_from_dict(d), check_invariants=True)
    monkeypatch.setattr(FairShare, "waiting_queues", lambda self: None)
    b = simulate(scenario_from_dict(d))
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.timeseries, b.timeseries)
    assert a.summary_dict["run"]["policy"] == b.summary_dict["run"]["policy"]


def test_tenant_queues_equal_rekeying_on_tenant_flood(monkeypatch):
    a = simulate(load_scenario("tenant_flood", overrides=["horizon_s=8"]))
    monkeypatch.setattr(FairShare, "waiting_queues", lambda self: None)
    b = simulate(load_scenario("tenant_flood", overrides=["horizon_s=8"]))
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.timeseries, b.timeseries)


# ---- fast-forwarded runs are booked as stepping books them --------------------------------------

def test_a_run_is_booked_step_by_step():
    """``on_scheduled_run`` gives the books of the same steps told one by one: each step's
    tokens in the window of its own end, its seconds split among the requests in it (one of
    which leaves after two steps), the counter gap checked after each step."""
    durations = [300_000_000, 250_000_000, 400_000_000, 450_000_000]  # ends 0.3, 0.55, 0.95, 1.4 s
    books = []
    for whole in (False, True):
        f = _fair(measure="gpu_seconds", window_s=0.5, shares={"b": 2.0})
        a, b, w = _req(0, "a"), _req(1, "b"), _req(2, "b")
        for r in (a, b, w):
            f.on_arrival(r, 0.0)
        # a decodes; b's prompt finishes in the first step (``computed``: as the engine leaves it)
        a.generated, b.generated, a.computed = 3, 0, 102
        if whole:
            a.generated, b.generated, a.computed, b.computed = 7, 2, 106, 101
            f.on_scheduled_run([(a, 1, 4), (b, 100, 2)], 0, durations)
        else:
            end = 0
            for j, d in enumerate(durations):
                end += d
                a.generated += 1
                a.computed += 1
                f.on_scheduled(a, 1, d / 1e9, end / 1e9)
                if j < 2:
                    b.generated += 1
                    b.computed += 100 if j == 0 else 1
                    f.on_scheduled(b, 100 if j == 0 else 1, d / 1e9, end / 1e9)
        books.append(f.report())
    assert books[0] == books[1]
    assert [w["start_s"] for w in books[1]["fairness"]["windows"]] == [0.0, 0.5, 1.0]


@pytest.mark.parametrize("enabled", [True, False])
@pytest.mark.parametrize("measure", ["tokens", "gpu_seconds"])
def test_fast_forward_keeps_the_accountants_books(enabled, measure):
    """Fast-forwarded runs and stepping give the same requests table and the same fairness
    report: per-window service (runs cross window edges), GPU seconds, counters, the gap."""
    from tests.conftest import small_scenario

    d = small_scenario(seed=7, horizon_s=12.0)
    d["engine"].update(kv_blocks=400)
    d["tenants"] = [{"name": "a", "share": 1.0}, {"name": "b", "share": 2.0}]
    d["fairness"] = {"enabled": enabled, "measure": measure, "window_s": 0.5}
    fast = simulate(scenario_from_dict(d))
    d["engine"].update(fast_forward=False, lazy_batch=False)
    stepped = simulate(scenario_from_dict(d))
    pd.testing.assert_frame_equal(fast.requests, stepped.requests)
    assert fast.summary_dict["run"]["policy"] == stepped.summary_dict["run"]["policy"]
    assert fast.summary_dict["run"]["engine_events"] < stepped.summary_dict["run"]["engine_events"]


def test_a_cached_prefix_and_a_prefill_elsewhere_are_not_charged_as_prompt(tmp_path):
    """Prompt tokens are charged where they are prefilled: a request that hits the prefix cache
    pays for the rest of its prompt only, and its decode steps never as prompt tokens (they were,
    one a step, until the charged prompt reached the whole prompt); a disaggregated decode
    replica charges no prompt and not the token its prefill replica sampled (and charged)."""
    import json

    rows = [(0, 100, [1, 2, 3]), (1000, 100, [1, 2, 9]), (2000, 96, [1, 2, 3]), (3000, 200, [1, 2, 3, 4, 5, 6])]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"timestamp": t, "input_length": n, "output_length": 3,
                                                          "hash_ids": h}) + "\n" for t, n, h in rows))
    d = {"name": "p", "seed": 0, "horizon_s": 10.0,
         "engine": {"profile": dict(LINEAR), "kv_blocks": 1000, "block_size": 16, "prefix_caching": True,
                    "prefix_block_tokens": 32},
         "classes": [{"name": "i", "priority": 0}], "tenants": [{"name": "t"}], "fairness": {"enabled": True},
         "streams": [{"class": "i", "tenant": "t", "trace": {"format": "mooncake", "path": "p.jsonl",
                                                             "spread_bucket_s": 0}}]}
    res = simulate(scenario_from_dict(d, base_dir=tmp_path))
    r = res.requests
    assert r.prefix_hit_tokens.sum() > 0
    books = res.summary_dict["run"]["policy"]["fairness"]["tenants"]["t"]["tokens_charged"]
    assert books == (r.prompt_tokens - r.prefix_hit_tokens).sum() + 2 * r.generated_tokens.sum()
    # 1 prefill + 1 decode replica: the two replicas' books add up to one prefill and the output
    from tests.conftest import small_scenario

    d = small_scenario()
    d.update(horizon_s=4.0, fairness={"enabled": True}, tenants=[{"name": "a"}, {"name": "b"}])
    d["engine"].update(kv_blocks=4000, preemption="off")
    d["engine"].pop("swap_blocks", None)
    d["cluster"] = {"groups": [{"name": "p", "role": "prefill", "replicas": 1},
                               {"name": "d", "role": "decode", "replicas": 1}],
                    "link": {"bandwidth_bytes_per_s": 50e9, "latency_s": 1e-5, "kv_bytes_per_token": 131072,
                             "layers": 32}}
    res = simulate(scenario_from_dict(d), per_replica=True)
    r = res.requests
    assert (r.status == "finished").all() and len(r) > 10
    books = {}
    for rep in res.replicas:
        for t, v in rep.summary_dict["run"]["policy"]["fairness"]["tenants"].items():
            books[t] = books.get(t, 0) + v["tokens_charged"]
    for t, g in r.groupby("tenant"):
        assert books[t] == g.prompt_tokens.sum() + 2 * g.generated_tokens.sum(), t
