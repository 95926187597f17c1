"""The shell commands the README and the docs/ pages show, read from the files themselves (so a test
that runs them cannot drift from what a reader sees), and a sandbox to run them in.

A fenced block marked ``bash`` holds commands to run as written; other fences (``toml``,
``python``, output, synopses with placeholders) are not run. Lines ending in ``\\`` continue.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (every page of the site, docs/findings/ and the generated docs/reference/ included)
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def fenced_blocks(path: Path) -> list[tuple[int, str, str]]:
    """(1-based line of the opening fence, language, body) of every fenced block."""
    text = path.read_text()
    return [(text[:m.start()].count("\n") + 1, m.group(1), m.group(2)) for m in FENCE.finditer(text)]


def commands(body: str) -> list[str]:
    """The command lines of a block: continuations joined, blank and comment-only lines dropped."""
    out, cur = [], ""
    for line in body.splitlines():
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
            continue
        cur += line
        if cur.strip() and not cur.lstrip().startswith("#"):
            out.append(cur.strip())
        cur = ""
    return out


def bash_commands(path: Path) -> list[tuple[int, str]]:
    """(fence line, command) for every command in the file's ``bash`` blocks."""
    return [(line, c) for line, lang, body in fenced_blocks(path) if lang == "bash" for c in commands(body)]


def pip_installs(text: str) -> list[str]:
    """The requirement arguments of every ``pip install`` in a command line (quotes removed)."""
    out = []
    for m in re.finditer(r"pip install ((?:[^&|;#]|&(?!&))+)", text):
        out += [a.strip("'\"") for a in m.group(1).split() if not a.startswith("-")]
    return out


def extras() -> set[str]:
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])


# What the sandbox appends to a priosim subcommand so that it runs in seconds: shorter horizons
# (and no draining of long batch jobs), never a different command.
SHRINK = {
    "run": "--set horizon_s=20 --set drain=false",
    "workload": "--set horizon_s=20",
    "sweep": "--set horizon_s=30 --set drain=false",
    "capacity": "--set horizon_s=60 --max-replicas 16",
}


def sandbox(tmp: Path) -> dict[str, str]:
    """A folder that looks like the repository root (links to its top-level entries, its own
    empty results/), and an environment whose PATH puts small wrappers first: ``priosim``
    appends SHRINK to its subcommand, ``pip`` records its arguments in ``pip.log`` instead of
    installing (the test checks them against pyproject's extras), ``python`` is this interpreter.
    """
    for entry in ROOT.iterdir():
        if entry.name == "docs":  # copied: a docs command may `cd docs/examples` and write results there
            shutil.copytree(entry, tmp / entry.name)
        elif entry.name not in ("results", ".git", ".venv") and not entry.name.endswith(".egg-info"):
            (tmp / entry.name).symlink_to(entry)
    (tmp / "results").mkdir()
    bin_dir = tmp / ".bin"
    bin_dir.mkdir()
    real = Path(sys.executable).parent / "priosim"
    cases = "\n".join(f'  {sub}) exec "{real}" "$@" {args} ;;' for sub, args in SHRINK.items())
    (bin_dir / "priosim").write_text(f'#!/usr/bin/env bash\ncase "$1" in\n{cases}\n  *) exec "{real}" "$@" ;;\nesac\n')
    (bin_dir / "pip").write_text(f'#!/usr/bin/env bash\necho "$@" >> "{tmp}/pip.log"\n')
    (bin_dir / "python").write_text(f'#!/usr/bin/env bash\nexec "{sys.executable}" "$@"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env.update(PATH=os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), env.get("PATH", "")]),
               MPLBACKEND="Agg", PRIOSIM_NOTEBOOK_SMALL="1", PRIOSIM_NOTEBOOK_OUT=str(tmp / "notebook-out"))
    return env


def run_line(cmd: str, cwd: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def tracked_digest() -> str:
    """sha256 over the repository's tracked files, to show a command wrote none of them."""
    try:
        files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                               check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*") if p.is_file())
    h = hashlib.sha256()
    for f in files:
        p = ROOT / f
        if p.is_file():
            h.update(f.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()
