"""The engine's fast paths equal stepping: one suite.

The fast paths: fast-forward (a run of steps priced at once), the lazily-advanced decode cohort,
and in a cluster runs held past arrivals routed elsewhere (and requests joining them). Each
case runs a scenario twice, fast and stepped (``engine.fast_forward = false``, ``engine.lazy_batch
= false``, every cluster run stopped at every arrival), and compares the request table, the time
series and summary.json (all but what only the engine's speed changes:
``scripts.exactness_fuzz.differences``).

* ``test_fast_paths_equal_stepping``: random small scenarios of each kind of
  ``scripts/exactness_fuzz.py`` (``cluster``, ``replica``, ``prefix``, ``join``, ``disagg``,
  ``prefill_first``), drawn by
  Hypothesis with ``derandomize`` (the same draws on every run). The ``replica`` kind also draws
  the engine's own corners over the fuzz's draw: any policy (``lpm`` too), every overhead
  preset (multi-step scheduling, overlap scheduling), prefix caching, reservations, prefill
  caps, tiny batches and budgets. Half the fast runs check KV conservation after every event
  (which syncs the cohort after each: the other half leave it lazy).
* ``test_found_cases_stay_exact``: scenarios that once differed, kept as fixed cases.
* the rest: shipped scenarios and fixed grids (each preemption mode under each overhead, with
  the iteration trace; the benchmark workload with and without the cohort), which also check
  that the fast paths take fewer engine events.

``tests/test_native.py`` reruns this module on the compiled build. Tests of one fast-path
mechanism (with spies that show the path was taken) stay beside that mechanism's other tests.
"""
from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scripts import exactness_fuzz as fuzz
from sim import load_scenario, scenario_from_dict, simulate
from sim.cluster import simulate_cluster
from tests.conftest import small_scenario

#: preemption mode, who may evict for a waiter
MODES = [("recompute", "strict"), ("swap", "strict"), ("auto", "priority"), ("off", "never"),
         ("recompute", "never"), ("swap", "threshold")]

#: engine overheads: none, a preset (priced in the same step function), one with multi-step
#: scheduling and decode KV re-reads (decode steps priced apart from others), one with overlap
#: scheduling (arrivals held back a step by the replica loop), and one whose CPU work is hidden
#: under the GPU's (a step priced as a maximum: no decode line, fast-forward steps one by one)
OVERHEADS = [None, "vllm-0.6", {"preset": "vllm-0.4", "scheduler_steps": 4}, "sglang-0.5",
             {"preset": "sglang-0.5", "seq_s": 1e-4, "cpu_overlap": 1.0}]

#: draws per kind (the replica kind carries the engine's corners as well as the fuzz's)
EXAMPLES = {"replica": 20, "cluster": 10, "prefix": 8, "join": 6, "disagg": 8, "prefill_first": 10}


def _run(d: dict, fast: bool, check: bool = False):
    """One run of scenario dict ``d``: with the fast paths, or stepped."""
    d = copy.deepcopy(d)
    if not fast:
        d["engine"].update(fast_forward=False, lazy_batch=False)
    sc = scenario_from_dict(d)
    if "cluster" in d:
        return simulate_cluster(sc, fast=fast, per_replica=False, check_invariants=check)
    return simulate(sc, check_invariants=check)


def assert_exact(d: dict, check: bool = False) -> None:
    """Scenario ``d`` fast and stepped give the same outputs (``check``: the fast run checks the
    invariants after every event)."""
    diff = fuzz.differences(_run(d, True, check), _run(d, False))
    assert not diff, "\n".join(diff)


@st.composite
def _engine_corners(draw, d: dict) -> dict:
    """The engine's corners over a fuzz draw of one replica (what the fuzz leaves out). Found a
    max_itl bug once: a 1-token last prefill chunk opening a run."""
    e = d["engine"]
    e.update(kv_blocks=draw(st.integers(25, 150)), max_num_seqs=draw(st.integers(1, 12)),
             max_batched_tokens=draw(st.integers(40, 500)),
             preemption=draw(st.sampled_from(["off", "recompute", "swap", "auto"])),
             preempt_for_waiting=draw(st.sampled_from(["never", "priority", "strict", "threshold", "policy"])),
             chunked_prefill=draw(st.booleans()), swap_blocks=20)
    overhead = draw(st.sampled_from(OVERHEADS))
    if overhead is None:
        e.pop("overhead", None)
    else:
        e["overhead"] = overhead
    d["drain"] = draw(st.booleans())
    d["classes"][0]["reserved_blocks"] = draw(st.sampled_from([0, 12]))
    d["classes"][1]["max_prefill_tokens_per_step"] = draw(st.sampled_from([0, 40]))
    d["policy"] = {"name": draw(st.sampled_from(["fcfs", "priority", "wfq", "aging", "mlfq", "srpt_oracle",
                                                 "sjf_rank", "lpm"]))}
    if draw(st.booleans()):
        e.update(prefix_caching=True, prefix_block_tokens=32)
        e.pop("speculative", None)  # (the fuzz never draws speculation with prefix caching)
        for s in d["streams"]:
            s["prefix"] = {"system_tokens": 64, "conversations": 3, "block_tokens": 32}
    return d


@st.composite
def scenarios(draw, kind: str) -> tuple[dict, bool]:
    """A fuzz draw of ``kind`` (its seed drawn here) and whether the fast run checks invariants."""
    seed = draw(st.integers(0, 2**32 - 1))
    d = fuzz.draw(kind, np.random.default_rng(seed))
    if kind == "replica":
        d = draw(_engine_corners(d))
    return d, seed % 2 == 0


@pytest.mark.parametrize("kind", fuzz.KINDS)
def test_fast_paths_equal_stepping(kind):
    """Random small scenarios of each kind (EXAMPLES of it): fast and stepped give the same
    outputs."""
    @settings(max_examples=EXAMPLES[kind], deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(case=scenarios(kind))
    def check(case):
        assert_exact(*case)

    check()


def _engine_case(seed, kv_blocks, max_num_seqs, budget, preemption, pfw, policy, prefix, drain, reserved, cap,
                 chunked, overhead) -> dict:
    """A one-replica scenario on small_scenario, as the engine's own random test drew them."""
    sc = small_scenario(seed=seed, horizon_s=6.0, drain=drain)
    sc["engine"].update(kv_blocks=kv_blocks, max_num_seqs=max_num_seqs, max_batched_tokens=budget,
                        preemption=preemption, preempt_for_waiting=pfw, swap_blocks=20,
                        chunked_prefill=chunked, overhead=overhead)
    if prefix:
        sc["engine"].update(prefix_caching=True, prefix_block_tokens=32)
        for s in sc["streams"]:
            s["prefix"] = {"system_tokens": 64, "conversations": 3, "block_tokens": 32}
    sc["classes"][0]["reserved_blocks"] = reserved
    sc["classes"][1]["max_prefill_tokens_per_step"] = cap
    sc["policy"] = {"name": policy}
    return sc


def _prefix_case(preemption: str) -> dict:
    """Prefix caching on a pool of 60 blocks (shared system prompts, conversations)."""
    sc = small_scenario(horizon_s=10.0)
    sc["engine"].update(prefix_caching=True, prefix_block_tokens=32, kv_blocks=60, preemption=preemption)
    for s in sc["streams"]:
        s["prefix"] = {"system_tokens": 64, "conversations": 4, "block_tokens": 32}
    return sc


FOUND = {
    # a run opened by a prefill that published to the prefix cache (publishing can shrink a
    # reserved pool's share for others); a decode run whose blocks evicted a cached group a
    # waiting request would have reused (which let it fit one step later)
    "prefix-publish": _engine_case(162304, 44, 4, 40, "recompute", "never", "fcfs", True, False, 12, 0, True, None),
    "prefix-evict": _engine_case(291, 56, 3, 40, "recompute", "never", "fcfs", True, False, 12, 0, True, None),
    # a run under a dynamic policy (lpm) while requests waited: it re-ranks every step
    "lpm-waiting": _engine_case(1, 41, 5, 40, "recompute", "priority", "lpm", True, False, 0, 0, True, None),
    # prefix caching under each preemption mode that keeps a victim's blocks or frees them
    "prefix-recompute": _prefix_case("recompute"),
    "prefix-swap": _prefix_case("swap"),
    # engine.batching = "prefill_first" under MLFQ (told of every step): a decode run after a
    # prefill step ran past a decoder's quantum, which the policy had not declared (the
    # decoders sat that step out), so such policies' plans are stepped in that mode
    "prefill-first-mlfq": fuzz.draw("prefill_first", np.random.default_rng(365)),
    # MLFQ with vLLM V1's walk in admission order: a step stopped by a swap-out left most
    # decoders out, so the quantum expiry the policy declared at its end knew only the two that
    # ran, and the decode run after it went past the others' expiries (their demotions came
    # 90 steps late, and another request was evicted)
    "admission-walk-mlfq": fuzz.draw("replica", np.random.default_rng(784)),
}
#: the cases whose fast run checks the invariants after every event (as when they were found)
CHECKED = {"prefix-publish"}


@pytest.mark.parametrize("name", FOUND)
def test_found_cases_stay_exact(name):
    assert_exact(FOUND[name], check=name in CHECKED)


# ---- fixed grids and shipped scenarios ---------------------------------------------------------
@pytest.mark.parametrize("overhead", OVERHEADS)
@pytest.mark.parametrize("preemption,pfw", MODES)
def test_fast_forward_is_exact(run, preemption, pfw, overhead):
    """A run with fast-forward gives the same request table, bit for bit, as one event per
    iteration (the iteration trace too); and it takes fewer events."""
    sc = small_scenario(engine__preemption=preemption, engine__preempt_for_waiting=pfw,
                        engine__overhead=overhead)
    a = run(sc, trace_iterations=True)
    sc2 = copy.deepcopy(sc)
    sc2["engine"]["fast_forward"] = False
    b = run(sc2, trace_iterations=True)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.iterations, b.iterations)
    pd.testing.assert_frame_equal(a.timeseries, b.timeseries)
    assert a.summary_dict["run"]["iterations"] == b.summary_dict["run"]["iterations"]
    assert a.summary_dict["run"]["engine_events"] < b.summary_dict["run"]["engine_events"]


def test_fast_forward_exact_on_default_scenario():
    """The shipped default scenario (H200 profile, real batch flood), shortened."""
    a = simulate(load_scenario(None, overrides=["horizon_s=8.0"]))
    b = simulate(load_scenario(None, overrides=["horizon_s=8.0", "engine.fast_forward=false"]))
    pd.testing.assert_frame_equal(a.requests, b.requests)
    assert a.summary_dict["run"]["engine_events"] < b.summary_dict["run"]["engine_events"] / 1.5


@pytest.mark.parametrize("overhead", ["none", None])  # None: the profile's own preset
@pytest.mark.parametrize("preemption,pfw", MODES)
def test_lazy_cohort_is_exact_on_the_benchmark_scenario(preemption, pfw, overhead):
    """The benchmark's workload (H200 profile, ~100 decoders at once; a small KV pool so that
    preemption happens), with and without the lazily-advanced decode cohort: identical outputs
    and no more events (fewer: a run goes on past members' last tokens when nothing waits)."""
    from benchmarks.core_scenario import scenario
    sc = scenario(1500, load=0.9)
    sc["engine"].update(preemption=preemption, preempt_for_waiting=pfw, swap_blocks=4000, kv_blocks=6000,
                        overhead=overhead)
    a = simulate(scenario_from_dict(copy.deepcopy(sc)), check_invariants=True)
    assert a.summary_dict["run"]["lazy_batch"]
    sc["engine"]["lazy_batch"] = False
    b = simulate(scenario_from_dict(sc))
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.timeseries, b.timeseries)
    assert a.summary_dict["classes"] == b.summary_dict["classes"]
    assert a.summary_dict["run"]["engine_events"] <= b.summary_dict["run"]["engine_events"]


def test_lazy_cohort_exact_with_long_prompts_cut_by_the_budget():
    """Long batch prompts whose chunks the token budget cuts, below every cohort member, and
    interactive waiters evicting batch decoders: the cohort stays (its members rank above the
    cut chunk; it dissolves only when an eviction happens) and the outputs equal stepping."""
    over = ["horizon_s=60.0"]
    a = simulate(load_scenario("diurnal_two_class", overrides=over), load_scale=0.3, check_invariants=True)
    b = simulate(load_scenario("diurnal_two_class", overrides=over + ["engine.lazy_batch=false",
                                                                     "engine.fast_forward=false"]), load_scale=0.3)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.timeseries, b.timeseries)
