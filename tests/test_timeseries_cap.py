"""The time series: each sample is the state at its instant, as the request table rebuilds it
(waiting: arrived, not rejected, not admitted yet; running: admitted, not finished; in an idle
stretch, the idle state); and it takes at most ``sim.assembly.MAX_SAMPLES`` samples over the
horizon: a shorter ``engine.timeseries_interval_s`` is raised to horizon_s / MAX_SAMPLES with a
one-line warning, and summary.json records the interval used; below the cap nothing changes."""
from __future__ import annotations

import copy
import warnings

import numpy as np
import pandas as pd
import pytest

from plumbing.notices import InputWarning
from sim import assembly
from sim.cluster import simulate_cluster
from sim.config import scenario_from_dict
from sim.core.errors import ScenarioError
from sim.run import simulate

BASE = {
    "name": "ts", "horizon_s": 10.0,
    "engine": {"profile": {"kind": "linear", "base_s": 0.01, "prefill_token_s": 1e-5, "decode_token_s": 1e-4,
                           "context_token_s": 0.0}, "kv_blocks": 400},
    "classes": [{"name": "chat", "priority": 0}],
    "streams": [{"tenant": "a", "class": "chat", "arrival": {"process": "poisson", "rate": 0.5},
                 "prompt_tokens": 10, "output_tokens": 5}],
}


def _run(overrides: list[str]):
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        res = simulate(scenario_from_dict(BASE, overrides=overrides))
    return res, [str(w.message) for w in got if issubclass(w.category, InputWarning)]


def test_a_tiny_interval_is_raised_to_horizon_over_the_cap_with_a_warning():
    """1e-6 s over 10 s asked for 10 million samples (6.3 GB); now 200,000, every 5e-05 s."""
    res, msgs = _run(["engine.timeseries_interval_s=1e-6"])
    used = 10.0 / assembly.MAX_SAMPLES
    assert res.summary_dict["run"]["timeseries_interval_s"] == pytest.approx(used)
    # (samples to the horizon, then through the drain's few steps)
    assert len(res.timeseries) <= assembly.MAX_SAMPLES * 1.01
    assert [m for m in msgs if "timeseries_interval_s" in m] == [
        f"<inline>: engine.timeseries_interval_s = 1e-06 s over horizon_s = 10 s is more than 200,000 samples; "
        f"sampling every {used:g} s instead"]


def test_a_long_horizon_at_a_tiny_rate_takes_at_most_the_cap(monkeypatch):
    monkeypatch.setattr(assembly, "MAX_SAMPLES", 100)
    res, msgs = _run(["horizon_s=1e6", "drain=false", "streams.0.arrival.rate=1e-5"])
    assert res.summary_dict["run"]["timeseries_interval_s"] == 1e4
    assert len(res.timeseries) <= 101
    assert any("sampling every 10000 s instead" in m for m in msgs)


def test_below_the_cap_the_interval_is_the_scenarios_and_no_warning():
    res, msgs = _run(["engine.timeseries_interval_s=0.5"])
    assert res.summary_dict["run"]["timeseries_interval_s"] == 0.5
    assert not [m for m in msgs if "timeseries_interval_s" in m]
    assert res.timeseries["t_s"].drop_duplicates().tolist()[:3] == [0.0, 0.5, 1.0]


@pytest.mark.parametrize("value", ["1e-10", "0", "2e9"])
def test_the_interval_is_between_1_ns_and_1e9_s(value):
    with pytest.raises(ScenarioError, match=r"engine\.timeseries_interval_s: Input should be"):
        scenario_from_dict(BASE, overrides=[f"engine.timeseries_interval_s={value}"])


# ---- each sample is the state at its instant --------------------------------------------------
# An M/D/1 queue: one request at a time, each one 1 s step (its prompt, and its only token)
MD1 = {
    "name": "md1", "seed": 3, "horizon_s": 400.0,
    "engine": {"profile": {"kind": "linear", "base_s": 1.0, "prefill_token_s": 0.0, "decode_token_s": 0.0,
                           "context_token_s": 0.0}, "kv_blocks": 1000, "max_num_seqs": 1},
    "policy": {"name": "fcfs"},
    "classes": [{"name": "a", "priority": 0}],
    "streams": [{"tenant": "t", "class": "a", "arrival": {"process": "poisson", "rate": 0.5},
                 "prompt_tokens": 16, "output_tokens": 1}],
}

# Two classes under a priority policy, batched decodes of many tokens (fast-forwarded runs, the
# decode cohort, runs past last tokens), no preemption: the request table says who waited and
# who ran when
BATCHED = {
    "name": "batched", "seed": 5, "horizon_s": 60.0, "drain": True,
    "engine": {"profile": {"kind": "linear", "base_s": 0.02, "prefill_token_s": 1e-4, "decode_token_s": 1e-3,
                           "context_token_s": 0.0},
               "kv_blocks": 4000, "block_size": 16, "max_num_seqs": 4, "max_batched_tokens": 512,
               "preemption": "off", "preempt_for_waiting": "never", "timeseries_interval_s": 0.25},
    "policy": {"name": "priority"},
    "classes": [{"name": "hi", "priority": 0}, {"name": "lo", "priority": 1}],
    "streams": [
        {"tenant": "a", "class": "hi", "arrival": {"process": "poisson", "rate": 1.0},
         "prompt_tokens": {"dist": "uniform", "low": 10, "high": 200},
         "output_tokens": {"dist": "uniform", "low": 5, "high": 120}, "max_tokens": 120},
        {"tenant": "b", "class": "lo", "arrival": {"process": "poisson", "rate": 1.5},
         "prompt_tokens": {"dist": "uniform", "low": 50, "high": 300},
         "output_tokens": {"dist": "uniform", "low": 20, "high": 200}, "max_tokens": 200},
    ],
}


def _rebuilt(res) -> pd.DataFrame:
    """The time series' waiting and running columns rebuilt from the request table at each
    sample's instant t, per class: waiting = arrived by t (arrival <= t), not rejected, not
    admitted by t, not ended by t; running = admitted <= t < end (no preemption: each request
    is admitted once)."""
    assert (res.requests["preemptions"] == 0).all()
    ts = res.timeseries
    out = ts[["t_s", "class"]].copy()
    out["waiting"] = out["running"] = 0
    for cls, rq in res.requests.groupby("class"):
        rows = ts["class"] == cls
        t = ts.loc[rows, "t_s"].to_numpy()[:, None]
        arrival, admitted, end = (rq[c].to_numpy()[None, :] for c in ("arrival_s", "admitted_s", "end_s"))
        kept = (rq["status"] != "rejected").to_numpy()[None, :]
        out.loc[rows, "waiting"] = ((arrival <= t) & ~(admitted <= t) & (end > t) & kept).sum(axis=1)
        out.loc[rows, "running"] = ((admitted <= t) & (end > t)).sum(axis=1)
    return out


@pytest.mark.parametrize("overhead", [None, {"frontend_s": 0.3, "frontend_busy_s": 0.2, "overlap_schedule": 1}])
def test_md1_samples_are_the_queue_at_their_instant(overhead):
    """Each sample of an M/D/1 queue is the queue at its instant, exactly as the request table
    rebuilds it: before, an idle server's samples read the state after the next arrival (waiting
    1 in an empty system) and a busy one's never showed the request in service (running and
    KV blocks always 0). Behind a front end (its delay, its serial work, overlap scheduling's
    step held back) a request waits from its arrival, before the engine sees it."""
    d = copy.deepcopy(MD1)
    if overhead is not None:
        d["engine"]["overhead"] = overhead
    res = simulate(scenario_from_dict(d))
    ts, want = res.timeseries, _rebuilt(res)
    assert (ts["waiting"].to_numpy() == want["waiting"].to_numpy()).all()
    assert (ts["running"].to_numpy() == want["running"].to_numpy()).all()
    # running is 0 only when nothing is in service, and the request in service holds its block
    rq = res.requests
    t = ts["t_s"].to_numpy()[:, None]
    in_service = ((rq["admitted_s"].to_numpy() <= t) & (t < rq["finish_s"].to_numpy())).sum(axis=1)
    assert ((ts["running"] == 0).to_numpy() == (in_service == 0)).all()
    assert (ts["running"] <= 1).all() and (ts["kv_blocks_used"] == ts["running"]).all()
    # the server is busy about half the time (utilisation 0.5), and queues about λ·Wq
    assert 0.4 < ts["running"].mean() < 0.6
    assert ts["waiting"].mean() == pytest.approx(0.5 * rq["queue_wait_s"].mean(), rel=0.3)


@pytest.mark.parametrize("fast", [True, False])
def test_batched_samples_are_the_sets_at_their_instant(fast):
    """Samples inside fast-forwarded runs (the cohort, runs past last tokens) read the running
    set of the step in progress, and arrivals inside a step count as waiting from their
    arrival: both classes' counts equal the request table's at every instant, stepped or not."""
    d = copy.deepcopy(BATCHED)
    d["engine"].update(fast_forward=fast, lazy_batch=fast)
    res = simulate(scenario_from_dict(d))
    ts, want = res.timeseries, _rebuilt(res)
    assert (ts["waiting"].to_numpy() == want["waiting"].to_numpy()).all()
    assert (ts["running"].to_numpy() == want["running"].to_numpy()).all()
    assert (ts["waiting"] > 0).any() and (ts["running"] > 1).any()
    per_sample = ts.groupby("t_s").agg(running=("running", "sum"), kv=("kv_blocks_used", "first"))
    assert ((per_sample["running"] == 0) == (per_sample["kv"] == 0)).all()  # (blocks held while running)


def test_cluster_samples_sum_the_replicas_states_at_their_instant():
    """A cluster's series is its replicas' summed, each read at the instant: runs held past
    arrivals routed elsewhere, and requests joining them, as the request table says."""
    d = copy.deepcopy(BATCHED)
    d["cluster"] = {"replicas": 3, "router": "least_outstanding"}
    for s in d["streams"]:
        s["arrival"]["rate"] *= 3
    res = simulate_cluster(scenario_from_dict(d))
    ts, want = res.timeseries, _rebuilt(res)
    assert (ts["waiting"].to_numpy() == want["waiting"].to_numpy()).all()
    assert (ts["running"].to_numpy() == want["running"].to_numpy()).all()
    assert (ts["running"] > 4).any()
