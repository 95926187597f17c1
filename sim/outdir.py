"""Output folders: where a command may write, and how its results appear whole or not at all.

The rule every command follows: **no command deletes or overwrites a file it did not create.**

- ``claim(out, kind)`` is called before any work. A folder that does not exist, or an empty one,
  is free; a folder holding a priosim result of the same ``kind`` may be resumed (sweep, tune,
  capacity) or replaced with ``--overwrite`` (run); anything else (a user's files, ``.``,
  ``..``, the scenario's own folder, a result of another kind) is refused in one line.
- Every result folder holds a marker, ``.priosim.json``: its kind, the names priosim wrote
  there, and (``paths``) every file and folder under them. Replacing a result touches only
  those; a user's file added beside them, or inside a folder of theirs (``figures/``, a run's
  ``replicas/``), survives; a folder with a marker of its own (``figures/``, which ``priosim
  plot`` adds later) is judged by that marker.
- ``publish(tmp, out)`` makes a folder filled under a hidden temporary name visible in one
  step: ``renameat2(RENAME_NOREPLACE)`` for a new folder, ``renameat2(RENAME_EXCHANGE)`` to
  replace an old result (so there is no moment with neither), then removes the old one.
  Temporary folders left by a killed process (``.NAME.tmp-PID-...``) are cleaned the next time
  anything is published beside them; a user's file moved into one is moved back first.
- ``write_file(path, data)`` writes one file beside its final name and renames it over, so a
  reader (or a kill) never sees half a file.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import glob
import json
import os
import re
import shutil
import sys
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

MARKER = ".priosim.json"
MOVED = ".priosim-moved.json"  # in a temporary folder: the user's files moved in before the exchange
TMP_TAG = ".tmp-"

# Per kind: the files that show a folder is that kind's result when it has no marker (a result of
# an older version, or one whose marker is not written yet), and every file that kind writes.
KINDS = {
    "run": (("manifest.json",),
            {"requests.parquet", "timeseries.parquet", "iterations.parquet", "summary.json", "perf.json",
             "scenario.json", "manifest.json", "figures", "replicas", "groups"}),
    "sweep": (("sweep.json", ".sweep.lock"),
              {"sweep.json", "sweep.parquet", "runs", "failures", "figures", ".sweep.lock"}),
    "tune": (("study.db", ".tune.lock"),
             {"study.db", "study.db-journal", "study.db-wal", "trials.parquet", "pareto.csv", "pareto.png",
              "best.toml", "importance.json", "tune.json",
              "evals", ".tune.lock"}),
    "capacity": (("capacity.json", ".capacity.lock"),
                 {"capacity.json", "points.csv", "perf.json", "capacity.png", "probes", ".capacity.lock"}),
    "sensitivity": (("sensitivity.json",), {"sensitivity.json", "sensitivity.csv", "tornado.png"}),
}

LOCKS = {"sweep": ".sweep.lock", "tune": ".tune.lock", "capacity": ".capacity.lock"}  # flock'd by the writer
# a temporary name this module makes: ".NAME.tmp-PID-<8 hex>" (or "-old", an exchange's fallback;
# SQLite adds "-journal" or "-wal" beside a database made under such a name)
_TMP_RE = re.compile(r"\..+" + re.escape(TMP_TAG) + r"([0-9]+)-(?:[0-9a-f]{8}(?:-journal|-wal|-shm)?|old)")


class OutError(ValueError):
    """An output folder or file that may not be written (the message is one line)."""


# ---- what a folder holds --------------------------------------------------------------------------
def marker(folder: Path) -> dict | None:
    """The folder's priosim marker (kind and files written), or one inferred for a result of an
    older version; None when the folder is not a priosim result."""
    m = folder / MARKER
    if m.is_file():
        try:
            doc = json.loads(m.read_text())
            if isinstance(doc, dict) and isinstance(doc.get("kind"), str):
                return doc
        except (OSError, ValueError):
            return None
    for kind, (keys, files) in KINDS.items():
        if any((folder / key).exists() for key in keys):
            return {"kind": kind, "files": sorted(p.name for p in folder.iterdir() if p.name in files)}
    return None


def foreign(folder: Path, doc: dict | None) -> list[str]:
    """What in ``folder`` priosim did not write there, by its marker: relative paths (POSIX),
    a name at the top, or ``sub/.../name`` inside a folder priosim wrote. Inside such a folder
    its own marker decides (``figures/``), else the outer marker's ``paths``; a marker of an
    older version lists no paths, and everything inside its folders counts as priosim's."""
    ours = set(doc.get("files", [])) if doc else set()
    paths = set(doc["paths"]) if doc and isinstance(doc.get("paths"), list) else None
    out: list[str] = []
    for p in sorted(folder.iterdir(), key=lambda q: q.name):
        name = p.name
        if name in (MARKER, MOVED) or _TMP_RE.fullmatch(name):
            continue
        is_dir = p.is_dir() and not p.is_symlink()
        if name not in ours or (paths is not None and name not in paths and not (is_dir and (p / MARKER).is_file())):
            out.append(name)  # (a name of the kind's that this result never wrote is the user's)
        elif is_dir:
            out += [f"{name}/{rel}" for rel in _foreign_inside(p, name, paths)]
    return out


def _foreign_inside(d: Path, rel: str, paths: set[str] | None) -> list[str]:
    """What inside ``d`` (at ``rel`` in the result) priosim did not write: by ``d``'s own marker
    when it has one, else by the result's recorded ``paths`` (None: all of it is priosim's)."""
    inner = marker(d) if (d / MARKER).is_file() else None
    if inner is not None:
        return foreign(d, inner)
    if paths is None:
        return []
    out: list[str] = []
    for q in sorted(d.iterdir(), key=lambda q: q.name):
        sub = f"{rel}/{q.name}"
        if sub not in paths:
            out.append(q.name)
        elif q.is_dir() and not q.is_symlink():
            out += [f"{q.name}/{x}" for x in _foreign_inside(q, sub, paths)]
    return out


def _tree(folder: Path) -> list[str]:
    """Every file and folder under ``folder`` (relative POSIX paths; its marker left out)."""
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(folder):
        rel = Path(dirpath).relative_to(folder)
        for n in dirnames + filenames:
            if not (rel == Path(".") and n == MARKER):
                out.append((rel / n).as_posix())
    return sorted(out)


def write_marker(folder: Path, kind: str, files: list[str] | None = None, paths: list[str] | None = None) -> None:
    """Record ``kind`` and the names priosim wrote in ``folder`` (all of its entries when not
    given), keeping what an earlier marker listed; ``paths``: every file and folder under them
    (relative), recorded when given, and names added later join them (:func:`foreign` reads
    them)."""
    old = marker(folder) or {}
    same = old.get("kind") == kind
    names = set(old.get("files", []) if same else [])
    if files is None:
        files = [p.name for p in folder.iterdir() if p.name not in (MARKER, MOVED) and not _TMP_RE.fullmatch(p.name)]
    names.update(files)
    doc: dict = {"kind": kind, "files": sorted(names)}
    if paths is not None:
        doc["paths"] = sorted(set(old.get("paths", []) if same else []) | set(paths))
    elif same and isinstance(old.get("paths"), list):  # (names added to a result later are priosim's too)
        doc["paths"] = sorted(set(old["paths"]) | set(files))
    write_file(folder / MARKER, json.dumps(doc, indent=1) + "\n")


# ---- before any work ------------------------------------------------------------------------------
def claim(out: str | Path, kind: str, *, flag: str = "--out", overwrite: bool = False,
          resume: bool = False) -> Path:
    """The real path results of ``kind`` may be written to, or :class:`OutError` (one line).

    ``resume``: a result of the same kind is continued (sweep, tune, capacity add to it);
    ``overwrite``: a result of the same kind may be replaced (only its own files are)."""
    given = str(out)
    if not given or not given.strip():
        raise OutError(f"{flag}: empty path (expected a folder for the results)")
    p = Path(os.path.realpath(given))  # a symlink to a folder means that folder, never the link
    if p == Path(p.anchor):
        raise OutError(f"{flag} {given}: is the file system's root (expected a folder for the results)")
    if len(p.name.encode()) > 200:
        raise OutError(f"{flag} {given}: the folder name is {len(p.name.encode())} bytes long (expected at most 200)")
    if p.exists() and not p.is_dir():
        raise OutError(f"{flag} {given}: exists and is not a folder (expected a folder for the results)")
    # (a priosim temporary name alone: another command is making this folder its result this very
    # moment, its marker not written yet; it is judged like the empty folder it was)
    if p.is_dir() and any(not _TMP_RE.fullmatch(q.name) for q in p.iterdir()):
        doc = marker(p)
        if doc is None or doc["kind"] != kind:
            what = f"a priosim {doc['kind']} result" if doc else "files priosim did not write"
            # (named by what they are: a result's own files, not a user's file beside them)
            names = _own(p, doc) if doc else foreign(p, None)
            first = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
            raise OutError(f"{flag} {given}: holds {what} ({first}); {_results(kind)} go to a new or empty "
                           f"folder (expected another {flag})")
        if not resume and not overwrite:
            # (a Python caller's flag is its argument's name: it passes overwrite=True)
            how = "--overwrite" if flag.startswith("-") else "overwrite=True"
            raise OutError(f"{flag} {given}: already holds a priosim {kind} result (pass {how} to "
                               f"replace it, or another {flag})")
    _check_writable(p, f"{flag} {given}")
    return p


def claim_file(path: str | Path, *, flag: str = "--out", overwrite: bool = False) -> Path:
    """A file a command will write, checked before any work (:class:`OutError` otherwise): not a
    folder, not an existing file unless ``overwrite``, in a writable folder with room."""
    p = Path(path)
    if p.is_dir():
        raise OutError(f"{flag} {path}: is a folder (expected a file name)")
    if p.exists() and not overwrite:
        raise OutError(f"{flag} {path}: already exists (pass --overwrite to replace it, or another {flag})")
    _check_writable(p.parent if str(p.parent) else Path("."), f"{flag} {path}")
    return p


def _own(folder: Path, doc: dict) -> list[str]:
    """The names at the top of ``folder`` that its priosim result (marker ``doc``) wrote."""
    theirs = set(foreign(folder, doc))
    return [q.name for q in sorted(folder.iterdir(), key=lambda q: q.name)
            if q.name not in theirs and q.name not in (MARKER, MOVED) and not _TMP_RE.fullmatch(q.name)]


def _results(kind: str) -> str:
    """A kind's results, for a message: ``figures``, ``run results``, ``sweep results``."""
    return kind if kind == "figures" else f"{kind} results"


def _check_writable(p: Path, label: str) -> None:
    """The nearest existing folder at or above ``p`` is writable and has room."""
    probe = p
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise OutError(f"{label}: {probe} is a file (expected a folder for the results)")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise OutError(f"{label}: cannot write in {probe} (expected a writable folder)")
    check_space(probe, flag=label)


MIN_FREE_BYTES = 64 << 20


def check_space(folder: Path, need: int = MIN_FREE_BYTES, *, flag: str = "--out") -> None:
    """Fail before long work when the disk under ``folder`` has less than ``need`` bytes free."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return
    free = st.f_bavail * st.f_frsize
    if free < need:
        raise OutError(f"{flag}: only {free >> 20} MiB free on the disk of {folder} (expected at least "
                       f"{need >> 20} MiB)")


@contextmanager
def locked(out: Path, kind: str) -> Iterator[Path]:
    """``out`` made (if need be), marked as a result of ``kind`` (a sweep, tune or capacity search,
    which add to their folder) and held by its lock for the block: a second process of the same
    kind waits until the first is done, then goes on from what it left."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_marker(out, kind, sorted(KINDS[kind][1]))
        lock = open(out / LOCKS[kind], "a+")
    except OSError as exc:
        raise OutError(f"{out}: cannot write the {kind} folder: {exc.strerror or exc} "
                       f"(expected a writable folder with room on its disk)") from None
    with lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"{kind}: another {kind} is writing into {out}; waiting for it to finish", file=sys.stderr,
                  flush=True)
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        yield out


def fresh(parent: str | Path, stem: str) -> Path:
    """A default result folder ``parent/stem`` that does not exist yet (``stem-2``, ``-3`` ... when
    it does), so two runs started in the same second never share one."""
    base = Path(parent) / stem
    p, k = base, 1
    while p.exists() or p.is_symlink():
        k += 1
        p = base.with_name(f"{stem}-{k}")
    return p


# ---- writing -------------------------------------------------------------------------------------
def write_file(path: str | Path, data: str | bytes | Callable[[Path], None]) -> Path:
    """Write ``path`` whole or not at all: into a hidden name beside it, flushed, then renamed
    over. ``data`` is the text, the bytes, or a function that writes a given path."""
    path = Path(path)
    clean_stale_files(path)
    tmp = path.with_name(f".{path.name}{TMP_TAG}{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        if callable(data):
            data(tmp)
        else:
            with open(tmp, "wb") as fh:
                fh.write(data.encode() if isinstance(data, str) else data)
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


@contextmanager
def staged(out: str | Path, kind: str, *, clean: bool = True) -> Iterator[Path]:
    """A fresh hidden folder beside ``out`` to fill; when the block ends without error it is
    marked with ``kind`` and published as ``out`` (replacing an old result of that kind, whose
    foreign files are kept). On an error the temporary folder is removed and ``out`` is as it was.
    ``clean=False``: the caller has cleaned stale temporary folders itself (a sweep, once for all
    its runs, rather than a scan of the runs folder per run)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if clean:
        clean_stale(out)
    tmp = out.with_name(f".{out.name}{TMP_TAG}{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        yield tmp
        # (the kind's names too: `priosim plot` adds figures/ to a run later, with a marker of
        # its own; ``paths`` says what this result wrote inside its folders)
        write_marker(tmp, kind, [p.name for p in tmp.iterdir() if p.name != MARKER] + sorted(KINDS.get(kind, ((), ()))[1]),
                     paths=_tree(tmp))
        publish(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def publish(tmp: Path, out: Path) -> None:
    """Make the filled folder ``tmp`` visible as ``out`` in one step (see the module's text)."""
    if not out.exists():
        try:
            _rename(tmp, out, _NOREPLACE)
            return
        except FileExistsError:
            if any(out.iterdir()):  # another process published there first
                raise OutError(f"--out {out}: another process wrote a result there meanwhile") from None
            out.rmdir()
            _rename(tmp, out, _NOREPLACE)
            return
    keep = _into(foreign(out, marker(out)), out, tmp)
    clash = [rel for rel in keep if (tmp / rel).exists() or (tmp / rel).is_symlink()]
    if clash:  # (before anything moves: the old result stays as it was)
        raise OutError(f"--out {out}: {clash[0]} is not priosim's, and the new result has a file of that name "
                       f"(expected it moved elsewhere, or another --out)")
    if keep:  # the user's files go into the new folder first, listed so a kill can put them back
        (tmp / MOVED).write_text(json.dumps(keep))
        for rel in keep:
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            os.rename(out / rel, tmp / rel)
    _rename(tmp, out, _EXCHANGE)  # now tmp holds the old result: only priosim's files
    (out / MOVED).unlink(missing_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)


def _into(keep: list[str], out: Path, tmp: Path) -> list[str]:
    """The user's entries ``keep`` (in ``out``) as they can move into the new result ``tmp``: a
    folder of theirs whose name the new result also has as a folder moves file by file into it."""
    moves: list[str] = []
    for rel in keep:
        src, dst = out / rel, tmp / rel
        if src.is_dir() and not src.is_symlink() and dst.is_dir() and not dst.is_symlink():
            moves += _into(sorted(f"{rel}/{q.name}" for q in src.iterdir()), out, tmp)
        else:
            moves.append(rel)
    return moves


def clean_stale(out: Path) -> None:
    """Remove temporary folders beside ``out`` that a killed process left, putting back any of
    the user's files that had been moved into one."""
    parent = out.parent
    if not parent.is_dir():
        return
    for tmp in parent.glob(f".{glob.escape(out.name)}{TMP_TAG}*"):
        m = _TMP_RE.fullmatch(tmp.name)
        if m is None or not tmp.is_dir() or _alive(int(m.group(1))):
            continue
        if tmp.name.endswith("-old") and not out.exists():  # killed inside an exchange's fallback
            os.rename(tmp, out)
            continue
        moved = tmp / MOVED
        if moved.is_file():
            try:
                names = json.loads(moved.read_text())
            except ValueError:
                names = []
            for name in names:
                if (tmp / name).exists() and not (out / name).exists() and out.is_dir():
                    (out / name).parent.mkdir(parents=True, exist_ok=True)
                    os.rename(tmp / name, out / name)
            if any((tmp / n).exists() for n in names):
                continue  # a user's file still inside: left for a person to look at
        shutil.rmtree(tmp, ignore_errors=True)


def clean_stale_files(path: Path) -> None:
    """Remove the temporary files that a killed process left beside ``path`` while writing it
    (``.NAME.tmp-PID-...`` of a PID no longer running): each is part of a write that never
    finished, never anything else."""
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return
    stem = f".{path.name}{TMP_TAG}"
    for e in entries:
        if not e.name.startswith(stem):
            continue
        m = _TMP_RE.fullmatch(e.name)
        if m is None or _alive(int(m.group(1))):
            continue
        try:
            if e.is_file(follow_symlinks=False):
                os.unlink(e.path)
        except OSError:
            pass


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (this one included; another user's counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


_NOREPLACE, _EXCHANGE = 1, 2
_AT_FDCWD = -100
_libc = None


def _rename(src: Path, dst: Path, flag: int) -> None:
    """``renameat2(src, dst, flag)``; where the system lacks it, the nearest plain renames (a new
    folder: ``rename``; an exchange: old aside, new in, and the old back should that fail)."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.renameat2  # noqa: B018 - raises AttributeError where it is missing
        except (OSError, AttributeError):
            _libc = False
    if _libc:
        rc = _libc.renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flag)
        if rc == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise OSError(err, os.strerror(err), str(dst)) if err != errno.EEXIST else FileExistsError(
                err, os.strerror(err), str(dst))
    if flag == _NOREPLACE:
        if dst.exists():
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst))
        os.rename(src, dst)
        return
    aside = dst.with_name(f".{dst.name}{TMP_TAG}{os.getpid()}-old")
    os.rename(dst, aside)
    try:
        os.rename(src, dst)
    except OSError:
        os.rename(aside, dst)
        raise
    os.rename(aside, src)
