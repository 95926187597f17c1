"""Small promises of the CLI and docs: full router descriptions, a bad --metric in one line,
the benchmark suite's --help, every policy documented, the docs' extras as in pyproject."""
from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from click.testing import CliRunner

from policies import POLICIES
from sim.cli import main
from sim.routers import ROUTERS

ROOT = Path(__file__).resolve().parents[1]


def test_routers_lists_whole_descriptions():
    out = CliRunner().invoke(main, ["routers"]).output
    line = next(x for x in out.splitlines() if x.startswith("class_aware"))
    assert line.rstrip().endswith("(default least_outstanding).")
    for name in ROUTERS.names():
        assert ROUTERS.entries()[ROUTERS.names().index(name)].description.endswith(".")


def test_compare_unknown_metric_is_one_line_exit_2(tmp_path, run):
    from tests.conftest import small_scenario

    a = run(small_scenario(horizon_s=2.0)).save(tmp_path / "a")
    r = CliRunner().invoke(main, ["compare", str(a), str(a), "--metric", "nosuch"])
    assert r.exit_code == 2
    assert r.output.strip().count("\n") == 0 and "unknown metric 'nosuch'" in r.output and "ttft_p99_s" in r.output
    ok = CliRunner().invoke(main, ["compare", str(a), str(a), "--metric", "ttft_p99_s"])
    assert ok.exit_code == 0 and "ttft_p99_s" in ok.output and "e2e_p99_s" not in ok.output


def test_benchmark_suite_help_does_not_run_it():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run_all.py"), "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--quick" in done.stdout and "usage:" in done.stdout


def test_every_registered_policy_is_in_the_policies_page():
    page = (ROOT / "docs" / "policies.md").read_text()
    for name in POLICIES.names():
        assert f"| `{name}` |" in page, name


def test_docs_name_the_distributed_extra_as_pyproject_does():
    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["distributed"]
    page = (ROOT / "docs" / "sweeps.md").read_text()
    said = re.search(r"pip install 'priosim\[distributed\]'\s+# = pip install '([^']+)'", page).group(1)
    assert [said] == spec
