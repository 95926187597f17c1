"""Sweeps: the pure grid expander, the 3 policies x 4 loads x 2 seeds sweep of the issue, resume
after a kill, a broken run that does not stop the others, and run comparison."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from tests.conftest import small_scenario
from sim.cli import main
from sim.core.errors import ScenarioError
from sim.experiments.sweep import RUN_FILE, expand_grid, read_grid, run_sweep

ROOT = Path(__file__).resolve().parents[1]
# chat_vs_batch cut down: 100 batch requests at t=0 and 10 s of chat, about 0.1 s per run
SMALL = ["--set", "horizon_s=10", "--set", "streams.0.arrival.n=100"]


def _cli(args):
    return CliRunner().invoke(main, args, catch_exceptions=False)


def _third_policy() -> str:
    from policies import list_policies

    names = [n for n, _ in list_policies() if n not in ("fcfs", "priority")]
    return "wfq" if "wfq" in names else (names[0] if names else "policies.fcfs:FCFS")


# ---- expand_grid (pure) -------------------------------------------------------------------
def test_expand_grid_is_the_product_in_axis_order_with_stable_ids():
    base = small_scenario(policy={"name": "priority"})
    before = json.dumps(base, sort_keys=True)
    specs = expand_grid(base, {"policy": ["fcfs", "priority"], "load": [0.5, 1.0], "seed": [7],
                               "engine.max_num_seqs": [4, 8]})
    assert json.dumps(base, sort_keys=True) == before  # base untouched
    assert len(specs) == 2 * 2 * 1 * 2
    assert [s.axes for s in specs[:2]] == [
        {"policy": "fcfs", "load": 0.5, "seed": 7, "engine.max_num_seqs": 4},
        {"policy": "fcfs", "load": 0.5, "seed": 7, "engine.max_num_seqs": 8}]
    s = specs[-1]
    assert s.run_id == "policy=priority__load=1__seed=7__engine.max_num_seqs=8"
    assert s.scenario["seed"] == 7 and s.scenario["engine"]["max_num_seqs"] == 8 and s.load_scale == 1.0
    assert len({x.run_id for x in specs}) == len(specs)
    assert expand_grid(base, {"policy": ["fcfs"]})[0].digest == expand_grid(base, {"policy": ["fcfs"]})[0].digest


def test_expand_grid_drops_the_base_policy_parameters_only_for_another_policy():
    base = small_scenario(policy={"name": "wfq", "weights": {"hi": 3}})
    a, b = expand_grid(base, {"policy": ["wfq", "fcfs"]})
    assert a.scenario["policy"] == {"name": "wfq", "weights": {"hi": 3}}
    assert b.scenario["policy"] == {"name": "fcfs"}


@pytest.mark.parametrize("axes, msg", [
    ({"load": [0.5, -1]}, "'load' must hold positive numbers"),
    ({"load": []}, "non-empty list"),
    ({"seed": "3"}, "non-empty list"),
    ({"seed": [1.5]}, "non-negative integers"),
    ({"policy": ["fcfs", "fcfs"]}, "repeats a value"),
])
def test_expand_grid_rejects_malformed_axes(axes, msg):
    with pytest.raises(ValueError, match=msg):
        expand_grid(small_scenario(), axes)


def test_expand_grid_rejects_a_key_that_does_not_fit_the_scenario():
    with pytest.raises(ScenarioError, match="classes.9"):
        expand_grid(small_scenario(), {"classes.9.priority": [1]})


def test_read_grid_flattens_tables_to_dotted_keys(tmp_path):
    p = tmp_path / "axes.toml"
    p.write_text('"engine.preemption" = ["swap", "recompute"]\n[engine]\nmax_num_seqs = [4, 8]\n')
    assert read_grid(p) == {"engine.preemption": ["swap", "recompute"], "engine.max_num_seqs": [4, 8]}
    p.write_text("[engine]\nmax_num_seqs = 4\n")
    with pytest.raises(ValueError, match="engine.max_num_seqs: an axis must be a list"):
        read_grid(p)


# ---- the sweep -------------------------------------------------------------------
def test_sweep_3_policies_4_loads_2_seeds_then_rerun_skips_everything(tmp_path):
    out = tmp_path / "sw"
    third = _third_policy()
    args = ["sweep", "chat_vs_batch", "--policies", f"fcfs,priority,{third}", "--loads", "0.5,0.7,0.9,1.1",
            "--seeds", "2", *SMALL, "--workers", "2", "--out", str(out)]
    res = _cli(args)
    assert res.exit_code == 0, res.output
    df = pd.read_parquet(out / "sweep.parquet")
    assert df["run_id"].nunique() == 24
    assert len(df) == 24 * 3  # one row per run and class: interactive, batch, overall
    assert list(df.columns[:4]) == ["run_id", "policy", "load", "seed"]
    assert set(df["class"]) == {"interactive", "batch", "overall"}
    assert set(df["policy"]) == {"fcfs", "priority", third} and set(df["seed"]) == {1, 2}
    assert df["ttft_p99_s"].notna().all() and (df["finished"] > 0).all()
    for name in ("latency_vs_load", "throughput_vs_load", "preemptions_vs_load"):
        for ext in ("png", "svg"):
            assert (out / "figures" / f"{name}.{ext}").stat().st_size > 1000
    # every run folder is complete: results, resolved scenario, manifest with provenance
    run = out / "runs" / "policy=fcfs__load=0.5__seed=1"
    manifest = json.loads((run / "manifest.json").read_text())
    assert {"priosim_version", "seed", "profile_sha256"} <= set(manifest)
    assert json.loads((run / "scenario.json").read_text())["policy"]["name"] == "fcfs"
    stamp = (run / RUN_FILE).stat().st_mtime_ns
    res = _cli(args + ["--no-plots"])
    assert res.exit_code == 0, res.output
    assert "0 done, 24 skipped" in res.output
    assert (run / RUN_FILE).stat().st_mtime_ns == stamp
    pd.testing.assert_frame_equal(pd.read_parquet(out / "sweep.parquet"), df)


def _finished(runs: Path) -> list[Path]:
    """The finished runs' files (pathlib's ``*`` also matches a run's hidden temporary folder)."""
    return [p for p in runs.glob(f"*/{RUN_FILE}") if not p.parent.name.startswith(".")]


def test_killed_sweep_resumes_with_only_the_missing_runs(tmp_path):
    out = tmp_path / "sw"
    cmd = [sys.executable, "-m", "sim.cli", "sweep", "chat_vs_batch", "--policies", "fcfs,priority",
           "--loads", "0.5,0.8,1.1,1.4", "--seeds", "1", "--set", "horizon_s=20", "--set",
           "streams.0.arrival.n=300", "--workers", "1", "--no-plots", "--no-progress", "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    runs = out / "runs"
    deadline = time.time() + 60
    try:
        while time.time() < deadline and proc.poll() is None:
            if runs.is_dir() and len(_finished(runs)) >= 3:
                break
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    done_before = {p.parent.name: p.stat().st_mtime_ns for p in _finished(runs)}
    assert 3 <= len(done_before) < 8, "the sweep should have been killed halfway"
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert f"{8 - len(done_before)} done, {len(done_before)} skipped" in res.stdout
    for name, stamp in done_before.items():  # finished runs were not redone
        assert (runs / name / RUN_FILE).stat().st_mtime_ns == stamp
    assert not list(runs.glob(".*"))  # no half-written folders left
    assert pd.read_parquet(out / "sweep.parquet")["run_id"].nunique() == 8


def test_changed_base_scenario_does_not_reuse_old_folders(tmp_path):
    out = tmp_path / "sw"
    args = ["sweep", "chat_vs_batch", "--policies", "fcfs", *SMALL, "--workers", "1", "--no-plots",
            "--out", str(out)]
    assert _cli(args).exit_code == 0
    res = _cli(args + ["--set", "engine.max_num_seqs=64"])
    assert "1 done, 0 skipped" in res.output


FIFO_FILE = """from policies import BasePolicy


class P(BasePolicy):
    def key(self, req, now):
        return (LEAD(req), req.arrival_s, req.request_id)


def LEAD(req):
    return {lead}
"""


def test_an_edited_policy_file_makes_its_runs_run_again(tmp_path):
    # the scenario names the file, not what it holds: a finished run of the old contents is not
    # reused, and the line says which file changed
    pol = tmp_path / "p.py"
    pol.write_text(FIFO_FILE.format(lead="0"))
    out = tmp_path / "sw"
    args = ["sweep", "chat_vs_batch", "--policies", f"{pol}:P,fcfs", *SMALL, "--workers", "1", "--no-plots",
            "--out", str(out)]
    assert _cli(args).exit_code == 0
    again = _cli(args)
    assert "0 done, 2 skipped" in again.output and "rerun:" not in again.output
    pol.write_text(FIFO_FILE.format(lead="-req.arrival_s"))  # (LIFO: another schedule)
    res = _cli(args)
    assert res.exit_code == 0, res.output
    assert "1 done, 1 skipped" in res.output
    assert f"rerun: {pol.resolve()} changed since 1 finished run read it: it runs again" in res.output
    run = json.loads((out / "runs" / next(p.name for p in (out / "runs").iterdir() if "p.py" in p.name)
                      / RUN_FILE).read_text())
    from sim.inputs import file_sha256
    assert run["inputs"] == {str(pol.resolve()): file_sha256(pol)}


def test_an_edited_trace_file_makes_its_runs_run_again(tmp_path):
    import tomli_w

    trace = tmp_path / "t.csv"
    trace.write_text("t,p,o\n" + "".join(f"{i * 0.1},50,20\n" for i in range(30)))
    sc = small_scenario(horizon_s=5.0)
    sc["streams"][0] = {"tenant": "a", "class": "hi", "trace": {
        "format": "csv", "path": "t.csv", "columns": {"arrival_s": "t", "prompt_tokens": "p", "output_tokens": "o"}}}
    (tmp_path / "s.toml").write_text(tomli_w.dumps(sc))
    args = ["sweep", str(tmp_path / "s.toml"), "--workers", "1", "--no-plots", "--out", str(tmp_path / "sw")]
    assert _cli(args).exit_code == 0
    assert "0 done, 1 skipped" in _cli(args).output
    trace.write_text("t,p,o\n" + "".join(f"{i * 0.1},400,20\n" for i in range(30)))  # (longer prompts)
    res = _cli(args)
    assert "1 done, 0 skipped" in res.output and f"rerun: {trace.resolve()} changed" in res.output


def test_a_broken_run_is_reported_and_the_others_land(tmp_path):
    out = tmp_path / "sw"
    args = ["sweep", "chat_vs_batch", "--policies", "fcfs,tests.sweep_helpers:Broken,priority", "--loads", "1",
            *SMALL, "--workers", "2", "--no-plots", "--out", str(out)]
    res = _cli(args)
    assert res.exit_code == 1  # one failed run
    assert "2 done, 0 skipped (already complete), 1 failed" in res.output
    fail = json.loads((out / "failures" / "policy=tests.sweep_helpers_Broken__load=1__seed=1.json").read_text())
    assert "boom: deliberately broken policy" in fail["error"] and "Traceback" in fail["traceback"]
    df = pd.read_parquet(out / "sweep.parquet")
    assert set(df["policy"]) == {"fcfs", "priority"}
    info = json.loads((out / "sweep.json").read_text())
    assert list(info["failed"]) == ["policy=tests.sweep_helpers_Broken__load=1__seed=1"]
    # a rerun retries only the failed run
    res = _cli(args)
    assert res.exit_code == 1 and "0 done, 2 skipped (already complete), 1 failed" in res.output


def test_bad_grid_value_fails_before_any_run(tmp_path):
    grid = tmp_path / "axes.toml"
    grid.write_text('"engine.max_num_seqs" = [64, 0]\n')
    res = _cli(["sweep", "chat_vs_batch", *SMALL, "--grid", str(grid), "--out", str(tmp_path / "sw")])
    assert res.exit_code == 2
    assert "engine.max_num_seqs" in res.output and "max_num_seqs=0" in res.output
    assert not (tmp_path / "sw").exists()


def test_grid_axes_become_columns(tmp_path):
    grid = tmp_path / "axes.toml"
    grid.write_text('[engine]\npreemption = ["recompute", "off"]\n')
    out = tmp_path / "sw"
    res = _cli(["sweep", "chat_vs_batch", *SMALL, "--grid", str(grid), "--workers", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    df = pd.read_parquet(out / "sweep.parquet")
    assert set(df["engine.preemption"]) == {"recompute", "off"}
    assert (out / "figures" / "latency_vs_load.png").exists()


def test_a_grid_files_seed_axis_runs_without_seeds_on_the_command_line(tmp_path):
    grid = tmp_path / "axes.toml"
    grid.write_text("seed = [3, 4]\n")
    out = tmp_path / "sw"
    res = _cli(["sweep", "chat_vs_batch", *SMALL, "--grid", str(grid), "--workers", "1", "--no-plots",
                "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert set(pd.read_parquet(out / "sweep.parquet")["seed"]) == {3, 4}
    res = _cli(["sweep", "chat_vs_batch", *SMALL, "--grid", str(grid), "--seeds", "2", "--out", str(tmp_path / "b")])
    assert res.exit_code == 2 and "'seed' is given both" in res.output


# ---- compare ----------------------------------------------------------------------------
def test_compare_prints_per_class_metrics_with_ratios(tmp_path):
    out = tmp_path / "sw"
    specs = expand_grid(small_scenario(), {"policy": ["fcfs", "priority"]})
    rep = run_sweep(specs, out, workers=1, progress=False)
    assert rep.done == 2
    a, b = (str(out / "runs" / s.run_id) for s in specs)
    res = _cli(["compare", a, b, "--csv", str(tmp_path / "c.csv")])
    assert res.exit_code == 0, res.output
    assert "[hi]" in res.output and "[lo]" in res.output and "[overall]" in res.output
    assert "ttft_p99_s" in res.output and "B/A" in res.output
    c = pd.read_csv(tmp_path / "c.csv")
    row = c[(c["class"] == "hi") & (c["metric"] == "arrived")].iloc[0]
    assert row["a"] == row["b"] and row["ratio"] == 1.0  # same seed, same arrivals
    res = _cli(["compare", str(out), b])
    assert res.exit_code == 2 and "sweep folder" in res.output


# ---- the order runs execute in -------------------------------------------------------------
def test_longest_first_orders_by_expected_work_and_keeps_ties_in_grid_order():
    from sim.experiments.sweep import longest_first

    base = small_scenario()
    specs = expand_grid(base, {"policy": ["fcfs", "priority"], "load": [0.5, 1.0, 0.7], "seed": [1, 2]})
    order = longest_first(specs)
    assert sorted(s.run_id for s in order) == sorted(s.run_id for s in specs)
    assert [s.load_scale for s in order] == sorted((s.load_scale for s in specs), reverse=True)
    heavy = [s.run_id for s in order if s.load_scale == 1.0]
    assert heavy == [s.run_id for s in specs if s.load_scale == 1.0]  # ties: the grid's order
    longer = expand_grid(base, {"horizon_s": [5.0, 50.0], "load": [1.0, 2.0]})
    assert [s.axes for s in longest_first(longer)] == [
        {"horizon_s": 50.0, "load": 2.0}, {"horizon_s": 50.0, "load": 1.0},
        {"horizon_s": 5.0, "load": 2.0}, {"horizon_s": 5.0, "load": 1.0}]


def test_run_order_changes_neither_the_runs_nor_the_table(tmp_path):
    """Two workers (longest first, rows gathered as runs finish) and one worker (grid order, in
    this process) write the same run folders and the same sweep.parquet, rows in grid order."""
    args = ["sweep", "chat_vs_batch", "--policies", "fcfs,priority", "--loads", "0.5,1.1,0.8", *SMALL,
            "--no-plots"]
    for w in (1, 2):
        res = _cli(args + ["--workers", str(w), "--out", str(tmp_path / f"w{w}")])
        assert res.exit_code == 0, res.output
    a, b = (pd.read_parquet(tmp_path / f"w{w}" / "sweep.parquet") for w in (1, 2))
    pd.testing.assert_frame_equal(a, b)
    specs = expand_grid({}, {"policy": ["fcfs", "priority"], "load": [0.5, 1.1, 0.8], "seed": [1]})
    assert list(dict.fromkeys(a["run_id"])) == [s.run_id for s in specs]
    for s in specs:
        for f in ("requests.parquet", "timeseries.parquet", "summary.json"):
            assert (tmp_path / "w1" / "runs" / s.run_id / f).read_bytes() == \
                   (tmp_path / "w2" / "runs" / s.run_id / f).read_bytes(), (s.run_id, f)
    info = json.loads((tmp_path / "w2" / "sweep.json").read_text())["time_s"]
    assert info["workers"] == 2 and 0 < info["busy_share"] <= 1.0
    assert {"wall", "simulate", "tables", "save", "sweep", "collect"} <= set(info)
