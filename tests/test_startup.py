"""Start-up and exit: the command line and the simulator import scipy only when a run needs it (a
length law or arrival process that uses scipy.special imports it on first use), that lazy import
changes no result, and the program's quick exit (no garbage collection of what is left) loses
nothing and keeps the exit status."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_importing_the_cli_and_the_simulator_does_not_import_scipy():
    mods = _modules_after("import sim.cli, sim.run, sim.cluster, sim.experiments.sweep, sim.experiments.capacity, "
                          "workloads")
    assert not {m for m in mods if m == "scipy" or m.startswith("scipy.")}


def test_a_run_without_scipy_laws_never_imports_it_and_one_with_them_does():
    plain = _modules_after("from sim import load_scenario, simulate\n"
                           "simulate(load_scenario('azure_two_tenants', overrides=['horizon_s=5']))")
    assert "scipy.special" not in plain  # a trace replay
    lognormal = _modules_after("from sim import load_scenario, simulate\n"
                               "simulate(load_scenario('diurnal_two_class', overrides=['horizon_s=5']))")
    assert "scipy.special" in lognormal


def test_lazily_imported_laws_draw_the_same_numbers_as_scipy_directly():
    import numpy as np
    from scipy import special

    from workloads.arrivals import WeibullRenewal
    from workloads.lengths import Lognormal, correlated_uniforms

    u = np.linspace(0.001, 0.999, 101)
    assert np.array_equal(Lognormal(800, 0.8).ppf(u), 800 * np.exp(0.8 * special.ndtri(u)))
    w = WeibullRenewal(rate=2.0, shape=0.7)
    assert w._scale == 1 / (2.0 * special.gamma(1 + 1 / 0.7))
    a, b = correlated_uniforms(np.random.default_rng(3), 50, 0.4)
    rng = np.random.default_rng(3)
    z1 = rng.standard_normal(50)
    z2 = 0.4 * z1 + np.sqrt(1 - 0.16) * rng.standard_normal(50)
    assert np.array_equal(a, special.ndtr(z1)) and np.array_equal(b, special.ndtr(z2))


def test_the_program_writes_the_same_files_as_the_command_in_process_and_keeps_exit_statuses(tmp_path):
    from click.testing import CliRunner

    from sim.cli import main

    args = ["run", "chat_vs_batch", "--set", "horizon_s=5", "--no-progress"]
    done = subprocess.run([sys.executable, "-m", "sim.cli", *args, "--out", str(tmp_path / "a")],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "results:" in done.stdout
    res = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "b")], catch_exceptions=False)
    assert res.exit_code == 0
    for f in ("requests.parquet", "timeseries.parquet", "summary.json", "scenario.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    bad = subprocess.run([sys.executable, "-m", "sim.cli", "run", "chat_vs_batch", "--set", "engine.max_num_seqs=0"],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "Traceback" not in bad.stderr
