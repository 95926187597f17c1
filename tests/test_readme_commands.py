"""Every command the README and docs/*.md show in a ``bash`` block runs as written.

The commands are read from the files at test time (tests/doc_commands.py), so the documentation
cannot drift from the code. Each block runs in a fresh folder that looks like the repository
root; ``priosim`` run/workload/sweep/capacity get a shorter horizon appended (never another
command), ``pip install`` is recorded instead of run and its extras checked against
pyproject.toml. A synopsis line (placeholders in ``[...]``) is checked against the subcommand's
``--help``. No command may write a tracked file (figures go to results/, not docs/).
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.doc_commands import (DOCS, ROOT, bash_commands, extras, fenced_blocks, pip_installs, run_line,
                                sandbox, tracked_digest)

# Commands not run here, each with where it is tested instead (matched by the start of the line).
NOT_RUN = {
    "python3 -m venv .venv": "the test command itself: .ci/run runs it on a clean clone",
    'pip install -e ".[native]" && priosim native build': "the compiled build: tests/test_native.py",
    "priosim native ": "the compiled build: tests/test_native.py",
    "priosim calibrate ": "calibration (torch timing on this machine): tests/test_calibrate.py",
    'priosim run --set engine.profile="p.json"': "needs the p.json priosim calibrate writes: tests/test_calibrate.py",
    "priosim validate ": "real execution against the simulator: tests/test_calibrate.py",
    "bash scripts/gpu_calibrate.sh ": "needs a CUDA GPU; tests/test_calibrate.py runs its CPU path (tiny shape)",
    "jupyter nbconvert ": "tests/test_notebooks.py runs this very line and checks the executed notebooks",
    "vllm bench serve ": "runs vLLM on your GPU; tests/test_replay.py reads files of its format",
    "priosim replay run3.json": "needs your own run file: tests/test_calibrate_from_runs.py replays a held-out run",
    "python -m scripts.harness_runs ": "needs the profile's GPU; tests/test_calibrate.py writes a harness run "
                                       "(the priced loop) and replays it",
    "priosim replay results/harness-runs/": "needs the GPU runs above: tests/test_calibrate.py replays a harness run",
}
SYNOPSIS = re.compile(r"\[(--|[A-Z])")


def _blocks():
    out = []
    for path in DOCS:
        lines: dict[int, list[str]] = {}
        for line, cmd in bash_commands(path):
            lines.setdefault(line, []).append(cmd)
        out += [pytest.param(path, cmds, id=f"{path.relative_to(ROOT)}:{line}") for line, cmds in lines.items()
                if any(not_run(c) is None for c in cmds)]
    return out


def not_run(cmd: str) -> str | None:
    return next((why for start, why in NOT_RUN.items() if cmd.startswith(start)), None)


_DONE: set[str] = set()  # a command shown twice (README and a docs page) runs once


def _check_synopsis(cmd: str, env, cwd) -> None:
    sub = cmd.split()[1]
    done = run_line(f"priosim {sub} --help", cwd, env)
    assert done.returncode == 0, done.stderr
    for opt in re.findall(r"--[a-z][a-z-]*", cmd):
        assert opt in done.stdout, f"{cmd!r}: {opt} is not an option of priosim {sub}"


def _check_pip_log(log: Path) -> None:
    if not log.exists():
        return
    for line in log.read_text().splitlines():  # "install -q -e .[a,b]" as the shell passed it
        for req in [a for a in line.split()[1:] if not a.startswith("-")]:
            m = re.fullmatch(r"(?:\.|priosim)\[([\w,]+)\]", req)
            if m:
                assert set(m.group(1).split(",")) <= extras(), f"pip install {req}: no such extra in pyproject.toml"


@pytest.mark.slow
@pytest.mark.parametrize("path,cmds", _blocks())
def test_bash_block_runs_as_written(path, cmds, tmp_path):
    env = sandbox(tmp_path)
    before = tracked_digest()
    ran = 0
    for cmd in cmds:
        if not_run(cmd) or cmd in _DONE:
            continue
        if cmd.startswith("priosim ") and SYNOPSIS.search(cmd):
            _check_synopsis(cmd, env, tmp_path)
            continue
        done = run_line(cmd, tmp_path, env)
        assert done.returncode == 0, f"{path.name}: {cmd}\n{(done.stdout + done.stderr)[-3000:]}"
        _DONE.add(cmd)
        ran += 1
    _check_pip_log(tmp_path / "pip.log")
    assert tracked_digest() == before, f"a command in {path.name} wrote a tracked file"


def test_every_bash_command_is_run_or_excused():
    """The exclusions are explicit: every command is run, is a synopsis, or is in NOT_RUN."""
    assert any(not_run(c) is None for p in DOCS for _, c in bash_commands(p))
    for start in NOT_RUN:
        assert any(c.startswith(start) for p in DOCS for _, c in bash_commands(p)), f"NOT_RUN entry {start!r} matches nothing"


def test_every_pip_install_names_real_extras():
    """In every fence of every page (run or not), `pip install .[x]` / `priosim[x]` name extras
    pyproject.toml defines."""
    for path in DOCS:
        for _, _, body in fenced_blocks(path):
            for req in pip_installs(body):
                m = re.fullmatch(r"(?:\.|priosim)\[([\w,]+)\]", req)
                if m:
                    assert set(m.group(1).split(",")) <= extras(), f"{path.name}: pip install {req}"


@pytest.mark.slow
def test_readme_python_blocks_run(tmp_path):
    env = sandbox(tmp_path)
    blocks = [body for _, lang, body in fenced_blocks(ROOT / "README.md") if lang == "python"]
    assert blocks
    for body in blocks:
        done = subprocess.run([sys.executable, "-c", body], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "results" / "what-if" / "summary.json").is_file()
