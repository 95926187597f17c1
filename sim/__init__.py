"""priosim's simulator: time, memory and mechanism (engine, KV pool, preemption, telemetry).

Public API (what the CLI and the notebooks use)::

    from sim import load_scenario, simulate
    sc = load_scenario("workloads/scenarios/chat_vs_batch.toml", overrides=["engine.max_num_seqs=64"])
    res = simulate(sc)
    res.summary            # per-class DataFrame
    res.requests           # one row per request
    res.save("results/x")  # requests.parquet, summary.json, timeseries.parquet, ...

``sim`` never imports torch or ``calibrate``.
"""
from sim import native

native.select()  # the compiled build of the hot modules, or pure Python (see sim.native)

from sim.config import Scenario, load_scenario, scenario_from_dict
from sim.core.costs import CostModel, load_profile
from sim.core.errors import ScenarioError
from sim.results import Results
from sim.run import simulate

__all__ = ["Scenario", "load_scenario", "scenario_from_dict", "simulate", "Results", "CostModel",
           "load_profile", "ScenarioError"]
