"""A fast-forwarded run priced a stretch at a time (:class:`sim.core.fastforward.OpenRun`, what a
cluster replica does) is the run priced at once (:func:`sim.core.fastforward.run_length`): the
same durations, step ends and instants of requests' last tokens inside it, whatever the stretches."""
from __future__ import annotations

import copy
from itertools import accumulate

import numpy as np
import pandas as pd
import pytest

from tests.conftest import small_scenario
from sim import scenario_from_dict, simulate
from sim.cluster import simulate_cluster
from sim.core import fastforward
from sim.core.costs import NEVER


def _gone_ns(eng, plan, now_ns: int, durs: list[int]) -> list[int]:
    """When each request whose last token ends a step before the run's last leaves it: cohort
    members, and items (the run's explicit requests) that leave inside it."""
    ends = list(accumulate(durs, initial=now_ns))[1:]
    left = [s.req.hidden_output_tokens - s.req.generated for s in plan.items]
    gone = [ends[n - 1] for n in left if n < len(durs)]
    if plan.cohort and eng.cohort is not None:
        g = eng.cohort.steps
        gone += [ends[f - g - 1] for f, _, _ in eng.cohort.finish if f - g - 1 < len(durs) - 1]
    return sorted(gone)


@pytest.mark.parametrize("kv, rate, mode", [(64, 2.0, "recompute"), (40, 6.0, "swap"), (400, 0.5, "off"),
                                            (400, 0.5, "recompute")])
@pytest.mark.pure_python  # (counts calls by patching the engine: see tests/conftest.py)
def test_run_priced_in_stretches_is_the_run_priced_at_once(monkeypatch, kv, rate, mode):
    rng = np.random.default_rng(7)
    seen = {"runs": 0, "stretches": 0, "gone": 0, "cut_by_blocks": 0}
    whole = fastforward.run_length

    def checked(eng, plan, now_ns, next_event_ns, dur0):
        durs = whole(eng, plan, now_ns, next_event_ns, dur0)
        run = fastforward.start_run(eng, plan, now_ns, next_event_ns, dur0)
        if run is None:
            assert durs == [dur0]
            return durs
        seen["runs"] += 1
        bound = now_ns
        while not run.done:
            bound += int(rng.integers(1, 3 * dur0 + 2))
            seen["stretches"] += run.extend(bound)
        assert run.durs == durs
        assert run.ends == list(accumulate(durs, initial=now_ns))[1:]
        assert run.gone_ns == _gone_ns(eng, plan, now_ns, durs)
        assert not run.extend(NEVER)  # (priced to its end)
        seen["gone"] += len(run.gone_ns)
        return durs

    limited = fastforward.block_limited

    def counted(eng, plan, k, avail, lo=1):
        kb = limited(eng, plan, k, avail, lo)
        seen["cut_by_blocks"] += kb < k
        return kb

    monkeypatch.setattr(fastforward, "run_length", checked)
    monkeypatch.setattr(fastforward, "block_limited", counted)
    d = small_scenario(horizon_s=15.0)
    d["engine"].update(kv_blocks=kv, preemption=mode)
    d["streams"][1]["arrival"]["rate"] = rate
    simulate(scenario_from_dict(d), check_invariants=True)
    assert seen["runs"] > 20 and seen["stretches"] > seen["runs"]
    if mode == "off":
        assert seen["gone"] > 0  # (runs went on past members' last tokens)
    if kv == 40:
        assert seen["cut_by_blocks"] > 0  # (KV blocks ended runs, some in a later stretch)


def test_run_priced_from_measured_tables_is_stepping():
    """A profile with measured decode tables has no cost line (``decode_line`` is None): a
    fast-forwarded run prices each step with the cost function, and equals stepping."""
    d = small_scenario()
    d["engine"]["profile"] = "cpu-tiny"
    d["engine"]["lazy_batch"] = True
    a = simulate(scenario_from_dict(d))
    d["engine"]["fast_forward"] = False
    b = simulate(scenario_from_dict(d))
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.timeseries, b.timeseries)
    assert a.summary_dict["run"]["engine_events"] < b.summary_dict["run"]["engine_events"]


def test_steps_are_priced_as_step_ns_prices_them():
    """A run prices a step in floats (context and NS as floats) and rounds with the function
    ``round`` calls for a float (ties to even): bit for bit ``step_ns``, over contexts far
    larger than any batch holds, and for integer cost terms."""
    rnd = fastforward._round_float
    for x in (0.5, 1.5, 2.5, 12_345_678.5, 12_345_679.5, 0.49999999999999994, 7.2e6 + 0.4999):
        assert rnd(x) == round(x) and type(rnd(x)) is int
    for a, b in ((0.0071234, 3.1e-10), (0.001, 3.4133333333333335e-08), (1, 0), (0, 2), (3, 0.5)):
        for ctx in (0, 1, 77_777, 10**6 + 3, 2**40 + 1):
            exact = (a + b * ctx) * 1_000_000_000
            if exact < 2**53:  # (integer terms: steps shorter than 104 days)
                assert rnd((a + b * float(ctx)) * fastforward._NS_F) == round(exact)


def _short_answers(lazy: bool) -> dict:
    """Short answers (1-6 tokens) among long ones, in a pool large enough that nothing waits
    most of the time."""
    d = small_scenario(horizon_s=30.0)
    d["engine"].update(kv_blocks=4000, lazy_batch=lazy)
    d["streams"][0]["output_tokens"] = {"dist": "uniform", "low": 1, "high": 6}
    d["streams"][0]["arrival"]["rate"] = 3.0
    return d


def _count_leaving_runs(monkeypatch) -> list:
    """Spy on the runs applied with items that left inside them: one entry (how many) each."""
    from sim.core import apply as apply_mod
    seen: list[int] = []
    segments = apply_mod._log_segments

    def spy(tel, start_ns, durations, emitted, steady, by_tenant, leavers, entrants, landed):
        seen.append(len(leavers))
        return segments(tel, start_ns, durations, emitted, steady, by_tenant, leavers, entrants, landed)

    monkeypatch.setattr(apply_mod, "_log_segments", spy)
    return seen


@pytest.mark.pure_python  # (counts calls by patching the engine: see tests/conftest.py)
@pytest.mark.parametrize("lazy", [True, False])
def test_items_leave_a_run_at_their_last_token(monkeypatch, lazy):
    """A run whose explicit requests (admitted in its first step, or decoding outside the
    cohort) answer before its last step goes on past their last tokens when nothing waits:
    each leaves the batch at its own, as cohort members do. Outputs, the time series and the
    iteration trace (without the cohort) equal stepping every request, and such runs happened."""
    seen = _count_leaving_runs(monkeypatch)
    d = _short_answers(lazy)
    a = simulate(scenario_from_dict(copy.deepcopy(d)), trace_iterations=not lazy, check_invariants=True)
    assert len(seen) > 20
    d["engine"].update(fast_forward=False, lazy_batch=False)
    b = simulate(scenario_from_dict(d), trace_iterations=not lazy)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.timeseries, b.timeseries)
    assert a.summary_dict["classes"] == b.summary_dict["classes"]
    if not lazy:
        pd.testing.assert_frame_equal(a.iterations, b.iterations)
    assert a.summary_dict["run"]["engine_events"] < b.summary_dict["run"]["engine_events"]


@pytest.mark.pure_python  # (counts calls by patching the engine: see tests/conftest.py)
def test_items_leave_runs_held_past_arrivals_in_a_cluster(monkeypatch):
    """The same in a 3-replica cluster whose replicas' runs go past arrivals routed elsewhere
    (the router's outstanding counts pass the items gone inside a run, as its members)."""
    seen = _count_leaving_runs(monkeypatch)
    d = _short_answers(True)
    d["cluster"] = {"replicas": 3, "router": "least_outstanding"}
    for s in d["streams"]:
        s["arrival"]["rate"] *= 3
    a = simulate_cluster(scenario_from_dict(copy.deepcopy(d)), check_invariants=True)
    assert len(seen) > 20
    d["engine"].update(fast_forward=False, lazy_batch=False)
    b = simulate_cluster(scenario_from_dict(d))
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.timeseries, b.timeseries)
