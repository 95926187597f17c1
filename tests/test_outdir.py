"""No command deletes or overwrites a file it did not create (sim.outdir): every command with
``--out`` against a folder holding a user's files, ``.``, ``..``, a symlink and the scenario's own
folder; results whole or absent after a kill; default folders that never collide."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings, strategies as st
from click.testing import CliRunner

from sim.cli import main
from tests.conftest import small_scenario
from sim.outdir import MARKER, OutError, claim, fresh, publish, staged, write_file

SMALL = ["--set", "horizon_s=3"]


def _user_tree(root: Path) -> dict[Path, bytes]:
    """A user's files: notes, a CSV, a hidden key and a thesis, as in a home folder."""
    files = {root / "notes.txt": b"my notes\n", root / "data.csv": b"a,b\n1,2\n",
             root / ".ssh" / "id": b"secret", root / "thesis.tex": b"\\begin{document}"}
    for p, b in files.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b)
    return files


def _survives(files: dict[Path, bytes]) -> None:
    for p, b in files.items():
        assert p.read_bytes() == b, p


def _invoke(args, cwd: Path):
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(main, args)
    finally:
        os.chdir(old)


def _commands(scenario: Path, run_dir: Path) -> dict[str, list[str]]:
    """Each command with --out, minus the --out value (cheap settings)."""
    return {
        "run": ["run", str(scenario), *SMALL],
        "sweep": ["sweep", str(scenario), *SMALL, "--workers", "1", "--no-plots", "--no-progress"],
        "capacity": ["capacity", str(scenario), *SMALL, "--workers", "1", "--no-plots", "--max-replicas", "2"],
        "plot": ["plot", str(run_dir)],
        "workload": ["workload", str(scenario), *SMALL],
        "fidelity": ["fidelity", "--rows", "no-such-row"],
        "validate": ["validate", "--profile", str(run_dir / "summary.json")],
        "calibrate": ["calibrate", "--device", "cpu", "--shape", "tiny"],
        "tune": ["tune", str(scenario), *SMALL, "--space", "engine.max_num_seqs=8,16", "--trials", "1",
                 "--maximize", "output_tokens_per_s", "--no-plots"],
        "sensitivity": ["sensitivity", str(scenario), *SMALL, "--knobs", "engine.max_num_seqs",
                        "--ranges", "engine.max_num_seqs=8..16"],
    }


#: Commands that write one named file, each with the option naming it: pointed at a user's file,
#: every one refuses (exit 2) and the file is unchanged.
RUN_FILE = Path(__file__).resolve().parent / "data" / "runs" / "vllm_concurrency8.json"


def _file_commands(scenario: Path, run_dir: Path) -> dict[str, tuple[list[str], str]]:
    return {
        "workload": (["workload", str(scenario), *SMALL], "--out"),
        "calibrate": (["calibrate", "--device", "cpu", "--shape", "tiny"], "--out"),
        "calibrate --from-runs": (["calibrate", "--from-runs", str(RUN_FILE), "--profile", "h200-llama-3-8b"], "--out"),
        "replay --json": (["replay", str(RUN_FILE)], "--json"),
        "replay --figure": (["replay", str(RUN_FILE)], "--figure"),
        "report --out": (["report", str(run_dir)], "--out"),
        "compare --csv": (["compare", str(run_dir), str(run_dir)], "--csv"),
        "capacity --figure": (["capacity", str(scenario), *SMALL, "--workers", "1", "--max-replicas", "2",
                               "--no-uncertainty"], "--figure"),
    }


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    base = tmp_path_factory.mktemp("survive")
    scen = base / "scen"
    scen.mkdir()
    scenario = scen / "s.toml"
    scenario.write_text(tomli_w.dumps(small_scenario(horizon_s=3.0)))
    run_dir = base / "run0"
    r = _invoke(["run", str(scenario), "--out", str(run_dir)], base)
    assert r.exit_code == 0, r.output
    return base, scenario, run_dir


@pytest.mark.parametrize("target", ["user_folder", "dot", "dotdot", "symlink", "scenario_folder"])
def test_every_command_keeps_a_users_files(setup, target, tmp_path):
    base, scenario, run_dir = setup
    home = tmp_path / "home"
    home.mkdir()
    files = _user_tree(home)
    inner = home / "work"
    inner.mkdir()
    files.update(_user_tree(inner))
    scen_copy = home / "s.toml"
    scen_copy.write_bytes(scenario.read_bytes())
    files[scen_copy] = scenario.read_bytes()
    (home / "link").symlink_to(home, target_is_directory=True)
    out, cwd = {"user_folder": (str(home), base), "dot": (".", home), "dotdot": ("..", inner),
                "symlink": (str(home / "link"), base), "scenario_folder": (str(home), base)}[target]
    scen_arg = scen_copy if target == "scenario_folder" else scenario
    for name, args in _commands(scen_arg, run_dir).items():
        if name in ("workload", "calibrate"):
            continue  # (they write a file: below)
        r = _invoke(args + ["--out", out], cwd)
        assert r.exit_code == 2, (name, r.exit_code, r.output)
        assert "Traceback" not in r.output, (name, r.output)
        _survives(files)
        assert (home / "link").is_symlink()
    for name, (args, flag) in _file_commands(scen_arg, run_dir).items():
        r = _invoke(args + [flag, str(home / "notes.txt")], cwd)
        assert r.exit_code == 2, (name, r.exit_code, r.output)
        assert "Traceback" not in r.output, (name, r.output)
        _survives(files)


def test_rerun_needs_overwrite_and_keeps_a_users_file(setup, tmp_path):
    base, scenario, _ = setup
    out = tmp_path / "r"
    assert _invoke(["run", str(scenario), "--out", str(out)], base).exit_code == 0
    (out / "mine.txt").write_text("keep me")
    r = _invoke(["run", str(scenario), "--out", str(out)], base)
    assert r.exit_code == 2 and "--overwrite" in r.output
    r = _invoke(["run", str(scenario), "--out", str(out), "--overwrite", "--seed", "7"], base)
    assert r.exit_code == 0, r.output
    assert (out / "mine.txt").read_text() == "keep me"
    assert json.loads((out / "manifest.json").read_text())["seed"] == 7
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_default_folders_never_collide(tmp_path):
    a = fresh(tmp_path, "x-20261202-101010")
    a.mkdir()
    b = fresh(tmp_path, "x-20261202-101010")
    assert b != a and b.name == "x-20261202-101010-2"


def test_publish_exchanges_without_a_window(tmp_path):
    out = tmp_path / "out"
    with staged(out, "run") as t:
        (t / "summary.json").write_text("1")
    (out / "user.txt").write_text("u")
    with staged(out, "run") as t:
        (t / "summary.json").write_text("2")
    assert (out / "summary.json").read_text() == "2" and (out / "user.txt").read_text() == "u"
    assert json.loads((out / MARKER).read_text())["kind"] == "run"


def test_a_users_file_inside_a_results_folder_survives_a_replace(tmp_path):
    """Inside the folders a result wrote (a run's replicas/) only what it wrote is replaced; a
    figures/ it never wrote, or one with a marker of its own (``priosim plot``'s), keeps the
    user's files; nested paths are recorded in the marker."""
    out = tmp_path / "out"
    with staged(out, "run") as t:
        (t / "replicas").mkdir()
        (t / "replicas" / "r0.json").write_text("old")
    assert "replicas/r0.json" in json.loads((out / MARKER).read_text())["paths"]
    (out / "replicas" / "mine.txt").write_text("u1")
    (out / "figures").mkdir()  # (names runs may write, never written here)
    (out / "figures" / "mine.png").write_text("u2")
    (out / "iterations.parquet").write_text("u4")
    with staged(out, "run") as t:
        (t / "replicas").mkdir()
        (t / "replicas" / "r0.json").write_text("new")
    assert (out / "replicas" / "r0.json").read_text() == "new"
    assert (out / "replicas" / "mine.txt").read_text() == "u1" and (out / "figures" / "mine.png").read_text() == "u2"
    assert (out / "iterations.parquet").read_text() == "u4"
    # figures/ drawn into the run later (a marker of its own), a user's file beside them
    (out / "figures" / "mine.png").unlink()
    (out / "figures" / "cdf.png").write_text("drawn")
    write_file(out / "figures" / MARKER, json.dumps({"kind": "figures", "files": ["cdf.png"]}))
    (out / "figures" / "notes.txt").write_text("u3")
    with staged(out, "run") as t:
        (t / "summary.json").write_text("3")
    assert (out / "figures" / "notes.txt").read_text() == "u3" and not (out / "figures" / "cdf.png").exists()
    assert (out / "replicas" / "mine.txt").read_text() == "u1"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_users_file_named_as_the_new_results_is_refused_and_nothing_moves(tmp_path):
    out = tmp_path / "out"
    with staged(out, "run") as t:
        (t / "summary.json").write_text("old")
    (out / "figures").mkdir()
    (out / "figures" / "cdf.png").write_text("mine")
    with pytest.raises(OutError, match="figures/cdf.png"):
        with staged(out, "run") as t:
            (t / "figures").mkdir()
            (t / "figures" / "cdf.png").write_text("drawn")
    assert (out / "figures" / "cdf.png").read_text() == "mine" and (out / "summary.json").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_plot_never_draws_into_a_users_figures_folder(setup, tmp_path):
    import shutil

    _, _, run_dir = setup
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    (run / "figures").mkdir()
    (run / "figures" / "latency_cdf.png").write_text("mine")
    r = _invoke(["plot", str(run)], tmp_path)
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert (run / "figures" / "latency_cdf.png").read_text() == "mine"


def test_a_failed_write_leaves_the_old_result(tmp_path):
    out = tmp_path / "out"
    with staged(out, "run") as t:
        (t / "summary.json").write_text("old")
    with pytest.raises(RuntimeError):
        with staged(out, "run") as t:
            (t / "summary.json").write_text("new")
            raise RuntimeError("disk full")
    assert (out / "summary.json").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_stale_temporary_folders_are_cleaned_and_a_users_file_put_back(tmp_path):
    out = tmp_path / "out"
    with staged(out, "run") as t:
        (t / "summary.json").write_text("old")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".out.tmp-{dead.pid}-deadbeef"  # killed after moving the user's file in
    stale.mkdir()
    (stale / "summary.json").write_text("half")
    (stale / "mine.txt").write_text("u")
    (stale / ".priosim-moved.json").write_text('["mine.txt"]')
    with staged(out, "run") as t:
        (t / "summary.json").write_text("new")
    assert (out / "mine.txt").read_text() == "u"
    assert not stale.exists()


def test_claim_refuses_other_kinds_and_long_names(tmp_path):
    out = tmp_path / "r"
    with staged(out, "run") as t:
        (t / "summary.json").write_text("x")
    with pytest.raises(OutError, match="priosim run result"):
        claim(out, "sweep", resume=True)
    with pytest.raises(OutError, match="bytes long"):
        claim(tmp_path / ("x" * 300), "run")


def test_a_refusal_names_the_results_own_files_and_reads_as_english(tmp_path):
    """A folder holding a result of another kind beside a user's file: the message lists the
    result's own files (not the user's, as if priosim had written it), and says where a kind's
    results go ("figures go to", not "results of a figures go to")."""
    out = tmp_path / "r"
    with staged(out, "run") as t:
        for name in ("summary.json", "manifest.json"):
            (t / name).write_text("x")
    (out / "my.txt").write_text("mine")
    with pytest.raises(OutError) as err:
        claim(out, "figures", resume=True)
    assert "holds a priosim run result (manifest.json, summary.json); figures go to a new or empty folder" \
        in str(err.value)
    with pytest.raises(OutError, match=r"\(manifest.json, summary.json\); sweep results go to"):
        claim(out, "sweep", resume=True)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "a.txt").write_text("x")
    with pytest.raises(OutError, match=r"holds files priosim did not write \(a.txt\); run results go to"):
        claim(tmp_path / "mine", "run")


def test_write_file_is_whole_or_absent(tmp_path):
    p = tmp_path / "a.json"
    write_file(p, "old")

    def boom(path):
        Path(path).write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        write_file(p, boom)
    assert p.read_text() == "old" and [q.name for q in tmp_path.iterdir()] == ["a.json"]


def test_kill_during_rerun_never_loses_the_earlier_result(setup, tmp_path):
    """kill -9 at 10 points of a rerun into an existing result (from half its time to past its
    end): the folder always holds one complete result (the old or the new), and a rerun
    afterwards recovers."""
    base, scenario, _ = setup
    out = tmp_path / "r"
    cmd = [sys.executable, "-m", "sim.cli", "run", str(scenario), "--out", str(out), "--set", "horizon_s=3"]
    assert subprocess.run(cmd, cwd=base, capture_output=True).returncode == 0
    started = time.perf_counter()
    full = subprocess.run(cmd + ["--overwrite"], cwd=base, capture_output=True)
    assert full.returncode == 0
    span = time.perf_counter() - started
    for i in range(10):  # (where a kill lands varies with the load anyway; every run is checked the same)
        p = subprocess.Popen(cmd + ["--overwrite"], cwd=base, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(span * (0.5 + i / 10 * 0.6))
        p.send_signal(signal.SIGKILL)
        p.wait()
        names = {q.name for q in out.iterdir()}
        assert {"summary.json", "requests.parquet", "manifest.json", MARKER} <= names, (i, names)
        json.loads((out / "summary.json").read_text())
    assert subprocess.run(cmd + ["--overwrite"], cwd=base, capture_output=True).returncode == 0
    assert not [q for q in tmp_path.iterdir() if q.name.startswith(".")]


def test_capacity_resumes_from_its_kept_probes(setup, tmp_path):
    """A capacity search keeps each probe as it finishes; a rerun into the folder (after a kill,
    say) simulates none of them again and gives the same answer."""
    base, scenario, _ = setup
    out = tmp_path / "cap"
    args = ["capacity", str(scenario), *SMALL, "--workers", "1", "--no-plots", "--max-replicas", "3", "--out",
            str(out)]
    assert _invoke(args, base).exit_code == 0
    first = json.loads((out / "capacity.json").read_text())
    kept = {p.name: p.stat().st_mtime_ns for p in (out / "probes").iterdir()}
    assert kept
    (out / "capacity.json").unlink()  # as if killed before the report was written
    r = _invoke(args, base)
    assert r.exit_code == 0, r.output
    assert {p.name: p.stat().st_mtime_ns for p in (out / "probes").iterdir()} == kept
    assert json.loads((out / "capacity.json").read_text())["designs"].keys() == first["designs"].keys()
    assert [d["replicas"] for d in json.loads((out / "capacity.json").read_text())["designs"].values()] == \
        [d["replicas"] for d in first["designs"].values()]


def test_a_users_file_with_tmp_in_its_name_survives_an_overwrite(tmp_path):
    out = tmp_path / "out"
    with staged(out, "run") as t:
        (t / "summary.json").write_text("old")
    (out / "backup.tmp-1").write_text("mine")  # not a name priosim makes (.NAME.tmp-PID-<8 hex>)
    with staged(out, "run") as t:
        (t / "summary.json").write_text("new")
    assert (out / "backup.tmp-1").read_text() == "mine"


def test_an_old_result_set_aside_by_a_killed_exchange_is_restored(tmp_path):
    """Where renameat2 is missing, an exchange sets the old result aside first; a kill before
    the new one lands leaves only that: the next publish puts it back rather than removing it."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    aside = tmp_path / f".out.tmp-{dead.pid}-old"
    aside.mkdir()
    (aside / "summary.json").write_text("old")
    from sim.outdir import clean_stale

    clean_stale(tmp_path / "out")
    assert (tmp_path / "out" / "summary.json").read_text() == "old" and not aside.exists()


@settings(derandomize=True, max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(["notes.txt", ".ssh", "summary.json", ".priosim.json", "requests.parquet",
                                 ".out.tmp-1-deadbeef", "out.txt", "figures"]), max_size=5, unique=True),
       st.sampled_from(["run", "sweep", "tune", "capacity"]), st.booleans(), st.booleans())
def test_any_folder_state_is_claimed_or_refused_and_nothing_is_lost(tmp_path_factory, names, kind, overwrite,
                                                                   write):
    """Whatever a folder holds (a user's files, a marker of another kind, a stale temporary
    name), ``claim`` returns or raises OutError, and a result published into it keeps every file
    priosim did not write."""
    root = tmp_path_factory.mktemp("fz")
    out = root / "out"
    out.mkdir()
    mine = {}
    for n in names:
        p = out / n
        if n == ".priosim.json":
            p.write_text(json.dumps({"kind": "sweep", "files": []}))
        elif n in ("figures", ".ssh"):
            p.mkdir()
            (p / "x").write_text("keep")
            mine[p / "x"] = b"keep"
        else:
            p.write_text(n)
            mine[p] = n.encode()
    try:
        claim(out, kind, overwrite=overwrite, resume=kind != "run")
    except OutError:
        _survives(mine)
        return
    if write and kind == "run":
        with staged(out, "run") as tmp:
            (tmp / "summary.json").write_text("{}")
    _survives(mine)


def test_results_save_from_python_names_its_own_argument(tmp_path):
    """``Results.save`` refusing a folder speaks Python: its argument and ``overwrite=True``, not
    the command line's ``--out`` and ``--overwrite``."""
    from sim import scenario_from_dict, simulate
    from tests.conftest import small_scenario

    res = simulate(scenario_from_dict(small_scenario(horizon_s=2.0)))
    res.save(tmp_path / "r")
    with pytest.raises(OutError, match=r"^out_dir .*: already holds a priosim run result \(pass overwrite=True to "
                                       r"replace it, or another out_dir\)$"):
        res.save(tmp_path / "r")
    res.save(tmp_path / "r", overwrite=True)
