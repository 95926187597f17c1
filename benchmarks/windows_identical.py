"""The 16-replica ServeGen hour with ``refresh_s = 1`` on 1 worker and on 2 local processes:
wall times, and a check that the results are byte-identical (the requests, time series and
summary of the cluster, less its wall and CPU clocks, and every replica's requests).

    python -m benchmarks.windows_identical
"""
from __future__ import annotations

import json
import time

import pandas as pd

from benchmarks.core_scenario import servegen_overrides
from sim import load_scenario
from sim.cluster import simulate_cluster


def _facts_out(d):
    if isinstance(d, dict):
        return {k: _facts_out(v) for k, v in d.items() if k not in ("wall_s", "cpu_s")}
    if isinstance(d, list):
        return [_facts_out(x) for x in d]
    return d


def main() -> None:
    cluster = "cluster={replicas=16, router={name='least_outstanding', refresh_s=1.0}}"
    sets = [s if not s.startswith("cluster=") else cluster for s in servegen_overrides(3600)]
    sc = load_scenario("servegen_multitenant", overrides=sets)
    out, res = {}, {}
    for name, kw in (("workers_1", {}), ("workers_2", {"backend": "local", "workers": 2})):
        t = time.perf_counter()
        res[name] = simulate_cluster(sc, load_scale=2.0, **kw)
        out[name] = {"wall_s": round(time.perf_counter() - t, 1), "requests": len(res[name].requests)}
    a, b = res["workers_1"], res["workers_2"]
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.timeseries, b.timeseries)
    assert json.dumps(_facts_out(a.summary_dict), default=str) == json.dumps(_facts_out(b.summary_dict), default=str)
    for x, y in zip(a.replicas, b.replicas, strict=True):
        pd.testing.assert_frame_equal(x.requests, y.requests)
    out["byte_identical"] = True
    print(json.dumps(out))


if __name__ == "__main__":
    main()
