"""Policy library: the conformance suite over every registered policy, the real engine on each
policy (deterministic, exact fast-forward, nothing lost), parameter validation, and the
SRPT-order score. Seeded, small; no golden values."""
import math

import numpy as np
import pandas as pd
import pytest

from policies import POLICIES, BasePolicy, check_policy, make_policy
from policies.check import PolicyCheckError
from policies.common import srpt_order_tau
from sim import scenario_from_dict, simulate

VARIANTS = {
    "wfq-weights": ("wfq", {"weights": {"hi": 4, "mid": 2}, "cost": "prompt"}),
    "wfq-predicted": ("wfq", {"cost": "predicted", "predictor": "learned",
                              "predictor_params": {"train_requests": 30}}),
    "aging-fast": ("aging", {"alpha": 5.0}),
    "mlfq-starve": ("mlfq", {"base_quantum_s": 0.02, "starve_limit_s": 0.3}),
    "sjf-noisy-guard": ("sjf_rank", {"predictor": "noisy", "tau": 0.5, "starve_limit_s": 0.5}),
    "sjf-learned": ("sjf_rank", {"predictor": "learned", "train_requests": 50}),
}
CASES = [(n, {}) for n in POLICIES.names()] + list(VARIANTS.values())
IDS = POLICIES.names() + list(VARIANTS)


@pytest.mark.parametrize("name,params", CASES, ids=IDS)
def test_conformance_suite(name, params):
    """Keys total, ending in (arrival, id), deterministic; next change honoured; same seed same
    schedule; nothing lost or served twice; no hidden oracle reads."""
    out = check_policy(name, **params)
    assert out["events"] > 600 and out["preemptions"] > 50


def _scenario(policy: dict, ff: bool = True, seed: int = 3) -> dict:
    """Three classes on a small KV pool (recompute preemption, strict preemption for waiting)."""
    return {
        "name": "conformance", "seed": seed, "horizon_s": 20.0,
        "engine": {"max_num_seqs": 8, "max_batched_tokens": 256, "block_size": 16, "kv_blocks": 96,
                   "preemption": "recompute", "preempt_for_waiting": "strict", "fast_forward": ff,
                   "profile": {"kind": "linear", "base_s": 0.01, "prefill_token_s": 1e-5,
                               "decode_token_s": 1e-4, "context_token_s": 1e-7}},
        "policy": policy,
        "classes": [{"name": "hi", "priority": 0}, {"name": "mid", "priority": 1}, {"name": "lo", "priority": 2}],
        "streams": [{"tenant": c, "class": c, "arrival": {"process": "poisson", "rate": 2.0},
                     "prompt_tokens": {"dist": "uniform", "low": 8, "high": 200},
                     "output_tokens": {"dist": "lognormal", "median": 40, "sigma": 1.0, "max": 400}}
                    for c in ("hi", "mid", "lo")],
    }


@pytest.mark.parametrize("name,params", CASES, ids=IDS)
def test_engine_runs_policy_exactly_and_deterministically(name, params):
    """On the real engine: every request finishes once with its full output; two runs with the
    same seed give the same table; fast-forward on and off give the same table."""
    pol = {"name": name, **params}
    a = simulate(scenario_from_dict(_scenario(pol))).requests
    b = simulate(scenario_from_dict(_scenario(pol))).requests
    c = simulate(scenario_from_dict(_scenario(pol, ff=False))).requests
    assert (a["status"] == "finished").all()
    assert (a["generated_tokens"] == a["output_tokens"]).all()
    assert a["request_id"].is_unique
    pd.testing.assert_frame_equal(a, b)
    pd.testing.assert_frame_equal(a, c)


def test_report_reaches_summary():
    res = simulate(scenario_from_dict(_scenario({"name": "sjf_rank", "predictor": "noisy", "tau": 0.7})))
    rep = res.summary_dict["run"]["policy"]
    assert rep["srpt_order_tau"] is not None and rep["predictor"]["requested_tau"] == 0.7


@pytest.mark.parametrize("name,params,message", [
    ("wfq", {"weights": {"batch": -1}}, "wfq: weights.batch must be a finite number > 0 (got -1)"),
    ("wfq", {"cost": "true"}, "wfq: cost must be one of 'declared', 'prompt', 'predicted' (got 'true')"),
    ("wfq", {"weightz": {}}, "wfq: unknown parameter 'weightz'"),
    ("aging", {"alpha": -0.5}, "aging: alpha must be a finite number >= 0 (got -0.5)"),
    ("aging", {"alpha": "fast"}, "aging: alpha must be a finite number >= 0 (got 'fast')"),
    ("mlfq", {"ratio": 0.5}, "mlfq: ratio must be a finite number >= 1 (got 0.5)"),
    ("mlfq", {"levels": 0}, "mlfq: levels must be an integer >= 1 (got 0)"),
    ("mlfq", {"starve_limit_s": 0}, "mlfq: starve_limit_s must be a finite number > 0 (got 0)"),
    ("sjf_rank", {"predictor": "noisy", "tau": 1.5}, "noisy: tau must be a finite number > 0 and <= 1 (got 1.5)"),
    ("sjf_rank", {"predictor": "nosy"}, "did you mean 'noisy'"),
    ("sjf_rank", {"predictor": "learned", "train_requests": 2}, "learned: train_requests must be an integer >= 10 (got 2)"),
    ("srpt_oracle", {"x": 1}, "srpt_oracle: unknown parameter 'x' (expected no parameters)"),
])
def test_bad_parameters_fail_with_one_clear_line(name, params, message):
    with pytest.raises(ValueError) as exc:
        make_policy(name, **params)
    assert message in str(exc.value)


def test_bad_parameter_fails_at_scenario_load():
    from sim.core.errors import ScenarioError
    with pytest.raises(ScenarioError, match="policy: aging: alpha must be"):
        scenario_from_dict(_scenario({"name": "aging", "alpha": -1}))


def test_wfq_weight_for_unknown_class_fails_at_bind():
    pol = make_policy("wfq", weights={"gold": 2})
    with pytest.raises(ValueError, match="wfq: weights.gold names no class"):
        pol.bind({"hi": {"priority": 0}}, 0)


class _NoTieBreak(BasePolicy):
    name = "no_tie_break"

    def key(self, req, now):
        return (req.priority,)


class _Sneaky(BasePolicy):
    name = "sneaky"

    def key(self, req, now):
        return (req.true_output_tokens, req.arrival_s, req.request_id)


class _Undeclared(BasePolicy):
    name = "undeclared"

    def key(self, req, now):  # changes with attained service but declares nothing
        return (req.attained_s > 0.05, req.arrival_s, req.request_id)


@pytest.mark.parametrize("policy,message", [
    (_NoTieBreak, "must end in (arrival_s, request_id)"),
    (_Sneaky, "reads true_output_tokens but does not declare oracle = True"),
    (_Undeclared, "before the declared next change"),
])
def test_conformance_suite_catches_broken_policies(policy, message):
    with pytest.raises(PolicyCheckError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_policy(policy)


def test_conformance_suite_accepts_a_user_instance():
    out = check_policy(make_policy("aging", alpha=2.0))
    assert out["policy"] == "aging"


def test_srpt_order_tau_extremes():
    """All requests waiting together: admitted shortest-first gives 1, longest-first -1."""
    arrival = np.zeros(5)
    size = np.array([5.0, 1, 4, 2, 3])
    assert srpt_order_tau(arrival, size, size) == (1.0, 10)
    assert srpt_order_tau(arrival, 10 - size, size) == (-1.0, 10)
    # requests that never waited together are not compared
    assert math.isnan(srpt_order_tau(np.arange(3.0), np.arange(3.0), np.array([3.0, 2, 1]))[0])


@pytest.mark.parametrize("seed", range(20))
def test_srpt_order_tau_counts_every_competing_pair(seed):
    """Against the definition pair by pair: ties in arrival, admission and size included."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 60))
    arrival = np.round(rng.random(n) * 10, int(rng.integers(0, 2)))
    admitted = arrival + np.round(rng.exponential(3, n), int(rng.integers(0, 2)))
    size = rng.integers(1, 6, n).astype(float)
    conc = disc = 0
    for x in range(n):
        for y in range(n):
            # y arrived after x (arrival order, ties by index) and before x was first admitted
            if (arrival[y], y) > (arrival[x], x) and arrival[y] < admitted[x]:
                p = np.sign(admitted[y] - admitted[x]) * np.sign(size[y] - size[x])
                conc, disc = conc + (p > 0), disc + (p < 0)
    for chunk in (1 << 13, 1, 7, 50):  # compared a few pairs at a time: the same counts
        tau, pairs = srpt_order_tau(arrival, admitted, size, chunk_pairs=chunk)
        assert pairs == conc + disc
        assert (math.isnan(tau) and not pairs) or tau == (conc - disc) / pairs


@pytest.mark.parametrize("policy,low,high", [
    ({"name": "fcfs"}, -0.15, 0.15), ({"name": "srpt_oracle"}, 0.99, 1.0),
    ({"name": "sjf_rank", "predictor": "noisy", "tau": 0.5}, 0.3, 0.75),
])
def test_srpt_order_tau_separates_policies(policy, low, high):
    """One server at load 0.9 (queues form): FCFS's admission order is blind to size (about 0),
    SRPT's is SRPT's (1), a tau-0.5 predictor's lies between."""
    from tests import theory_cases as tc
    sc = tc.single_server(policy=policy, classes=[("a", 0, 9.0)], horizon_s=300.0, seed=4)
    rep = simulate(scenario_from_dict(sc)).summary_dict["run"]["policy"]
    assert rep["srpt_order_pairs"] > 1000
    assert low <= rep["srpt_order_tau"] <= high


def test_a_reached_starvation_deadline_is_not_declared_again():
    """A request that starved and was not ranked since (nothing reset its clock) changes no
    ranking by starving further: the next deadline declared is the next one still to come, not
    the past one again (which stopped every run a nanosecond later, over and over: the
    disaggregated fuzz's draw 368, MLFQ with decode-side waiters, ran for minutes)."""
    from types import SimpleNamespace

    from policies.common import StarvationClock

    clock = StarvationClock(1.0)
    a = SimpleNamespace(request_id=0, arrival_s=0.0, last_scheduled_s=float("nan"))
    b = SimpleNamespace(request_id=1, arrival_s=0.5, last_scheduled_s=float("nan"))
    clock.add(a, 0.0)
    clock.add(b, 0.5)
    assert clock.next_deadline() == 1.0 and clock.next_deadline(0.9) == 1.0
    assert clock.next_deadline(1.2) == 1.5  # (a starved at 1.0 and was never reset)
    assert clock.next_deadline(2.0) is None
    clock.reset(a, 2.0)  # (a progresses: its deadline moves on)
    assert clock.next_deadline(2.0) == 3.0 and clock.next_deadline() == 1.5


def test_a_ranked_policy_with_hooks_of_its_own_keeps_them_called():
    from sim.core.binding import BoundPolicy

    for name in ("mlfq", "lpm"):
        pol = make_policy(name)
        assert pol.native_books() is None
        assert BoundPolicy(pol).on_finish.__self__ is pol


@pytest.mark.parametrize("name", ["fcfs", "priority"])
def test_engine_writes_a_ranked_policys_records_as_its_hooks_do(name):
    """A policy whose finish and preemption hooks only record (RankedPolicy's) hands the engine
    its records' storage (``sim.core.binding.FinishBooks``): the same records, in the same order,
    as its own hooks write."""
    from sim.core.binding import BoundPolicy
    from sim.core.request import Request

    rng = np.random.default_rng(3)
    reqs = []
    for i in range(300):
        r = Request(i, int(rng.integers(0, 10**9)), "t", "c", 0, 0, 100, 50, 60)
        r.admitted_s = r.arrival_s + float(rng.random())
        r.generated = int(rng.integers(1, 60))
        reqs.append(r)
    own, bound = make_policy(name), make_policy(name)
    engine = BoundPolicy(bound)
    assert engine.on_finish.__self__ is not bound
    for pol, hooks in ((own, own), (bound, engine)):
        for r in reqs:
            if r.request_id % 7 == 0:
                admitted = r.admitted_s
                hooks.on_preempt(r, admitted)
                r.admitted_s = admitted + 1.0  # (admitted again later: the first admission is kept)
                hooks.on_finish(r, 0.0)
                r.admitted_s = admitted
            else:
                hooks.on_finish(r, 0.0)
    mine, theirs = own._records(), bound._records()
    for k in ("arrival", "admitted", "size"):
        np.testing.assert_array_equal(mine[k], theirs[k])
    assert own.report() == bound.report()
