"""Clusters: replicas sharing one clock, routers, per-replica telemetry, validation,
and the capacity search pinned on a case computed by hand."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import small_scenario
from sim import ScenarioError, load_scenario, scenario_from_dict, simulate
from sim.experiments.capacity import capacity_search
from sim.experiments.slos import parse_slos
from sim.cluster import ClusterResults, simulate_cluster
from policies.contracts import ReplicaView, Router
from sim.routers import ROUTERS, BaseRouter, make_router

ROUTER_NAMES = ROUTERS.names()


def cluster_scenario(cluster: dict, **over) -> dict:
    d = small_scenario(**over)
    d["horizon_s"] = 12.0
    d["streams"][0]["arrival"]["rate"] = 3.0
    d["streams"][1]["arrival"]["rate"] = 5.0
    d["cluster"] = cluster
    return d


def layout_for(router: str) -> dict:
    if router == "class_aware":  # static partitioning: 1 replica for hi, 2 for lo
        return {"groups": [{"name": "fast", "replicas": 1, "classes": ["hi"]},
                           {"name": "bulk", "replicas": 2, "classes": ["lo"], "engine": {"kv_blocks": 96}}],
                "router": router}
    return {"replicas": 3, "router": router}


def closed_stream() -> dict:
    return {"tenant": "u", "class": "hi", "arrival": {"process": "closed_loop", "users": 4,
                                                      "think": {"dist": "exponential", "mean": 0.3}},
            "prompt_tokens": {"dist": "uniform", "low": 10, "high": 100},
            "output_tokens": {"dist": "uniform", "low": 5, "high": 60}, "max_tokens": 60}


def strip(df):
    return df.drop(columns=[c for c in ("replica", "group") if c in df.columns]).fillna(-1)


# ---- one replica is the single-replica simulator -------------------------------------------------
@pytest.mark.parametrize("closed", [False, True])
def test_one_replica_cluster_equals_simulate(closed):
    d = cluster_scenario({"replicas": 1})
    if closed:
        d["streams"][0] = closed_stream()
    sc = scenario_from_dict(d)
    single = scenario_from_dict({k: v for k, v in d.items() if k != "cluster"})
    a, b = simulate(single), simulate_cluster(sc)
    assert a.requests.fillna(-1).equals(strip(b.requests))
    assert a.summary.equals(b.summary)
    assert isinstance(b, ClusterResults) and len(b.replicas) == 1


# ---- router conformance ------------------------------------------------------------------------------
class View:
    """A stand-in replica with exactly what policies.contracts.ReplicaView declares."""

    def __init__(self, index, outstanding, kv_used):
        self.index, self.group, self.outstanding, self.kv_used = index, "g", outstanding, kv_used
        self.running = self.waiting = 0
        self.waiting_by_class = {"hi": 0, "lo": 0}


def test_routers_and_views_meet_the_contracts():
    assert isinstance(View(0, 0, 0.0), ReplicaView)
    for name in ROUTER_NAMES:
        assert isinstance(make_router(name), Router), name
    with pytest.raises(KeyError, match="is not a router"):
        make_router("collections:OrderedDict")


class ViewCheckingRouter(BaseRouter):
    """A router outside the simulator (loaded by ``tests.test_cluster:ViewCheckingRouter``): it checks
    what it reads is the declared view, consistent with itself, and joins the shortest queue."""

    name = "view_checking"
    seen = 0

    def route(self, req, candidates, now_ns):
        for c in candidates:
            assert isinstance(c, ReplicaView)
            assert sum(c.waiting_by_class.values()) == c.waiting
            assert c.outstanding == c.running + c.waiting and 0.0 <= c.kv_used <= 1.0
        ViewCheckingRouter.seen += 1
        return min(candidates, key=lambda c: (c.outstanding, c.index))


def test_a_router_is_one_class_reading_the_view():
    sc = scenario_from_dict(cluster_scenario({"replicas": 3, "router": "tests.test_cluster:ViewCheckingRouter"}))
    res = simulate(sc, check_invariants=True)
    assert ViewCheckingRouter.seen > 0 and sorted(res.requests["request_id"]) == list(range(len(res.requests)))
    same = simulate(sc.model_copy(update={"cluster": sc.cluster.model_copy(update={"router": "least_outstanding"})}))
    pd.testing.assert_frame_equal(res.requests, same.requests)  # it is JSQ with the same tie rule


class Req:
    def __init__(self, i):
        self.request_id, self.cls, self.cls_idx = i, "hi", 0


@pytest.mark.parametrize("name", ROUTER_NAMES)
def test_router_contract_unit(name):
    """Returns one of the candidates; the same seed gives the same answers."""
    rng = np.random.default_rng(0)
    states = [[View(i, int(rng.integers(0, 9)), float(rng.random())) for i in range(6)] for _ in range(200)]
    subsets = [s[: 1 + j % 6] if j % 3 else s[j % 6:] or s for j, s in enumerate(states)]

    def answers():
        r = make_router(name)
        r.bind(6, seed=11)
        return [r.route(Req(j), c, j).index for j, c in enumerate(subsets)]

    a = answers()
    assert a == answers()
    for idx, c in zip(a, subsets):
        assert idx in {v.index for v in c}


def test_router_rules():
    vs = [View(0, 3, 0.5), View(1, 1, 0.9), View(2, 1, 0.1)]
    assert make_router("least_outstanding").route(Req(0), vs, 0).index == 1  # tie -> lowest index
    assert make_router("least_kv").route(Req(0), vs, 0).index == 2
    rr = make_router("round_robin")
    rr.bind(3, 0)
    assert [rr.route(Req(i), vs, 0).index for i in range(5)] == [0, 1, 2, 0, 1]
    assert [rr.route(Req(i), vs[1:], 0).index for i in range(3)] == [2, 1, 2]
    with pytest.raises(ValueError):
        make_router("power_of_two", d=0)


def test_least_kv_from_bounds_of_kv_use_chooses_as_from_the_values():
    """least_kv's ``route_kv_bounds`` answers only where the intervals settle the choice, and then
    with what ``route`` picks from the values inside them (ties and overlaps: None); a subclass
    overriding ``route`` keeps it (``kv_bounds_router``)."""
    from sim.routers import LeastKV, kv_bounds_router
    rng = np.random.default_rng(5)
    lk = make_router("least_kv")
    answered = 0
    for _ in range(2000):
        n = int(rng.integers(1, 5))
        kv = rng.integers(0, 40, n) / 40  # (coarse: ties happen)
        lo = kv - rng.integers(0, 3, n) / 40
        hi = kv + rng.integers(0, 3, n) / 40
        vs = [View(i, int(rng.integers(0, 3)), float(u)) for i, u in enumerate(kv)]
        i = lk.route_kv_bounds([(float(a), float(b)) for a, b in zip(lo, hi)])
        if i is not None:
            answered += 1
            assert lk.route(Req(0), vs, 0).index == i
            assert all(hi[i] < lo[j] for j in range(n) if j != i)
    assert answered > 300
    assert lk.route_kv_bounds([(0.2, 0.3), (0.3, 0.4)]) is None  # (both could be 0.3: a tie)

    class Mine(LeastKV):
        def route(self, req, candidates, now_ns):
            return candidates[-1]

    assert kv_bounds_router(lk) is not None and kv_bounds_router(Mine()) is None
    assert kv_bounds_router(make_router("least_outstanding")) is None


def test_routing_by_counts_is_routing_by_views(monkeypatch):
    """least_outstanding's ``route_counts`` picks what its ``route`` picks (ties to the lowest
    index); a cluster asks it instead of ``route`` (never called) when every replica is a
    candidate, with the same tables as asking ``route``; a subclass overriding ``route`` keeps it."""
    from sim.cluster import replicas
    from sim.routers import LeastOutstanding, counts_router
    rng = np.random.default_rng(3)
    lo = make_router("least_outstanding")
    for _ in range(300):
        vs = [View(i, int(rng.integers(0, 4)), 0.0) for i in range(int(rng.integers(1, 17)))]
        assert lo.route_counts([v.outstanding for v in vs]) == lo.route(Req(0), vs, 0).index

    class Mine(LeastOutstanding):
        def route(self, req, candidates, now_ns):
            return candidates[-1]

    assert counts_router(lo) is not None and counts_router(Mine()) is None
    assert counts_router(make_router("power_of_two")) is None
    # round_robin's: the replica at its cursor, as ``route`` picks among every replica
    rr, rr_views = make_router("round_robin"), make_router("round_robin")
    rr.bind(5, 1)
    rr_views.bind(5, 1)
    vs = [View(i, 0, 0.0) for i in range(5)]
    assert [rr.route_counts([0] * 5) for _ in range(12)] == [rr_views.route(Req(0), vs, 0).index for _ in range(12)]
    sc = scenario_from_dict(cluster_scenario({"replicas": 4, "router": "least_outstanding"}))
    monkeypatch.setattr(replicas, "counts_router", lambda router: None)
    by_views = simulate_cluster(sc)
    monkeypatch.undo()
    calls = []
    monkeypatch.setattr(LeastOutstanding, "route", lambda *a: calls.append(a))
    by_counts = simulate_cluster(sc)
    assert not calls and len(by_counts.requests) > 50
    pd.testing.assert_frame_equal(by_views.requests, by_counts.requests)
    pd.testing.assert_frame_equal(by_views.timeseries, by_counts.timeseries)


@pytest.mark.parametrize("name", ROUTER_NAMES)
def test_router_in_cluster_deterministic_nothing_lost(name):
    sc = scenario_from_dict(cluster_scenario(layout_for(name)))
    a = simulate_cluster(sc, check_invariants=True)
    b = simulate_cluster(sc)
    assert a.requests.fillna(-1).equals(b.requests.fillna(-1))
    req = a.requests
    n = len(simulate(sc.model_copy(update={"cluster": {}})).requests)
    assert sorted(req["request_id"]) == list(range(n))  # every request exactly once, ids global
    assert (req["status"] == "finished").all()
    assert sum(len(r.requests) for r in a.replicas) == n
    assert set(req["replica"]) == {0, 1, 2}
    if name == "class_aware":
        assert (req.loc[req["class"] == "hi", "group"] == "fast").all()
        assert (req.loc[req["class"] == "lo", "group"] == "bulk").all()
        assert a.summary_dict["cluster"]["replicas"][1]["kv_blocks"] == 96
    for i, r in enumerate(a.replicas):
        assert (r.requests["replica"] == i).all()
        assert r.requests["request_id"].isin(req.loc[req["replica"] == i, "request_id"]).all()
    g = a.groups
    assert sum(x.summary_dict["overall"]["arrived"] for x in g.values()) == n


@pytest.mark.parametrize("closed", [False, True])
def test_fast_forward_exact_in_cluster(closed):
    """Fast-forward across replicas (the router's lower bound on arrivals, closed-loop users
    sending from other replicas) changes nothing."""
    d = cluster_scenario({"replicas": 3, "router": "power_of_two"})
    if closed:
        d["streams"].append(closed_stream())
    on = simulate_cluster(scenario_from_dict(d))
    d["engine"]["fast_forward"] = False
    off = simulate_cluster(scenario_from_dict(d))
    assert on.requests.fillna(-1).equals(off.requests.fillna(-1))
    assert on.summary_dict["run"]["engine_events"] <= off.summary_dict["run"]["engine_events"]


@pytest.mark.parametrize("name", ROUTER_NAMES)
@pytest.mark.parametrize("rate", [3.0, 12.0])
@pytest.mark.parametrize("lookahead", [None, 0.01, 100.0])
def test_cluster_runs_past_other_replicas_arrivals_exact(monkeypatch, name, rate, lookahead):
    """Replicas whose runs go past arrivals routed elsewhere (cut short only when a request is
    routed to them; KV blocks allocated as far as a router reads them; priced a stretch at a
    time, short or long) give the same request table and time series as stopping every replica
    at every arrival, with fewer events."""
    if lookahead is not None:
        from sim.cluster.replicas import Replica
        monkeypatch.setattr(Replica, "LOOKAHEAD", lookahead)
    d = cluster_scenario(layout_for(name))
    d["streams"][0]["arrival"]["rate"] = rate
    d["streams"][1]["arrival"]["rate"] = 2 * rate
    sc = scenario_from_dict(d)
    slow = simulate_cluster(sc, fast=False, check_invariants=True)
    fast = simulate_cluster(sc, check_invariants=True)
    pd.testing.assert_frame_equal(slow.requests, fast.requests)
    pd.testing.assert_frame_equal(slow.timeseries, fast.timeseries)
    for a, b in zip(slow.replicas, fast.replicas):
        pd.testing.assert_frame_equal(a.timeseries, b.timeseries)
    assert fast.summary_dict["run"]["engine_events"] < slow.summary_dict["run"]["engine_events"]


@pytest.mark.parametrize("router", ["least_outstanding", "least_kv", "round_robin"])
def test_cluster_runs_past_arrivals_exact_on_the_h200_workload(router):
    """The same on diurnal_two_class (H200 profile, ~100 decoders a replica, long batch prompts,
    evictions for interactive waiters), shortened, 3 replicas, no drain."""
    sc = load_scenario("diurnal_two_class", overrides=["horizon_s=40.0", "drain=false",
                                                       f'cluster={{replicas=3, router="{router}"}}'])
    slow = simulate_cluster(sc, fast=False, load_scale=0.6)
    fast = simulate_cluster(sc, load_scale=0.6, check_invariants=True)
    pd.testing.assert_frame_equal(slow.requests, fast.requests)
    pd.testing.assert_frame_equal(slow.timeseries, fast.timeseries)
    assert fast.summary_dict["run"]["engine_events"] < slow.summary_dict["run"]["engine_events"]


def _summary_but_speed(res) -> dict:
    """``res.summary_dict`` without what only the engine's speed changes (its event counts, its
    wall and CPU seconds)."""
    def strip(node):
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k not in ("engine_events", "wall_s", "cpu_s")}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node
    return strip(res.summary_dict)


def _assert_same_results(stepped, held) -> None:
    """The two runs' request tables, time series and summaries (but speed) are equal."""
    pd.testing.assert_frame_equal(stepped.requests, held.requests)
    pd.testing.assert_frame_equal(stepped.timeseries, held.timeseries)
    assert _summary_but_speed(stepped) == _summary_but_speed(held)


@pytest.mark.parametrize("seed, policy, router, rates, over", [
    (6363, "fcfs", "least_outstanding", (1.0, 1.0),
     {"preemption": "swap", "max_num_seqs": 4, "timeseries_interval_s": 0.5}),
    (5915, "wfq", "power_of_two", (2.0, 1.0), {"max_num_seqs": 16}),
])
def test_held_runs_end_a_run_at_the_horizon_where_stepping_does(seed, policy, router, rates, over):
    """With no drain, the run ends at the last replica's last step: a run held past arrivals and
    cut after it was priced to its end leaves its first end event in SimPy's queue with no waiter,
    and that event must not move the run's end (every unfinished request's ``end_s``, the summary's
    rates) past where the same run stepped one iteration at a time ends."""
    d = small_scenario(seed=seed, horizon_s=5.0, drain=False, policy={"name": policy})
    d["engine"].update(kv_blocks=128, preempt_for_waiting="never", **over)
    for stream, rate in zip(d["streams"], rates):
        stream["arrival"]["rate"] = rate
    if policy == "fcfs":  # (short answers: runs that go past them)
        d["streams"][0]["output_tokens"] = {"dist": "uniform", "low": 1, "high": 4}
    else:  # (a prefill cap on the second class)
        d["classes"][1]["max_prefill_tokens_per_step"] = 64
    d["cluster"] = {"replicas": 2, "router": router}
    fast = simulate_cluster(scenario_from_dict(d), check_invariants=True)
    d["engine"].update(fast_forward=False, lazy_batch=False)
    stepped = simulate_cluster(scenario_from_dict(d), fast=False)
    assert (fast.requests.status == "unfinished").any()
    _assert_same_results(stepped, fast)


class RecordingRouter(BaseRouter):
    """JSQ that records what it reads at every call (loaded by ``tests.test_cluster:RecordingRouter``):
    each candidate's ``outstanding`` and, with ``full``, ``running`` and ``waiting`` too. With
    ``oracle``, it also checks ``outstanding`` against the replica's engine (exact when every run
    stops at every arrival, ``fast=False``)."""

    name = "recording"
    reads_kv = False
    log: list = []
    full = False
    oracle = False

    def route(self, req, candidates, now_ns):
        row = [c.outstanding for c in candidates]
        if self.full:
            row += [(c.running, c.waiting) for c in candidates]
        if self.oracle:
            for c in candidates:
                assert c.outstanding == len(c.engine.queues.running) + len(c.engine.queues.waiting) + len(c.inbox)
        RecordingRouter.log.append((now_ns, req.request_id, row))
        return min(candidates, key=lambda c: (c.outstanding, c.index))


class PathCounts:
    """Counts, over a cluster run, the fast paths taken: runs resumed past a stretch's end,
    requests routed to a replica with a run in flight (``routed``; ``cut``: its steps priced
    past the arrival were dropped), members not counted by a router read because their last
    token ended a step of a run in flight, and arrival instants routed ahead of the clock
    (``ahead``: nothing else happened before them)."""

    def __init__(self, monkeypatch):
        from sim.cluster.replicas import Replica, _Cluster
        self.resumed = self.routed = self.cut = self.gone = self.ahead = 0
        hold, price, cut, pass_gone = Replica._hold, Replica._price, Replica.cut, Replica._pass_gone
        route_until = _Cluster.route_until

        def _route_until(cl, now_ns):
            self.ahead += now_ns > cl.env.now
            route_until(cl, now_ns)

        def _hold(rep, now_ns, plan, dur0, run):
            self.resumed -= run is not None  # (its first stretch is priced here, not resumed)
            return hold(rep, now_ns, plan, dur0, run)

        def _price(rep):
            self.resumed += 1
            price(rep)

        def _cut(rep, t_ns):
            n = len(rep._durs)
            cut(rep, t_ns)
            self.routed += rep._run_ev is not None
            self.cut += rep._run_ev is not None and len(rep._durs) < n

        def _pass_gone(rep, now_ns):
            p = rep._gone_p
            pass_gone(rep, now_ns)
            self.gone += rep._gone_p - p

        monkeypatch.setattr(Replica, "_hold", _hold)
        monkeypatch.setattr(Replica, "_price", _price)
        monkeypatch.setattr(Replica, "cut", _cut)
        monkeypatch.setattr(Replica, "_pass_gone", _pass_gone)
        monkeypatch.setattr(_Cluster, "route_until", _route_until)


@pytest.mark.pure_python  # (counts calls by patching the engine: see tests/conftest.py)
@pytest.mark.parametrize("lookahead", [0.01, 1.0, 100.0])
@pytest.mark.parametrize("rate", [1.5, 12.0])
@pytest.mark.parametrize("full", [False, True])
def test_views_a_router_reads_are_those_of_stopped_replicas(monkeypatch, lookahead, rate, full):
    """What a router reads of every candidate at every arrival (``outstanding`` kept by the
    cluster, members finishing inside runs in flight, runs priced a stretch at a time and
    resumed, or cut by a routed request that is admitted or waits) is what it reads when every
    replica stops at every arrival; and so are the tables."""
    from sim.cluster.replicas import Replica
    monkeypatch.setattr(Replica, "LOOKAHEAD", lookahead)
    monkeypatch.setattr(RecordingRouter, "full", full)
    d = cluster_scenario({"replicas": 3, "router": "tests.test_cluster:RecordingRouter"})
    d["streams"][0]["arrival"]["rate"] = rate
    d["streams"][1]["arrival"]["rate"] = rate
    sc = scenario_from_dict(d)
    RecordingRouter.log = []
    monkeypatch.setattr(RecordingRouter, "oracle", True)
    slow = simulate_cluster(sc, fast=False, check_invariants=True)
    slow_log = RecordingRouter.log
    RecordingRouter.log = []
    monkeypatch.setattr(RecordingRouter, "oracle", False)
    counts = PathCounts(monkeypatch)
    fast = simulate_cluster(sc, check_invariants=True)
    assert len(slow_log) == len(slow.requests) and RecordingRouter.log == slow_log
    pd.testing.assert_frame_equal(slow.requests, fast.requests)
    pd.testing.assert_frame_equal(slow.timeseries, fast.timeseries)
    assert counts.routed > 0
    if lookahead >= 1:
        assert counts.cut > 0  # (steps priced past a routed request's arrival were dropped)
    if lookahead <= 1:
        assert counts.resumed > 0  # (runs went on past a stretch's end)
    if rate < 2:
        assert counts.gone > 0  # (light load: nobody waits, runs go past members' last tokens)
    else:
        assert (fast.requests["queue_wait_s"] > 0.5).any()  # (heavy: routed requests wait)
        if lookahead >= 1:  # (long runs go past arrivals: some are routed ahead of the clock)
            assert counts.ahead > 0


def test_views_with_closed_loop_users_and_rejections(monkeypatch):
    """Closed-loop users with no think time whose requests are often too large (rejected at
    admission, and sent again at once): requests are routed while a replica's own process is
    taking requests in; what a router reads is still the replica's engine."""
    d = cluster_scenario({"replicas": 3, "router": "tests.test_cluster:RecordingRouter"})
    users = closed_stream()
    users["arrival"]["think"] = {"dist": "constant", "value": 0.0}
    users["prompt_tokens"] = {"dist": "uniform", "low": 10, "high": 1400}
    d["streams"].append(users)
    monkeypatch.setattr(RecordingRouter, "oracle", True)
    monkeypatch.setattr(RecordingRouter, "full", True)
    RecordingRouter.log = []
    res = simulate_cluster(scenario_from_dict(d), check_invariants=True)
    assert (res.requests["status"] == "rejected").sum() > 10 and len(RecordingRouter.log) == len(res.requests)


def test_no_drain_nothing_lost():
    d = cluster_scenario({"replicas": 2, "router": "round_robin"})
    d["drain"] = False
    d["streams"].append(closed_stream())
    sc = scenario_from_dict(d)
    res = simulate_cluster(sc, check_invariants=True)
    req = res.requests
    assert req["request_id"].is_unique
    assert set(req["status"]) <= {"finished", "unfinished", "rejected"}
    assert (req["status"] == "unfinished").any()
    assert sorted(req["request_id"]) == list(range(len(req)))


# ---- property: per-replica KV conservation -----------------------------------------------------------
@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(replicas=st.integers(1, 3), router=st.sampled_from(["round_robin", "least_outstanding", "least_kv",
                                                           "power_of_two"]),
       kv=st.integers(40, 120), mode=st.sampled_from(["recompute", "swap", "auto"]),
       rate=st.floats(1.0, 8.0), seed=st.integers(0, 50), closed=st.booleans())
def test_property_kv_conservation_per_replica(replicas, router, kv, mode, rate, seed, closed):
    d = cluster_scenario({"replicas": replicas, "router": router}, seed=seed)
    d["horizon_s"] = 5.0
    d["engine"].update(kv_blocks=kv, preemption=mode, swap_blocks=64)
    d["streams"][1]["arrival"]["rate"] = rate
    if closed:
        d["streams"].append(closed_stream())
    res = simulate_cluster(scenario_from_dict(d), check_invariants=True)  # raises on any imbalance
    req = res.requests
    assert req["request_id"].is_unique and sorted(req["request_id"]) == list(range(len(req)))
    assert set(req["status"]) <= {"finished", "rejected"}


# ---- requests joining held runs ---------------------------------------------------------------------
def _count_joins(monkeypatch) -> dict:
    """Spy on ``Replica.join`` and ``undo_join``: how many requests joined a run in flight, were
    cut (the usual way) or had their join undone."""
    from sim.cluster.replicas import Replica
    seen = {"joined": 0, "cut": 0, "undone": 0}
    join, undo = Replica.join, Replica.undo_join

    def spy_join(self, req, t_ns):
        ok = join(self, req, t_ns)
        seen["joined" if ok else "cut"] += 1
        return ok

    def spy_undo(self):
        seen["undone"] += 1
        return undo(self)

    monkeypatch.setattr(Replica, "join", spy_join)
    monkeypatch.setattr(Replica, "undo_join", spy_undo)
    return seen


@pytest.mark.pure_python  # (counts calls by patching the engine: see tests/conftest.py)
def test_requests_join_held_runs_as_the_next_boundary_would_take_them(monkeypatch):
    """A request routed to a replica whose run is in flight joins the run where the plan at the
    run's next boundary would only admit it (its whole prompt in that step beside the decoders):
    the request table, time series and summary equal those of the same cluster with such runs
    cut there (``Replica.JOIN`` off) and of the cluster stepped; KV conservation holds at every
    boundary. Requests join, and some joins are undone (another request routed to the replica
    before the boundary: both are admitted there)."""
    from scripts.exactness_fuzz import draw
    from sim.cluster.replicas import Replica
    seen = _count_joins(monkeypatch)
    for seed in (10, 18, 39, 45):  # (draws with joins undone)
        d = draw("join", np.random.default_rng(seed))
        joined = simulate_cluster(scenario_from_dict(d), check_invariants=True)
        monkeypatch.setattr(Replica, "JOIN", False)
        cut = simulate_cluster(scenario_from_dict(d))
        monkeypatch.setattr(Replica, "JOIN", True)
        _assert_same_results(cut, joined)
        assert joined.summary_dict["run"]["engine_events"] < cut.summary_dict["run"]["engine_events"]
        d["engine"].update(fast_forward=False, lazy_batch=False)
        _assert_same_results(simulate_cluster(scenario_from_dict(d), fast=False), joined)
    assert seen["joined"] > 100 and seen["undone"] >= 3


def test_no_join_where_routing_reads_more_than_counts(monkeypatch):
    """A router that reads the replicas' views (running, waiting, KV use) sees a replica as it is
    before its run ends: there, every request waits for the run's next boundary."""
    seen = _count_joins(monkeypatch)
    for router in ("power_of_two", "least_kv"):
        d = cluster_scenario({"replicas": 3, "router": router})
        simulate_cluster(scenario_from_dict(d))
    assert seen["joined"] == 0


# ---- validation ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("cluster, expect", [
    ({"replicas": 0}, "cluster.replicas: expected an integer >= 1 (got 0)"),
    ({"replicas": 2, "groups": []}, "exactly one of"),
    ({"replicas": 2, "routr": "x"}, "cluster.routr: unknown key"),
    ({"replicas": 2, "router": "round_robbin"}, "did you mean 'round_robin'"),
    ({"groups": [{"name": "a", "replicas": 1, "classes": ["hi"]}, {"name": "b", "classes": ["lo"]}],
      "router": "round_robin"}, "only the class_aware"),
    ({"groups": [{"name": "a", "classes": ["nope"]}]}, "cluster.groups.0.classes: unknown class 'nope'"),
    ({"groups": [{"name": "a", "classes": ["hi"]}]}, "no group serves class 'lo'"),
    ({"groups": [{"name": "a", "engine": {"kv_blockz": 3}}]}, "cluster.groups.0.engine.kv_blockz: unknown key"),
    ({"groups": [{"name": "a", "engine": {"max_num_seqs": 0}}]}, "cluster.groups.0.engine.max_num_seqs"),
    ({"groups": [{"name": "a"}, {"name": "a"}]}, "duplicate group name"),
    ({"groups": [{"name": "a", "policy": {"name": "nope"}}]}, "cluster.groups.0.policy"),
    ({"groups": [{"name": "a", "gpus": 0}]}, "cluster.groups.0.gpus: expected an integer >= 1 (GPUs per replica) (got 0)"),
    ({"groups": [{"name": "a", "gpus": 2, "engine": {"profile": "h200-llama-3-70b-tp4"}}]},
     "cluster.groups.0.gpus: 2 GPUs per replica contradicts profile 'h200-llama-3-70b-tp4', whose tensor-parallel "
     "size is 4 (expected gpus = 4"),
    ({"groups": [{"name": "a", "gpus": 2, "engine": {"model": "llama-3.1-70b", "gpu": "h200", "tp": 4}}]},
     "profile 'h200-llama-3.1-70b-tp4', whose tensor-parallel size is 4"),
    ({"groups": [5]}, "cluster.groups.0: expected a table (got 5)"),
    ({"replicas": 2, "router": 5}, "cluster.router: expected a router name or a table with 'name' (got 5)"),
    # (an unknown router parameter named with the ones it takes, not Python's "takes no arguments")
    ({"replicas": 2, "router": {"name": "least_outstanding", "bogus": 1}},
     "cluster.router: least_outstanding: unknown parameter 'bogus' (expected no parameters)"),
    ({"replicas": 2, "router": {"name": "power_of_two", "dd": 3}},
     "cluster.router: power_of_two: unknown parameter 'dd' (expected d); did you mean 'd'?"),
    ({"groups": [{"name": "a", "classes": ["hi"]}, {"name": "b", "classes": ["lo"]}],
      "router": {"name": "class_aware", "inner": "power_of_two", "e": 3}},
     "cluster.router: power_of_two: unknown parameter 'e' (expected d)"),
    ({"groups": [{"name": "a", "classes": ["high"]}]}, "unknown class 'high' (expected one of hi, lo); did you mean 'hi'?"),
])
def test_validation_one_line(cluster, expect):
    # the [cluster] table is validated with the rest of the scenario, when it is read
    with pytest.raises(ScenarioError) as ei:
        scenario_from_dict(cluster_scenario(cluster), source="x.toml")
    msg = str(ei.value)
    assert expect in msg and msg.startswith("x.toml: ") and "\n" not in msg


def test_cluster_table_kept_as_written():
    """scenario.json shows the [cluster] table as the scenario wrote it (no defaults filled in)."""
    table = {"groups": [{"name": "a", "replicas": 2, "engine": {"max_num_seqs": 8}}, {"classes": ["lo"]}],
             "router": {"name": "class_aware", "inner": "round_robin"}}
    sc = scenario_from_dict(cluster_scenario(table))
    assert sc.to_dict()["cluster"] == table
    assert [name for name, _ in sc.cluster.group_list()] == ["a", "g1"]
    assert sc.cluster.router_name == "class_aware" and sc.cluster.router_params == {"inner": "round_robin"}


def test_class_aware_with_no_group_listing_classes_is_warned_as_its_inner_router():
    with pytest.warns(UserWarning, match=r"cluster.router = 'class_aware' but no group lists 'classes'.*"
                                         r"\('round_robin'\)"):
        scenario_from_dict(cluster_scenario({"replicas": 2, "router": {"name": "class_aware",
                                                                       "inner": "round_robin"}}))


# ---- the capacity search, pinned by hand ------------------------------------------------------------
# Every step costs exactly 1 s (linear profile: base 1 s, nothing else), max_num_seqs = 1, and each
# request is a one-token answer, so a replica serves one request per second, in priority order.
# 12 "hi" requests arrive at t = 0 with TTFT SLO 3.5 s; 6 "lo" requests too, due by t = 2.5 s.
#  * hi alone on k replicas: TTFTs are 1, 2, ..., ceil(12/k) s and p99 of 12 values lies between
#    the two largest, so p99 <= 3.5 needs ceil(12/k) <= 3: k = 4 (k = 3 gives three 4 s TTFTs).
#  * partitioned: hi needs 4 as above; lo must finish by 2.5 s, so at most 2 per replica: 3.
#    Total 7.
#  * shared: everything must be done by 2.5 s (lo runs after hi on each replica and must finish by
#    2.5 s; hi needs <= 3 per replica anyway): at most 2 requests per replica, 18 / 2 = 9.
PROF = {"kind": "linear", "base_s": 1.0, "prefill_token_s": 0.0, "decode_token_s": 0.0,
        "context_token_s": 0.0, "swap_block_s": 0.0}


def toy(n_lo: int) -> dict:
    one = {"prompt_tokens": {"dist": "constant", "value": 16}, "output_tokens": {"dist": "constant", "value": 1},
           "max_tokens": 1}
    streams = [{"tenant": "u", "class": "hi", "arrival": {"process": "batch", "n": 12, "at_s": 0.0}, **one}]
    classes = [{"name": "hi", "priority": 0, "ttft_slo_s": 3.5}]
    if n_lo:
        streams.append({"tenant": "b", "class": "lo", "arrival": {"process": "batch", "n": n_lo, "at_s": 0.0}, **one})
        classes.append({"name": "lo", "priority": 1})
    return {"name": "toy", "horizon_s": 1.0, "engine": {"profile": PROF, "kv_blocks": 64, "max_num_seqs": 1},
            "policy": {"name": "priority"}, "classes": classes, "streams": streams}


def test_capacity_search_by_hand():
    sc = scenario_from_dict(toy(0))
    rep = capacity_search(sc, ["shared"], parse_slos(sc), workers=1)
    assert rep.designs["shared"]["replicas"] == 4
    sc = scenario_from_dict(toy(6))
    rep = capacity_search(sc, ["shared", "partitioned"], parse_slos(sc, ["lo:done=2.5"]), workers=2)
    assert rep.designs["shared"]["replicas"] == 9
    assert rep.designs["partitioned"]["split"] == {"hi": 4, "lo": 3}
    assert rep.designs["partitioned"]["gpus"] == 7
    tried = {(p["design"], tuple(p["counts"])): p["ok"] for p in rep.points}
    assert tried[("shared", (8,))] is False and tried[("shared", (9,))] is True


def test_capacity_probes_kept_are_not_reused_after_the_policy_file_changed(tmp_path):
    # a kept probe is named by the scenario and what the files it reads hold: an edited policy
    # file is simulated again, and the search says why
    pol = tmp_path / "p.py"
    pol.write_text("from policies.priority import Priority as P\n")
    d = toy(0)
    d["policy"] = {"name": f"{pol}:P"}
    sc = scenario_from_dict(d)
    slos = parse_slos(sc)
    lines: list[str] = []
    first = capacity_search(sc, ["shared"], slos, workers=1, out_dir=tmp_path / "c", log=lines.append)
    kept = {p.name for p in (tmp_path / "c" / "probes").glob("*.json")}
    capacity_search(sc, ["shared"], slos, workers=1, out_dir=tmp_path / "c", log=lines.append)
    assert {p.name for p in (tmp_path / "c" / "probes").glob("*.json")} == kept  # (all reused)
    pol.write_text("from policies.fcfs import FCFS as P\n")
    lines.clear()
    again = capacity_search(sc, ["shared"], slos, workers=1, out_dir=tmp_path / "c", log=lines.append)
    assert len({p.name for p in (tmp_path / "c" / "probes").glob("*.json")} - kept) >= len(first.points) - 1
    assert f"rerun: {pol.resolve()} changed since the kept probes read it: its points are simulated again" in lines
    assert again.designs["shared"]["replicas"] == first.designs["shared"]["replicas"]


def test_capacity_search_from_known_verdicts():
    """A search at another time factor started from the verdicts a first search established
    that still hold (a miss stays a miss with slower steps, a pass stays a pass with faster
    ones) finds the answers a search from scratch finds, with fewer probes; without simulating
    the answers as a whole (``whole=False``) it reports their counts and the GPUs of their layout."""
    from sim.experiments.uncertainty import at_scale

    sc = scenario_from_dict(toy(6))
    slos = parse_slos(sc, ["lo:done=2.5"])
    first = capacity_search(sc, ["shared", "partitioned"], slos, workers=1)
    assert first.known["partitioned"].passes == (4, 3) and first.known["partitioned"].fails == (3, 2)
    assert "known" not in first.to_dict()
    for f in (0.6, 1.5):
        scf = at_scale(sc, f)
        cold = capacity_search(scf, ["shared", "partitioned"], slos, workers=1)
        known = {d: k.carried(slower=f > 1.0) for d, k in first.known.items()}
        warm = capacity_search(scf, ["shared", "partitioned"], slos, workers=1, known=known, whole=False)
        for d in ("shared", "partitioned"):
            assert (warm.designs[d]["gpus"], warm.designs[d]["split"]) == (cold.designs[d]["gpus"],
                                                                             cold.designs[d]["split"]), (f, d)
        assert len(warm.points) < len(cold.points) - 1  # (the answers as a whole, and probes carried)
    slower = first.known["shared"].carried(slower=True)
    assert slower.fails == first.known["shared"].fails and slower.passes == (None,)
    faster = first.known["shared"].carried(slower=False)
    assert faster.fails == (0,) and faster.passes == first.known["shared"].passes


def test_capacity_early_stop_same_verdicts():
    """A probe stops once it has lost (a request past its deadline, enough TTFTs over the SLO
    that the p99 must be over it); every probe's verdict and every answer are the same as
    running each probe to its end."""
    for sc, slo in [(scenario_from_dict(toy(6)), ["lo:done=2.5"]),
                    (load_scenario("diurnal_two_class", overrides=["horizon_s=30.0"]), [])]:
        slos = parse_slos(sc, slo)
        a = capacity_search(sc, ["shared", "partitioned"], slos, workers=1, max_replicas=16)
        b = capacity_search(sc, ["shared", "partitioned"], slos, workers=1, max_replicas=16, early_stop=False)
        assert a.designs == b.designs
        verdict = {(p["design"], tuple(p["counts"])): p["ok"] for p in b.points}
        assert {(p["design"], tuple(p["counts"])): p["ok"] for p in a.points} == verdict
        stopped = [p for p in a.points if p.get("stopped_at_s") is not None]
        assert stopped and all(not p["ok"] for p in stopped)
        full = {(p["design"], tuple(p["counts"])): p for p in b.points}
        for p in stopped:  # a lower bound of what the whole run measures
            q = full[(p["design"], tuple(p["counts"]))]
            for c, m in p["classes"].items():
                if m["slo_ratio"] is not None:
                    assert m["ok"] is False and q["classes"][c]["ok"] is False
                    assert m["slo_ratio"] <= q["classes"][c]["slo_ratio"] + 1e-12


def test_a_stopped_probe_counts_the_gpus_of_its_replicas():
    """A probe stopped early (it lost) reports the GPUs of its layout, as one run to its end
    does: a tensor-parallel replica has several."""
    from sim.experiments.capacity import evaluate

    d = toy(6)
    d["engine"] = {"model": "qwen3-8b", "gpu": "h200", "tp": 2, "max_num_seqs": 1}
    sc = scenario_from_dict(d)
    slos = parse_slos(sc, ["lo:done=0.001"])
    stopped = evaluate(sc, {"replicas": 2, "router": "least_outstanding"}, 1.0, slos, [["hi", "lo"]])
    full = evaluate(sc, {"replicas": 2, "router": "least_outstanding"}, 1.0, slos)
    assert stopped["stopped_at_s"] is not None and full.get("stopped_at_s") is None
    assert (stopped["replicas"], stopped["gpus"]) == (full["replicas"], full["gpus"]) == (2, 4)


def test_capacity_partitions_apart_same_answers():
    """Probing each partition alone (its class's requests on its replicas) gives the answers of
    probing all partitions in lockstep, and each probe's verdict is its class's verdict there."""
    from sim.experiments.capacity import partitions_apart

    for sc, slo in [(scenario_from_dict(toy(6)), ["lo:done=2.5"]),
                    (load_scenario("diurnal_two_class", overrides=["horizon_s=30.0"]), [])]:
        slos = parse_slos(sc, slo)
        assert partitions_apart(sc, 1.0)
        a = capacity_search(sc, ["partitioned"], slos, workers=1, max_replicas=16)
        b = capacity_search(sc, ["partitioned"], slos, workers=1, max_replicas=16, apart=False, early_stop=False)
        assert a.designs == b.designs
        assert all(None in p["counts"] for p in a.points[:-1])  # the answer alone is simulated whole
        joint = {}
        for p in b.points:
            for j, c in enumerate(sc.class_names):
                joint[(j, p["counts"][j])] = p["classes"][c]["ok"]
        for p in a.points[:-1]:
            j, k = next((j, k) for j, k in enumerate(p["counts"]) if k is not None)
            if (j, k) in joint:
                assert p["ok"] == joint[(j, k)]
    d = toy(6)
    d["policy"] = {"name": "sjf_rank", "predictor": "noisy"}  # draws random numbers: not apart
    assert not partitions_apart(scenario_from_dict(d), 1.0)


def test_capacity_limit_and_slo_parsing():
    sc = scenario_from_dict(toy(0))
    rep = capacity_search(sc, ["shared"], parse_slos(sc), workers=1, max_replicas=3)
    assert rep.designs["shared"]["replicas"] is None and "max-replicas=3" in rep.designs["shared"]["note"]
    assert parse_slos(sc, ["hi:ttft=2,tpot=0.1"])["hi"] == {"ttft": 2.0, "tpot": 0.1, "done": None}
    for bad in ["nope:ttft=1", "hi:ttfx=1", "hi:ttft=abc", "hi:ttft=-1"]:
        with pytest.raises(ScenarioError):
            parse_slos(sc, [bad])
    # (one key twice in one --slo: which was meant is not known, so neither is kept silently)
    with pytest.raises(ScenarioError, match=r"^--slo 'hi:ttft=0.5,ttft=0.2': ttft given twice \(expected each key once\)$"):
        parse_slos(sc, ["hi:ttft=0.5,ttft=0.2"])


# ---- CLI ------------------------------------------------------------------------------------------------
@pytest.fixture
def toy_file(tmp_path):
    import json
    d = toy(6)
    lines = ['name = "toy"', "horizon_s = 1.0", "[engine]", f"profile = {_inline(PROF)}", "kv_blocks = 64",
             "max_num_seqs = 1", "[policy]", 'name = "priority"']
    for c in d["classes"]:
        lines += ["[[classes]]"] + [f"{k} = {json.dumps(v)}" for k, v in c.items()]
    for s in d["streams"]:
        lines += ["[[streams]]"] + [f"{k} = {_inline(v) if isinstance(v, dict) else json.dumps(v)}"
                                    for k, v in s.items()]
    p = tmp_path / "toy.toml"
    p.write_text("\n".join(lines) + "\n")
    return p


def _inline(d: dict) -> str:
    import json
    return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in d.items()) + " }"


def test_cli_capacity(toy_file, tmp_path):
    from sim.cli import main
    out = tmp_path / "cap"
    r = CliRunner().invoke(main, ["capacity", str(toy_file), "--slo", "lo:done=2.5", "--workers", "1",
                                  "--out", str(out), "--figure", str(tmp_path / "fig.png")])
    assert r.exit_code == 0, r.output
    assert "shared" in r.output and (out / "capacity.json").exists() and (tmp_path / "fig.png").exists()
    r = CliRunner().invoke(main, ["capacity", str(toy_file), "--designs", "shared,nope"])
    assert r.exit_code == 2 and "unknown design 'nope'" in r.output


# ---- the implicit deadline, refused requests, classes with no traffic, output files ---------------
STEP = {"kind": "linear", "base_s": 0.01, "prefill_token_s": 0.0, "decode_token_s": 0.0, "context_token_s": 0.0,
        "swap_block_s": 0.0}


def late_toy(**engine) -> dict:
    """10 s of traffic: 4 "hi" requests (TTFT SLO 1 s) at t = 0, and one "lo" request (no SLO) at
    9.9 s that takes 10 s alone (a 10 ms step, 1,000 output tokens): it cannot finish by
    horizon_s * 1.1 = 11 s on any number of replicas."""
    def stream(cls, arrival, out):
        return {"tenant": cls, "class": cls, "arrival": arrival, "prompt_tokens": {"dist": "constant", "value": 16},
                "output_tokens": {"dist": "constant", "value": out}, "max_tokens": out}
    return {"name": "late", "horizon_s": 10.0, "engine": {"profile": STEP, "kv_blocks": 256, **engine},
            "policy": {"name": "priority"},
            "classes": [{"name": "hi", "priority": 0, "ttft_slo_s": 1.0}, {"name": "lo", "priority": 1}],
            "streams": [stream("hi", {"process": "batch", "n": 4, "at_s": 0.0}, 5),
                        stream("lo", {"process": "batch", "n": 1, "at_s": 9.9}, 1000)]}


def test_implicit_deadline_adds_the_longest_request_alone():
    """A class without SLOs must finish by horizon_s * (1 + grace) plus its longest request's
    unloaded service time: a request arriving at the horizon with a long answer no longer makes
    every count fail. The early stop judges by the same deadline; --slo CLASS:done= is literal."""
    sc = scenario_from_dict(late_toy())
    slos = parse_slos(sc)
    basis = slos["lo"]["done_from"]
    assert basis["longest_s"] == pytest.approx(10.0, abs=1e-6)  # (one prefill step, 999 decode steps)
    assert slos["lo"]["done"] == pytest.approx(10.0 * 1.1 + basis["longest_s"])
    assert basis["request"]["arrival_s"] == pytest.approx(9.9) and basis["request"]["output_tokens"] == 1000
    rep = capacity_search(sc, ["shared", "partitioned"], slos, workers=1, max_replicas=4)
    assert rep.designs["shared"]["replicas"] == 1
    assert rep.designs["partitioned"]["split"] == {"hi": 1, "lo": 1}
    # alone on its partition, the request takes exactly its unloaded service time
    lo = rep.designs["partitioned"]["classes"]["lo"]
    assert lo["last_finish_s"] == pytest.approx(9.9 + basis["longest_s"], abs=1e-6)
    full = capacity_search(sc, ["shared", "partitioned"], slos, workers=1, max_replicas=4, early_stop=False)
    assert full.designs == rep.designs
    literal = parse_slos(sc, ["lo:done=11"])
    assert literal["lo"] == {"ttft": None, "tpot": None, "done": 11.0}
    assert capacity_search(sc, ["shared"], literal, workers=1, max_replicas=4).designs["shared"]["replicas"] is None


def _write_toml(path, d: dict) -> str:
    """``d`` (a scenario dict of scalars, tables and lists of tables) as a TOML file."""
    import tomli_w

    path.write_text(tomli_w.dumps(d))
    return str(path)


def test_capacity_says_refused_requests_and_idle_classes(tmp_path):
    """Requests refused for their length at any count are said in one line (not blamed on the
    step time); a class with no request gets no partition, not one replica with no metrics."""
    from sim.cli import main

    d = late_toy(max_model_len=500)
    d["classes"].append({"name": "idle", "priority": 2})
    d["streams"].append({**d["streams"][0], "tenant": "idle", "class": "idle",
                         "arrival": {"process": "poisson", "rate": 1e-6}})
    f = _write_toml(tmp_path / "s.toml", d)
    out = tmp_path / "cap"
    r = CliRunner().invoke(main, ["capacity", f, "--workers", "1", "--max-replicas", "4", "--no-plots",
                                  "--no-uncertainty", "--out", str(out)])
    assert r.exit_code == 0, r.output + r.stderr
    said = [line for line in r.stderr.splitlines() if "refused at any count" in line]
    assert len(said) == 1 and "lo: 1 of 1 requests refused at any count" in said[0]
    assert "engine.max_model_len = 500" in said[0]
    assert "per-step time" not in r.stdout and "no count helps" in r.stdout
    doc = json.loads((out / "capacity.json").read_text())
    assert doc["refused"]["lo"]["too_long"] == 1 and "refused" in doc["designs"]["shared"]["note"]
    assert "up to --max-replicas" not in doc["designs"]["shared"]["note"]
    assert not [p for p in doc["points"] if p["design"] == "shared"]  # (no count to search)
    del d["engine"]["max_model_len"]
    f = _write_toml(tmp_path / "s2.toml", d)
    r = CliRunner().invoke(main, ["capacity", f, "--workers", "1", "--max-replicas", "4", "--no-plots",
                                  "--no-uncertainty", "--out", str(tmp_path / "cap2")])
    assert r.exit_code == 0, r.output + r.stderr
    assert "class idle has no traffic" in r.stdout
    a = json.loads((tmp_path / "cap2" / "capacity.json").read_text())["designs"]["partitioned"]
    assert a["split"] == {"hi": 1, "lo": 1, "idle": 0} and a["gpus"] == 2
    assert [g["name"] for g in a["cluster"]["groups"]] == ["hi", "lo"]


def test_capacity_on_bad_input_leaves_no_folder(tmp_path, monkeypatch):
    """A trace that fails to read stops capacity before its folder is made, with --out or
    without (no results/capacity-*), in one line that does not offer a --lenient it lacks."""
    from sim.cli import main

    (tmp_path / "t.csv").write_text("t,p,o\n0.0,16,4\n0.5,abc,4\n")
    (tmp_path / "s.toml").write_text(
        'name = "bad"\nhorizon_s = 1.0\n[engine]\nprofile = ' + _inline(STEP) + '\nkv_blocks = 64\n'
        '[[classes]]\nname = "c"\npriority = 0\n[[streams]]\ntenant = "u"\nclass = "c"\n'
        'trace = { format = "csv", path = "t.csv", columns = { arrival_s = "t", prompt_tokens = "p", '
        'output_tokens = "o" } }\n')
    monkeypatch.chdir(tmp_path)
    for extra in (["--out", "out"], []):
        r = CliRunner().invoke(main, ["capacity", "s.toml", "--no-plots", "--workers", "1", *extra])
        assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "t.csv line 3" in r.stderr and "lenient mode" not in r.stderr
        assert "priosim capacity reads every row" in r.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "results").exists()


def test_capacity_results_are_the_same_bytes_for_the_same_seed(toy_file, tmp_path):
    """capacity.json and points.csv hold no wall-clock time (perf.json does): two identical
    searches write the same bytes. A --slo latency that looks like milliseconds is warned."""
    from sim.cli import main

    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        r = CliRunner().invoke(main, ["capacity", str(toy_file), "--slo", "lo:done=2.5", "--slo", "hi:ttft=500",
                                      "--workers", "1", "--no-plots", "--no-uncertainty", "--out", str(out)])
        assert r.exit_code == 0, r.output + r.stderr
        assert "--slo 'hi:ttft=500': ttft = 500 looks like milliseconds" in r.stderr
    for name in ("capacity.json", "points.csv"):
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
        assert b"wall_s" not in (outs[0] / name).read_bytes()
    perf = json.loads((outs[0] / "perf.json").read_text())
    assert perf["wall_s"] > 0 and len(perf["points"]) == len(json.loads((outs[0] / "capacity.json").read_text())
                                                                 ["points"])


def test_cli_run_cluster(toy_file, tmp_path):
    from sim.cli import main
    out = tmp_path / "run"
    r = CliRunner().invoke(main, ["run", str(toy_file), "--set", "cluster={replicas=3}", "--out", str(out),
                                  "--no-plots"])
    assert r.exit_code == 0, r.output
    assert "cluster: 3 replicas" in r.output
    assert (out / "replicas" / "2" / "requests.parquet").exists() and (out / "groups" / "default").is_dir()
    r = CliRunner().invoke(main, ["run", str(toy_file), "--set", "cluster={replicas=0}", "--no-plots"])
    assert r.exit_code == 2 and "cluster.replicas" in r.output


def test_merged_inter_token_latency_matches_the_replicas():
    """The cluster's ITL percentiles come from every replica's gaps, including the per-step
    weighted ones (they were once left out of the merge, which skewed p99 five-fold)."""

    res = simulate_cluster(load_scenario("diurnal_two_class", overrides=["horizon_s=30.0", "cluster={replicas=3}"]))
    per = [r.summary_dict["classes"]["interactive"]["itl_p99_s"] for r in res.replicas]
    merged = res.summary_dict["classes"]["interactive"]["itl_p99_s"]
    assert min(per) <= merged <= max(per)


def test_cluster_imports_point_down():
    """sim/cluster builds its replicas from sim.assembly, as the single-replica driver does; it
    never imports the driver (sim.run) that calls it."""
    import ast
    from pathlib import Path

    folder = Path(__file__).resolve().parents[1] / "sim" / "cluster"
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not [n for n in names if n == "sim.run" or n.startswith("sim.run.")], path.name


def test_simulate_is_the_one_driver():
    """simulate() runs a [cluster] scenario exactly as simulate_cluster does."""
    sc = scenario_from_dict(cluster_scenario({"replicas": 2, "router": "round_robin"}))
    a, b = simulate(sc), simulate_cluster(sc)
    assert isinstance(a, ClusterResults)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    assert a.summary_dict["cluster"]["replicas"] == b.summary_dict["cluster"]["replicas"]


def test_capacity_probe_scenario_is_the_validated_one_with_its_cluster():
    """A probe sets [cluster] on the scenario validated once (with_cluster), which crosses the
    process pool by pickling: the same scenario as validating the whole dict with that table."""
    import pickle

    from sim.config import with_cluster

    d = toy(6)
    sc = scenario_from_dict(d, source="toy.toml", base_dir="/x")
    for table in ({"replicas": 3, "router": "least_outstanding"},
                  {"groups": [{"name": "hi", "replicas": 2, "classes": ["hi"]},
                              {"name": "lo", "replicas": 1, "classes": ["lo"]}], "router": "class_aware"}):
        probe = pickle.loads(pickle.dumps(with_cluster(sc, table)))
        whole = scenario_from_dict({**d, "cluster": table}, source="toy.toml", base_dir="/x")
        assert probe == whole and (probe.source, probe.base_dir) == (whole.source, whole.base_dir)


def test_groups_priced_alike_share_one_cost_model(monkeypatch):
    """The driver loads a profile once per distinct pricing (profile and overhead), not once per
    group after the first."""
    import sim.cluster.driver as driver

    loads = []
    real = driver.engine_costs

    def counting(*a, **k):
        loads.append(a)
        return real(*a, **k)

    monkeypatch.setattr(driver, "engine_costs", counting)
    same = layout_for("class_aware")
    same["groups"][1]["engine"] = {"kv_blocks": 96}  # other settings, the same pricing
    res = simulate_cluster(scenario_from_dict(cluster_scenario(same)))
    assert loads == [] and len(res.requests)  # the first group's came with the setup; the second shares it
    other = layout_for("class_aware")
    other["groups"][1]["engine"] = {"overhead": "vllm-0.6"}
    simulate_cluster(scenario_from_dict(cluster_scenario(other)))
    assert len(loads) == 1


@pytest.mark.parametrize("name", ROUTER_NAMES)
@pytest.mark.parametrize("frontend_s", [0.0, 0.013])
def test_open_arrivals_are_routed_before_a_replica_reaches_their_instant(monkeypatch, name, frontend_s):
    """With open arrivals only, the router routes each instant's arrivals before any replica
    reaches that instant, so a replica's boundary never finds one due (it skips the router call;
    the tables stay those of routing at every boundary)."""
    from sim.cluster.replicas import Replica
    pop_due = Replica.pop_due
    seen = {"boundaries": 0}

    def checked(self, now_ns):
        cl = self.cluster
        assert cl.source.next_arrival_ns() > min(now_ns, cl.stop_ns)  # (nothing left to route)
        seen["boundaries"] += 1
        return pop_due(self, now_ns)

    d = cluster_scenario(layout_for(name))
    d["engine"]["overhead"] = {"frontend_s": frontend_s}
    sc = scenario_from_dict(d)
    plain = simulate_cluster(sc)
    monkeypatch.setattr(Replica, "pop_due", checked)
    for fast in (True, False):
        res = simulate_cluster(sc, fast=fast)
        pd.testing.assert_frame_equal(plain.requests, res.requests)
    assert seen["boundaries"] > 100


@pytest.mark.pure_python  # (counts calls by patching the engine: see tests/conftest.py)
def test_run_end_and_router_events_reused(monkeypatch):
    """A replica's run waits on its last run's end event, re-armed (it fired and left the
    queue), and the router's event is re-armed at each wakeup: new events only for a replica's
    first run and for a cut run's new end (``_schedule_end``); the tables are those of stopping
    at every arrival."""
    import simpy

    from sim.cluster import replicas
    made = {"events": 0, "replaced": 0}

    class Counted(simpy.Event):
        def __init__(self, env):
            made["events"] += 1
            super().__init__(env)

    schedule_end = replicas.Replica._schedule_end

    def counted_end(rep, end_ns):
        made["replaced"] += 1
        schedule_end(rep, end_ns)

    d = cluster_scenario({"replicas": 3, "router": "least_outstanding"})
    d["streams"][0]["arrival"]["rate"] = 12.0
    sc = scenario_from_dict(d)
    slow = simulate_cluster(sc, fast=False)
    monkeypatch.setattr(replicas.simpy, "Event", Counted)
    monkeypatch.setattr(replicas.Replica, "_schedule_end", counted_end)
    fast = simulate_cluster(sc)
    pd.testing.assert_frame_equal(slow.requests, fast.requests)
    assert made["events"] == 3 + made["replaced"] and fast.summary_dict["run"]["engine_events"] > 200


def test_a_new_router_is_one_file():
    """tests/plugins/tenant_affinity.py is all a new router takes: named by its dotted path, or
    registered under a short name, it sends every request of a tenant to one replica."""
    from tests.plugins.tenant_affinity import TenantAffinity

    def replicas_by_tenant(router: str) -> dict:
        res = simulate(scenario_from_dict(cluster_scenario({"replicas": 3, "router": router})), check_invariants=True)
        return res.requests.groupby("tenant")["replica"].unique().map(sorted).to_dict()

    mine = replicas_by_tenant("tests.plugins.tenant_affinity:TenantAffinity")
    assert set(mine) == {"a", "b"} and all(len(reps) == 1 for reps in mine.values())
    assert any(len(reps) > 1 for reps in replicas_by_tenant("round_robin").values())
    ROUTERS.register("tenant_affinity", TenantAffinity, "Each tenant to one replica.")
    try:
        assert replicas_by_tenant("tenant_affinity") == mine
        with pytest.raises(ScenarioError, match=r"cluster\.router: unknown router 'tenant_afinity'.*"
                                                r"did you mean 'tenant_affinity'\?"):
            load_scenario(None, overrides=['cluster.replicas=2', 'cluster.router="tenant_afinity"'])
    finally:
        ROUTERS.unregister("tenant_affinity")
    assert "tenant_affinity" not in ROUTERS.names()


@pytest.mark.parametrize("router, returned", [("Nowhere", "None"), ("ByIndex", "1")])
@pytest.mark.parametrize("groups", [None, "disaggregated"])
def test_a_users_router_answering_no_candidate_stops_in_one_line(router, returned, groups):
    """A user's router whose ``route`` returns something other than one of its candidates stops
    the run with one line naming the router, the request and the value (a shipped router is
    trusted, as a shipped policy is)."""
    from sim.routers import GuardedRouter, make_router

    name = f"tests.plugins.bad_routers:{router}"
    cl = {"replicas": 2, "router": name}
    if groups:
        cl = {"router": name, "link": {"bandwidth_bytes_per_s": 50e9, "latency_s": 1e-5, "kv_bytes_per_token": 131072},
              "groups": [{"name": "p", "role": "prefill", "replicas": 2},
                         {"name": "d", "role": "decode", "replicas": 1}]}
    with pytest.raises(ScenarioError) as err:
        simulate(scenario_from_dict(cluster_scenario(cl)))
    assert "\n" not in str(err.value)
    assert str(err.value).startswith(f"router '{name}': route() returned {returned} for request ")
    assert str(err.value).endswith("expected one of the 2 replicas it was handed (an element of candidates)")
    assert isinstance(make_router(name), GuardedRouter) and not isinstance(make_router("least_kv"), GuardedRouter)


def test_iteration_trace_of_a_cluster_with_an_idle_replica_keeps_its_types():
    """A replica that never stepped has an empty trace: the cluster's trace stays numeric (a
    capacity search's explanation once failed on an object column there)."""
    d = cluster_scenario({"groups": [{"name": "idle", "replicas": 1, "classes": ["hi"]},
                                     {"name": "busy", "replicas": 1, "classes": ["lo"]}], "router": "class_aware"},
                         drain=False)
    d["streams"][0]["arrival"] = {"process": "batch", "n": 1, "at_s": 1e6}  # (after the horizon: none arrives)
    res = simulate_cluster(scenario_from_dict(d), trace_iterations=True)
    it = res.iterations
    assert len(it) and (it["replica"] == 1).all()
    assert it["tokens"].dtype.kind == "i" and it["end_s"].dtype.kind == "f"
