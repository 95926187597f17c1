"""A full disk, end to end, for every command that writes results (run, sweep, tune, capacity,
workload --out, calibrate --out):

* before any work (the disk reports little free space): one line ``error: ...``, exit status 2,
  nothing written;
* during the writes (``ENOSPC`` after N bytes, injected into every file write; and, where this
  runs as root and may mount one, a real 2 MiB tmpfs, SQLite's own writes included): one line
  ``error: ...``, exit status 2, no traceback, every visible file whole and no 0-byte result
  left, and the same command after space is freed succeeds (no --overwrite needed)."""
from __future__ import annotations

import builtins
import errno
import io
import os
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import tomli_w
from click.testing import CliRunner

import sim.outdir
from sim.cli import main
from sim.outdir import foreign, marker
from tests.conftest import small_scenario
from tests.kill_points import check_whole, visible

S = ["--set", "horizon_s=3"]
ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {  # each command, with --out OUT to be added; "tune" needs --resume when its study was made
    "run": ["run", "s.toml", *S],
    "sweep": ["sweep", "s.toml", *S, "--seeds", "2", "--workers", "1", "--no-plots", "--no-progress"],
    "tune": ["tune", "s.toml", *S, "--space", "engine.max_num_seqs=4..16", "--trials", "1",
             "--maximize", "output_tokens_per_s", "--no-plots"],
    "capacity": ["capacity", "s.toml", *S, "--workers", "1", "--no-plots", "--max-replicas", "2",
                 "--designs", "shared"],
    "workload": ["workload", "s.toml", *S],
    "calibrate": ["calibrate", "--device", "cpu", "--shape", "tiny"],
}
FILE_OUT = {"workload": "w.parquet", "calibrate": "profile.json"}  # these write one file, not a folder


@pytest.fixture
def base(tmp_path, monkeypatch):
    (tmp_path / "s.toml").write_text(tomli_w.dumps(small_scenario(horizon_s=3.0)))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _needs(name: str) -> None:
    if name == "tune":
        pytest.importorskip("optuna")
    if name == "calibrate":
        pytest.importorskip("torch")


def _fake_calibration(monkeypatch) -> None:
    """``calibrate`` without the measuring (minutes on a CPU): the shipped cpu-tiny profile, written
    as the real one is (:func:`calibrate.measure.write_profile`)."""
    import json

    import calibrate.measure as cm

    doc = json.loads((ROOT / "sim" / "core" / "profiles" / "cpu-tiny.json").read_text())

    def fake(device, shape, *, out_path=None, **kw):
        cm.write_profile(doc, out_path)
        return doc

    monkeypatch.setattr(cm, "calibrate_profile", fake)


def _args(name: str, out: Path, again: bool = False) -> list[str]:
    args = [*COMMANDS[name], "--out", str(out)]
    if name == "tune" and again and (out / "study.db").exists():
        args.append("--resume")
    return args


def _out(base: Path, name: str) -> Path:
    return base / "disk" / FILE_OUT.get(name, "out")


def _one_error_line(r, name: str) -> str:
    assert r.exit_code == 2, (name, r.exit_code, r.output, r.exception)
    assert isinstance(r.exception, SystemExit), (name, r.exception)
    lines = r.stderr.splitlines()
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in r.output, (name, r.stderr)
    assert len([ln for ln in lines if not ln.startswith(("warning: ", name))]) == 1, (name, r.stderr)
    return errors[0]


def _left_whole(out: Path, name: str) -> None:
    """What a failed write leaves: every visible file whole, no 0-byte result, nothing that
    would make the folder a user's."""
    if not out.exists():
        return
    if out.is_file():
        raise AssertionError(f"{name}: a failed write left {out}")
    if not any(out.iterdir()):
        return  # (an empty folder: free for any command)
    check_whole(out)
    for p in visible(out):
        assert p.stat().st_size > 0 or p.name.endswith(".lock"), f"{name}: 0-byte {p}"
    doc = marker(out)
    assert doc is not None and not foreign(out, doc), (name, doc and foreign(out, doc))


# ---- (a) before any work ------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(COMMANDS))
def test_too_little_free_space_is_refused_before_any_work(base, monkeypatch, name):
    _needs(name)
    if name == "calibrate":
        _fake_calibration(monkeypatch)
    real = os.statvfs

    def statvfs(path):  # 10 MiB free (and shutil.disk_usage, which reads it, says the same)
        st = real(path)
        return os.statvfs_result((st.f_bsize, 4096, st.f_blocks, 2560, 2560, st.f_files, st.f_ffree,
                                  st.f_favail, st.f_flag, st.f_namemax))

    monkeypatch.setattr(os, "statvfs", statvfs)
    assert shutil.disk_usage(base).free == 10 << 20
    out = _out(base, name)
    r = CliRunner().invoke(main, _args(name, out))
    line = _one_error_line(r, name)
    assert "only 10 MiB free" in line and "expected at least 64 MiB" in line, line
    assert not out.exists() and not out.parent.exists(), name  # nothing written, not even the folder


# ---- (b) during the writes: ENOSPC injected after N bytes ---------------------------------------
class _Disk:
    """Bytes left on a pretend disk; every file write takes from it, and the write that does not
    fit writes what fits and raises ENOSPC, as a real disk does."""

    def __init__(self, free: int | None) -> None:
        self.free = free
        self.written = 0

    def take(self, n: int) -> int:
        if self.free is None:
            self.written += n
            return n
        k = min(n, self.free)
        self.free -= k
        self.written += k
        return k


class _File:
    def __init__(self, fh, disk: _Disk, name) -> None:
        self._fh, self._disk, self._name = fh, disk, name

    def write(self, data):
        n = len(data.encode() if isinstance(data, str) else data)
        k = self._disk.take(n)
        if k < n:
            self._fh.write(data[:k])
            self._fh.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self._name))
        return self._fh.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._fh.close()

    def __iter__(self):
        return iter(self._fh)

    def __getattr__(self, attr):
        return getattr(self._fh, attr)


def _fill(monkeypatch, disk: _Disk) -> None:
    """Every write priosim makes (Python files, parquet tables) goes through ``disk``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    real_open, real_table = builtins.open, pq.write_table

    def open_(file, mode="r", *a, **k):
        fh = real_open(file, mode, *a, **k)
        if isinstance(file, (str, os.PathLike)) and any(c in mode for c in "wax+"):
            return _File(fh, disk, file)
        return fh

    def write_table(table, where, *a, **k):
        if not isinstance(where, (str, os.PathLike)):
            return real_table(table, where, *a, **k)
        buf = pa.BufferOutputStream()
        real_table(table, buf, *a, **k)
        with open_(where, "wb") as fh:
            fh.write(buf.getvalue().to_pybytes())

    real_frame = pd.DataFrame.to_parquet

    def to_parquet(self, path=None, *a, **k):  # (pandas opens a local path with Arrow's own file)
        if not isinstance(path, (str, os.PathLike)):
            return real_frame(self, path, *a, **k)
        buf = io.BytesIO()
        real_frame(self, buf, *a, **k)
        with open_(path, "wb") as fh:
            fh.write(buf.getvalue())

    monkeypatch.setattr(builtins, "open", open_)
    monkeypatch.setattr(io, "open", open_)
    monkeypatch.setattr(pq, "write_table", write_table)
    monkeypatch.setattr(pd.DataFrame, "to_parquet", to_parquet)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_disk_that_fills_during_the_writes(base, monkeypatch, name):
    _needs(name)
    if name == "calibrate":
        _fake_calibration(monkeypatch)
    scratch = base / "scratch"
    with monkeypatch.context() as m:
        disk = _Disk(None)
        _fill(m, disk)
        r = CliRunner().invoke(main, _args(name, scratch / FILE_OUT.get(name, "out")))
        assert r.exit_code == 0, r.output
    total = disk.written
    for frac in (0.0, 0.3, 0.6, 0.9, 0.99):
        shutil.rmtree(base / "disk", ignore_errors=True)
        out = _out(base, name)
        with monkeypatch.context() as m:
            _fill(m, _Disk(int(total * frac)))
            r = CliRunner().invoke(main, _args(name, out))
        where = f"{name} with {int(total * frac)} of {total} bytes free"
        if r.exit_code == 0 and frac > 0:  # (SQLite's writes, not counted, may let the last ones through)
            continue
        line = _one_error_line(r, where)
        assert "No space left on device" in line and "room on" in line, line
        _left_whole(out, where)
        again = CliRunner().invoke(main, _args(name, out, again=True))
        assert again.exit_code == 0, (where, again.output)
        if out.is_dir():
            check_whole(out)


# ---- (b) during the writes: a real tmpfs of 2 MiB ----------------------------------------------
@pytest.fixture
def tmpfs(base):
    """A 2 MiB tmpfs at ``base/disk`` (skipped unless this runs as root and may mount one)."""
    where = base / "disk"
    where.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a real full disk needs root (mount -t tmpfs)")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_real_disk_that_fills(base, tmpfs, monkeypatch, name):
    """Ballast leaves F bytes free on the tmpfs (the check before any work, which wants 64 MiB,
    is lifted); every F from nothing to enough gives one line or a result, and a rerun once the
    ballast is gone succeeds."""
    _needs(name)
    if name == "calibrate":
        _fake_calibration(monkeypatch)
    monkeypatch.setattr(sim.outdir, "check_space", lambda *a, **k: None)
    out = _out(base, name)
    for free_kib in (0, 8, 32, 96, 256):
        for p in list(tmpfs.iterdir()):
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        st = os.statvfs(tmpfs)
        ballast = max(0, st.f_bavail * st.f_frsize - (free_kib << 10))
        with open(tmpfs / "ballast", "wb") as fh:
            try:
                fh.write(b"\0" * ballast)
            except OSError:
                pass
        r = CliRunner().invoke(main, _args(name, out))
        where = f"{name} with {free_kib} KiB free"
        (tmpfs / "ballast").unlink()
        if r.exit_code == 0 and free_kib > 0:
            continue
        line = _one_error_line(r, where)
        assert "room on" in line and ("No space left on device" in line or "disk is full" in line), line
        _left_whole(out, where)
        again = CliRunner().invoke(main, _args(name, out, again=True))
        assert again.exit_code == 0, (where, again.output)
        if out.is_dir():
            check_whole(out)
