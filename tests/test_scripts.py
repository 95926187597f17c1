"""The scripts that draw the docs' figures run from a clean clone (their data is bundled), here at
a small size and into a scratch folder, never over the tracked figures."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_sjf_tau_curve_small(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, "-m", "scripts.sjf_tau_curve", "--seeds", "1", "--horizon-s", "20",
                           "--out", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    table = (tmp_path / "sjf_tau_curve.md").read_text()
    assert table.count("| sjf_rank(noisy, tau=") == 4 and "| fcfs |" in table
    assert (tmp_path / "sjf_tau_curve.png").stat().st_size > 0


def test_docs_run_scripts_and_benchmarks_as_modules():
    """They import the project as packages from the repository root (no sys.path edits), so a
    page that shows one shows ``python -m scripts.NAME`` / ``python -m benchmarks.NAME``."""
    import re
    pages = [ROOT / "README.md", ROOT / "benchmarks" / "results.md", *sorted((ROOT / "docs").rglob("*.md"))]
    bad = [f"{p.name}: {m.group(0)}" for p in pages
           for m in re.finditer(r"python3? +(scripts|benchmarks)/\w+\.py", p.read_text())]
    assert not bad, bad


def test_measured_vs_roofline_compares_every_decode_and_prefill_row(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, "-m", "scripts.measured_vs_roofline", "--out", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    table = (tmp_path / "measured_vs_roofline.md").read_text()
    assert table.count("| decode |") == 36 and table.count("| prefill |") == 14
    assert (tmp_path / "measured_vs_roofline.png").stat().st_size > 0


def test_instruction_count_harness_reads_callgrind_and_refuses_bad_input(tmp_path, monkeypatch, capsys):
    """benchmarks.instructions (valgrind, run by hand): its reading of callgrind's report, and one
    line with exit status 2 for a missing valgrind or a folder that is no checkout."""
    import pytest

    from benchmarks import instructions
    assert instructions.collected("==1== Events    : Ir\n==1== Collected : 7014751201\n==1==\n") == 7014751201
    with pytest.raises(RuntimeError, match="no 'Collected' count"):
        instructions.collected("valgrind: command failed")
    assert instructions.main(["--tree", str(tmp_path)]) == 2  # (no valgrind, or no sim/ there)
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    monkeypatch.setattr(instructions.shutil, "which", lambda name: None)
    assert instructions.main([]) == 2
    assert "valgrind is not on the PATH" in capsys.readouterr().err
