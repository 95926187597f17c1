"""Killing a priosim command with SIGKILL at chosen points, for the crash-safety tests.

A command runs in a child forked from the test process (its imports already done, so a child
costs milliseconds rather than an interpreter's start). Two ways to pick the moment of death:

* ``kill_at=N``: the child counts the file-system events it causes itself (opening a file for
  writing, a rename, an unlink, a folder made or removed, a parquet table written) and sends
  itself SIGKILL just before event ``N`` (or, for an open, just after it: a file then exists,
  empty). The same N is the same point in every run: the commands run on one worker, in
  one process, deterministically.
* ``kill_after_s=S``: the parent sends SIGKILL after ``S`` seconds (anywhere, SQLite's own
  writes included, which no Python hook sees).

:func:`uncut` runs the command to its end and returns its event log (kind, path, seconds since
the start), from which the tests choose their points.
"""
from __future__ import annotations

import builtins
import csv
import gc
import io
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from sim.outdir import MARKER, TMP_TAG


@dataclass
class Outcome:
    """How a forked command ended: ``killed`` by SIGKILL, else its exit ``code``; its output."""

    killed: bool
    code: int | None
    output: str
    events: list


def _install_hooks(kill_at: int | None, log: list, t0: float) -> None:
    """Wrap the file-system calls priosim makes so each one is an event (see module text)."""
    import sim.outdir as od

    count = [0]

    def event(kind: str, path) -> None:
        count[0] += 1
        log.append((kind, str(path), round(time.perf_counter() - t0, 4)))
        if kill_at is not None and count[0] >= kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    real_open = builtins.open

    def open_(file, mode="r", *a, **k):
        fh = real_open(file, mode, *a, **k)
        if isinstance(file, (str, os.PathLike)) and any(c in mode for c in "wax+"):
            event("open", file)  # after: the file exists, empty
        return fh

    def wrap(name: str, fn, kind: str):
        def f(*a, **k):
            event(kind, a[0] if a else "")
            return fn(*a, **k)
        f.__name__ = name
        return f

    builtins.open = open_
    io.open = open_
    os.replace = wrap("replace", os.replace, "replace")
    os.rename = wrap("rename", os.rename, "rename")
    os.unlink = wrap("unlink", os.unlink, "unlink")
    os.mkdir = wrap("mkdir", os.mkdir, "mkdir")
    os.rmdir = wrap("rmdir", os.rmdir, "rmdir")
    shutil.rmtree = wrap("rmtree", shutil.rmtree, "rmtree")
    od._rename = wrap("_rename", od._rename, "publish")
    if "sqlalchemy" in sys.modules:  # a tune's study (imported by warm): each commit is an event too
        from sqlalchemy import event as sa_event
        from sqlalchemy.engine import Engine

        sa_event.listen(Engine, "commit", lambda conn: event("commit", "study.db"))
    to_parquet = pd.DataFrame.to_parquet
    pd.DataFrame.to_parquet = lambda self, path, *a, **k: (event("parquet", path), to_parquet(self, path, *a, **k))[1]


def fork_run(args: list[str], cwd: Path, *, kill_at: int | None = None, kill_after_s: float | None = None,
             timeout_s: float = 60.0) -> Outcome:
    """Run ``priosim ARGS`` in a forked child in ``cwd`` (see module text)."""
    return start(args, cwd, kill_at=kill_at).wait(kill_after_s=kill_after_s, timeout_s=timeout_s)


@dataclass
class Child:
    """A forked ``priosim`` (see :func:`start`)."""

    pid: int
    args: list
    log_path: str

    def wait(self, *, kill_after_s: float | None = None, timeout_s: float = 60.0) -> Outcome:
        """Its end (after SIGKILL at ``kill_after_s`` seconds, if given)."""
        deadline = time.monotonic() + timeout_s
        if kill_after_s is not None:
            time.sleep(kill_after_s)
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        while True:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
                raise TimeoutError(f"priosim {' '.join(self.args)} ran past {timeout_s} s")
            time.sleep(0.002)
        ev_path = self.log_path + ".events"
        output = Path(self.log_path).read_text(errors="replace")
        events = json.loads(Path(ev_path).read_text()) if os.path.exists(ev_path) else []
        for p in (self.log_path, ev_path):
            if os.path.exists(p):
                os.unlink(p)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        return Outcome(killed, None if killed else os.WEXITSTATUS(status), output, events)


def start(args: list[str], cwd: Path, *, kill_at: int | None = None) -> Child:
    """Fork a child that runs ``priosim ARGS`` in ``cwd``, its stdout and stderr into one log."""
    from sim.cli import main

    fd, log_path = tempfile.mkstemp(prefix="priosim-kill-", suffix=".log")
    os.close(fd)
    ev_path = log_path + ".events"
    sys.stdout.flush()
    sys.stderr.flush()
    gc.freeze()  # the child's collections leave what it inherits alone (else each copies every page)
    pid = os.fork()
    if pid == 0:  # the child: never returns into the test
        code = 70
        try:
            out = os.open(log_path, os.O_WRONLY | os.O_TRUNC)
            os.dup2(out, 1)
            os.dup2(out, 2)
            sys.stdout = sys.stderr = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
            os.chdir(cwd)
            log: list = []
            _install_hooks(kill_at, log, time.perf_counter())
            try:
                main.main(args=list(args), prog_name="priosim", standalone_mode=True)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            with io.FileIO(ev_path, "w") as fh:
                fh.write(json.dumps(log).encode())
        except BaseException:  # noqa: BLE001 - reported through the log
            import traceback

            os.write(2, traceback.format_exc().encode())
            code = 71
        finally:
            os._exit(code)
    gc.unfreeze()
    return Child(pid, list(args), log_path)


def warm(args: list[str], cwd: Path) -> None:
    """Run ``priosim ARGS`` once in this process (its ``--out`` swapped for a scratch folder), so
    that what it imports on the way is imported before the children are forked, not in each."""
    from click.testing import CliRunner

    from sim.cli import main

    with tempfile.TemporaryDirectory() as d:
        a = list(args)
        a[a.index("--out") + 1] = str(Path(d) / "out")
        old = os.getcwd()
        os.chdir(cwd)
        try:
            r = CliRunner().invoke(main, a)
        finally:
            os.chdir(old)
        assert r.exit_code == 0, r.output


def uncut(args: list[str], cwd: Path) -> Outcome:
    """Run ``priosim ARGS`` to its end in a forked child; its output and its event log."""
    out = fork_run(args, cwd)
    assert not out.killed and out.code == 0, out.output
    return out


def spread(n_events: int, k: int, tail: int = 6) -> list[int]:
    """``k`` event numbers spread over ``1..n_events``, the last ``tail`` events (the final
    report's writes) all included."""
    tail = min(tail, n_events)
    last = list(range(n_events - tail + 1, n_events + 1))
    rest = max(0, k - len(last))
    body = sorted({1 + round(i * (n_events - tail - 1) / max(rest - 1, 1)) for i in range(rest)})
    return sorted(set(body) | set(last))


# ---- a result's tables -------------------------------------------------------------------------
# (these differ between an uncut run and a resumed one)
VOLATILE = {"wall_s", "runs_per_minute", "time_s", "done_now", "skipped"}


def _drop(doc, keys=VOLATILE):
    if isinstance(doc, dict):
        return {k: _drop(v, keys) for k, v in doc.items() if k not in keys}
    if isinstance(doc, list):
        return [_drop(v, keys) for v in doc]
    return doc


def tables(kind: str, out: Path) -> dict:
    """The final tables of a result, wall-clock fields (and, for a tune, trial numbers, which a
    trial asked again after a kill changes) left out."""
    t: dict = {}
    if kind == "run":
        for name in ("summary.json", "scenario.json", "manifest.json"):
            t[name] = (out / name).read_bytes()
        for name in ("requests.parquet", "timeseries.parquet"):
            t[name] = pd.read_parquet(out / name)
    elif kind == "sweep":
        t["sweep.parquet"] = pd.read_parquet(out / "sweep.parquet")
        t["sweep.json"] = _drop(json.loads((out / "sweep.json").read_text()))
        for p in sorted((out / "runs").glob("*/summary.json")):
            t[str(p.relative_to(out))] = p.read_bytes()
    elif kind == "capacity":
        t["capacity.json"] = _drop(json.loads((out / "capacity.json").read_text()))
        t["points.csv"] = pd.read_csv(out / "points.csv")
    else:  # (which configurations a resumed tune tries after a kill may differ: see check_tune)
        t["tune.json:default"] = json.loads((out / "tune.json").read_text())["default"]
        t["tune.json:trials"] = json.loads((out / "tune.json").read_text())["trials"]
    return t


def same_tables(a: dict, b: dict, where: str) -> None:
    assert a.keys() == b.keys(), ("files differ", sorted(set(a) ^ set(b)))
    for k in a:
        if isinstance(a[k], pd.DataFrame):
            try:
                pd.testing.assert_frame_equal(a[k], b[k])
            except AssertionError as exc:
                raise AssertionError(f"{k} differs: {' '.join(str(exc).split())}") from None
        else:
            assert a[k] == b[k], f"{k} differs: {str(a[k])[:200]} != {str(b[k])[:200]}"


# ---- what a folder shows ------------------------------------------------------------------------
def visible(folder: Path) -> list[Path]:
    """Every file under ``folder`` a reader sees: none under a hidden temporary name."""
    out = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if TMP_TAG not in d]
        out += [Path(root) / f for f in files if TMP_TAG not in f]
    return sorted(out)


def check_whole(folder: Path) -> None:
    """Every visible result file parses whole: JSON loads, parquet reads, CSV has its header and
    whole rows, TOML loads, a marker lists only files that exist."""
    import tomllib

    for p in visible(folder):
        name = p.name
        if name.startswith(".") and name.endswith(".lock"):
            continue  # a lock: empty by design
        if name.endswith("-journal") and p.stat().st_size == 0:
            continue  # SQLite's rollback journal, killed as it was made: an empty one is not hot (ignored)
        assert p.stat().st_size > 0 or name.endswith(".lock"), f"0-byte file {p}"
        if name.endswith(".json"):
            doc = json.loads(p.read_text())
            if name == MARKER:
                assert isinstance(doc.get("kind"), str) and isinstance(doc.get("files"), list), p
        elif name.endswith(".parquet"):
            pd.read_parquet(p)
        elif name.endswith(".csv"):
            text = p.read_text()
            assert text.endswith("\n"), f"{p}: ends inside a row"
            rows = list(csv.reader(io.StringIO(text)))
            assert rows and all(len(r) == len(rows[0]) for r in rows), f"{p}: a short row"
        elif name.endswith(".toml"):
            tomllib.loads(p.read_text())
        elif name.endswith(".png"):
            assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.read_bytes()[-8:-4] == b"IEND", p
        elif name == "study.db":
            _check_sqlite(p)


def _check_sqlite(db: Path) -> None:
    """``db`` (with its journal, if a kill left one: rolled back on a copy) is a sound SQLite file
    holding the tune's study."""
    import sqlite3

    with tempfile.TemporaryDirectory() as d:
        for suffix in ("", "-journal", "-wal"):
            if Path(f"{db}{suffix}").exists():
                shutil.copyfile(f"{db}{suffix}", f"{d}/study.db{suffix}")
        con = sqlite3.connect(f"{d}/study.db")
        try:
            assert con.execute("pragma integrity_check").fetchone()[0] == "ok", db
            names = {r[0] for r in con.execute("select study_name from studies")}
            assert names == {"tune"}, (db, names)
        finally:
            con.close()
