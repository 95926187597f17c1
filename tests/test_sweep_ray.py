"""The Ray backend gives the same sweep.parquet as local processes (skipped without Ray).

The test starts its own Ray on loopback with the dashboard and usage reporting off and a
temporary Ray directory (short, because Ray's socket paths must fit in 107 bytes)."""
from __future__ import annotations

import os
import shutil
import tempfile

import pandas as pd
import pytest

ray = pytest.importorskip("ray")

from sim import load_scenario  # noqa: E402
from sim.experiments.sweep import expand_grid, ray_runtime_env, run_sweep  # noqa: E402


@pytest.fixture(scope="module")
def local_ray():
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", _temp_dir=tmp,
             configure_logging=False, log_to_driver=False,
             runtime_env=ray_runtime_env())  # ships the project's code, as the CLI does
    try:
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def test_ray_backend_matches_local(tmp_path, local_ray):
    sc = load_scenario("chat_vs_batch", overrides=["horizon_s=10", "streams.0.arrival.n=100"])
    specs = expand_grid(sc.to_dict(), {"policy": ["fcfs", "priority"], "load": [0.6, 1.2], "seed": [1]})
    kw = dict(base_dir=sc.base_dir, source=sc.source, progress=False)
    rep_ray = run_sweep(specs, tmp_path / "ray", backend="ray", **kw)
    rep_loc = run_sweep(specs, tmp_path / "local", backend="local", workers=1, **kw)
    assert not rep_ray.failed and not rep_loc.failed, (rep_ray.failed, rep_loc.failed)
    assert rep_ray.done == rep_loc.done == 4
    a = pd.read_parquet(tmp_path / "ray" / "sweep.parquet")
    b = pd.read_parquet(tmp_path / "local" / "sweep.parquet")
    assert len(a) == 4 * 3
    pd.testing.assert_frame_equal(a, b)
    rid = specs[-1].run_id
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "ray" / "runs" / rid / "requests.parquet"),
                                  pd.read_parquet(tmp_path / "local" / "runs" / rid / "requests.parquet"))
    # a rerun on Ray skips the finished runs
    assert run_sweep(specs, tmp_path / "ray", backend="ray", **kw).skipped == 4
