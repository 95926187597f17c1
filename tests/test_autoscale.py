"""The autoscaler and the cost report (docs/autoscaling.md): each policy's rule on hand-made
observations, and small cluster runs whose fleet timeline, routing and cost are checked against
the rules written in sim/cluster/autoscale.py and sim/cluster/cost.py."""
from __future__ import annotations

import copy
import math
import warnings

import pytest

from tests.conftest import small_scenario
from plumbing.notices import InputWarning
from sim import ScenarioError, scenario_from_dict
from sim.autoscalers import (AUTOSCALERS, SLO, BaseAutoscaler, Ended, Observation, QueueLength, ReplicaState,
                             Schedule, TargetUtilisation, make_autoscaler)
from sim.cluster import simulate_cluster


def obs(*reps, now=100.0, prov=0, ended=()):
    return Observation(now, tuple(ReplicaState(*r) for r in reps), prov, 0, tuple(ended))


# ---- the policies, alone ------------------------------------------------------------------------
def test_target_utilisation_is_hpa_rule():
    # two replicas at 8 of 8 running slots, target 0.5: ceil(2 x 1.0 / 0.5) = 4
    p = TargetUtilisation(target=0.5, metric="running")
    assert p.desired(obs((8, 0, 8, 0.1), (8, 3, 8, 0.1))) == 4
    # KV use 0.35 and 0.35 against 0.7: ceil(2 x 0.5) = 1
    assert TargetUtilisation(target=0.7).desired(obs((1, 0, 8, 0.35), (1, 0, 8, 0.35))) == 1
    # within the tolerance: no change (the current count includes one provisioning)
    assert TargetUtilisation(target=0.7).desired(obs((1, 0, 8, 0.72), prov=1)) == 2


def test_queue_length_counts_outstanding_or_waiting():
    # 10 + 4 running, 6 + 0 waiting: outstanding 20 / 8 -> 3; waiting 6 / 4 -> 2
    reps = ((10, 6, 16, 0.5), (4, 0, 16, 0.2))
    assert QueueLength(target=8).desired(obs(*reps)) == 3
    assert QueueLength(target=4, metric="waiting").desired(obs(*reps)) == 2


def test_slo_policy_scales_on_the_window_percentile():
    p = SLO(target_s=1.0, percentile=50, window_s=10, min_samples=3, classes=["hi"])
    slow = [Ended(95.0, "hi", 2.0, 0.01)] * 3
    assert p.desired(obs((1, 0, 8, 0.1), ended=slow)) == 2  # p50 2 s > 1 s: one more
    fast = [Ended(95.0, "hi", 0.1, 0.01)] * 3
    assert p.desired(obs((1, 0, 8, 0.1), (1, 0, 8, 0.1), ended=fast)) == 1  # 0.1 < 0.5 x 1: one fewer
    old = [Ended(80.0, "hi", 2.0, 0.01)] * 3  # outside the 10 s window: too few samples, no change
    assert p.desired(obs((1, 0, 8, 0.1), ended=old)) == 1
    other = [Ended(95.0, "lo", 2.0, 0.01)] * 3  # another class: not counted
    assert p.desired(obs((1, 0, 8, 0.1), ended=other)) == 1


def test_schedule_follows_its_table():
    p = Schedule(table=[[0, 1], [4, 3], [8, 2]], period_s=12)
    assert [p.desired(obs(now=t)) for t in (0, 3.9, 4, 7.9, 8, 11.9, 12, 16)] == [1, 1, 3, 3, 2, 2, 1, 3]


@pytest.mark.parametrize("name,params,msg", [
    ("target_utilisation", {"target": 1.5}, "target: expected a number in (0, 1]"),
    ("queue_length", {"metric": "tokens"}, "metric: expected 'outstanding' or 'waiting'"),
    ("slo", {"metric": "e2e"}, "metric: expected 'ttft' or 'tpot'"),
    ("schedule", {"table": [[1, 2]]}, "table: expected times increasing from 0"),
])
def test_bad_policy_params(name, params, msg):
    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        make_autoscaler(name, **params)


def test_registry_lists_the_four():
    assert {"target_utilisation", "queue_length", "slo", "schedule"} <= set(AUTOSCALERS.names())


# ---- runs -------------------------------------------------------------------------------------------
def scenario(cluster: dict, **over) -> dict:
    d = small_scenario(**over)
    d["horizon_s"] = 12.0
    d["cluster"] = cluster
    return d


def run(d: dict):
    return simulate_cluster(scenario_from_dict(copy.deepcopy(d)))


def timeline(res) -> list[tuple]:
    return [(round(r.t_s, 9), r.serving, r.provisioning, r.draining) for r in res.fleet_table().itertuples()]


def paid_replica_seconds(res, end_s: float) -> float:
    """The integral of serving + provisioning + draining over the timeline (one group)."""
    rows = res.fleet_table().itertuples()
    total, last_t, last_n = 0.0, 0.0, 0
    for r in rows:
        total += last_n * (r.t_s - last_t)
        last_t, last_n = r.t_s, r.serving + r.provisioning + r.draining
    return total + last_n * (end_s - last_t)


def test_step_in_load_adds_a_replica_that_serves_after_provisioning():
    # 0.5 req/s for 6 s, then 30 req/s: the first tick after the step (interval 2 s) finds the
    # one replica's 8 running slots full (utilisation 1 > target 0.5 x 1.1) and provisions more;
    # they serve exactly provision_s = 3 s later, and no request reaches them before that.
    d = scenario({"replicas": 1, "autoscale": {"policy": {"name": "target_utilisation", "metric": "running",
                                                          "target": 0.5},
                                               "min": 1, "max": 3, "interval_s": 2.0, "provision_s": 3.0}})
    d["streams"][0]["arrival"] = {"process": "piecewise", "times": [0, 6], "rates": [0.5, 30.0]}
    d["streams"][1]["arrival"] = {"process": "poisson", "rate": 0.1}
    res = run(d)
    tl = timeline(res)
    assert tl[0] == (0.0, 1, 0, 0)
    up = next(r for r in tl if r[2] > 0)
    t_up = up[0]
    assert t_up >= 6 and t_up % 2.0 == 0  # decided at a tick after the step
    assert (t_up + 3.0, 1 + up[2], 0, 0) in tl  # ... serving provision_s later
    req = res.requests
    assert (req.loc[req.replica > 0, "arrival_s"] >= t_up + 3.0).all()
    assert (req.replica > 0).any()
    assert (req.loc[(req.arrival_s < t_up + 3.0), "replica"] == 0).all()


def test_scale_down_drains():
    # two replicas, the schedule wants one from t = 6: the one with the fewest outstanding
    # requests (ties to the highest index) drains: nothing is routed to it from then on, it
    # finishes what it has and is paid for until its last request ends.
    d = scenario({"replicas": 2, "gpu_hour_usd": 2.0,
                  "autoscale": {"policy": {"name": "schedule", "table": [[0, 2], [6, 1]]},
                                "min": 1, "max": 2, "interval_s": 2.0, "provision_s": 1.0}})
    res = run(d)
    tl = timeline(res)
    down = [r for r in tl if r[0] == 6.0][0]
    assert down[1] == 1 and down[3] in (0, 1)
    req = res.requests
    gone = 1 - int(req.loc[req.arrival_s >= 6.0, "replica"].iloc[0])  # the one drained
    mine = req[req.replica == gone]
    assert (mine.arrival_s < 6.0).all()
    lives = [lf for lf in _lives(res) if lf[0] == gone]
    end = max(6.0, mine.finish_s.max())
    assert lives == [(gone, 0.0, pytest.approx(end, abs=1e-9))]
    assert tl[-1][1:] == (1, 0, 0)


def _lives(res):
    """(replica, start, end) of each paid stretch, s (summary.json's cluster.fleet.lives)."""
    return [(lf["replica"], lf["start_s"], lf["end_s"]) for lf in res.summary_dict["cluster"]["fleet"]["lives"]]


def test_schedule_run_follows_table_and_cost_is_lifetimes():
    d = scenario({"groups": [{"name": "pool", "replicas": 1, "gpus": 2}], "gpu_hour_usd": {"pool": 3.0},
                  "autoscale": {"policy": {"name": "schedule", "table": [[0, 1], [4, 3], [8, 2]]},
                                "min": 1, "max": 3, "interval_s": 2.0, "provision_s": 0.0}})
    res = run(d)
    tl = timeline(res)
    assert tl[0] == (0.0, 1, 0, 0)
    assert (4.0, 3, 0, 0) in tl  # provision_s = 0: serving at the decision
    assert [r for r in tl if r[0] == 8.0][0][1] == 2
    end_s = res.summary_dict["run"]["end_s"]
    secs = sum(e - s for _, s, e in _lives(res))
    assert secs == pytest.approx(paid_replica_seconds(res, end_s), rel=1e-12)
    cost = res.summary_dict["cost"]
    assert cost["gpu_hours"] == pytest.approx(secs * 2 / 3600, rel=1e-12)
    assert cost["cost_usd"] == pytest.approx(secs * 2 / 3600 * 3.0, rel=1e-12)
    assert cost["groups"]["pool"]["gpu_hour_usd"] == 3.0


def test_fixed_cluster_cost_and_rate_per_class():
    d = scenario({"replicas": 2, "gpu_hour_usd": 4.0})
    res = run(d)
    end_s = res.summary_dict["run"]["end_s"]
    cost = res.summary_dict["cost"]
    assert cost["gpu_hours"] == pytest.approx(2 * end_s / 3600, rel=1e-12)
    assert cost["cost_usd"] == pytest.approx(8 * end_s / 3600, rel=1e-12)
    mtok = res.requests.generated_tokens.sum() / 1e6
    # one shared group: every class pays the pool's rate
    for c in ("hi", "lo"):
        assert cost["classes"][c]["usd_per_million_output_tokens"] == pytest.approx(cost["cost_usd"] / mtok)
    assert res.fleet_table().to_dict("records") == [
        {"t_s": 0.0, "group": "default", "serving": 2, "provisioning": 0, "draining": 0}]


def test_partitions_pay_their_own_rate():
    d = scenario({"groups": [{"name": "a", "replicas": 1, "classes": ["hi"], "gpu_hour_usd": 1.0},
                             {"name": "b", "replicas": 2, "classes": ["lo"]}], "gpu_hour_usd": 2.0})
    res = run(d)
    cost = res.summary_dict["cost"]
    req = res.requests
    end_h = res.summary_dict["run"]["end_s"] / 3600
    assert cost["groups"]["a"]["cost_usd"] == pytest.approx(end_h * 1.0)
    assert cost["groups"]["b"]["cost_usd"] == pytest.approx(end_h * 2 * 2.0)
    hi = req[req["class"] == "hi"].generated_tokens.sum() / 1e6
    assert cost["classes"]["hi"]["usd_per_million_output_tokens"] == pytest.approx(end_h / hi)


def test_no_price_reports_gpu_hours_only():
    res = run(scenario({"replicas": 1}))
    cost = res.summary_dict["cost"]
    assert cost["cost_usd"] is None and cost["gpu_hours"] > 0
    assert cost["classes"]["hi"]["usd_per_million_output_tokens"] is None


def test_same_seed_same_bytes():
    d = scenario({"replicas": 1, "gpu_hour_usd": 1.0,
                  "autoscale": {"policy": {"name": "slo", "target_s": 0.05, "window_s": 4.0, "min_samples": 2},
                                "min": 1, "max": 3, "interval_s": 1.0, "provision_s": 0.5}})
    a, b = run(d), run(d)
    assert a.requests.to_csv() == b.requests.to_csv()
    assert a.summary_dict["cluster"]["fleet"] == b.summary_dict["cluster"]["fleet"]
    assert a.summary_dict["cost"] == b.summary_dict["cost"]
    assert len(a.fleet_table()) > 1  # it did scale


@pytest.mark.parametrize("cluster,msg", [
    ({"replicas": 5, "autoscale": {"policy": "slo", "max": 3}},
     "cluster.replicas: the count at the start must be within the autoscaler's min=1 and max=3 (got 5)"),
    ({"replicas": 1, "autoscale": {"policy": "nosuch", "max": 3}}, "cluster.autoscale.policy: unknown autoscaler"),
    ({"replicas": 1, "autoscale": {"policy": "slo", "max": 3, "drain": "migrate"}},
     "cluster.autoscale.drain: expected 'drain' (got 'migrate')"),
    ({"replicas": 1, "autoscale": {"policy": {"name": "slo", "window_s": -1}, "max": 3}},
     "cluster.autoscale.policy: window_s: expected a number > 0"),
    ({"groups": [{"replicas": 1, "autoscale": {"policy": "slo", "max": 2, "min": 3}}]},
     "cluster.groups.0.autoscale.max: expected max >= min=3 (got 2)"),
    ({"replicas": 1, "gpu_hour_usd": {"h100": 2.0}}, "cluster.gpu_hour_usd.h100: not a group name or a group's engine.gpu"),
    ({"replicas": 1, "gpu_hour_usd": -2}, "cluster.gpu_hour_usd: expected a number >= 0"),
    # (a table's bad entry is named)
    ({"replicas": 1, "gpu_hour_usd": {"default": "x"}},
     "cluster.gpu_hour_usd.default: expected a number >= 0 (dollars per GPU-hour) (got 'x')"),
    ({"replicas": 1, "gpu_hour_usd": {"default": -1.0}}, "cluster.gpu_hour_usd.default: expected a number >= 0"),
])
def test_bad_settings_are_one_line(cluster, msg):
    with pytest.raises(ScenarioError) as err:
        scenario_from_dict(scenario(cluster))
    text = str(err.value)
    assert "\n" not in text and msg in text, text


# ---- parameters that name classes, unknown parameters, a schedule outside min..max -------------------
def input_warnings(d: dict) -> list[str]:
    """The InputWarnings reading scenario ``d`` gives."""
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always", InputWarning)
        scenario_from_dict(d)
    return [str(w.message) for w in got if issubclass(w.category, InputWarning)]


@pytest.mark.parametrize("classes,msg", [
    (["high"], "cluster.autoscale.policy.classes: unknown class 'high' (expected one of hi, lo); did you mean 'hi'?"),
    (["hi", "nope"], "cluster.autoscale.policy.classes: unknown class 'nope' (expected one of hi, lo)"),
])
def test_an_slo_policy_naming_no_class_is_refused(classes, msg):
    # (it used to be accepted: the policy saw no request of the class and never acted)
    d = scenario({"replicas": 1, "autoscale": {"policy": {"name": "slo", "classes": classes}, "max": 3}})
    with pytest.raises(ScenarioError) as err:
        scenario_from_dict(d)
    assert str(err.value) == f"<inline>: {msg}"


def test_a_group_policy_naming_a_class_its_group_does_not_serve_warns():
    groups = [{"name": "a", "replicas": 1, "classes": ["hi"]},
              {"name": "b", "replicas": 1, "classes": ["lo"],
               "autoscale": {"policy": {"name": "slo", "classes": ["hi"]}, "max": 2}}]
    (msg,) = [m for m in input_warnings(scenario({"groups": groups})) if "autoscale" in m]
    assert msg == ("<inline>: cluster.groups.1.autoscale.policy.classes: group 'b' does not serve 'hi' (it serves "
                   "lo): its autoscaler never sees a request of it")
    groups[1]["autoscale"]["policy"]["classes"] = ["lo"]  # its own class: quiet
    assert not [m for m in input_warnings(scenario({"groups": groups})) if "autoscale" in m]


def test_class_params_are_checked_for_a_users_autoscaler_too():
    class Watcher(BaseAutoscaler):
        class_params = ("watch",)

        def __init__(self, watch: str = "hi") -> None:
            self.watch = watch

        def desired(self, obs):
            return obs.current

    AUTOSCALERS.register("watcher_test", Watcher)
    try:
        d = scenario({"replicas": 1, "autoscale": {"policy": {"name": "watcher_test", "watch": "hl"}, "max": 2}})
        with pytest.raises(ScenarioError, match=r"cluster.autoscale.policy.watch: unknown class 'hl' \(expected one "
                                                r"of hi, lo\)"):
            scenario_from_dict(d)
    finally:
        AUTOSCALERS.unregister("watcher_test")


@pytest.mark.parametrize("policy,msg", [
    ({"name": "slo", "bogus": 1}, "cluster.autoscale.policy: slo: unknown parameter 'bogus' (expected target_s, "
                                  "metric, percentile, window_s, low, step, min_samples, classes)"),
    ({"name": "slo", "clases": ["hi"]}, "did you mean 'classes'?"),
    ({"name": "schedule", "table": [[0, 1]], "period": 10}, "schedule: unknown parameter 'period' (expected table, "
                                                            "period_s); did you mean 'period_s'?"),
])
def test_an_unknown_autoscaler_parameter_is_named(policy, msg):
    with pytest.raises(ScenarioError) as err:
        scenario_from_dict(scenario({"replicas": 1, "autoscale": {"policy": policy, "max": 3}}))
    assert msg in str(err.value) and "__init__" not in str(err.value)


def test_a_schedule_outside_min_max_warns_once_naming_the_row():
    a = {"policy": {"name": "schedule", "table": [[0, 2], [5, 12], [10, 0], [15, 9]]}, "min": 1, "max": 8}
    d = scenario({"groups": [{"name": "x", "replicas": 2}, {"name": "y", "replicas": 2}], "autoscale": a})
    msgs = [m for m in input_warnings(d) if "table" in m]
    # (one line for the cluster's autoscale, though two groups use it)
    assert msgs == ["<inline>: cluster.autoscale.policy.table.1 = [5, 12]: 12 replicas is above max = 8 (and 2 "
                    "more rows outside 1..8): the autoscaler keeps 8 there (expected counts within min..max, or a "
                    "wider min..max)"]
    a["policy"]["table"] = [[0, 2], [5, 0]]
    (msg,) = [m for m in input_warnings(scenario({"replicas": 2, "autoscale": a})) if "table" in m]
    assert "table.1 = [5, 0]: 0 replicas is below min = 1: the autoscaler keeps 1 there" in msg
    a["policy"]["table"] = [[0, 2], [5, 8]]
    assert not [m for m in input_warnings(scenario({"replicas": 2, "autoscale": a})) if "table" in m]


@pytest.mark.parametrize("cluster,unpriced", [
    ({"groups": [{"name": "a", "replicas": 1}, {"name": "b", "replicas": 1}], "gpu_hour_usd": {"a": 2.0}},
     "cluster.gpu_hour_usd: no price for group 'b'"),
    ({"groups": [{"name": "a", "replicas": 1, "gpu_hour_usd": 2.0}, {"name": "b", "replicas": 1},
                 {"name": "c", "replicas": 1}]}, "cluster.groups.0.gpu_hour_usd: no price for group 'b', 'c'"),
])
def test_a_price_on_some_groups_only_warns(cluster, unpriced):
    (msg,) = [m for m in input_warnings(scenario(cluster)) if "price" in m]
    assert msg.startswith(f"<inline>: {unpriced}: the run's cost_usd will be null")
    assert run(scenario(cluster)).summary_dict["cost"]["cost_usd"] is None  # (what it warns of)


@pytest.mark.parametrize("cluster", [
    {"groups": [{"name": "a", "replicas": 1}, {"name": "b", "replicas": 1}], "gpu_hour_usd": {"a": 2.0, "b": 1.0}},
    {"groups": [{"name": "a", "replicas": 1}, {"name": "b", "replicas": 1}], "gpu_hour_usd": 2.0},
    {"groups": [{"name": "a", "replicas": 1}, {"name": "b", "replicas": 1}]},  # (no price anywhere: as asked)
])
def test_a_price_on_every_group_or_none_is_quiet(cluster):
    assert not [m for m in input_warnings(scenario(cluster)) if "price" in m]


def test_fixed_and_autoscaled_at_max_agree():
    # an autoscaled group whose policy always wants what it has serves as the fixed cluster does
    fixed = run(scenario({"replicas": 2}))
    held = run(scenario({"replicas": 2, "autoscale": {"policy": {"name": "schedule", "table": [[0, 2]]},
                                                      "min": 2, "max": 2, "interval_s": 1.0}}))
    cols = ["request_id", "replica", "first_token_s", "finish_s"]
    assert fixed.requests[cols].to_csv() == held.requests[cols].to_csv()
    assert math.isclose(fixed.summary_dict["cost"]["gpu_hours"], held.summary_dict["cost"]["gpu_hours"])


@pytest.mark.parametrize("policy", [
    {"name": "target_utilisation", "metric": "kv", "target": 0.3, "tolerance": 0.0},
    {"name": "slo", "target_s": 0.2, "window_s": 3.0, "min_samples": 2},
])
def test_fast_forward_equals_stepping_when_autoscaled(policy):
    # a run stops at a tick as at an arrival: what the policy reads (KV blocks, requests ended)
    # is what stepping one iteration at a time shows, so the decisions and the tables agree
    d = scenario({"replicas": 1, "autoscale": {"policy": policy, "min": 1, "max": 3, "interval_s": 0.7,
                                               "provision_s": 0.3}})
    for st in d["streams"]:  # (sparse arrivals, long answers: runs span ticks)
        st["arrival"]["rate"] = 1.0
        st["output_tokens"] = {"dist": "uniform", "low": 100, "high": 300}
    fast = run(d)
    d["engine"]["fast_forward"] = False
    slow = run(d)
    assert fast.requests.to_csv() == slow.requests.to_csv()
    assert fast.summary_dict["cluster"]["fleet"] == slow.summary_dict["cluster"]["fleet"]
    assert len(fast.fleet_table()) > 2


def test_time_series_has_the_replica_counts_when_autoscaled():
    d = scenario({"replicas": 1, "autoscale": {"policy": {"name": "schedule", "table": [[0, 1], [4, 3], [8, 2]]},
                                               "min": 1, "max": 3, "interval_s": 2.0, "provision_s": 1.0}})
    ts = run(d).timeseries.drop_duplicates("t_s").set_index("t_s")
    # provisioning from 4 s, serving from 5 s; one of three drained at 8 s (paid until it is empty)
    assert [ts.replicas_serving[t] for t in (0.0, 4.0, 5.0, 8.0, 9.0)] == [1, 1, 3, 2, 2]
    assert ts.replicas_paid[4.0] == 3
    assert "replicas_serving" not in run(scenario({"replicas": 2})).timeseries


class AlwaysTwo:
    """A user's autoscaler (named by dotted path): always two replicas."""

    def __init__(self, n: int = 2) -> None:
        self.n = n

    def desired(self, obs: Observation) -> int:
        return self.n


def test_a_users_policy_by_dotted_path_and_partitions_scale_apart():
    d = scenario({"groups": [
        {"name": "a", "replicas": 1, "classes": ["hi"],
         "autoscale": {"policy": "tests.test_autoscale:AlwaysTwo", "max": 2, "interval_s": 1.0, "provision_s": 0.5}},
        {"name": "b", "replicas": 1, "classes": ["lo"], "engine": {"max_num_seqs": 4}}]})
    res = run(d)
    ft = res.fleet_table()
    assert ft[ft.group == "a"].serving.tolist() == [1, 1, 2]  # provisioning at 1 s, serving at 1.5 s
    assert ft[ft.group == "b"].serving.tolist() == [1]
    req = res.requests
    assert set(req.loc[req["class"] == "hi", "group"]) == {"a"} and set(req.loc[req["class"] == "lo", "group"]) == {"b"}
    assert req.loc[req.replica == 1, "arrival_s"].min() >= 1.5


def test_closed_loop_users_with_an_autoscaler():
    d = scenario({"replicas": 1, "autoscale": {"policy": {"name": "queue_length", "target": 2}, "max": 3,
                                               "interval_s": 1.0, "provision_s": 0.5}})
    d["streams"][0]["arrival"] = {"process": "closed_loop", "users": 6, "think": 0.2}
    res = run(d)
    assert res.fleet_table().serving.max() > 1
    assert (res.requests.status == "finished").all()


def test_capacity_reports_dollars_of_each_answer():
    # the by-hand toy of tests/test_cluster.py: 4 replicas meet the SLO; priced at $2 per GPU-hour
    from sim.experiments.capacity import capacity_search
    from sim.experiments.slos import parse_slos
    from tests.test_cluster import toy

    d = toy(0)
    d["cluster"] = {"replicas": 1, "gpu_hour_usd": 2.0}
    sc = scenario_from_dict(d)
    a = capacity_search(sc, ["shared"], parse_slos(sc), workers=1).designs["shared"]
    assert a["replicas"] == 4
    assert a["gpu_hours"] == pytest.approx(4 * a["end_s"] / 3600)
    assert a["cost_usd"] == pytest.approx(2.0 * a["gpu_hours"])
