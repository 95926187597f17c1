"""kill -9 at 20 and more points of ``run``, ``sweep``, ``tune`` and ``capacity``: every visible
result file is whole, an earlier complete result is never lost, and the same command run again
finishes with the same tables as a run that was never cut (wall-clock fields aside).

Each command is killed at file-system events of its own (every write, rename and SQLite commit
it makes can be the last: :mod:`tests.kill_points`) spread over an uncut run, the final
report's writes all included, and at a few moments in time (SQLite's own writes included)."""
from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.outdir import TMP_TAG, foreign, marker
from tests.conftest import small_scenario
from tests.kill_points import check_whole, fork_run, same_tables, spread, tables, uncut, visible, warm

optuna = pytest.importorskip("optuna")

S = ["--set", "horizon_s=3"]
TUNE = ["--space", "engine.max_num_seqs=4..16", "--maximize", "output_tokens_per_s", "--no-plots"]
SWEEP = ["--workers", "1", "--no-plots", "--no-progress"]
CAP = ["--workers", "1", "--no-plots"]


@dataclass
class Case:
    """``prior``: the command whose complete result is in the folder before (None: a new folder);
    ``victim``: the command that is killed; ``again``: its rerun (default: the victim again)."""

    kind: str
    prior: list[str] | None
    victim: list[str]
    hooks: int = 20
    timed: int = 2

    def again(self, out: Path) -> list[str]:
        if self.kind == "tune" and "--resume" not in self.victim and (out / "study.db").exists():
            return self.victim + ["--resume"]  # the study was made before the kill: it is resumed
        return self.victim


CASES = {
    "run": Case("run", ["run", "s.toml", *S], ["run", "s.toml", *S, "--seed", "7", "--overwrite"],
                hooks=12, timed=0),  # (and 20 timed kills in tests/test_outdir.py)
    "sweep": Case("sweep", ["sweep", "s.toml", *S, *SWEEP, "--seeds", "2"],
                  ["sweep", "s.toml", *S, *SWEEP, "--seeds", "3"]),
    "capacity": Case("capacity", ["capacity", "s.toml", *S, *CAP, "--max-replicas", "2", "--designs", "shared"],
                     ["capacity", "s.toml", *S, *CAP, "--max-replicas", "3"]),
    "tune-new": Case("tune", None, ["tune", "s.toml", *S, *TUNE, "--trials", "2"], hooks=10, timed=4),
    "tune-resume": Case("tune", ["tune", "s.toml", *S, *TUNE, "--trials", "1"],
                        ["tune", "s.toml", *S, *TUNE, "--trials", "2", "--resume"], hooks=8, timed=0),
}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("kill")
    (d / "s.toml").write_text(tomli_w.dumps(small_scenario(horizon_s=3.0)))
    return d


def check_tune(out: Path, ref: Path, prior: Path, trials: int) -> None:
    """A recovered tune: exactly ``trials`` trials, all complete; the trials the earlier result
    held kept as they were; every configuration the uncut tune also tried measured the same,
    its simulations byte-identical."""
    df = pd.read_parquet(out / "trials.parquet")
    assert len(df) == trials and (df["state"] == "COMPLETE").all(), ("trials", df[["trial", "state"]].to_dict("list"))
    want = pd.read_parquet(ref / "trials.parquet")
    cols = [c for c in want.columns if c != "trial"]
    for cfg in set(df["config"]) & set(want["config"]):
        a = df[df["config"] == cfg][cols].iloc[:1].reset_index(drop=True)
        b = want[want["config"] == cfg][cols].iloc[:1].reset_index(drop=True)
        pd.testing.assert_frame_equal(a, b)
    if (prior / "trials.parquet").exists():
        old = pd.read_parquet(prior / "trials.parquet")
        kept = df.merge(old, on="trial", suffixes=("", "_old"))
        assert len(kept) == len(old), ("earlier trials lost", old["trial"].tolist(), df["trial"].tolist())
        pd.testing.assert_frame_equal(kept[cols].reset_index(drop=True), old[cols].reset_index(drop=True))
    for p in (out / "evals" / "runs").glob("*/summary.json"):
        q = ref / p.relative_to(out)
        if q.exists():
            assert p.read_bytes() == q.read_bytes(), f"{p.parent.name}: another simulation than the uncut tune's"


def _args(args: list[str], out: Path) -> list[str]:
    return [*args, "--out", str(out)]


@dataclass
class Setup:
    """A case made ready: the earlier result (``prior``, its files ``before``), an uncut run of
    the victim (its folder ``ref``, its event log and wall time) and its tables (``want``)."""

    case: Case
    root: Path
    prior: Path
    before: set
    ref: Path
    events: list
    wall: float
    want: dict

    def fresh(self, tag: str) -> Path:
        """A folder as the victim finds it: a copy of the earlier result, or none."""
        out = self.root / tag / "out"
        if self.prior.exists():
            shutil.copytree(self.prior, out)
        else:
            out.parent.mkdir(parents=True)
        return out

    def kill(self, base: Path, tag: str, how: str, at) -> None:
        """Kill the victim at ``how`` (``event`` or ``time``) ``at``, check, rerun, check."""
        where = f"kill at {how} {at:g} of {len(self.events) if how == 'event' else round(self.wall, 3)}"
        if how == "event":
            where += f" ({self.events[at - 1][0]} {Path(self.events[at - 1][1]).name})"
        try:
            _kill_and_recover(self.case, self.fresh(tag), base, self.before, self.want, self.ref, self.prior, how,
                              at, where)
        except AssertionError as exc:
            raise AssertionError(f"{where}: {str(exc).splitlines()[0][:300]}") from None


def prepare(case: Case, root: Path, base: Path) -> Setup:
    prior = root / "prior" / "out"
    warm(_args(case.prior or case.victim, root / "warm"), base)
    if case.prior is not None:
        uncut(_args(case.prior, prior), base)
    before = {str(p.relative_to(prior)) for p in visible(prior)} if prior.exists() else set()
    s = Setup(case, root, prior, before, root / "uncut" / "out", [], 0.0, {})
    ref = uncut(_args(case.victim, s.fresh("uncut")), base)
    s.events, s.wall, s.want = ref.events, ref.events[-1][2] if ref.events else 0.5, tables(case.kind, s.ref)
    return s


@pytest.mark.parametrize("name", list(CASES))
def test_kill_minus_9_anywhere_loses_nothing_and_a_rerun_recovers(base, tmp_path, name):
    case = CASES[name]
    s = prepare(case, tmp_path, base)
    points = [("event", k) for k in spread(len(s.events), case.hooks)]
    points += [("time", s.wall * (i + 0.5) / case.timed) for i in range(case.timed)]
    problems = []
    for i, (how, at) in enumerate(points):
        try:
            s.kill(base, f"k{i}", how, at)
        except AssertionError as exc:
            problems.append(f"{name}: {exc}")
    assert not problems, "\n".join(problems)


@pytest.fixture(scope="module")
def sweep_setup(base, tmp_path_factory):
    return prepare(CASES["sweep"], tmp_path_factory.mktemp("hypothesis"), base)


@settings(max_examples=8, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(at=st.integers(0, 10**6), by_time=st.booleans())
def test_kill_points_hypothesis_chooses(sweep_setup, base, at, by_time):
    """Kill points drawn by Hypothesis (derandomized: the same every time) among a sweep's events
    and its wall time."""
    s = sweep_setup
    if by_time:
        s.kill(base, uuid.uuid4().hex, "time", s.wall * (at % 1000) / 1000)
    else:
        s.kill(base, uuid.uuid4().hex, "event", 1 + at % len(s.events))


def _kill_and_recover(case: Case, out: Path, base: Path, before: set, want: dict, ref: Path, prior: Path, how: str,
                      at, where: str) -> None:
    got = fork_run(_args(case.victim, out), base, **({"kill_at": at} if how == "event" else {"kill_after_s": at}))
    assert got.killed or got.code == 0, got.output
    if out.exists():
        check_whole(out)
        seen = {str(p.relative_to(out)) for p in visible(out)}
        assert before <= seen, ("lost", sorted(before - seen))
        doc = marker(out)
        assert doc is not None and doc["kind"] == case.kind and not foreign(out, doc), \
            ("files the marker does not list", doc and foreign(out, doc))
    rerun = fork_run(_args(case.again(out), out), base)
    assert not rerun.killed and rerun.code == 0, ("rerun failed", rerun.output[-400:])
    check_whole(out)
    same_tables(tables(case.kind, out), want, where)
    if case.kind == "tune":
        check_tune(out, ref, prior, int(case.victim[case.victim.index("--trials") + 1]))
    left = [str(p.relative_to(out.parent)) for p in out.parent.rglob(f"*{TMP_TAG}*")]
    assert not left, ("temporary files left", left)


def _cli(args: list[str], cwd: Path):
    from click.testing import CliRunner

    from sim.cli import main

    old = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(main, args)
    finally:
        os.chdir(old)


def test_a_trial_killed_after_it_was_marked_evaluated_is_asked_again(base, tmp_path):
    """Killed between marking a trial evaluated and telling the study: the resumed tune asks
    its parameters again and ends with --trials complete trials, not one short."""
    out = tmp_path / "t"
    args = ["tune", "s.toml", *S, *TUNE, "--out", str(out)]
    assert _cli(args + ["--trials", "1"], base).exit_code == 0
    storage = optuna.storages.RDBStorage(f"sqlite:///{out / 'study.db'}")
    study = optuna.load_study(storage=storage, study_name="tune")
    t = study.ask({"engine.max_num_seqs": optuna.distributions.IntDistribution(4, 16)})
    t.set_user_attr("evaluated", True)  # (the kill: the trial stays running)
    storage.engine.dispose()
    r = _cli(args + ["--trials", "2", "--resume"], base)
    assert r.exit_code == 0, r.output
    df = pd.read_parquet(out / "trials.parquet")
    assert len(df) == 2 and (df["state"] == "COMPLETE").all(), df[["trial", "state"]]
    assert json.loads((out / "tune.json").read_text())["trials"] == 2


def test_a_resumed_tune_does_not_draw_its_first_trials_again(base, tmp_path):
    out = tmp_path / "t"
    args = ["tune", "s.toml", *S, "--space", "engine.watermark=0.0..0.2", "--maximize", "output_tokens_per_s",
            "--no-plots", "--out", str(out)]
    assert _cli(args + ["--trials", "1"], base).exit_code == 0
    r = _cli(args + ["--trials", "3", "--resume"], base)
    assert r.exit_code == 0, r.output
    drawn = pd.read_parquet(out / "trials.parquet")["engine.watermark"].tolist()
    assert len(drawn) == 3 and len(set(drawn)) == 3, drawn
