"""Every notebook executes top to bottom (nbclient) in small mode (PRIOSIM_NOTEBOOK_SMALL=1), so
none can rot. The calibration notebook needs torch and ``calibrate``'s calibrate_profile; it is
skipped, alone, when either is missing."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]
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
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path, tmp_path, monkeypatch):
    if path.name.startswith("03_"):
        why = _calibrate_ready()
        if why:
            pytest.skip(why)
    monkeypatch.setenv("PRIOSIM_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("PRIOSIM_NOTEBOOK_OUT", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    images = sum(1 for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                 if "image/png" in o.get("data", {}))
    if not path.name.startswith("03_"):
        assert images >= 3, "the notebook should show its figures"
