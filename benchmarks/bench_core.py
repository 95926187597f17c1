"""Benchmark: simulate N Poisson requests (lognormal lengths, load 0.75, default profile, the
default pricing unless ``--pricing none``).

Run by hand from the repository root: ``python -m benchmarks.bench_core [--pricing P] [--batching B] [N ...]``
(default 100000). Reports wall time, events and wall microseconds per request,
CPU time, engine events, decode iterations represented, simulated requests per wall second and
peak memory (ru_maxrss). Not a test: timings depend on the machine.
"""
from __future__ import annotations

import resource
import time

from benchmarks.core_scenario import scenario
from sim import scenario_from_dict, simulate


def bench(n: int, load: float = 0.75, fast_forward: bool = True, pricing: str = "default",
          batching: str = "mixed") -> dict:
    sc = scenario_from_dict(scenario(n, load=load, fast_forward=fast_forward, pricing=pricing, batching=batching))
    t0, c0 = time.perf_counter(), time.process_time()
    res = simulate(sc)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    run = res.summary_dict["run"]
    return {"requests": len(res.requests), "pricing": pricing, "fast_forward": fast_forward, "wall_s": round(wall, 2),
            "cpu_s": round(cpu, 2), "engine_events": run["engine_events"], "iterations": run["iterations"],
            "requests_per_wall_s": round(len(res.requests) / wall),
            "events_per_request": round(run["engine_events"] / len(res.requests), 3),
            "wall_us_per_request": round(wall / len(res.requests) * 1e6, 1),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "simulated_s": round(run["end_s"], 1)}


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sizes", nargs="*", type=int, default=[100_000], help="requests per run")
    ap.add_argument("--pricing", choices=("default", "none"), default="default",
                    help="the core scenario's pricing (benchmarks.core_scenario)")
    ap.add_argument("--batching", choices=("mixed", "prefill_first"), default="mixed",
                    help="engine.batching (prefill_first: prompts in steps of their own, SGLang's default)")
    args = ap.parse_args()
    for n in args.sizes:
        print(bench(n, pricing=args.pricing, batching=args.batching), flush=True)
