"""Every notebook executes top to bottom, by the docs' own command (``jupyter nbconvert
--to notebook --execute notebooks/*.ipynb ...``, read from docs/notebooks.md), in small mode
(PRIOSIM_NOTEBOOK_SMALL=1), so none can rot and the command a reader copies works. The
calibration notebook needs torch (the calibrate extra, which the test command installs)."""
from __future__ import annotations

import importlib.util
import re

import pytest

from tests.doc_commands import ROOT, bash_commands, run_line, sandbox

nbformat = pytest.importorskip("nbformat")

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _calibrate_ready() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed (the calibrate extra)"
    try:
        import calibrate
        if getattr(calibrate, "calibrate_profile", None) is None:
            from calibrate.measure import calibrate_profile  # noqa: F401
    except ImportError as exc:
        return f"calibrate has no calibrate_profile yet ({exc})"
    return None


def test_there_are_three_notebooks():
    assert [p.name for p in NOTEBOOKS] == ["01_quickstart.ipynb", "02_policy_comparison.ipynb",
                                           "03_calibrate_then_simulate.ipynb"]


@pytest.mark.slow
def test_docs_command_executes_every_notebook(tmp_path):
    pytest.importorskip("nbconvert")  # the dev extra has it; the notebooks extra brings jupyter
    why = _calibrate_ready()
    if why:
        pytest.skip(why)
    cmds = [c for _, c in bash_commands(ROOT / "docs" / "notebooks.md") if c.startswith("jupyter nbconvert ")]
    assert len(cmds) == 1, cmds
    env = sandbox(tmp_path)  # PRIOSIM_NOTEBOOK_SMALL=1, MPLBACKEND=Agg, results/ of its own
    done = run_line(cmds[0], tmp_path, env, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    out_dir = tmp_path / re.search(r"--output-dir[ =](\S+)", cmds[0]).group(1)
    for path in NOTEBOOKS:
        nb = nbformat.read(out_dir / path.name, as_version=4)
        errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                  if o.get("output_type") == "error"]
        assert not errors, path.name
        images = sum(1 for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                     if "image/png" in o.get("data", {}))
        if not path.name.startswith("03_"):
            assert images >= 3, f"{path.name} should show its figures"
