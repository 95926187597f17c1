"""Shared fixtures: small scenario dicts and a runner."""
from __future__ import annotations

import copy

import pytest
from hypothesis import settings

from sim import scenario_from_dict, simulate

# Every Hypothesis test draws the same examples on every run (CI is deterministic; a failure
# reproduces) and has no per-example deadline (the machine is shared: timing is not a check).
# A test's own @settings inherit these; tests/test_suite_rules.py checks that none turns them off.
settings.register_profile("priosim", derandomize=True, deadline=None)
settings.load_profile("priosim")

LINEAR = {"kind": "linear", "base_s": 0.01, "prefill_token_s": 1e-5, "decode_token_s": 1e-4,
          "context_token_s": 1e-7, "swap_block_s": 1e-4}


def small_scenario(**over) -> dict:
    """Two classes, Poisson arrivals, a small KV pool so preemption happens."""
    sc = {
        "name": "small", "seed": 3, "horizon_s": 20.0, "drain": True,
        "engine": {"profile": dict(LINEAR), "max_num_seqs": 8, "max_batched_tokens": 256,
                   "block_size": 16, "kv_blocks": 64, "swap_blocks": 32, "preemption": "recompute",
                   "preempt_for_waiting": "strict", "timeseries_interval_s": 1.0},
        "policy": {"name": "priority"},
        "classes": [{"name": "hi", "priority": 0, "ttft_slo_s": 1.0}, {"name": "lo", "priority": 1}],
        "streams": [
            {"tenant": "a", "class": "hi", "arrival": {"process": "poisson", "rate": 1.0},
             "prompt_tokens": {"dist": "uniform", "low": 10, "high": 200},
             "output_tokens": {"dist": "uniform", "low": 5, "high": 150}, "max_tokens": 150},
            {"tenant": "b", "class": "lo", "arrival": {"process": "poisson", "rate": 2.0},
             "prompt_tokens": {"dist": "uniform", "low": 50, "high": 400},
             "output_tokens": {"dist": "uniform", "low": 20, "high": 300}, "max_tokens": 300},
        ],
    }
    for k, v in over.items():
        node = sc
        parts = k.split("__")
        for p in parts[:-1]:
            node = node[p]
        node[parts[-1]] = v
    if sc["engine"].get("preemption") in ("recompute", "off") and "engine__swap_blocks" not in over:
        del sc["engine"]["swap_blocks"]  # (host space a mode that never swaps leaves unused: it warns)
    return sc


@pytest.fixture
def run():
    def _run(sc: dict, **kw):
        return simulate(scenario_from_dict(copy.deepcopy(sc)), **kw)
    return _run


def pytest_collection_modifyitems(config, items):
    """With the compiled build (``priosim native build``) the suite runs on it, less the tests
    marked ``pure_python``: they count the engine's calls by patching its functions and methods,
    which compiled modules call directly (``tests/test_native.py`` checks the build itself)."""
    from sim import native

    if native.BUILD != "mypyc":
        return
    skip = pytest.mark.skip(reason="patches the engine's functions, which the compiled build calls directly "
                                   "(PRIOSIM_PURE_PYTHON=1 runs it)")
    for item in items:
        if item.get_closest_marker("pure_python"):
            item.add_marker(skip)
