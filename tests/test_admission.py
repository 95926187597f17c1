"""Admission gate: each check on small hand-checked cases, validation, and the overload path."""
from __future__ import annotations


import numpy as np
import pytest

from policies import make_policy
from sim import ScenarioError, load_scenario, scenario_from_dict, simulate
from sim.admission import Gate, TokenBucket
from sim.core.costs import load_profile
from sim.core.kvpool import KVPool
from sim.core.request import Request, State

LINEAR = {"kind": "linear", "base_s": 0.01, "prefill_token_s": 1e-4, "decode_token_s": 1e-3,
          "context_token_s": 0.0}


def scenario(streams, *, classes=None, tenants=(), admission=None, fairness=None, engine=None, **top):
    d = {
        "name": "t", "seed": 0, "horizon_s": 10.0, "drain": True,
        "engine": {"profile": LINEAR, "kv_blocks": 4096, "max_num_seqs": 64, **(engine or {})},
        "policy": {"name": "priority"},
        "classes": classes or [{"name": "interactive", "priority": 0, "ttft_slo_s": 0.5}],
        "streams": streams,
        "tenants": list(tenants),
        "admission": admission or {},
        "fairness": fairness or {},
        **top,
    }
    return scenario_from_dict(d)


def batch_stream(tenant="a", cls="interactive", n=10, at_s=0.0, spread_s=1.0, prompt=50, output=5, max_tokens=50):
    return {"tenant": tenant, "class": cls, "arrival": {"process": "batch", "n": n, "at_s": at_s, "spread_s": spread_s},
            "prompt_tokens": prompt, "output_tokens": output, "max_tokens": max_tokens}


def rejected(res, reason=None):
    rq = res.requests
    m = rq["status"] == "rejected"
    if reason:
        m &= rq["reject_reason"] == reason
    return rq[m]


# ---- token buckets ------------------------------------------------------------------------------

def test_token_bucket_refills_continuously_up_to_burst():
    b = TokenBucket(rate=2.0, burst=2.0)
    assert b.can(2.0, 0.0) and not b.can(2.1, 0.0)
    b.take(2.0, 0.0)
    assert not b.can(1.0, 0.25)  # 0.5 refilled
    assert b.can(1.0, 0.5)  # 1.0 refilled
    b.take(1.0, 0.5)
    assert b.peek(100.0) == 2.0  # capped at the burst


def test_request_rate_limit_hand_checked():
    # arrivals at 0, 0.1, ..., 0.9 s; bucket 2 req/s, burst 2, starts full:
    # t=0 2.0 -> take; 0.1 1.2 -> take; 0.2..0.4 < 1 reject; 0.5 1.0 -> take; 0.6..0.9 reject
    sc = scenario([batch_stream()], tenants=[{"name": "a", "rate_rps": 2.0, "burst_requests": 2}])
    res = simulate(sc)
    ok = res.requests[res.requests["status"] == "finished"]
    assert np.allclose(sorted(ok["arrival_s"]), [0.0, 0.1, 0.5])
    assert len(rejected(res, "rate_limit")) == 7
    assert res.summary_dict["tenants"]["a"]["reject_reasons"] == {"rate_limit": 7}


def test_token_rate_limit_counts_prompt_plus_max_tokens():
    # each request costs 50 + 50 = 100 tokens; 250 burst, 100 tokens/s
    # t=0 250 -> 150; 0.1 160 -> 60; 0.2..0.4 70..90 no; 0.5 100 -> 0; 0.6..0.9 10..40 no
    sc = scenario([batch_stream()], tenants=[{"name": "a", "rate_tps": 100.0, "burst_tokens": 250}])
    res = simulate(sc)
    ok = res.requests[res.requests["status"] == "finished"]
    assert np.allclose(sorted(ok["arrival_s"]), [0.0, 0.1, 0.5])
    assert len(rejected(res, "rate_limit")) == 7


def test_tenant_concurrency_cap_released_on_finish():
    # one request at a time: the first (t=0) runs 0.015 + 49 x 0.011 = 0.554 s; t=0.05 is
    # refused, t=1.0 is admitted
    streams = [batch_stream(n=2, spread_s=0.1, output=50), batch_stream(n=1, at_s=1.0, spread_s=0.0)]
    sc = scenario(streams, tenants=[{"name": "a", "max_concurrency": 1}])
    res = simulate(sc)
    rq = res.requests.sort_values("arrival_s")
    assert list(rq["status"]) == ["finished", "rejected", "finished"]
    assert list(rq["reject_reason"]) == ["", "concurrency", ""]


def test_class_concurrency_cap():
    classes = [{"name": "interactive", "priority": 0}, {"name": "batch", "priority": 1}]
    streams = [batch_stream(cls="batch", n=5, spread_s=0.0), batch_stream(n=5, spread_s=0.0)]
    sc = scenario(streams, classes=classes, admission={"class_concurrency": {"batch": 2}})
    res = simulate(sc)
    per = res.summary_dict["classes"]
    assert per["batch"]["rejected"] == 3 and per["batch"]["reject_reasons"] == {"concurrency": 3}
    assert per["interactive"]["rejected"] == 0


def test_too_large_by_limit_and_by_pool():
    streams = [batch_stream(n=1, prompt=500, max_tokens=600, output=5), batch_stream(n=1, prompt=10, max_tokens=20)]
    res = simulate(scenario(streams, admission={"max_request_tokens": 1000}))
    assert list(rejected(res)["reject_reason"]) == ["too_large"]
    # the engine rejects what can never fit in the pool (16 blocks x 16 tokens = 256 tokens)
    res = simulate(scenario([batch_stream(n=1, prompt=300, max_tokens=10)], engine={"kv_blocks": 16}))
    assert list(rejected(res)["reject_reason"]) == ["too_large"]


@pytest.mark.parametrize("engine, most, reason", [
    ({"kv_blocks": 16}, 256, "too_large"),  # 16 blocks x 16 tokens
    ({"kv_blocks": 20, "watermark": 0.2}, 256, "too_large"),  # 4 blocks kept free
    # one step's budget: a preempted request prefills again all it holds, in one step
    ({"kv_blocks": 100, "chunked_prefill": False, "max_batched_tokens": 300}, 300, "too_long_for_step"),
])
def test_too_large_at_the_boundary(engine, most, reason):
    # the largest request that could ever be served is queued; one token more is rejected at arrival
    for total in (most - 1, most, most + 1):
        res = simulate(scenario([batch_stream(n=1, prompt=total - 10, max_tokens=10)], engine=engine))
        assert list(rejected(res)["reject_reason"]) == ([] if total <= most else [reason])
        assert len(res.requests) == 1


def test_without_preemption_only_the_prompt_must_fit_a_step():
    """Without chunked prefill and with preemption off nothing is prefilled again: a prompt that
    fits one step's budget is served whatever its max_tokens (it was refused as too_large, the
    KV cache named as the cause); a longer prompt is refused as too_long_for_step."""
    engine = {"kv_blocks": 100, "chunked_prefill": False, "max_batched_tokens": 300, "preemption": "off"}
    res = simulate(scenario([batch_stream(n=1, prompt=290, max_tokens=200, output=5)], engine=engine))
    assert list(rejected(res)["reject_reason"]) == [] and (res.requests["status"] == "finished").all()
    res = simulate(scenario([batch_stream(n=1, prompt=301, max_tokens=10)], engine=engine))
    assert list(rejected(res)["reject_reason"]) == ["too_long_for_step"]
    # more than the KV cache can ever hold stays too_large (100 blocks x 16 tokens)
    res = simulate(scenario([batch_stream(n=1, prompt=290, max_tokens=1400)], engine=engine))
    assert list(rejected(res)["reject_reason"]) == ["too_large"]


def test_memory_budget_refuses_less_urgent_work_first():
    # pool 100 blocks x 16 tokens, budget 1.0x = 100 blocks; each request promises
    # ceil((100 + 60) / 16) = 10 blocks. 8 batch at t=0 (80 blocks), then at t=0.001
    # 2 interactive (see 0 promised ahead: admitted) and 2 more batch (see 80 + 20 = 100 ahead,
    # + 10 > 100: refused)
    classes = [{"name": "interactive", "priority": 0}, {"name": "batch", "priority": 1}]
    streams = [batch_stream(cls="batch", n=8, spread_s=0.0, prompt=100, max_tokens=60, output=50),
               batch_stream(tenant="b", n=2, at_s=0.001, spread_s=0.0, prompt=100, max_tokens=60, output=50),
               batch_stream(cls="batch", n=2, at_s=0.002, spread_s=0.0, prompt=100, max_tokens=60, output=50)]
    sc = scenario(streams, classes=classes, admission={"memory_budget": 1.0}, engine={"kv_blocks": 100})
    res = simulate(sc)
    per = res.summary_dict["classes"]
    assert per["interactive"]["rejected"] == 0
    assert per["batch"]["reject_reasons"] == {"memory_budget": 2}


# ---- the deadline estimate ----------------------------------------------------------------------

class FakeEngine:
    """Just what the gate reads (a :class:`sim.core.engine.GateView`): the limits, costs, pool,
    the policy's key, the waiting and running requests."""

    def __init__(self, cfg, costs, pool):
        self.costs, self.pool = costs, pool
        self.max_num_seqs, self.max_batched_tokens = cfg.max_num_seqs, cfg.max_batched_tokens
        self.evicts_for_waiters = cfg.preempt_for_waiting != "never" and cfg.preemption != "off"
        self.grows_blocks = cfg.preemption != "off"
        self.policy = make_policy("priority")
        self._waiting, self.running_set = [], {}
        self.watermark_blocks = 0

    def key(self, req, now):
        return tuple(self.policy.key(req, now))

    def wait(self, req):
        req.key = self.policy.key(req, 0.0)
        self._waiting.append((req.key, req))

    def waiting(self):
        return list(self._waiting)

    def running(self):
        return list(self.running_set.values())


def _req(i, cls_idx=0, prio=0, prompt=100, max_tokens=100, t_ns=0, cls="interactive"):
    return Request(i, t_ns, "a", cls, cls_idx, prio, prompt, 10, max_tokens)


def _gate_and_engine(max_num_seqs):
    classes = [{"name": "interactive", "priority": 0, "ttft_slo_s": 0.5}, {"name": "batch", "priority": 1}]
    sc = scenario([batch_stream(), batch_stream(cls="batch")], classes=classes, admission={"shed": "deadline"},
                  engine={"max_num_seqs": max_num_seqs})
    costs = load_profile(LINEAR)
    eng = FakeEngine(sc.engine, costs, KVPool(4096, 16, [0, 1], [0, 0]))
    return Gate(sc, costs), eng


def test_gate_meets_the_contract():
    from policies.contracts import Gate as GateContract
    gate, _ = _gate_and_engine(max_num_seqs=64)
    assert isinstance(gate, GateContract)


def test_deadline_estimate_prefill_only_hand_checked():
    gate, eng = _gate_and_engine(max_num_seqs=64)
    eng.wait(_req(0))
    eng.wait(_req(1))
    eng.wait(_req(2, cls_idx=1, prio=1, cls="batch"))  # ranked behind: not counted
    new = _req(3, t_ns=1)
    # Q = 3 x 100 prompt tokens in one step with D = 2 decoders: 0.01 + 300e-4 + 2 x 1e-3
    assert gate.estimate_ttft(new, 0.0, eng) == pytest.approx(0.042)
    # the batch request sees all four ahead of it: 0.01 + 400e-4 + 3e-3
    assert gate.estimate_ttft(_req(4, 1, 1, cls="batch", t_ns=2), 0.0, eng) == pytest.approx(0.053)


def test_deadline_estimate_waits_for_slots_hand_checked():
    gate, eng = _gate_and_engine(max_num_seqs=2)
    for i in range(2):  # two running decoders, prompts computed, 10 generated
        r = _req(i)
        r.state, r.generated, r.tokens, r.computed = State.RUNNING, 10, 110, 109
        eng.running_set[r.request_id] = r
    eng.wait(_req(2))
    new = _req(3, t_ns=1)
    # slots: 1 waiting + new need 2, 0 free -> 2 departures; L = 100/2 = 50 (no finishes yet),
    # one leaves every 50/2 decode steps -> 50 steps of (0.01 + 2e-3) = 0.6 s;
    # prefill: Q = 100 + 100, D = 2: 0.01 + 200e-4 + 2e-3 = 0.032
    assert gate.estimate_ttft(new, 0.0, eng) == pytest.approx(0.632)
    assert gate.check(new, 0.0, eng) == "deadline"  # 0.632 > 0.5
    # finished requests teach the gate the class's mean output: 20 -> 20 steps -> 0.24 + 0.032
    done = _req(9)
    done.generated = 20
    gate.on_finish(done, 0.0)
    assert gate.estimate_ttft(new, 0.0, eng) == pytest.approx(0.272)
    assert gate.check(new, 0.0, eng) == ""


# ---- validation ------------------------------------------------------------------------------

@pytest.mark.parametrize("patch, msg", [
    ({"admission": {"shed": "x"}}, "<inline>: admission.shed: expected 'none' or 'deadline' (got 'x')"),
    ({"admission": {"shedd": "none"}}, "<inline>: admission.shedd: unknown key"),
    ({"admission": {"class_concurrency": {"nope": 1}}}, "<inline>: admission.class_concurrency.nope: no such class"),
    ({"admission": {"memory_budget": -1}}, "<inline>: admission.memory_budget: expected a number >= 0 (got -1)"),
    ({"tenants": [{"name": "a", "rate_rps": 0}]}, "<inline>: tenants.0.rate_rps: expected a number > 0 (got 0)"),
    ({"tenants": [{"name": "a", "max_concurrency": 1.5}]}, "<inline>: tenants.0.max_concurrency: expected an integer >= 1 (got 1.5)"),
    ({"tenants": [{"name": "a"}, {"name": "a"}]}, "<inline>: tenants.1.name: duplicate tenant 'a'"),
    ({"tenants": [{"share": 1}]}, "<inline>: tenants.0.name: expected a tenant name string (got None)"),
    ({"fairness": {"measure": "joules"}}, "<inline>: fairness.measure: expected 'tokens' or 'gpu_seconds' (got 'joules')"),
    ({"fairness": {"enabled": "yes"}}, "<inline>: fairness.enabled: expected true or false (got 'yes')"),
    ({"tenants": [{"name": "a", "burst_tokens": 5}]}, "<inline>: tenants.0.burst_tokens: needs rate_tps"),
    ({"tenants": [5]}, "<inline>: tenants.0: expected a table (got 5)"),
    ({"fairness": {"window_s": float("inf")}}, "<inline>: fairness.window_s: expected a number > 0 (got inf)"),
])
def test_validation_errors_are_one_line(patch, msg):
    with pytest.raises(ScenarioError) as ei:
        scenario([batch_stream()], **{k: v for k, v in patch.items() if k != "tenants"},
                 tenants=patch.get("tenants", ()))
    text = str(ei.value)
    assert text.startswith(msg) and "\n" not in text


# ---- overload: shedding at the edge -----------------------------------------------------------

@pytest.fixture(scope="module")
def overload_runs():
    # the shipped scenario, shortened: spike 5 s -> 25 s, horizon 30 s; priced without engine
    # overhead, the step prices its spike rates were sized against (with the default preset the
    # replica is slower and the spike no longer leaves batch an exact zero in every second)
    over = ["horizon_s=30", "streams.0.arrival.times=[0.0, 5.0, 25.0]", "streams.1.arrival.n=400",
            'engine.overhead="none"']
    return {shed: simulate(load_scenario("overload", overrides=[f"admission.shed={shed}", *over]))
            for shed in ("none", "deadline")}


def test_overload_deadline_shedding_goodput(overload_runs):
    g_none = overload_runs["none"].summary_dict["overall"]["goodput_rps"]
    g_shed = overload_runs["deadline"].summary_dict["overall"]["goodput_rps"]
    assert g_shed >= 1.5 * g_none, (g_shed, g_none)
    shed = overload_runs["deadline"].summary_dict["classes"]["interactive"]
    assert shed["reject_reasons"].get("deadline", 0) > 0
    assert overload_runs["deadline"].summary_dict["tenants"]["chat-app"]["reject_reasons"]["deadline"] > 0


def test_overload_shed_requests_answered_at_arrival():
    over = ["horizon_s=20", "streams.0.arrival.times=[0.0, 5.0, 15.0]", "streams.1.arrival.n=200"]
    sc = load_scenario("overload", overrides=over)
    gate = Gate(sc, load_profile(sc.engine.profile))
    res = simulate(sc, gate=gate)
    rq = res.requests.set_index("request_id")
    rej = rq[rq["status"] == "rejected"]
    assert len(rej) > 0 and len(gate.rejections) == len(rej)
    for rid, t, reason in gate.rejections:
        assert rej.loc[rid, "reject_reason"] == reason
        # the engine ingests arrivals at step boundaries: the answer comes when the engine first
        # sees the request, at most one step (< 0.3 s on this profile) after it arrived, and it
        # never waits in a queue
        assert 0.0 <= t - rej.loc[rid, "arrival_s"] < 0.3
    assert rej["admitted_s"].isna().all() and rej["first_token_s"].isna().all()


def test_overload_batch_fully_paused_while_interactive_over_capacity(overload_runs):
    res = overload_runs["deadline"]
    ts = res.timeseries
    inter = ts[ts["class"] == "interactive"].set_index("t_s")
    batch = ts[ts["class"] == "batch"].set_index("t_s")
    # shedding seconds: an interactive request was refused in [t, t + 1)
    rq = res.requests
    shed_s = np.floor(rq.loc[rq["reject_reason"] == "deadline", "arrival_s"])
    first, last = shed_s.min(), shed_s.max()
    assert last - first >= 10
    # from the second after shedding starts (the transition second may still hold the batch
    # requests being preempted) to the last second with shedding: no batch token, none running
    over = batch.loc[first + 1:last]
    assert (over["tokens_per_s"] == 0).all() and (over["running"] == 0).all()
    assert inter["tokens_per_s"].max() > 0
    # batch did run before the spike and backfills after it
    assert batch.loc[:4.0, "tokens_per_s"].sum() > 0
