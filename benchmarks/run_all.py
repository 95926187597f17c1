"""The benchmark suite: run by hand, writes benchmarks/results.md.

    python -m benchmarks.run_all [--quick] [--no-paths] [--no-servegen]      (from the repository root)

Cases: the core scenario (Poisson, two classes, lognormal lengths, strict priority with recompute
preemption, default H200 profile) at 10k, 100k and 1M requests, at 0.75 of the saturation rate
measured under its pricing (``benchmarks.core_scenario``); the 10k case again with fast-forward
forced off (the speed-up is the ratio) and with the decode cohort off too; a real-trace replay
(the bundled Azure code + conversation hour). The headline table prices steps as users run them
(the default ``engine.overhead`` preset); a second table pins ``engine.overhead = "none"``. Each
case runs in a fresh process so peak memory (ru_maxrss) is its own, and each is stated as a ratio
to the yardstick (``python -m benchmarks.yardstick``) timed just before and just after it.
Then, unless ``--no-paths``, the commands users wait on (``benchmarks.bench_paths``, with the
sweep throughput on 1 and 2 local workers); without it that section of results.md is kept.

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
kind, n, ff, lazy, pricing = {kind!r}, {n}, {ff}, {lazy}, {pricing!r}
if kind == "core":
    d = scenario(n, load=0.75, fast_forward=ff, pricing=pricing)
    d["engine"]["lazy_batch"] = lazy
    sc = scenario_from_dict(d)
else:
    sc = load_scenario("azure_two_tenants", overrides=["horizon_s=3600.0", "engine.fast_forward=" + ("true" if ff else "false"),
                                                       "engine.lazy_batch=" + ("true" if lazy else "false")])
t0, c0 = time.perf_counter(), time.process_time()
res = simulate(sc)
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
run = res.summary_dict["run"]
print(json.dumps({{"case": kind, "pricing": pricing, "requests": len(res.requests), "fast_forward": ff, "lazy_batch": lazy,
    "build": run["engine_build"], "wall_s": wall, "cpu_s": cpu,
    "engine_events": run["engine_events"], "iterations": run["iterations"],
    "requests_per_wall_s": len(res.requests) / wall, "simulated_s": run["end_s"],
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
'''


def run_case(kind: str, n: int, ff: bool, lazy: bool = True, pure: bool = False, pricing: str = "default") -> dict:
    """One case in a fresh process; ``pure`` forces the pure-Python build (PRIOSIM_PURE_PYTHON);
    ``pricing``: the core scenario's (``benchmarks.core_scenario.PRICINGS``)."""
    code = CASE.format(kind=kind, n=n, ff=ff, lazy=lazy, pricing=pricing)
    env = os.environ | ({"PRIOSIM_PURE_PYTHON": "1"} if pure else {})
    # (from the repository root, where ``python -c`` finds the benchmarks package)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env,
                         cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def yardstick() -> float:
    """Seconds the yardstick reports (``python -m benchmarks.yardstick``, in a fresh process)."""
    out = subprocess.run([sys.executable, "-m", "benchmarks.yardstick"], capture_output=True, text=True, check=True,
                         cwd=ROOT)
    return float(out.stdout.strip().splitlines()[-1])


def bracketed(cases: list[dict]) -> list[dict]:
    """Run ``cases`` (``run_case`` keyword arguments) with the yardstick timed before the first,
    between each two and after the last: each row gets ``yardstick_s``, the mean of the two
    around it (this machine's speed moves within minutes, so a row is held to its neighbours)."""
    rows, ys = [], [yardstick()]
    for case in cases:
        rows.append(run_case(**case))
        ys.append(yardstick())
    for i, r in enumerate(rows):
        r["yardstick_s"] = (ys[i] + ys[i + 1]) / 2
    return rows


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


def case_list(sizes: list[int], pricing: str, compiled: bool) -> list[dict]:
    """The ``run_case`` arguments of one pricing's table: the core sizes, fast-forward off, every
    request every step, the Azure replay (the default table only: its scenario's own pricing),
    then the core cases again on pure Python when the compiled build ran them first."""
    cases = [dict(kind="core", n=n, ff=True, pricing=pricing) for n in sizes]
    cases.append(dict(kind="core", n=10_000, ff=False, pricing=pricing))  # fast-forward off, decode cohort on
    cases.append(dict(kind="core", n=10_000, ff=False, lazy=False, pricing=pricing))  # every request, every step
    if pricing == "default":
        cases.append(dict(kind="trace", n=0, ff=True))
    if compiled:  # the same engine, interpreted: the compiled build's speed-up
        cases += [dict(kind="core", n=n, ff=True, pure=True, pricing=pricing) for n in sizes]
        cases.append(dict(kind="core", n=10_000, ff=False, lazy=False, pure=True, pricing=pricing))
    return cases


def table(rows: list[dict]) -> list[str]:
    """One pricing's markdown table and the speed-ups read from it."""
    md = ["| case | engine build | requests | fast-forward | decode cohort | wall (s) | wall / yardstick | CPU (s) | "
          "engine events | events / request | wall us / request | iterations represented | peak RSS (MB) |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        name = "core (load 0.75)" if r["case"] == "core" else "Azure code+conv replay, 1 h"
        md.append(f"| {name} | {r['build']} | {r['requests']:,} | {'on' if r['fast_forward'] else 'off'} | "
                  f"{'on' if r['lazy_batch'] else 'off'} | {r['wall_s']:.1f} | {r['wall_s'] / r['yardstick_s']:.2f} | "
                  f"{r['cpu_s']:.1f} | {r['engine_events']:,} | {r['engine_events'] / r['requests']:.2f} | "
                  f"{r['wall_s'] / r['requests'] * 1e6:.0f} | {r['iterations']:,} | {r['peak_rss_mb']:.0f} |")
    core = [r for r in rows if r["case"] == "core"]
    on = next(r for r in core if r["requests"] < 20_000 and r["fast_forward"])
    off = next(r for r in core if not r["fast_forward"] and r["lazy_batch"])
    plain = next(r for r in core if not r["fast_forward"] and not r["lazy_batch"])
    ys = [r["yardstick_s"] for r in rows]
    md += ["", f"Yardstick (`python -m benchmarks.yardstick`) around the rows: {min(ys):.2f}-{max(ys):.2f} s; each "
           f"row's ratio is to the mean of the two timed just before and just after it.",
           "", f"Fast-forward speed-up on the 10k case: {off['wall_s'] / on['wall_s']:.2f}x wall, "
           f"{off['engine_events'] / on['engine_events']:.2f}x fewer engine events "
           f"({on['iterations'] / on['engine_events']:.2f} iterations per event). Against stepping every "
           f"request every iteration (fast-forward and decode cohort off): {plain['wall_s'] / on['wall_s']:.2f}x wall."]
    pure = {r["requests"]: r for r in core if r["build"] == "python" and r["fast_forward"]}
    comp = [r for r in core if r["build"] != "python" and r["fast_forward"]]
    if comp and pure:
        md += ["", "Compiled build (mypyc) against pure Python, same cases: " + ", ".join(
            f"{r['requests']:,} requests {pure[r['requests']]['wall_s'] / r['wall_s']:.2f}x"
            for r in comp if r["requests"] in pure) + "."]
    return md


def per_request(tables: dict[str, list[dict]]) -> list[str]:
    """Events and wall time per request of the fast-forwarded core cases at each pricing."""
    md = ["| requests | engine build | " + " | ".join(f"events / request ({p})" for p in tables) + " | "
          + " | ".join(f"wall us / request ({p})" for p in tables) + " |",
          "|---|---|" + "---|" * (2 * len(tables))]
    first = next(iter(tables.values()))
    for r in first:
        if r["case"] != "core" or not r["fast_forward"]:
            continue
        same = [next((x for x in rows if x["case"] == "core" and x["fast_forward"] and x["build"] == r["build"]
                      and x["requests"] == r["requests"]), None) for rows in tables.values()]
        if None in same:
            continue
        md.append(f"| {r['requests']:,} | {r['build']} | "
                  + " | ".join(f"{x['engine_events'] / x['requests']:.2f}" for x in same) + " | "
                  + " | ".join(f"{x['wall_s'] / x['requests'] * 1e6:.0f}" for x in same) + " |")
    return md


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="only the 10k cases, no sweep or path cases (about a minute)")
    ap.add_argument("--no-paths", action="store_true",
                    help="leave out the commands users wait on and the sweeps (bench_paths; minutes): "
                         "results.md keeps that section as it was")
    ap.add_argument("--no-servegen", action="store_true", help="leave out the 16-replica ServeGen row (minutes)")
    args = ap.parse_args()
    from benchmarks.core_scenario import SATURATION_RPS_MEASURED  # (after --help: run as a script, no package)

    quick = args.quick
    sizes = [10_000] if quick else [10_000, 100_000, 1_000_000]
    compiled = ensure_compiled()
    warm_bytecode()
    tables = {p: bracketed(case_list(sizes, p, compiled)) for p in ("default", "none")}
    try:
        model = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor() or platform.machine()
    load = os.getloadavg()[0]
    md = ["# Benchmark results", "",
          f"Machine: {model}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"{time.strftime('%Y-%m-%d %H:%M')} UTC, load average {load:.1f} when the tables were written. "
          f"Produced by `python -m benchmarks.run_all`.", "",
          "## The engine at the default pricing", "",
          f"The core scenario with steps priced as users run them (the default `engine.overhead` preset), at "
          f"0.75 of its saturation rate under that pricing, {SATURATION_RPS_MEASURED['default']:g} requests/s "
          f"(`benchmarks.core_scenario.SATURATION_RPS_MEASURED`; how it was found: the Notes).", ""]
    md += table(tables["default"])
    md += ["", '## The engine with `engine.overhead = "none"`', "",
           f"The same scenario priced by the profile's step times alone, at 0.75 of "
           f"{SATURATION_RPS_MEASURED['none']:g} requests/s, its saturation rate under that pricing.", ""]
    md += table(tables["none"])
    md += ["", "## Per request at each pricing", ""] + per_request(tables)
    out = HERE / "results.md"
    old = out.read_text() if out.exists() else ""
    notes = ""  # a hand-written "## Notes" section at the end survives re-measuring
    if "\n## Notes" in old:
        old, notes = old.split("\n## Notes", 1)
        notes = "\n## Notes" + notes
    from benchmarks.bench_paths import SECTION
    if quick or args.no_paths:  # the section as it was
        paths = SECTION + old.split(SECTION, 1)[1] if SECTION in old else ""
        paths_md = [paths.rstrip("\n")] if paths else []
    else:  # the commands users wait on (bench_paths.py), with the sweeps, against the yardstick
        from benchmarks.bench_paths import measure as measure_paths
        paths_md = measure_paths(servegen=not args.no_servegen)
    md += [""] + paths_md if paths_md else []
    out.write_text("\n".join(md) + "\n" + notes)
    print("\n".join(md))


if __name__ == "__main__":
    main()
