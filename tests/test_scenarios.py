"""Every shipped scenario loads, validates and runs at a reduced horizon."""
from __future__ import annotations

from pathlib import Path

import pytest

from sim import load_scenario, simulate

SCEN = Path(__file__).resolve().parents[1] / "workloads" / "scenarios"


@pytest.mark.parametrize("path", sorted(SCEN.glob("*.toml")), ids=lambda p: p.stem)
def test_shipped_scenario_runs(path):
    text = path.read_text()
    assert text.lstrip().startswith("#"), "a scenario opens with a comment saying what question it answers"
    sc = load_scenario(path, overrides=["horizon_s=20.0", "drain=false"])
    res = simulate(sc, check_invariants=True)  # a [cluster] scenario runs its replicas
    r = res.requests
    assert set(r.status) <= {"finished", "rejected", "unfinished"}
    assert len(res.summary) == len(sc.classes) + 1
