"""The benchmark suite: run by hand, writes benchmarks/results.md.

    python -m benchmarks.run_all [--quick] [--no-servegen]      (from the repository root)

Cases: the core scenario (Poisson, two classes, lognormal lengths, load 0.75 of the measured
saturation rate, strict priority with recompute preemption, default H200 profile) at 10k, 100k
and 1M requests; the 10k case again with fast-forward forced off (the speed-up is the ratio);
a real-trace replay (the bundled Azure code + conversation hour); and sweep throughput for a
24-cell sweep of 10k-request runs with 1 and 2 local workers (pure Python, measured once for
this table and the "Where users wait" one). Each case runs in a fresh process so peak memory
(ru_maxrss) is its own.

The cases run on the compiled engine (``priosim native build``; built first if missing or stale,
which needs ``pip install -e ".[native]"``), and the core cases again on pure Python
(``PRIOSIM_PURE_PYTHON=1``) for the ratio. Without mypyc, everything runs on pure Python.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

CASE = r'''
import json, resource, sys, time
from benchmarks.core_scenario import scenario
from sim import scenario_from_dict, load_scenario, simulate
kind, n, ff, lazy = {kind!r}, {n}, {ff}, {lazy}
if kind == "core":
    d = scenario(n, load=0.75, fast_forward=ff)
    d["engine"]["lazy_batch"] = lazy
    sc = scenario_from_dict(d)
else:
    sc = load_scenario("azure_two_tenants", overrides=["horizon_s=3600.0", "engine.fast_forward=" + ("true" if ff else "false"),
                                                       "engine.lazy_batch=" + ("true" if lazy else "false")])
t0, c0 = time.perf_counter(), time.process_time()
res = simulate(sc)
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
run = res.summary_dict["run"]
print(json.dumps({{"case": kind, "requests": len(res.requests), "fast_forward": ff, "lazy_batch": lazy,
    "build": run["engine_build"], "wall_s": wall, "cpu_s": cpu,
    "engine_events": run["engine_events"], "iterations": run["iterations"],
    "requests_per_wall_s": len(res.requests) / wall, "simulated_s": run["end_s"],
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
'''


def run_case(kind: str, n: int, ff: bool, lazy: bool = True, pure: bool = False) -> dict:
    """One case in a fresh process; ``pure`` forces the pure-Python build (PRIOSIM_PURE_PYTHON)."""
    code = CASE.format(kind=kind, n=n, ff=ff, lazy=lazy)
    env = os.environ | ({"PRIOSIM_PURE_PYTHON": "1"} if pure else {})
    # (from the repository root, where ``python -c`` finds the benchmarks package)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env,
                         cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def sweep_rate(workers: int, n: int) -> dict:
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        scen = Path(d) / "core.toml"
        from benchmarks.core_scenario import scenario
        sc = scenario(n, load=0.75)
        scen.write_text(_toml(sc))
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "sim.cli", "sweep", str(scen), "--policies", "fcfs,priority,wfq",
                        "--loads", "0.5,0.6,0.7,0.75", "--seeds", "2", "--workers", str(workers),
                        "--out", str(Path(d) / "out"), "--no-plots", "--no-progress"],
                       check=True, capture_output=True, cwd=ROOT)
        wall = time.perf_counter() - t0
        info = json.loads((Path(d) / "out" / "sweep.json").read_text())
    # outside_s: the command's time outside its runs (start-up, validating the grid, the summary)
    # runs_s: the runs' own wall seconds summed (two at a time they share the host's two cores)
    times = info.get("time_s", {})
    return {"workers": workers, "runs": 24, "wall_s": wall, "runs_per_min": 24 / wall * 60,
            "outside_s": wall - info["wall_s"], "busy_share": times.get("busy_share"), "runs_s": times.get("wall")}


def _toml(d: dict, prefix: str = "") -> str:
    def val(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {val(x)}" for k, x in v.items()) + " }"
        return repr(v)
    lines = [f"{k} = {val(v)}" for k, v in d.items() if not isinstance(v, (dict, list))]
    for k, v in d.items():
        if isinstance(v, dict):
            lines.append(f"\n[{k}]")
            lines += [f"{kk} = {val(vv)}" for kk, vv in v.items()]
        elif isinstance(v, list):
            for item in v:
                lines.append(f"\n[[{k}]]")
                lines += [f"{kk} = {val(vv)}" for kk, vv in item.items()]
    return "\n".join(lines) + "\n"


PACKAGES = ("sim", "policies", "workloads", "plumbing", "calibrate", "benchmarks")


def warm_bytecode() -> None:
    """Write the project's bytecode (``__pycache__``) before anything is timed, as a user's
    machine has it from the first command on: Python caches each module it compiles, and pip
    compiles an installed package. Where ``PYTHONDONTWRITEBYTECODE`` is set (this workplace sets
    it), every process would otherwise compile the project's modules from source again (54 for
    ``import sim.cli`` alone): about 0.09 s of each command's start-up, which no user pays twice."""
    import compileall

    for pkg in PACKAGES:
        compileall.compile_dir(str(ROOT / pkg), quiet=1)


def ensure_compiled() -> bool:
    """Build the compiled engine (sim.native) if it is missing or stale; False if it cannot be."""
    from sim import native
    if all(v == "compiled" for v in native.status().values()):
        return True
    try:
        print("building the compiled engine (priosim native build) ...", file=sys.stderr)
        native.build()
        return True
    except (RuntimeError, OSError) as e:
        print(f"no compiled engine ({e}); measuring pure Python only", file=sys.stderr)
        return False


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="only the 10k cases, no sweep cases (a few seconds)")
    ap.add_argument("--no-servegen", action="store_true", help="leave out the 16-replica ServeGen row (minutes)")
    args = ap.parse_args()
    quick = args.quick
    sizes = [10_000] if quick else [10_000, 100_000, 1_000_000]
    compiled = ensure_compiled()
    warm_bytecode()
    rows = [run_case("core", n, True) for n in sizes]
    rows.append(run_case("core", 10_000, False))  # fast-forward off, decode cohort on
    rows.append(run_case("core", 10_000, False, lazy=False))  # every request, every step
    rows.append(run_case("trace", 0, True))
    if compiled:  # the same engine, interpreted: the compiled build's speed-up
        rows += [run_case("core", n, True, pure=True) for n in sizes]
        rows.append(run_case("core", 10_000, False, lazy=False, pure=True))
    # the sweep pair is measured once, pure Python (the figure "Where users wait" reports too)
    from benchmarks.bench_paths import sweep_pair
    sweeps = [] if quick else sweep_pair()
    cpu = platform.processor() or platform.machine()
    try:
        model = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        model = cpu
    md = ["# Benchmark results", "",
          f"Machine: {model}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"date {time.strftime('%Y-%m-%d')}. Produced by `python -m benchmarks.run_all`.", "",
          "| case | engine build | requests | fast-forward | decode cohort | wall (s) | CPU (s) | engine events | iterations represented | requests / wall s | peak RSS (MB) |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        name = "core (load 0.75)" if r["case"] == "core" else "Azure code+conv replay, 1 h"
        md.append(f"| {name} | {r['build']} | {r['requests']:,} | {'on' if r['fast_forward'] else 'off'} | "
                  f"{'on' if r['lazy_batch'] else 'off'} | {r['wall_s']:.1f} | "
                  f"{r['cpu_s']:.1f} | {r['engine_events']:,} | {r['iterations']:,} | {r['requests_per_wall_s']:,.0f} | "
                  f"{r['peak_rss_mb']:.0f} |")
    on = next(r for r in rows if r["case"] == "core" and r["requests"] < 20_000 and r["fast_forward"])
    off = next(r for r in rows if not r["fast_forward"] and r["lazy_batch"])
    plain = next(r for r in rows if not r["fast_forward"] and not r["lazy_batch"])
    pure = {r["requests"]: r for r in rows if r["build"] == "python" and r["case"] == "core" and r["fast_forward"]}
    md += ["", f"Fast-forward speed-up on the 10k case: {off['wall_s'] / on['wall_s']:.2f}x wall, "
           f"{off['engine_events'] / on['engine_events']:.2f}x fewer engine events "
           f"({on['iterations'] / on['engine_events']:.2f} iterations per event). Against stepping every "
           f"request every iteration (fast-forward and decode cohort off): {plain['wall_s'] / on['wall_s']:.2f}x wall."]
    if compiled:
        md += ["", "Compiled build (mypyc) against pure Python, same cases: " + ", ".join(
            f"{n:,} requests {pure[r['requests']]['wall_s'] / r['wall_s']:.2f}x"
            for n, r in zip(sizes, rows) if r["requests"] in pure) + "."]
    if sweeps:
        eff = sweeps[1]["runs_per_min"] / (2 * sweeps[0]["runs_per_min"])
        md += ["", "| sweep (24 cells of 10k-request runs, pure Python) | wall (s) | runs / min |", "|---|---|---|"]
        md += [f"| {s['workers']} worker(s) | {s['wall_s']:.1f} | {s['runs_per_min']:.1f} |" for s in sweeps]
        md += ["", f"Parallel efficiency with 2 workers: {eff:.2f}."]
    if not quick:  # the commands users wait on (bench_paths.py), against the yardstick
        from benchmarks.bench_paths import measure as measure_paths
        md += [""] + measure_paths(servegen=not args.no_servegen, sweeps=sweeps)
    out = HERE / "results.md"
    notes = ""  # a hand-written "## Notes" section at the end survives re-measuring
    if out.exists() and "\n## Notes" in out.read_text():
        notes = "\n## Notes" + out.read_text().split("\n## Notes", 1)[1]
    out.write_text("\n".join(md) + "\n" + notes)
    print("\n".join(md))


if __name__ == "__main__":
    main()
