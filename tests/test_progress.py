"""Progress of long commands where stderr is not a terminal (a log, CI, a pipe): a plain line at
least every sim.progress.INTERVAL_S seconds (shortened here), and a closing line; nothing with
--no-progress. On a terminal the same commands draw a tqdm bar."""
from __future__ import annotations

import io
import time

from click.testing import CliRunner

from sim import progress
from sim.cli import main

SMALL = ["--set", "horizon_s=10", "--set", "streams.0.arrival.n=100"]


def test_progress_lines_count_what_is_done_and_close_with_the_total():
    out = io.StringIO()
    bar = progress.ProgressLines(4, "sweep", "runs", initial=3, interval_s=0.01, file=out)
    deadline = time.monotonic() + 10
    while not out.getvalue() and time.monotonic() < deadline:  # (the line comes from a thread)
        time.sleep(0.01)
    bar.update(1)
    bar.set_postfix(failed=0)
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("sweep: 3/4 runs (75%), ") and " elapsed" in lines[0]
    assert lines[-1].startswith("sweep: 4/4 runs (100%), ") and lines[-1].endswith(", failed=0")
    bar.close()  # (twice is harmless)
    assert len(out.getvalue().splitlines()) == len(lines)


def test_no_line_for_a_step_shorter_than_the_interval_and_none_when_off():
    out = io.StringIO()
    bar = progress.ProgressLines(None, "capacity", "simulations", interval_s=60, file=out)
    bar.update(3)
    bar.close()
    assert out.getvalue() == ""
    assert progress.progress_bar(False, total=3, desc="x", unit="y") is None


def test_sweep_and_run_write_progress_lines_when_stderr_is_not_a_terminal(tmp_path, monkeypatch):
    monkeypatch.setattr(progress, "INTERVAL_S", 0.01)
    args = ["sweep", "chat_vs_batch", "--policies", "fcfs", "--loads", "0.5,1", "--seeds", "1", *SMALL,
            "--workers", "1", "--no-plots"]
    res = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "sw")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("sweep: ")]
    assert lines and lines[-1].startswith("sweep: 2/2 runs (100%)"), res.stderr
    res = CliRunner().invoke(main, ["run", "chat_vs_batch", "--out", str(tmp_path / "r")],  # (about a second)
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert any(ln.startswith("chat_vs_batch: ") and " sim-s (" in ln for ln in res.stderr.splitlines()), res.stderr

    res = CliRunner().invoke(main, [*args, "--no-progress", "--out", str(tmp_path / "sw2")], catch_exceptions=False)
    assert res.exit_code == 0 and "sweep: " not in res.stderr


def test_a_drain_says_how_far_it_has_come_past_the_horizon(tmp_path, monkeypatch):
    """chat_vs_batch drains to about 470 s past a 5 s horizon: the bar stays at 100 % ("00:00
    left") and its closing line says where the drain ended, not only that the horizon was done."""
    monkeypatch.setattr(progress, "INTERVAL_S", 0.01)
    res = CliRunner().invoke(main, ["run", "chat_vs_batch", "--set", "horizon_s=5",
                                    "--out", str(tmp_path / "r")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    last = [ln for ln in res.stderr.splitlines() if ln.startswith("chat_vs_batch: ")][-1]
    assert last.startswith("chat_vs_batch: 5/5 sim-s (100%)") and ", draining=t=470s" in last, res.stderr
