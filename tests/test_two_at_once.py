"""Two commands into one folder at once (``tune --resume``, ``tune``, ``capacity``, ``sweep``):
the folder's lock makes them take turns. Both finish (the second says, in one line, that it waits)
or the second refuses in one line; the result is the one a single command gives: a tune has
exactly ``--trials`` trials (not one more), a sweep's runs are each simulated once."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pandas as pd
import pytest
import tomli_w

from tests.conftest import small_scenario
from tests.kill_points import check_whole, same_tables, start, tables, uncut, warm

S = ["--set", "horizon_s=3"]
TUNE = ["tune", "s.toml", *S, "--space", "engine.max_num_seqs=4..16", "--maximize", "output_tokens_per_s",
        "--no-plots"]
SWEEP = ["sweep", "s.toml", *S, "--seeds", "3", "--workers", "1", "--no-plots", "--no-progress"]
CAPACITY = ["capacity", "s.toml", *S, "--workers", "1", "--no-plots", "--max-replicas", "3"]
WAITS = re.compile(r"^\w+: another \w+ is writing into .*; waiting for it to finish$", re.M)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("two")
    (d / "s.toml").write_text(tomli_w.dumps(small_scenario(horizon_s=3.0)))
    return d


def _both(a: list[str], b: list[str], base: Path):
    """``a`` and ``b`` started together (forked one after the other); their outcomes."""
    ca, cb = start(a, base), start(b, base)
    return ca.wait(), cb.wait()


def _clean(*outs) -> None:
    for o in outs:
        assert not o.killed and "Traceback" not in o.output and "UpdateFinishedTrialError" not in o.output, o.output


def _tune_trials(out: Path) -> dict:
    """Trial states in the study (every trial, not only the evaluated ones)."""
    import optuna

    storage = optuna.storages.RDBStorage(f"sqlite:///{out / 'study.db'}")
    try:
        study = optuna.load_study(storage=storage, study_name="tune")
        states: dict = {}
        for t in study.get_trials(deepcopy=False):
            states[t.state.name] = states.get(t.state.name, 0) + 1
        return states
    finally:
        storage.engine.dispose()


@pytest.mark.parametrize("trials", [(3, 3), (3, 4)])
def test_two_tune_resumes_take_turns_and_make_exactly_the_trials_asked(base, tmp_path, trials):
    pytest.importorskip("optuna")
    out = tmp_path / "t"
    warm([*TUNE, "--trials", "1", "--out", str(out)], base)
    uncut([*TUNE, "--trials", "1", "--out", str(out)], base)
    a, b = _both([*TUNE, "--trials", str(trials[0]), "--resume", "--out", str(out)],
                 [*TUNE, "--trials", str(trials[1]), "--resume", "--out", str(out)], base)
    _clean(a, b)
    assert a.code == 0 and b.code == 0, (a.output, b.output)
    assert len(WAITS.findall(a.output + b.output)) == 1, (a.output, b.output)  # the second waited, once
    n = max(trials)
    df = pd.read_parquet(out / "trials.parquet")
    assert len(df) == n and (df["state"] == "COMPLETE").all(), df[["trial", "state"]]
    assert _tune_trials(out) == {"COMPLETE": n}
    assert json.loads((out / "tune.json").read_text())["trials"] == n  # the report shows the last study
    check_whole(out)


def test_two_new_tunes_into_one_folder_one_refuses(base, tmp_path):
    pytest.importorskip("optuna")
    out = tmp_path / "t"
    warm([*TUNE, "--trials", "1", "--out", str(out)], base)
    a, b = _both([*TUNE, "--trials", "2", "--out", str(out)], [*TUNE, "--trials", "2", "--out", str(out)], base)
    _clean(a, b)
    assert sorted([a.code, b.code]) == [0, 2], (a.output, b.output)
    refused = a if a.code == 2 else b
    errors = [ln for ln in refused.output.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "already holds a tune (pass --resume" in errors[0], refused.output
    assert _tune_trials(out) == {"COMPLETE": 2}
    check_whole(out)


def test_two_capacity_searches_take_turns(base, tmp_path):
    ref = tmp_path / "ref"
    warm([*CAPACITY, "--out", str(ref)], base)
    uncut([*CAPACITY, "--out", str(ref)], base)
    out = tmp_path / "c"
    a, b = _both([*CAPACITY, "--out", str(out)], [*CAPACITY, "--out", str(out)], base)
    _clean(a, b)
    assert a.code == 0 and b.code == 0, (a.output, b.output)
    assert len(WAITS.findall(a.output + b.output)) == 1, (a.output, b.output)
    check_whole(out)
    same_tables(tables("capacity", out), tables("capacity", ref), "two capacity searches")


def test_two_sweeps_take_turns_and_simulate_each_run_once(base, tmp_path):
    ref = tmp_path / "ref"
    warm([*SWEEP, "--out", str(ref)], base)
    uncut([*SWEEP, "--out", str(ref)], base)
    out = tmp_path / "s"
    a, b = _both([*SWEEP, "--out", str(out)], [*SWEEP, "--out", str(out)], base)
    _clean(a, b)
    assert a.code == 0 and b.code == 0, (a.output, b.output)
    assert len(WAITS.findall(a.output + b.output)) == 1, (a.output, b.output)
    counts = sorted(re.search(r"runs: (\d+ done, \d+ skipped)", o.output).group(1) for o in (a, b))
    assert counts == ["0 done, 3 skipped", "3 done, 0 skipped"], counts
    check_whole(out)
    same_tables(tables("sweep", out), tables("sweep", ref), "two sweeps")


def test_a_folder_another_command_is_making_is_not_a_users(tmp_path):
    """The moment two commands start into one new folder: the first has made it and is writing
    its marker (a hidden temporary name only). The second's check takes it for the empty folder
    it is, not for a user's files."""
    from sim.outdir import claim

    out = tmp_path / "out"
    out.mkdir()
    (out / f"..priosim.json.tmp-{os.getpid()}-0123abcd").write_text("{")
    for kind in ("sweep", "tune", "capacity"):
        assert claim(out, kind, resume=True) == out
