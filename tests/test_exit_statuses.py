"""Every priosim command exits with the same statuses (sim.cli.group.EPILOG, docs/errors.md):
0 done, 1 a run failed inside a sweep / tune / capacity search, 2 bad input, 130 interrupted
(one line ``interrupted``, nothing partial published)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from sim.cli import main

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--set", "horizon_s=10", "--set", "streams.0.arrival.n=100"]


def _cli(args):
    return CliRunner().invoke(main, args, catch_exceptions=False)


def test_a_sweep_with_failed_runs_exits_1_not_the_number_of_failures(tmp_path):
    """Two failed runs used to exit 2, the status of bad input."""
    res = _cli(["sweep", "chat_vs_batch", "--policies", "fcfs,tests.sweep_helpers:Broken", "--loads", "1,0.5",
                *SMALL, "--workers", "1", "--no-plots", "--out", str(tmp_path / "sw")])
    assert "2 done, 0 skipped (already complete), 2 failed" in res.output
    assert res.exit_code == 1


def test_a_failed_capacity_probe_exits_1(tmp_path, monkeypatch):
    import sim.experiments.capacity as cap

    def broken(*args, **kwargs):
        raise RuntimeError("capacity point shared [1] failed: boom\nTraceback (most recent call last): ...")

    monkeypatch.setattr(cap, "capacity_search", broken)
    res = CliRunner().invoke(main, ["capacity", "chat_vs_batch", "--out", str(tmp_path / "c"), "--no-plots"])
    assert res.exit_code == 1, res.output
    assert res.stderr.splitlines()[0] == "error: capacity point shared [1] failed: boom"


def test_a_failed_error_bound_search_exits_1_and_drops_the_explanation(tmp_path, monkeypatch):
    """The explanation's points simulate while the searches at the cost model's error bounds
    run: when one of those fails, the command ends with status 1 at once, its explanation given
    up (not waited for)."""
    import sim.experiments.capacity_explain as ex
    import sim.experiments.uncertainty as unc

    def broken(*args, **kwargs):
        raise RuntimeError("capacity point shared [2] failed: boom")

    dropped = []
    cancel = ex.Explaining.cancel
    monkeypatch.setattr(unc, "capacity_uncertainty", broken)
    monkeypatch.setattr(ex.Explaining, "cancel", lambda self: (dropped.append(self.pool is not None), cancel(self)))
    res = CliRunner().invoke(main, ["capacity", "chat_vs_batch", "--designs", "shared", "--max-replicas", "4",
                                    "--set", "horizon_s=60.0", "--workers", "2", "--out", str(tmp_path / "c"),
                                    "--no-plots"])
    assert res.exit_code == 1, res.output
    assert "error: capacity point shared [2] failed: boom" in res.stderr
    assert dropped == [True]  # (given up while its workers ran)


@pytest.mark.parametrize("args", [["run", "chat_vs_batch", "--no-plots"], ["workload", "chat_vs_batch"]])
def test_ctrl_c_in_any_command_is_one_line_and_130(tmp_path, monkeypatch, args):
    """Click's own handling printed "Aborted!" with status 1."""
    import sim.assembly
    import sim.run

    def interrupt(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(sim.run, "simulate", interrupt)
    monkeypatch.setattr(sim.assembly, "build_workload", interrupt)
    res = CliRunner().invoke(main, args + ["--out", str(tmp_path / "o")])
    assert res.exit_code == 130, res.output
    assert res.stderr.strip() == "interrupted"
    assert not (tmp_path / "o").exists()


def test_a_run_sent_sigint_exits_130_and_publishes_nothing(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    err = tmp_path / "err.txt"
    with open(err, "wb") as fh:  # (a run of minutes: the progress bar says when it has started)
        # (Ctrl-C's SIGINT, with its default action: a test run launched as a background job
        # inherits SIGINT ignored, and a child would then never hear it)
        proc = subprocess.Popen([sys.executable, "-m", "sim.cli", "run", "chat_vs_batch", "--set", "horizon_s=1e6",
                                 "--progress", "--out", str(tmp_path / "out")], cwd=tmp_path, env=env,
                                stdout=subprocess.DEVNULL, stderr=fh,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            deadline = time.monotonic() + 120
            while b"sim-s" not in err.read_bytes() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    lines = err.read_bytes().decode(errors="replace").replace("\r", "\n").strip().splitlines()
    assert code == 130, lines[-5:]
    assert lines[-1].strip() == "interrupted"
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]  # no staged leftovers


def test_validate_without_torch_is_one_line_and_2(tmp_path, monkeypatch):
    """It was a ModuleNotFoundError traceback (the real runs import torch when they start)."""
    monkeypatch.setitem(sys.modules, "torch", None)  # (import torch now fails, installed or not)
    prof = ROOT / "sim" / "core" / "profiles" / "cpu-tiny.json"
    res = CliRunner().invoke(main, ["validate", "--profile", str(prof), "--out", str(tmp_path / "v")])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: validate needs torch: pip install -e '.[calibrate]'")
    assert not (tmp_path / "v").exists()


def test_help_and_version_keep_click_s_output_and_list_the_statuses():
    res = CliRunner().invoke(main, ["--help"])
    assert res.exit_code == 0 and res.output.startswith("Usage: ")
    text = " ".join(res.output.split())
    assert "Exit status, every command: 0 done; 1 a run failed" in text and "130 interrupted" in text
    res = CliRunner().invoke(main, ["run", "--help"])
    assert res.exit_code == 0 and "--seed INTEGER" in res.output
    assert CliRunner().invoke(main, ["--version"]).exit_code == 0


@pytest.mark.parametrize("args, line", [
    (["run", "--seed", "abc"], "error: --seed: 'abc' is not a valid integer (see priosim run --help)"),
    (["sweep", "--backend", "dask"], "error: --backend: 'dask' is not one of 'local', 'ray' (see priosim sweep --help)"),
    (["run", "--sed", "1"], "error: no such option '--sed'; did you mean '--seed' or '--set'? (see priosim run --help)"),
    (["nosuch"], "error: no such command 'nosuch' (see priosim --help)"),
    (["calibrate", "--shape", "tiny"], "error: missing option '--out' (see priosim calibrate --help)"),
])
def test_click_usage_errors_are_one_line_and_2(args, line):
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines() == [line]


def test_the_help_hint_names_the_command_whatever_the_program_is_called():
    """Started as ``python -m sim.cli`` the hint still reads ``priosim replay --help`` (it read
    ``priosim -m sim.cli replay --help``)."""
    res = CliRunner().invoke(main, ["replay", "x.json", "--arrivals", "foo"], prog_name="python -m sim.cli")
    assert res.exit_code == 2 and res.stderr.strip().endswith("(see priosim replay --help)")
