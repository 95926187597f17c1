"""Where users wait: the commands people run to answer capacity and fairness questions, timed
on pure Python against a yardstick measured in the same run.

    python -m benchmarks.bench_paths [--no-servegen]      (from the repository root)

This machine's speed drifts by 20-30 % within an hour (more when it is shared), so every row is
reported as a ratio to the yardstick (``python -m benchmarks.yardstick``, the shared one; until
2026-12-06 the core 10k-request case with fast-forward and the decode cohort off), measured before
and after the rows (their mean); the minute-long ServeGen row has a yardstick of its own before and
after it. Each
command runs in a fresh process with ``PRIOSIM_PURE_PYTHON=1``; "wall" is the whole command as
a user waits for it (start-up, workload, engine, writing results), "engine" the simulation alone
where the run reports it. The project's bytecode is written first
(``run_all.warm_bytecode``), as a user's machine has it after the first command.

The 16-replica, one-hour ServeGen row (815k requests, the run in docs/cluster.md) takes minutes;
``--no-servegen`` leaves it out. The table replaces the "Where users wait" section of
benchmarks/results.md (``run_all.py`` calls :func:`measure` too).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SECTION = "## Where users wait"

SINGLE = r'''
import json, sys, time
from sim import load_scenario, simulate
sc = load_scenario({name!r}, overrides={over!r})
t0 = time.perf_counter()
res = simulate(sc, load_scale={load})
wall = time.perf_counter() - t0
print(json.dumps({{"requests": len(res.requests), "engine_s": wall,
                   "engine_events": res.summary_dict["run"]["engine_events"]}}))
'''

SERVEGEN = r'''
import json, time
from sim import load_scenario
from sim.cluster import simulate_cluster
from benchmarks.core_scenario import servegen_overrides
sc = load_scenario("servegen_multitenant", overrides=servegen_overrides({horizon}, pinned={pinned}))
t0 = time.perf_counter()
res = simulate_cluster(sc, load_scale=2.0, per_replica=False)
wall = time.perf_counter() - t0
print(json.dumps({{"requests": len(res.requests), "engine_s": wall,
                   "engine_events": res.summary_dict["run"]["engine_events"],
                   "preemptions": int(res.requests.preemptions.sum())}}))
'''


def _env() -> dict:
    return os.environ | {"PRIOSIM_PURE_PYTHON": "1"}


def _timed(cmd: list[str], cwd: Path) -> tuple[float, str]:
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=cwd)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    return wall, out.stdout


def _cli(args: list[str], tmp: Path) -> dict:
    """``priosim ARGS --out TMP/x``: wall, and the engine's numbers from summary.json (runs)."""
    out = tmp / f"out{len(list(tmp.iterdir()))}"
    wall, _ = _timed([sys.executable, "-m", "sim.cli", *args, "--out", str(out)], ROOT)
    row = {"wall_s": wall}
    summ = out / "summary.json"
    if summ.exists():  # a run: summary.json has its events, perf.json the simulation's wall time
        s = json.loads(summ.read_text())
        row.update(engine_s=json.loads((out / "perf.json").read_text())["wall_s"],
                   engine_events=s["run"]["engine_events"],
                   requests=sum(c["arrived"] for c in s["classes"].values()))
    return row


def _py(code: str) -> dict:
    wall, out = _timed([sys.executable, "-c", code], ROOT)
    return {"wall_s": wall, **json.loads(out.strip().splitlines()[-1])}


def yardstick() -> float:
    from benchmarks.run_all import yardstick as shared
    return shared()


def sweep_pair(repeats: int = 3, n: int = 10_000) -> list[dict]:
    """The 24-run sweep of ``n``-request runs on 1 and on 2 local workers, pure Python: each
    ``repeats`` times, alternating, the quickest of each kept (``benchmarks.run_all.sweep_rate``
    rows): on a shared machine a single pair measures the other jobs' load as much as ours."""
    from benchmarks.run_all import sweep_rate
    before = os.environ.get("PRIOSIM_PURE_PYTHON")
    os.environ["PRIOSIM_PURE_PYTHON"] = "1"  # the sweep's processes inherit it
    try:
        tries = [[sweep_rate(w, n) for w in (1, 2)] for _ in range(repeats)]
    finally:
        if before is None:
            del os.environ["PRIOSIM_PURE_PYTHON"]
        else:
            os.environ["PRIOSIM_PURE_PYTHON"] = before
    return [min((t[i] for t in tries), key=lambda r: r["wall_s"]) | {"tries": repeats, "n": n} for i in range(2)]


# The sweep grid again with runs five times as long (1.3-2.5 s each): the command's start-up
# (imports, validating the grid, the seed check: 0.6-1.0 s, the same in every process) is then
# a smaller share, as in most sweeps people run, whose runs take seconds to minutes.
LONG_SWEEP_REQUESTS = 50_000


# The ServeGen cluster at its own preset (docs/cluster.md's run) over this many seconds: the
# preemption path (no target: it shows what a KV-bound replica costs per request).
PREEMPTING_S = 600


def host_pair(n: int = 4_000, repeats: int = 2) -> dict:
    """What the host's two cores give one engine loop each: the core ``n``-request case (the
    yardstick's, fast-forward off) in one process alone and in two processes at once, ``repeats``
    times alternating, the quickest of each kept. ``efficiency`` (alone over together: 1.0 when
    the cores do not slow each other) bounds a sweep's parallel efficiency on this host whatever
    the sweep does; on a VM whose two vCPUs share a physical core or its caches it is well below 1."""
    from benchmarks.run_all import CASE
    code = CASE.format(kind="core", n=n, ff=False, lazy=False, pricing="default")

    def start():
        return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=_env(),
                                cwd=ROOT)

    def wall(p) -> float:
        out, _ = p.communicate()
        if p.returncode != 0:
            raise RuntimeError("the host pair's engine loop failed")
        return json.loads(out.strip().splitlines()[-1])["wall_s"]

    alone, together = [], []
    for _ in range(repeats):
        alone.append(wall(start()))
        both = [start(), start()]
        together.append(max(wall(p) for p in both))
    return {"alone_s": min(alone), "together_s": min(together), "efficiency": min(alone) / min(together),
            "tries": repeats}


def sweep_efficiency(pair: list[dict]) -> float:
    """Parallel efficiency of a :func:`sweep_pair`: the 1-worker wall over twice the 2-worker one."""
    return pair[0]["wall_s"] / (2 * pair[1]["wall_s"])


def servegen_row() -> dict:
    """The ServeGen row, bracketed by a yardstick of its own just before and just after it
    (``yardstick_s``: their mean, ``yardsticks_s``: both): the row takes a minute or more, over
    which this machine's speed moves, and it sits near its target (20 yardsticks), so its ratio
    is taken to the machine's speed while it ran rather than to the table's two yardsticks,
    measured minutes away."""
    before = yardstick()
    row = _py(SERVEGEN.format(horizon=3600, pinned=True))
    after = yardstick()
    return row | {"yardstick_s": (before + after) / 2, "yardsticks_s": (before, after)}


def contention(pair: list[dict]) -> float:
    """How much longer a :func:`sweep_pair`'s runs took two at a time than one at a time: the
    2-worker sweep's summed run seconds over the 1-worker sweep's (1.0: the cores did not slow
    each other)."""
    return pair[1]["runs_s"] / pair[0]["runs_s"]


def run_seconds(pair: list[dict]) -> float:
    """A run's mean wall seconds in a :func:`sweep_pair`: the 1-worker sweep's time inside its runs
    over its number of runs."""
    return (pair[0]["wall_s"] - pair[0]["outside_s"]) / pair[0]["runs"]


def measure(servegen: bool = True, sweeps: list[dict] | None = None) -> list[str]:
    """Measure the rows; returns the markdown section. ``sweeps``: :func:`sweep_pair`'s rows when
    the caller measured them already (``run_all.py``), else measured here."""
    rows: list[tuple[str, dict]] = []
    y0 = yardstick()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        rows.append(("`priosim run diurnal_two_class --set 'cluster={replicas=5}' --no-plots`",
                     _cli(["run", "diurnal_two_class", "--set", "cluster={replicas=5}", "--no-plots", "--no-progress"], tmp)))
        rows.append(("the same per-replica load on one replica (`simulate(diurnal_two_class, load_scale=0.2)`)",
                     _py(SINGLE.format(name="diurnal_two_class", over=[], load=0.2))))
        if servegen:
            rows.append(("16 replicas x 1 h of ServeGen multi-tenant traffic (docs/cluster.md)",
                         servegen_row()))
        rows.append((f"16 replicas x {PREEMPTING_S // 60} min of ServeGen at the scenario's own overhead preset "
                     "(queues build; waiters preempt running requests)",
                     _py(SERVEGEN.format(horizon=PREEMPTING_S, pinned=False))))
        rows.append(("`priosim capacity diurnal_two_class --designs shared,partitioned`",
                     _cli(["capacity", "diurnal_two_class", "--designs", "shared,partitioned", "--no-plots",
                           "--workers", "2"], tmp)))
        rows.append(("... with `--set classes.1.max_prefill_tokens_per_step=256`",
                     _cli(["capacity", "diurnal_two_class", "--designs", "shared,partitioned", "--no-plots",
                           "--workers", "2", "--set", "classes.1.max_prefill_tokens_per_step=256"], tmp)))
        rows.append(("`priosim run tenant_flood --no-plots`",
                     _cli(["run", "tenant_flood", "--no-plots", "--no-progress"], tmp)))
        rows.append(("`priosim run chat_vs_batch --no-plots`", _cli(["run", "chat_vs_batch", "--no-plots", "--no-progress"], tmp)))
        rows.append(("... with `--set classes.1.max_prefill_tokens_per_step=512`",
                     _cli(["run", "chat_vs_batch", "--no-plots", "--no-progress", "--set",
                           "classes.1.max_prefill_tokens_per_step=512"], tmp)))
    if sweeps is None:
        sweeps = sweep_pair()
    host = host_pair()
    long_sweeps = sweep_pair(repeats=1, n=LONG_SWEEP_REQUESTS)
    y1 = yardstick()
    y = (y0 + y1) / 2
    md = [SECTION, "",
          f"Pure Python, {time.strftime('%Y-%m-%d %H:%M')}, produced by `python -m benchmarks.bench_paths`. "
          f"Yardstick (`python -m benchmarks.yardstick`): {y0:.2f} s before the rows, "
          f"{y1:.2f} s after; ratios are to their mean, {y:.2f} s.", "",
          "| what a user runs | requests | wall (s) | wall / yardstick | engine (s) | engine / yardstick | engine events per request |",
          "|---|---|---|---|---|---|---|"]
    for name, r in rows:
        n = r.get("requests")
        ev = r.get("engine_events")
        eng = r.get("engine_s")
        ry = r.get("yardstick_s", y)  # (the ServeGen row: its own bracket, servegen_row)
        md.append(f"| {name} | {f'{n:,}' if n else '-'} | {r['wall_s']:.1f} | {r['wall_s'] / ry:.2f} | "
                  f"{f'{eng:.1f}' if eng is not None else '-'} | {f'{eng / ry:.2f}' if eng is not None else '-'} | "
                  f"{f'{ev / n:.2f}' if ev and n else '-'} |")
    for sw in sweeps + long_sweeps:
        k = f"{sw.get('n', 10_000) // 1000}k"
        md.append(f"| a {sw['runs']}-run sweep of {k}-request runs (`priosim sweep`), {sw['workers']} local worker(s) | "
                  f"{sw['runs']} x {k} | {sw['wall_s']:.1f} | {sw['wall_s'] / y:.2f} | - | - | - |")
    md += ["", f"Sweep parallel efficiency with 2 workers: {sweep_efficiency(sweeps):.2f} with 10k-request runs "
           f"(about {run_seconds(sweeps):.2f} s each; the quickest of {sweeps[0].get('tries', 1)} alternating tries "
           f"of each; on a machine whose 2 cores are shared with other jobs, this measures their load as much as "
           f"ours), "
           f"{sweep_efficiency(long_sweeps):.2f} with {LONG_SWEEP_REQUESTS // 1000}k-request runs (about "
           f"{run_seconds(long_sweeps):.1f} s each, one try). "
           f"Outside the runs (start-up, validating the grid, the seed check, the summary): "
           f"{sweeps[0]['outside_s']:.2f} s with 1 worker, {sweeps[1]['outside_s']:.2f} s with 2, whose workers "
           f"were busy {sweeps[1]['busy_share'] or float('nan'):.0%} of the runs' wall time "
           f"({long_sweeps[1]['busy_share'] or float('nan'):.0%} with the longer runs). "
           f"The runs themselves took {contention(sweeps):.2f}x as long two at a time as one at a time; "
           f"the host's two cores, given the yardstick's engine loop in two processes at once, ran each at "
           f"{host['efficiency']:.2f} of its speed alone ({host['alone_s']:.2f} s alone, {host['together_s']:.2f} s "
           f"together, the quickest of {host['tries']} alternating tries): what the host gives any two processes bounds the "
           f"sweep's efficiency here, whatever the sweep does."]
    sg = [r for _, r in rows if "yardsticks_s" in r]
    if sg:
        a, b = sg[0]["yardsticks_s"]
        md += ["", f"The ServeGen row is a ratio to the yardsticks measured just before and after it ({a:.2f} s and "
               f"{b:.2f} s, mean {sg[0]['yardstick_s']:.2f} s); to the table's: wall {sg[0]['wall_s'] / y:.2f}, "
               f"engine {sg[0]['engine_s'] / y:.2f}."]
    pre = [r for _, r in rows if r.get("preemptions")]
    if pre:
        md += ["", f"The ServeGen run at its own preset preempted {pre[0]['preemptions']:,} times "
               f"({pre[0]['preemptions'] / pre[0]['requests']:.2f} per request)."]
    cl, one = rows[0][1], rows[1][1]
    if cl.get("requests") and one.get("requests"):
        md += ["", f"Requests per engine second: 5-replica cluster {cl['requests'] / cl['engine_s']:,.0f}, one replica "
               f"at the same per-replica load {one['requests'] / one['engine_s']:,.0f} "
               f"(ratio {one['requests'] / one['engine_s'] / (cl['requests'] / cl['engine_s']):.2f})."]
    return md


def write_section(md: list[str]) -> None:
    """Replace (or add, before the hand-written notes) the section in results.md."""
    out = HERE / "results.md"
    text = out.read_text() if out.exists() else "# Benchmark results\n"
    block = "\n".join(md) + "\n"
    if SECTION in text:
        head, rest = text.split(SECTION, 1)
        tail = rest.split("\n## ", 1)
        text = head + block + ("\n## " + tail[1] if len(tail) > 1 else "")
    elif "\n## Notes" in text:
        head, notes = text.split("\n## Notes", 1)
        text = head.rstrip("\n") + "\n\n" + block + "\n## Notes" + notes
    else:
        text = text.rstrip("\n") + "\n\n" + block
    out.write_text(text)


def main() -> None:
    from benchmarks.run_all import warm_bytecode
    warm_bytecode()
    md = measure(servegen="--no-servegen" not in sys.argv)
    write_section(md)
    print("\n".join(md))


if __name__ == "__main__":
    main()
