"""The compiled build (sim.native, mypyc) gives the same results as pure Python.

A session fixture builds the hot modules once per test run in a scratch copy of the project (at
the C compiler's -O0: about 15 s of one core); the tests then use that build: every shipped
scenario, a cluster, and the benchmark workload with a small KV pool under each preemption mode
run twice, compiled and pure Python (``PRIOSIM_PURE_PYTHON=1``), and their request tables, time
series and summaries must be equal; the exactness suite (tests/test_exactness.py: the fast paths
against stepping), the engine's core tests and the vLLM conformance cases pass on the compiled
build (two items, so the two workers of ``-n auto`` can share them); the console script runs
the compiled build from another folder, and a missing shared library or a source edited after
the build makes ``import sim`` fall back to pure Python (each on a copy of the build of its own).
Skipped where mypyc or a C compiler is missing.
"""
from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sim", "policies", "workloads", "calibrate", "plumbing")  # what an install holds

RUN_ALL = r'''
import json, sys
from pathlib import Path
from sim import load_scenario, scenario_from_dict, simulate, native
from benchmarks.core_scenario import scenario
assert Path(native.__file__).resolve().parents[1] == Path.cwd().resolve(), native.__file__  # the copy's sim
out = Path(sys.argv[1])
cases = {}
for p in sorted(Path("workloads/scenarios").glob("*.toml")):
    cases[p.stem] = load_scenario(str(p), overrides=["horizon_s=15.0"])  # traces: the copy's bundled data
cases["cluster"] = load_scenario("diurnal_two_class", overrides=["horizon_s=15.0", "cluster={replicas=3}"])
for mode in ("recompute", "swap", "auto", "off"):
    d = scenario(800, load=0.9)
    d["engine"].update(preemption=mode, swap_blocks=4000, kv_blocks=6000)
    cases["bench_" + mode] = scenario_from_dict(d)
for name, sc in cases.items():
    res = simulate(sc)  # "cluster" runs its three replicas
    res.requests.to_parquet(out / f"{name}.requests.parquet")
    res.timeseries.to_parquet(out / f"{name}.timeseries.parquet")
    s = res.summary_dict
    for k in ("wall_s", "cpu_s", "engine_build"):
        s["run"].pop(k, None)
    (out / f"{name}.summary.json").write_text(json.dumps(s, sort_keys=True, default=str))
(out / "build.txt").write_text(native.BUILD)
'''


def _can_build() -> bool:
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return importlib.util.find_spec("mypyc") is not None and shutil.which(cc) is not None


needs_build = pytest.mark.skipif(not _can_build(), reason="needs mypyc (pip install -e .[native]) and a C compiler")


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PRIOSIM_PURE_PYTHON"}


def _run(proj: Path, *args: str, **extra: str) -> str:
    done = subprocess.run([sys.executable, *args], cwd=proj, env=_env() | extra, capture_output=True, text=True)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return done.stdout


def _build(folder: Path) -> Path:
    """``folder``/proj: the project's code copied and compiled (once: a later call finds it, or
    the first call's failure)."""
    proj, ok, failed = folder / "proj", folder / "built", folder / "failed.txt"
    if ok.exists():
        return proj
    if failed.exists():
        pytest.fail(failed.read_text())
    skip = shutil.ignore_patterns("*.so", "native_build.json", "__pycache__", "build", ".hypothesis")
    for d in (*PACKAGES, "tests", "benchmarks", "scripts"):
        shutil.copytree(ROOT / d, proj / d, ignore=skip)
    try:
        # the C compiler's -O0: the same code mypyc generates, compiled in 11 CPU-s against -O1's
        # 49 (one C file for every module), its code running the compiled reruns 5 s slower
        _run(proj, "-c", "from sim import native; native.build(opt_level='0')")
        assert _run(proj, "-c", "from sim import native; print(native.BUILD)").strip() == "mypyc"
    except AssertionError as e:
        failed.write_text(f"the compiled build failed: {e}")
        raise
    ok.touch()
    return proj


@pytest.fixture(scope="session")
def compiled(tmp_path_factory) -> Path:
    """A copy of the project with the compiled build in place, made once per test run: under
    pytest-xdist the workers share it through the run's common temporary folder (the first to
    take the lock builds; as tests/test_calibrate.py's ``measured``). Tests only read it; a test
    that changes a build works on :func:`_own_copy`."""
    if "PYTEST_XDIST_WORKER" not in os.environ:  # (not under xdist)
        return _build(tmp_path_factory.mktemp("native"))
    shared = tmp_path_factory.getbasetemp().parent  # this run's, common to its workers
    with open(shared / "native.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build(shared / "native")


def _own_copy(proj: Path, tmp_path: Path) -> Path:
    """The installed packages of the compiled copy (compiled files and build record included),
    copied for a test that breaks or edits them."""
    own = tmp_path / "proj"
    for d in PACKAGES:
        shutil.copytree(proj / d, own / d, ignore=shutil.ignore_patterns("__pycache__"))
    return own


@pytest.mark.slow
@needs_build
def test_compiled_build_gives_identical_results(compiled, tmp_path):
    outs = {}
    for build, extra in (("mypyc", {}), ("python", {"PRIOSIM_PURE_PYTHON": "1"})):
        out = tmp_path / build
        out.mkdir()
        _run(compiled, "-c", RUN_ALL, str(out), **extra)
        assert (out / "build.txt").read_text() == build
        outs[build] = out
    names = sorted(p.name for p in outs["python"].iterdir() if p.name != "build.txt")
    assert len(names) == 3 * (len(list((ROOT / "workloads" / "scenarios").glob("*.toml"))) + 5)
    for name in names:
        a, b = outs["mypyc"] / name, outs["python"] / name
        if name.endswith(".parquet"):
            pd.testing.assert_frame_equal(pd.read_parquet(a), pd.read_parquet(b), check_exact=True, obj=name)
        else:
            assert json.loads(a.read_text()) == json.loads(b.read_text()), name


#: The compiled reruns, as items of about the same length (pytest arguments in the copy).
RERUNS = {
    "benchmark-cohort": ["tests/test_exactness.py::test_lazy_cohort_is_exact_on_the_benchmark_scenario"],
    "exactness-core-conformance": ["tests/test_exactness.py", "-k",
                                   "not test_lazy_cohort_is_exact_on_the_benchmark_scenario",
                                   "tests/test_engine_core.py", "tests/test_vllm_conformance.py"],
    # requests and telemetry pickled to and from worker processes; user policies' keys and
    # preemption modes of their own (interpreted subclasses of compiled classes)
    "windows-extensions": ["tests/test_cluster_windows.py", "tests/test_policy_guard.py", "tests/test_preemption.py",
                           "-k", "not ray"],
}
RERUN = """import sys, pytest
from sim import native
assert native.BUILD == "mypyc", native.BUILD  # (the tests below run the compiled build)
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:xdist", *sys.argv[1:]]))
"""


@pytest.mark.slow
@needs_build
@pytest.mark.parametrize("part", list(RERUNS))
def test_fast_paths_and_engine_tests_pass_compiled(compiled, part):
    """The fast paths stay exact when compiled (tests/test_exactness.py imports
    scripts/exactness_fuzz.py), and the engine's core and vLLM conformance tests pass."""
    _run(compiled, "-c", RERUN, *RERUNS[part])


@needs_build
def test_a_source_edited_after_the_build_runs_pure_python(compiled, tmp_path):
    """A source edited after the build: pure Python runs, with a warning naming the module."""
    proj = _own_copy(compiled, tmp_path)
    assert _run(proj, "-c", "from sim import native; print(native.BUILD)").strip() == "mypyc"
    with open(proj / "sim" / "core" / "loop.py", "a") as f:
        f.write("\n# edited after the build\n")
    done = subprocess.run([sys.executable, "-c", "from sim import native; print(native.BUILD)"], cwd=proj,
                          env=_env(), capture_output=True, text=True)
    assert done.stdout.strip() == "python" and "sim/core/loop.py changed since the compiled build" in done.stderr


@needs_build
def test_console_script_runs_the_compiled_build_from_another_folder(compiled, tmp_path):
    """The installed ``priosim`` script, run from a folder that is not the project's, imports the
    copy's packages the way an install does (from a site folder; the project root is not on
    sys.path) and runs the compiled build; without mypyc's shared library it warns once and runs
    pure Python."""
    proj = _own_copy(compiled, tmp_path)
    site, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    site.mkdir()
    elsewhere.mkdir()
    for d in PACKAGES:
        (site / d).symlink_to(proj / d)
    script = Path(sys.executable).parent / "priosim"
    if not script.exists():  # (not installed: what pip writes for [project.scripts])
        script = site / "priosim"
        script.write_text("import sys\nfrom sim.cli import main\nsys.exit(main())\n")
    env = _env() | {"PYTHONPATH": str(site)}

    def priosim(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, str(script), *args], cwd=elsewhere, env=env, capture_output=True,
                              text=True)
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        return done

    def run_build(out: str) -> str:
        priosim("run", "--no-plots", "--set", "horizon_s=30.0", "--out", out)
        return json.loads((elsewhere / out / "summary.json").read_text())["run"]["engine_build"]

    where = subprocess.run([sys.executable, "-c", "import sim; print(sim.__file__)"], cwd=elsewhere, env=env,
                           capture_output=True, text=True).stdout
    assert Path(where.strip()).resolve().parent == (proj / "sim").resolve(), where
    assert "import sim uses: mypyc" in priosim("native", "status").stdout
    assert run_build("compiled") == "mypyc"

    lib = next((proj / "sim").glob("_native__mypyc.*"))  # a broken build: its shared library gone
    lib.rename(tmp_path / lib.name)
    done = priosim("native", "status")
    assert "import sim uses: python (the compiled build's shared library" in done.stdout
    assert done.stderr.count("RuntimeWarning") == 1 and "running pure Python" in done.stderr, done.stderr
    assert run_build("broken") == "python"
    (tmp_path / lib.name).rename(lib)
    assert "import sim uses: mypyc" in priosim("native", "status").stdout


def test_status_names_every_module_and_the_build_in_use(monkeypatch):
    from click.testing import CliRunner

    from sim import native
    from sim.cli import main

    out = CliRunner().invoke(main, ["native", "status"]).output
    for rel in native.MODULES:
        assert rel in out
    assert "import sim uses: " in out
    monkeypatch.setenv("PRIOSIM_PURE_PYTHON", "1")
    out = CliRunner().invoke(main, ["native", "status"]).output
    assert "import sim uses: python (PRIOSIM_PURE_PYTHON=1)" in out
