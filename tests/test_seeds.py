"""Seeds mean something: what the seed changes in a scenario (sim.experiments.seeds), and a sweep over seeds
of a run the seed cannot change runs it once, with a one-line notice, instead of copies."""
from __future__ import annotations

import pandas as pd
import pytest
from click.testing import CliRunner

from policies.check import uses_seed
from sim import load_scenario
from sim.cli import main
from sim.experiments.seeds import seed_sources

REPLAY = ["horizon_s=120"]  # azure_two_tenants: two real traces replayed, fcfs by default


@pytest.mark.parametrize("overrides,expected", [
    (REPLAY, []),
    (REPLAY + ["policy.name=priority"], []),
    (REPLAY + ["streams.0.trace.sample=0.5"], ["workload"]),  # thinning a trace draws
    (REPLAY + ['policy={name="sjf_rank", predictor="noisy", tau=0.5}'], ["policy"]),
    (REPLAY + ["engine.speculative={k=4,acceptance=0.7}"], ["speculative decoding"]),
    (REPLAY + ['cluster={replicas=3, router="power_of_two"}'], ["router"]),
    (REPLAY + ['cluster={replicas=3, router="least_outstanding"}'], []),
])
def test_seed_sources_of_a_trace_replay(overrides, expected):
    assert seed_sources(load_scenario("azure_two_tenants", overrides=overrides)) == expected


def test_synthetic_arrivals_depend_on_the_seed():
    assert seed_sources(load_scenario("chat_vs_batch", overrides=["horizon_s=10"])) == ["workload"]


def test_policy_seed_use_is_judged_by_its_schedule():
    assert not uses_seed("fcfs") and not uses_seed("wfq")
    assert uses_seed("sjf_rank", predictor="noisy", tau=0.5)
    assert not uses_seed("sjf_rank", predictor="oracle")


def _sweep(tmp_path, *args):
    out = tmp_path / "sw"
    r = CliRunner().invoke(main, ["sweep", *args, "--out", str(out), "--no-plots", "--workers", "1"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r.output, pd.read_parquet(out / "sweep.parquet")


def test_sweep_of_a_pure_replay_runs_each_cell_once_and_says_so(tmp_path):
    out, df = _sweep(tmp_path, "azure_two_tenants", "--policies", "fcfs,priority", "--seeds", "2",
                     "--set", "horizon_s=120")
    notices = [line for line in out.splitlines() if line.startswith("seeds:")]
    assert len(notices) == 1 and "2 of 4 runs not run" in notices[0] and "seed 0" in notices[0]
    assert sorted(df["seed"].unique()) == [0] and df["run_id"].nunique() == 2


def test_sweep_over_seeds_of_random_traffic_replicates(tmp_path):
    out, df = _sweep(tmp_path, "chat_vs_batch", "--seeds", "2", "--set", "horizon_s=10",
                     "--set", "streams.0.arrival.n=50")
    assert "seeds:" not in out
    chat = df[df["class"] == "interactive"].set_index("seed")
    assert sorted(chat.index) == [1, 2]
    assert chat.loc[1, "arrived"] != chat.loc[2, "arrived"] or chat.loc[1, "ttft_p50_s"] != chat.loc[2, "ttft_p50_s"]


def test_mixed_sweep_keeps_seeds_only_where_they_matter(tmp_path):
    grid = tmp_path / "axes.toml"
    grid.write_text('"streams.1.trace.sample" = [1.0, 0.5]\n')
    out, df = _sweep(tmp_path, "azure_two_tenants", "--seeds", "2", "--set", "horizon_s=120", "--grid", str(grid))
    assert "1 of 4 runs not run" in out
    runs = df.drop_duplicates("run_id")
    assert sorted(runs[runs["streams.1.trace.sample"] == 0.5]["seed"]) == [0, 1]
    assert list(runs[runs["streams.1.trace.sample"] == 1.0]["seed"]) == [0]


@pytest.mark.parametrize("overrides", [
    REPLAY, REPLAY + ["streams.0.trace.sample=0.5"], REPLAY + ["engine.speculative={k=4,acceptance=0.7}"],
    REPLAY + ['cluster={replicas=3, router="power_of_two"}'],
    REPLAY + ["streams.0.trace.sample=0.5", "engine.speculative={k=4,acceptance=0.7}"],
])
def test_first_source_agrees_on_whether_the_seed_matters_and_judges_the_cheapest_first(overrides):
    sc = load_scenario("azure_two_tenants", overrides=overrides)
    every = seed_sources(sc)
    first = seed_sources(sc, first=True)
    assert bool(first) == bool(every) and set(first) <= set(every) and len(first) <= 1
    if len(every) > 1:  # speculation is read off the scenario; the workload is built twice to tell
        assert first == ["speculative decoding"]
