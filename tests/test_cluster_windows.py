"""A cluster whose router reads snapshots every ``refresh_s`` (sim/cluster/windows.py): the
same results however its replicas are partitioned (in this process, local processes, Ray), the
same as the one-clock cluster for a router that reads no replica state, and one line for what
it cannot do."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pandas as pd
import pytest

from sim import load_scenario
from sim.cluster import simulate_cluster
from sim.core.errors import ScenarioError
from sim.experiments.sweep import PROJECT_ROOT


def _scenario(router: str, refresh: float | None = 1.0, replicas: int = 4, horizon: int = 40):
    r = f"{{name='{router}', refresh_s={refresh}}}" if refresh is not None else f"'{router}'"
    return load_scenario("diurnal_two_class", overrides=[f"horizon_s={horizon}",
                                                         f"cluster={{replicas={replicas}, router={r}}}"])


def _facts_out(d, drop=()):
    """The summary without the run's wall and CPU clocks (the only things allowed to differ)
    and the keys in ``drop``."""
    if isinstance(d, dict):
        return {k: _facts_out(v, drop) for k, v in d.items() if k not in ("wall_s", "cpu_s", *drop)}
    if isinstance(d, list):
        return [_facts_out(x, drop) for x in d]
    return d


def _same(a, b, events: bool = True) -> None:
    """The same results (``events=False``: but for the count of engine events)."""
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.timeseries, b.timeseries)
    drop = () if events else ("engine_events",)
    assert json.dumps(_facts_out(a.summary_dict, drop), default=str) == \
        json.dumps(_facts_out(b.summary_dict, drop), default=str)
    assert len(a.replicas) == len(b.replicas)
    for x, y in zip(a.replicas, b.replicas):
        pd.testing.assert_frame_equal(x.requests, y.requests)


@pytest.mark.parametrize("router", ["least_outstanding", "least_kv"])
def test_partitions_change_nothing(router):
    sc = _scenario(router)
    one = simulate_cluster(sc)
    assert len(one.requests) > 500
    _same(one, simulate_cluster(sc, backend="inprocess", workers=2))
    _same(one, simulate_cluster(sc, backend="inprocess", workers=3))


def test_local_processes_match_one_process():
    sc = _scenario("least_outstanding", replicas=3, horizon=20)
    _same(simulate_cluster(sc), simulate_cluster(sc, backend="local", workers=2))


def test_stateless_router_needs_no_windows():
    """Round robin reads no replica state: in windows it routes as the one-clock cluster, and
    every replica's run is exact wherever a window cuts it (runs stop at window ends: more
    engine events, the same results)."""
    _same(simulate_cluster(_scenario("round_robin", refresh=0.5)), simulate_cluster(_scenario("round_robin", None)),
          events=False)


def test_snapshot_routing_differs_from_live_routing():
    """The router sees stale state: with a long refresh JSQ piles a window's arrivals onto the
    replica that was emptiest at its start, less so than live counts would allow."""
    live = simulate_cluster(_scenario("least_outstanding", None))
    stale = simulate_cluster(_scenario("least_outstanding", refresh=5.0))
    assert not live.requests["replica"].equals(stale.requests["replica"])


def test_refused_with_one_line():
    with pytest.raises(ScenarioError, match="refresh_s: expected a number of seconds > 0"):
        _scenario("least_outstanding", refresh=-1.0)
    with pytest.raises(ScenarioError, match="needs the router's refresh_s"):
        simulate_cluster(_scenario("least_outstanding", None, horizon=5), workers=2)
    with pytest.raises(ScenarioError, match="refresh_s: not available with an autoscaler"):
        load_scenario("diurnal_two_class", overrides=[
            "cluster={replicas=2, router={name='least_outstanding', refresh_s=1.0}, "
            "autoscale={policy='queue', min=1, max=2}}"])


def test_cli_refuses_workers_without_refresh(tmp_path):
    p = subprocess.run([sys.executable, "-m", "sim.cli", "run", "diurnal_two_class", "--set", "horizon_s=5",
                        "--workers", "2", "--out", str(tmp_path / "o")], capture_output=True, text=True,
                       cwd=PROJECT_ROOT)
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1 and "refresh_s" in p.stderr


def test_ray_matches_one_process():
    ray = pytest.importorskip("ray")
    from sim.experiments.sweep import ray_runtime_env
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", _temp_dir=tmp,
             configure_logging=False, log_to_driver=False, runtime_env=ray_runtime_env())
    try:
        sc = _scenario("least_outstanding", replicas=2, horizon=10)
        _same(simulate_cluster(sc), simulate_cluster(sc, backend="ray", workers=2))
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def test_capacity_with_refresh_same_answers_on_two_workers():
    """``priosim capacity --refresh-s 1 --partitions 2``: every probe in windows, its replicas on
    two local processes; the same probes and answers as in one process (probes run to their end:
    early stopping listens to every request's end, which stays in the workers)."""
    from sim.experiments.capacity import capacity_search
    from sim.experiments.slos import parse_slos
    sc = load_scenario("diurnal_two_class", overrides=["horizon_s=20.0"])
    slos = parse_slos(sc, [])
    router = {"name": "least_outstanding", "refresh_s": 1.0}
    a = capacity_search(sc, ["shared", "partitioned"], slos, router=router, workers=1, max_replicas=8,
                        early_stop=False)
    b = capacity_search(sc, ["shared", "partitioned"], slos, router=router, max_replicas=8, early_stop=False,
                        distributed={"backend": "local", "workers": 2, "address": None})
    assert a.designs == b.designs
    pts = [{k: v for k, v in p.items() if k != "wall_s"} for p in a.points]
    assert pts == [{k: v for k, v in p.items() if k != "wall_s"} for p in b.points]
