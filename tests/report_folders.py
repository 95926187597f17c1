"""Tiny result folders of every kind, each made by its command with ``--report`` (for
tests/test_report.py and tests/test_report_browser.py): a run (with iterations.parquet), a
sweep of two policies x two loads x two seeds, a capacity search and a tune of three trials."""
from __future__ import annotations

from pathlib import Path

import tomli_w
from click.testing import CliRunner

from sim.cli import main
from tests.conftest import small_scenario

SMALL = ["--set", "horizon_s=4"]


def cli(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def make_folders(base: Path) -> dict[str, Path]:
    """Kind -> the result folder, each with its report.html (asserted written)."""
    scenario = base / "s.toml"
    scenario.write_text(tomli_w.dumps(small_scenario(horizon_s=4.0)))
    out = {k: base / k for k in ("run", "sweep", "capacity", "tune")}
    commands = {
        "run": ["run", scenario, *SMALL, "--trace-iterations", "--no-progress"],
        "sweep": ["sweep", scenario, *SMALL, "--policies", "fcfs,priority", "--loads", "0.5,1", "--seeds", "2",
                  "--workers", "1", "--no-plots", "--no-progress"],
        "capacity": ["capacity", scenario, *SMALL, "--workers", "1", "--no-plots", "--max-replicas", "3"],
        "tune": ["tune", scenario, *SMALL, "--space", "engine.max_num_seqs=2..16", "--trials", "3",
                 "--maximize", "output_tokens_per_s", "--minimize", "ttft_p99_s:hi", "--no-plots"],
    }
    for kind, args in commands.items():
        r = cli(*args, "--out", out[kind], "--report")
        assert r.exit_code == 0, (kind, r.output)
        assert (out[kind] / "report.html").is_file(), (kind, r.output)
        assert f"report: {out[kind] / 'report.html'}" in r.output
    return out
