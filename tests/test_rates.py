"""Rates are over the window a class was offered, not the whole run with its drain, and
``priosim compare`` judges every metric by its direction, calling a difference within noise
"same" (docs/metrics.md)."""
from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from sim import load_scenario, scenario_from_dict, simulate
from sim.cli import main
from sim.experiments.compare import compare_runs, noise, verdict
from sim.metrics import HIGHER, LOWER, METRIC_TABLE, NEITHER
from sim.results import WINDOW_KEYS
from tests.conftest import small_scenario

STEP = {"kind": "linear", "base_s": 0.01, "prefill_token_s": 0.0, "decode_token_s": 0.0, "context_token_s": 0.0}


def _job(cls: str, n: int, at_s: float, tenant: str = "t") -> dict:
    return {"tenant": tenant, "class": cls, "arrival": {"process": "batch", "n": n, "at_s": at_s},
            "prompt_tokens": {"dist": "constant", "value": 64}, "output_tokens": {"dist": "constant", "value": 100},
            "max_tokens": 100}


def long_drain() -> dict:
    """One slot, every step 0.01 s, 100 output tokens a request: a request holds the engine
    1.0 s (its prefill step makes the first token, 99 decode steps the rest). ``burst`` sends 2
    requests at 0 s and 2 at 1 s, so its offered window is [0, 1] s and it is served until 4 s:
    TTFT 0.01, 1.01, 1.01 (arrived at 1 s, started at 2 s), 2.01 s; a 1.05 s TTFT SLO is met by 3."""
    return {"name": "drain", "seed": 0, "horizon_s": 2.0, "drain": True,
            "engine": {"profile": dict(STEP), "overhead": "none", "max_num_seqs": 1, "max_batched_tokens": 4096,
                       "kv_blocks": 10000, "preemption": "off"},
            "policy": {"name": "fcfs"},
            "classes": [{"name": "burst", "priority": 0, "ttft_slo_s": 1.05}],
            "streams": [_job("burst", 2, 0.0), _job("burst", 2, 1.0)]}


def test_a_class_with_a_long_drain_has_its_rates_over_its_offered_window():
    res = simulate(scenario_from_dict(long_drain()))
    req = res.requests
    m = res.summary_dict["classes"]["burst"]
    # by hand: the run serves the four requests one after another until 4.0 s
    assert req["finish_s"].tolist() == pytest.approx([1.0, 2.0, 3.0, 4.0])
    assert req["ttft_s"].tolist() == pytest.approx([0.01, 1.01, 1.01, 2.01])
    assert m["rate_window_s"] == [0.0, 1.0] and m["rate_window_basis"] == "arrivals"
    assert m["slo_attainment"] == 0.75
    assert m["goodput_rps"] == pytest.approx(3 / 1.0)  # not 3 / 4.0 s of run
    assert m["throughput_rps"] == pytest.approx(4 / 1.0)
    assert m["output_tokens_per_s"] == pytest.approx(400 / 1.0)
    # the same figures from the requests table: those arriving in the window, over its length
    t0, t1 = req["arrival_s"].min(), req["arrival_s"].max()
    inside = req[(req["arrival_s"] >= t0) & (req["arrival_s"] <= t1)]
    good = ((inside["status"] == "finished") & (inside["ttft_s"] <= 1.05)).sum()
    assert m["goodput_rps"] == good / (t1 - t0)
    assert m["output_tokens_per_s"] == inside["generated_tokens"].sum() / (t1 - t0)
    assert res.summary_dict["run"]["end_s"] == pytest.approx(4.0)
    assert "rate_window_s" in res.summary_dict["rates_note"]


def test_a_backlog_is_measured_over_its_service_and_overall_sums_the_classes():
    """A class offered all at one instant has no offered duration: its rates are over its
    service (arrival to its last request's end). Overall and a tenant of several classes sum
    their classes' rates, each over its own window."""
    sc = long_drain()
    sc["classes"].append({"name": "backlog", "priority": 1})
    sc["streams"].append(_job("backlog", 2, 0.0))  # served after the burst (fcfs by arrival, then id)
    res = simulate(scenario_from_dict(sc))
    req, s = res.requests, res.summary_dict
    b = s["classes"]["backlog"]
    last = req.loc[req["class"] == "backlog", "end_s"].max()
    assert b["rate_window_basis"] == "backlog" and b["rate_window_s"] == [0.0, last]
    assert b["output_tokens_per_s"] == pytest.approx(200 / last)
    burst = s["classes"]["burst"]
    o = s["overall"]
    assert o["rate_window_basis"] == "sum of classes"
    assert o["rate_window_s"] == {"burst": burst["rate_window_s"], "backlog": b["rate_window_s"]}
    for k in ("output_tokens_per_s", "throughput_rps"):
        assert o[k] == pytest.approx(burst[k] + b[k])
    assert o["goodput_rps"] == burst["goodput_rps"]  # the backlog has no SLO
    t = s["tenants"]["t"]  # one tenant sends both classes
    assert t["rate_window_basis"] == "sum of classes"
    assert t["output_tokens_per_s"] == pytest.approx(o["output_tokens_per_s"])
    assert not set(WINDOW_KEYS) & set(res.summary.columns)  # windows are in summary.json only


def test_cluster_classes_groups_and_replicas_have_windowed_rates():
    from sim.cluster import simulate_cluster

    d = small_scenario(horizon_s=6.0)
    d["cluster"] = {"groups": [{"name": "fast", "replicas": 1, "classes": ["hi"]},
                               {"name": "bulk", "replicas": 1, "classes": ["lo"]}], "router": "class_aware"}
    res = simulate_cluster(scenario_from_dict(d))
    s, req = res.summary_dict, res.requests
    for name, m in s["classes"].items():
        mine = req[req["class"] == name]
        t0, t1 = mine["arrival_s"].min(), mine["arrival_s"].max()
        assert m["rate_window_s"] == [t0, t1]
        assert m["output_tokens_per_s"] == pytest.approx(mine["generated_tokens"].sum() / (t1 - t0))
    fast = s["cluster"]["groups"]["fast"]["classes"]["hi"]
    assert fast["rate_window_s"] == s["classes"]["hi"]["rate_window_s"]
    assert fast["output_tokens_per_s"] == pytest.approx(s["classes"]["hi"]["output_tokens_per_s"])
    rep = s["cluster"]["replicas"][0]
    assert rep["output_tokens_per_s"] == pytest.approx(s["classes"]["hi"]["output_tokens_per_s"])


@pytest.fixture(scope="module")
def off_and_recompute(tmp_path_factory):
    """The question that started it: the default scenario (a shorter horizon) without preemption
    (A) and with recompute (B). Both serve every request the same tokens; B's drain is longer."""
    out = tmp_path_factory.mktemp("what_if")
    runs = {}
    for mode in ("off", "recompute"):
        res = simulate(load_scenario(None, overrides=["horizon_s=30", f"engine.preemption={mode!r}"]))
        runs[mode] = (res, res.save(out / mode))
    return runs


def test_two_runs_serving_the_same_tokens_compare_the_same(off_and_recompute):
    (a, da), (b, db) = off_and_recompute["off"], off_and_recompute["recompute"]
    ra, rb = a.requests.set_index("request_id"), b.requests.set_index("request_id")
    assert (ra["generated_tokens"] == rb["generated_tokens"]).all()
    assert a.summary_dict["run"]["end_s"] != b.summary_dict["run"]["end_s"]  # the drains differ: the old
    # per-run rates differed, and compare marked the shorter run better
    df = compare_runs(da, db).set_index(["class", "metric"])
    for k in ("output_tokens_per_s", "throughput_rps"):
        assert df.loc[("interactive", k), "a"] == df.loc[("interactive", k), "b"]
        assert df.loc[("interactive", k), "better"] == "same"
    # what did differ is judged by its direction: B's strict preemption gives chat its first token
    assert df.loc[("interactive", "ttft_p99_s"), "better"] == "b"
    for k in ("slo_attainment", "goodput_rps"):  # higher is better; equal ones (as at this horizon) are the same
        va, vb = df.loc[("interactive", k), "a"], df.loc[("interactive", k), "b"]
        want = "same" if abs(va - vb) <= 0.01 * max(abs(va), abs(vb)) else ("b" if vb > va else "a")
        assert df.loc[("interactive", k), "better"] == want, (k, va, vb)
    assert df.loc[("batch", "preemptions"), "better"] == "a"
    got = CliRunner().invoke(main, ["compare", str(da), str(db), "--metric", "output_tokens_per_s"])
    assert got.exit_code == 0, got.output
    line = next(x for x in got.output.split("[interactive]")[1].splitlines() if "output_tokens_per_s" in x)
    assert line.split()[-1] == "same"


def test_every_summary_column_has_a_direction(off_and_recompute):
    """Every figure a run's summary gives a class, overall or a tenant (prefix caching on, SLOs,
    tenants) is in the metric table with a direction, and compare accepts it."""
    d = small_scenario(horizon_s=4.0)
    d["engine"]["prefix_caching"] = True
    res = simulate(scenario_from_dict(d))
    s = res.summary_dict
    groups = [*s["classes"].values(), s["overall"], *s["tenants"].values(),
              *off_and_recompute["off"][0].summary_dict["classes"].values()]
    keys = set(res.summary.columns) - {"class"}
    keys |= {k for g in groups for k, v in g.items() if not isinstance(v, dict) and k not in WINDOW_KEYS}
    assert "prefix_evictions_by_pressure" in keys and "goodput_rps" in keys and "gpu_s" in keys
    for k in sorted(keys):
        assert k in METRIC_TABLE, f"{k}: no direction in sim.metrics.METRIC_TABLE"
        assert METRIC_TABLE[k].better in (HIGHER, LOWER, NEITHER), k
    run = off_and_recompute["off"][1]
    df = compare_runs(run, run, sorted(METRIC_TABLE))
    assert set(df["better"]) == {"same"}


def test_noise_is_one_percent_or_the_seeds_spread():
    assert noise(100.0, 100.9) == pytest.approx(1.009)
    assert verdict("output_tokens_per_s", 100.0, 100.9, noise(100.0, 100.9)) == "same"
    assert verdict("output_tokens_per_s", 100.0, 102.0, noise(100.0, 102.0)) == "b"
    assert verdict("ttft_p99_s", 1.0, 1.2, noise(1.0, 1.2)) == "a"
    assert verdict("arrived", 10.0, 12.0, noise(10.0, 12.0)) == ""  # no side is better
    assert verdict("rejected", 0.0, 0.0, noise(0.0, 0.0)) == "same"
    # two seeds a side: sd sqrt(2) each, so two standard errors of the difference = 2 sqrt(2)
    assert noise(11.0, 12.0, math.sqrt(2), 2, math.sqrt(2), 2) == pytest.approx(2 * math.sqrt(2))


def _fake_run(path, seed: int, tokens_per_s: float):
    path.mkdir()
    m = {"arrived": 10, "output_tokens_per_s": tokens_per_s}
    (path / "summary.json").write_text(json.dumps({"scenario": "x", "policy": "p", "seed": seed,
                                                   "classes": {"c": dict(m)}, "overall": dict(m)}))
    return path


def test_compare_over_seeds_uses_their_spread(tmp_path):
    a = [_fake_run(tmp_path / f"a{i}", i, v) for i, v in enumerate((10.0, 12.0))]
    close = [_fake_run(tmp_path / f"b{i}", i, v) for i, v in enumerate((11.0, 13.0))]
    far = [_fake_run(tmp_path / f"f{i}", i, v) for i, v in enumerate((20.0, 20.5))]
    row = compare_runs(a, close).set_index(["class", "metric"]).loc[("c", "output_tokens_per_s")]
    assert (row["a"], row["b"], row["better"]) == (11.0, 12.0, "same")  # 1.0 apart, 2 SE = 2.83
    assert row["a_sd"] == pytest.approx(math.sqrt(2))
    one = compare_runs(a[0], close[0]).set_index(["class", "metric"]).loc[("c", "output_tokens_per_s")]
    assert one["better"] == "b"  # one run a side: 10 vs 11 is beyond 1 %
    assert compare_runs(a, far).set_index(["class", "metric"]).loc[("c", "output_tokens_per_s"), "better"] == "b"
    got = CliRunner().invoke(main, ["compare", str(a[0]), str(close[0]), "--also-a", str(a[1]),
                                    "--also-b", str(close[1])])
    assert got.exit_code == 0, got.output
    assert "+ 1 more run(s)" in got.output and "seed=0,1" in got.output
    line = next(x for x in got.output.split("[c]")[1].splitlines() if "output_tokens_per_s" in x)
    assert line.split()[-1] == "same" and "11±1.4" in line


def test_compare_warns_when_a_side_repeats_a_seed(tmp_path):
    from plumbing.notices import InputWarning

    a = _fake_run(tmp_path / "a", 1, 10.0)
    twin = _fake_run(tmp_path / "twin", 1, 10.0)
    with pytest.warns(InputWarning, match="same seed 1"):
        compare_runs([a, twin], a)
    got = CliRunner().invoke(main, ["compare", str(a), str(a), "--also-a", str(twin)])
    assert got.exit_code == 0 and "warning: compare: A's runs" in got.output


def test_the_default_printed_metrics_are_in_the_table():
    from sim.experiments.compare import METRICS

    assert all(k in METRIC_TABLE and METRIC_TABLE[k].unit == u for k, u in METRICS)
    assert [k for k, _ in METRICS if METRIC_TABLE[k].better == NEITHER] == ["arrived"]
