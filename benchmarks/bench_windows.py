"""The inputs of the windowed cluster's speed-up model (docs/distributed.md).

Runs one cluster scenario whose router has ``refresh_s`` on 1 worker (this process) and on
``--workers`` local processes, timing where the coordinator's wall time goes: routing and
pickling each window's arrivals (serial), waiting at the window's barrier for the workers, and
the rest (setup, merging results). Then times the barrier alone: ``--pings`` empty windows on
idle workers (the per-window coordination cost ``c``). Prints one JSON document.

    python -m benchmarks.bench_windows servegen_multitenant --servegen --horizon 3600 --workers 2
"""
from __future__ import annotations

import argparse
import json
import time

from sim import load_scenario
from sim.assembly import prepare
from sim.cluster import parse_cluster
from sim.cluster.executors import InProcess, Processes
from sim.cluster.windows import simulate_windows
from sim.core.costs import NS


class _Timed:
    """An executor whose ``advance`` calls (the barrier) are timed."""

    def __init__(self, ex) -> None:
        self.ex, self.wait_s, self.calls = ex, 0.0, 0
        self.between_s = 0.0  # the coordinator's own time between barriers (routing)
        self._last: float | None = None

    def __getattr__(self, name):
        return getattr(self.ex, name)

    def advance(self, batches, until_ns):
        t = time.perf_counter()
        if self._last is not None:
            self.between_s += t - self._last
        out = self.ex.advance(batches, until_ns)
        self._last = time.perf_counter()
        self.wait_s += self._last - t
        self.calls += 1
        return out


def timed_run(sc, executor, load_scale: float = 1.0) -> dict:
    spec = parse_cluster(sc)
    t0 = time.perf_counter()
    setup = prepare(sc, spec.groups[0].engine, load_scale=load_scale, frontends=spec.n_replicas)
    ex = _Timed(executor)
    try:
        res = simulate_windows(sc, spec, setup, ex, per_replica=False)
    finally:
        executor.close()
    wall = time.perf_counter() - t0
    return {"wall_s": round(wall, 2), "barrier_s": round(ex.wait_s, 2), "routing_s": round(ex.between_s, 2), "windows": ex.windows,
            "calls": ex.calls, "requests": len(res.requests), "engine_events": res.summary_dict["run"]["engine_events"]}


def ping(sc, workers: int, n: int) -> float:
    """Seconds per empty window on ``workers`` idle local processes (1: this process)."""
    spec = parse_cluster(sc)
    ex = InProcess(sc, spec, 1) if workers == 1 else Processes(sc, spec, workers)
    try:
        R = 10 ** 9
        ex.advance([[] for _ in ex.parts], R)
        t = time.perf_counter()
        for k in range(2, n + 2):
            ex.advance([[] for _ in ex.parts], k * R)
        return (time.perf_counter() - t) / n
    finally:
        ex.finish(0, False) if workers > 1 else None
        ex.close()


def ray_ping(sc, workers: int, n: int) -> float:
    """Seconds per empty window on ``workers`` idle Ray actors (a local Ray started here)."""
    import os
    import shutil
    import tempfile

    import ray

    from sim.cluster.executors import RayActors
    from sim.experiments.sweep import ray_runtime_env
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    ray.init(num_cpus=workers, include_dashboard=False, _node_ip_address="127.0.0.1", _temp_dir=tmp,
             configure_logging=False, log_to_driver=False, runtime_env=ray_runtime_env())
    try:
        ex = RayActors(sc, parse_cluster(sc), workers)
        R = 10 ** 9
        ex.advance([[] for _ in ex.parts], R)
        t = time.perf_counter()
        for k in range(2, n + 2):
            ex.advance([[] for _ in ex.parts], k * R)
        dt = (time.perf_counter() - t) / n
        ex.close()
        return dt
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def model(m: dict, workers: int, scale: float = 1.0, ray: bool = True) -> float:
    """Modelled wall seconds on ``workers`` of the measured run ``m`` (this script's output,
    with ``pickle_us`` and ``unpickle_us`` per request added) for a fleet ``scale`` times as
    large (replicas and requests; the same windows). docs/distributed.md has the formula."""
    one = m["workers_1"]
    q = one["requests"] * scale
    w = one["windows"]
    r = one["routing_s"] / one["requests"]
    t0 = (one["wall_s"] - one["barrier_s"] - one["routing_s"]) * scale
    pings = m["ray_ping_s"] if ray else m["ping_s"]
    c1, cn = pings["1"], pings[str(max(int(k) for k in pings))]
    n_ping = max(int(k) for k in pings)
    b = (cn - c1) / (n_ping - 1)  # per worker
    a = c1 - b
    p = (one["barrier_s"] - w * m["ping_s"]["1"]) * scale
    if workers == 1:
        return t0 + q * r + p + w * m["ping_s"]["1"] * scale
    x, u = m["pickle_us"] * 1e-6, m["unpickle_us"] * 1e-6
    return t0 + q * (r + x) + (p + q * u) / workers + w * (a + b * workers)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario")
    ap.add_argument("--replicas", type=int, default=16)
    ap.add_argument("--horizon", type=float, default=3600)
    ap.add_argument("--refresh", type=float, default=1.0)
    ap.add_argument("--router", default="least_outstanding")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--pings", type=int, default=2000)
    ap.add_argument("--servegen", action="store_true",
                    help="the 16-replica ServeGen row of benchmarks.bench_paths (whole-day traces, load 2)")
    ap.add_argument("--ray-ping", action="store_true", help="also time empty windows on Ray actors")
    ap.add_argument("--skip-run", action="store_true", help="only the pings")
    ap.add_argument("--skip-one", action="store_true", help="skip the 1-worker run")
    a = ap.parse_args()
    cluster = f"cluster={{replicas={a.replicas}, router={{name='{a.router}', refresh_s={a.refresh}}}}}"
    load = 1.0
    if a.servegen:
        from benchmarks.core_scenario import servegen_overrides
        sets = [s if not s.startswith("cluster=") else cluster for s in servegen_overrides(a.horizon)]
        load = 2.0
    else:
        sets = [f"horizon_s={a.horizon}", cluster]
    sc = load_scenario(a.scenario, overrides=sets)
    out: dict = {"scenario": a.scenario, "replicas": a.replicas, "horizon_s": a.horizon, "refresh_s": a.refresh,
                 "router": a.router, "load_scale": load}
    spec = parse_cluster(sc)
    if not a.skip_one and not a.skip_run:
        out["workers_1"] = timed_run(sc, InProcess(sc, spec, 1), load)
    if not a.skip_run:
        out[f"workers_{a.workers}"] = timed_run(sc, Processes(sc, spec, a.workers), load)
    out["ping_s"] = {str(w): ping(sc, w, a.pings) for w in (1, a.workers)}
    if a.ray_ping:
        out["ray_ping_s"] = {str(w): ray_ping(sc, w, a.pings) for w in (1, a.workers)}
    out["window_ns"] = int(a.refresh * NS)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
