"""Every JSON file a command writes is strict JSON (no NaN or Infinity: JavaScript's JSON.parse
rejects them); a non-finite value is null with its reason beside it (sim/jsonout.py)."""
from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.jsonout import dumps, strict


def _reject(const):
    raise ValueError(f"not strict JSON: {const}")


def test_non_finite_values_become_null_with_the_reason():
    doc = strict({"mean_rate": math.inf, "x": [float("nan"), 1.0], "ok": 2.0})
    assert doc == {"mean_rate": None, "mean_rate_note": "infinite", "x": [None, 1.0], "ok": 2.0}
    json.loads(dumps({"a": -math.inf}), parse_constant=_reject)


@pytest.mark.parametrize("args", [
    ["run", "--set", "horizon_s=20"],  # the default scenario: a batch arrives at once (mean rate infinite)
    ["sweep", "chat_vs_batch", "--set", "horizon_s=5", "--workers", "1", "--no-plots", "--no-progress"],
    ["capacity", "diurnal_two_class", "--set", "horizon_s=30", "--workers", "1", "--no-plots"],
])
def test_every_json_written_parses_strictly(tmp_path, args):
    out = tmp_path / "out"
    r = CliRunner().invoke(main, args + ["--out", str(out)])
    assert r.exit_code == 0, r.output
    files = [p for p in out.rglob("*.json") if "probes" not in p.parts]  # (probes: the search's own cache)
    assert files
    for p in files:
        json.loads(p.read_text(), parse_constant=_reject)
