"""The time series takes at most ``sim.assembly.MAX_SAMPLES`` samples over the horizon: a
shorter ``engine.timeseries_interval_s`` is raised to horizon_s / MAX_SAMPLES with a one-line
warning, and summary.json records the interval used; below the cap nothing changes."""
from __future__ import annotations

import warnings

import pytest

from plumbing.notices import InputWarning
from sim import assembly
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
