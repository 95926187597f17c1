"""Inputs checked for what they mean: step-time terms of a profile finite and >= 0, and a horizon
within the integer-nanosecond clock; each gets one line and exit 2."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from sim.cli import main


def _profile(tmp_path, token_s) -> str:
    from sim.core.costs import load_profile  # noqa: F401 (the shipped profile below is valid)
    import sim.core.costs as costs

    src = next(p for n, p in costs.list_profiles() if p.suffix == ".json")
    doc = json.loads(src.read_text())
    doc["step"]["token_knots"] = [1, 2, 3][: len(token_s)]
    doc["step"]["token_s"] = token_s
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(doc))
    return str(p)


@pytest.mark.parametrize("token_s", [[-1, -1, -1], [0.001, float("nan"), 0.002], [0.001, "x", 0.002]])
def test_a_profile_with_a_negative_or_non_finite_step_term_is_refused(tmp_path, token_s):
    r = CliRunner().invoke(main, ["run", "--set", f'engine.profile="{_profile(tmp_path, token_s)}"', "--set",
                                  "horizon_s=2", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2, r.output
    (line,) = r.output.strip().splitlines()
    assert "step.token_s[" in line and "expected a finite number >= 0" in line
    assert not (tmp_path / "o").exists()


def test_a_horizon_past_the_nanosecond_clock_is_refused(tmp_path):
    r = CliRunner().invoke(main, ["run", "--set", "horizon_s=1e10", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2, r.output
    (line,) = r.output.strip().splitlines()
    assert "horizon_s" in line and "1000000000" in line
