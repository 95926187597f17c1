"""Benchmark: simulate N Poisson requests (lognormal lengths, load ~0.8, default profile).

Run by hand from the repository root: ``python -m benchmarks.bench_core [N ...]`` (default 100000). Reports wall time,
CPU time, engine events, decode iterations represented, simulated requests per wall second and
peak memory (ru_maxrss). Not a test: timings depend on the machine.
"""
from __future__ import annotations

import resource
import sys
import time

from benchmarks.core_scenario import scenario
from sim import scenario_from_dict, simulate


def bench(n: int, load: float = 0.8, fast_forward: bool = True) -> dict:
    sc = scenario_from_dict(scenario(n, load=load, fast_forward=fast_forward))
    t0, c0 = time.perf_counter(), time.process_time()
    res = simulate(sc)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    run = res.summary_dict["run"]
    return {"requests": len(res.requests), "fast_forward": fast_forward, "wall_s": round(wall, 2),
            "cpu_s": round(cpu, 2), "engine_events": run["engine_events"], "iterations": run["iterations"],
            "requests_per_wall_s": round(len(res.requests) / wall),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "simulated_s": round(run["end_s"], 1)}


if __name__ == "__main__":
    sizes = [int(a) for a in sys.argv[1:]] or [100_000]
    for n in sizes:
        print(bench(n), flush=True)
