"""scripts/identical_tables.py, the before/after proof, piece by piece and once end to end at a
tiny size (never all the scenarios)."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from scripts import identical_tables as it

ROOT = it.ROOT


def test_the_runs_are_every_shipped_scenario_a_cluster_and_each_preemption_mode():
    todo = it.runs(None, ["horizon_s=5"])
    keys = [k for k, _, _ in todo]
    shipped = sorted(p.stem for p in (ROOT / "workloads" / "scenarios").glob("*.toml"))
    assert keys == shipped + ["cluster3", "preemption_off", "preemption_recompute", "preemption_swap",
                              "preemption_auto"]
    assert all(sets[-1] == "horizon_s=5" for _, _, sets in todo)
    assert ("cluster3", "diurnal_two_class", ["cluster={replicas=3}", "horizon_s=5"]) in todo
    # the 200-replica day runs its first 180 s (hours as shipped); --set still comes last
    assert ("fleet_day", "fleet_day", ["horizon_s=180", "horizon_s=5"]) in todo
    assert it.runs(["fleet_day"], []) == [("fleet_day", "fleet_day", ["horizon_s=180"])]
    assert it.runs(["preemption_swap"], []) == [("preemption_swap", "chat_vs_batch", ['engine.preemption="swap"'])]
    with pytest.raises(ValueError, match="--only: unknown run 'nope'"):
        it.runs(["nope"], [])


def test_compare_names_each_table_and_counts_runs_that_differ_or_fail():
    same = {t: "a" * 64 for t in it.TABLES}
    other = same | {"timeseries": "b" * 64}
    lines, bad = it.compare(["x", "y", "z"], {"x": same, "y": same, "z": {"error": "KeyError: k"}},
                            {"x": same, "y": other, "z": same})
    assert bad == 2
    assert "requests identical  timeseries identical  summary identical" in lines[0]
    assert "timeseries DIFFERENT" in lines[1] and "requests identical" in lines[1]
    assert "FAILED here: KeyError: k" in lines[2]
    assert it.compare(["x"], {"x": same}, {"*": {"error": "boom"}}) == ([f"{'x':24s} FAILED there: boom"], 1)
    # a scenario the other commit does not ship yet is new, neither identical nor a failure
    missing = {"error": "ScenarioError: new: no such scenario file (expected a TOML file path ...)"}
    assert it.compare(["new"], {"new": same}, {"new": missing}) == (
        [f"{'new':24s} new here (not shipped there): not compared"], 0)
    assert it.compare(["new"], {"new": missing}, {"new": missing})[1] == 1  # missing here too: a failure


needs_git = pytest.mark.skipif(shutil.which("git") is None or subprocess.run(
    ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True).returncode != 0, reason="needs a git checkout")


@needs_git
def test_end_to_end_against_this_commit(capsys, monkeypatch):
    """HEAD against HEAD (here = a checkout of HEAD too, so uncommitted work cannot make it
    differ): the script checks out, runs both sides and finds them identical."""
    assert it.main(["--against", "no-such-commit-here", "--only", "chat_vs_batch"]) == 2
    assert "--against no-such-commit-here: cannot check it out" in capsys.readouterr().err
    with it.checkout("HEAD") as head:
        assert (head / "sim" / "__init__.py").is_file()
        monkeypatch.setattr(it, "ROOT", head)
        assert it.main(["--against", "HEAD", "--only", "chat_vs_batch", "--set", "horizon_s=5"]) == 0
    assert not head.exists()  # the temporary worktree is gone
    out = capsys.readouterr().out
    assert "chat_vs_batch" in out and "1 of 1 runs byte-identical" in out


def test_fuzz_runs_are_the_fuzz_draws_handed_to_both_sides_whole():
    import numpy as np

    from scripts.exactness_fuzz import draw

    todo = it.fuzz_runs(["cluster", "prefix"], 7, 2)
    assert [k for k, _, _ in todo] == ["fuzz-cluster-7", "fuzz-cluster-8", "fuzz-prefix-7", "fuzz-prefix-8"]
    assert todo[1][1] == draw("cluster", np.random.default_rng(8)) and todo[1][2] == []
    assert "cluster" in todo[0][1] and todo[2][1]["engine"]["prefix_caching"] is True


def test_fuzz_refuses_the_shipped_runs_options(capsys):
    assert it.main(["--against", "HEAD", "--fuzz", "cluster", "--set", "horizon_s=5"]) == 2
    assert "--fuzz draws whole scenarios" in capsys.readouterr().err
    assert it.main(["--against", "HEAD", "--fuzz", "replica", "--trials", "0"]) == 2
    assert "--trials 0: expected at least 1" in capsys.readouterr().err


@needs_git
def test_fuzz_end_to_end_against_this_commit(capsys, monkeypatch):
    """One draw of each kind, HEAD against a checkout of HEAD: identical."""
    with it.checkout("HEAD") as head:
        monkeypatch.setattr(it, "ROOT", head)
        assert it.main(["--against", "HEAD", "--fuzz", "cluster", "--fuzz", "replica", "--fuzz", "prefix",
                        "--start", "3", "--trials", "1"]) == 0
    out = capsys.readouterr().out
    assert "fuzz-cluster-3" in out and "fuzz-prefix-3" in out and "3 of 3 runs byte-identical" in out
