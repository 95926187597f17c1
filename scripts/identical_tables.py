"""Prove a change left behaviour alone: run the same scenarios with another commit's code and with
this checkout's, and say, per run, whether the request table, the time series and the summary
are byte-identical.

    python -m scripts.identical_tables --against COMMIT [--set KEY=VALUE ...] [--only NAME ...]
    python -m scripts.identical_tables --against COMMIT --fuzz KIND [--start S] [--trials N]

Run from the repository root. COMMIT is checked out into a temporary git worktree (removed
afterwards); each side runs in its own Python process from its own root, so it imports its own
``sim``, ``policies`` and ``workloads`` and reads its own bundled data. The runs: every scenario
shipped here (``workloads/scenarios/*.toml``; ``fleet_day``, a 200-replica day, over its first
180 s only), ``diurnal_two_class`` on a 3-replica cluster, and ``chat_vs_batch`` under each
preemption mode (off, recompute, swap, auto). A scenario shipped here but not at COMMIT is
reported as new and not compared. ``--set`` overrides
apply to every run on both sides (the same pricing there and here, e.g.
``--set engine.overhead='"none"'``). Tables are compared as CSV text (sha256; the summary table
with its index), as the project's before/after checks always have.

``--fuzz KIND`` (repeatable: ``cluster``, ``replica``, ``prefix``, ``join``) runs, instead, the differential
fuzz's random small scenarios (:func:`scripts.exactness_fuzz.draw`; trial ``i`` from seed ``i``,
``--trials`` of them from ``--start``) on both sides, as shipped (fast paths on): they reach what
the shipped scenarios do not (every policy, router, preemption mode and victim rule, caps,
overlap, speculation, closed-loop users, gates, prefix caching), so a refactor of the engine is
held to the same bytes there too. The scenarios are drawn here and handed to both sides, so
COMMIT's own fuzz does not matter; a draw COMMIT's schema refuses shows as FAILED there.

Exit status 0 when every run compared is identical, 1 when any differs or fails on either side,
2 when COMMIT cannot be checked out.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from scripts.exactness_fuzz import KINDS, draw
from workloads.library import shipped_scenarios

ROOT = Path(__file__).resolve().parent.parent
TABLES = ("requests", "timeseries", "summary")
#: shipped scenarios run shorter than shipped (hours of simulation as they are), before ``--set``
SHORTER = {"fleet_day": ["horizon_s=180"]}  # (the night's batch jobs start at 150 s)
#: a scenario COMMIT does not ship: compared once both sides have it
NEW_HERE = "no such scenario file"
#: runs beyond the shipped scenarios: key -> (scenario, overrides)
EXTRA = {
    "cluster3": ("diurnal_two_class", ["cluster={replicas=3}"]),
    **{f"preemption_{m}": ("chat_vs_batch", [f'engine.preemption="{m}"']) for m in ("off", "recompute", "swap", "auto")},
}

# Runs in each checkout's root (stdin: the runs as JSON); one JSON line per run. A run's scenario
# is a shipped name (with overrides) or a whole scenario as a dict (a fuzz draw). A cluster runs
# through simulate_cluster where the checkout has it (older code: simulate() ran one replica).
RUNNER = r'''
import hashlib, json, sys, warnings
from pathlib import Path
warnings.filterwarnings("ignore")
import sim
from sim import load_scenario, scenario_from_dict, simulate
if Path(sim.__file__).resolve().parents[1] != Path.cwd().resolve():
    sys.exit(f"imported sim from {sim.__file__}, not from {Path.cwd()}")
try:
    from sim.cluster import simulate_cluster
except ImportError:
    simulate_cluster = None
digest = lambda text: hashlib.sha256(text.encode()).hexdigest()
for key, name, sets in json.loads(sys.stdin.read()):
    try:
        sc = scenario_from_dict(name) if isinstance(name, dict) else load_scenario(name, overrides=sets)
        res = simulate_cluster(sc) if getattr(sc, "cluster", None) and simulate_cluster else simulate(sc)
        out = {"requests": digest(res.requests.to_csv(index=False)),
               "timeseries": digest(res.timeseries.to_csv(index=False)), "summary": digest(res.summary.to_csv())}
    except Exception as exc:
        out = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    print(json.dumps({"run": key, **out}), flush=True)
'''


def runs(names: list[str] | None, sets: list[str]) -> list[tuple[str, str, list[str]]]:
    """(key, scenario, overrides) of every run: the shipped scenarios and EXTRA, or only ``names``
    (scenario names or EXTRA keys); ``sets`` is appended to every run's overrides."""
    shipped = shipped_scenarios()
    table = {n: (n, list(SHORTER.get(n, []))) for n in shipped} | EXTRA
    unknown = [n for n in names or [] if n not in table]
    if unknown:
        raise ValueError(f"--only: unknown run {unknown[0]!r} (expected one of {', '.join(table)})")
    return [(k, table[k][0], table[k][1] + list(sets)) for k in (names or table)]


def fuzz_runs(kinds: list[str], first: int, trials: int) -> list[tuple[str, dict, list[str]]]:
    """(key, scenario dict, no overrides) of the fuzz's draws: ``trials`` of each kind from seed
    ``first`` (key ``fuzz-KIND-i``; ``python -m scripts.exactness_fuzz --kind KIND --start i
    --trials 1`` runs the same draw fast against stepped)."""
    return [(f"fuzz-{kind}-{i}", draw(kind, np.random.default_rng(i)), [])
            for kind in kinds for i in range(first, first + trials)]


def start(root: Path, todo: list[tuple[str, Any, list[str]]]) -> subprocess.Popen:
    """The runs in a fresh process from ``root`` (so it imports that checkout's code)."""
    proc = subprocess.Popen([sys.executable, "-c", RUNNER], cwd=root, text=True, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(todo))  # (on stdin: a hundred drawn scenarios overflow an argument list)
    proc.stdin.close()
    proc.stdin = None  # (read in full before the runs start; communicate() has nothing to send)
    return proc


def collect(proc: subprocess.Popen) -> dict[str, dict]:
    """Run key -> digests (or ``{"error": ...}``) from a finished :func:`start`."""
    out, err = proc.communicate()
    results = {}
    for line in out.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            results[row.pop("run")] = row
    if proc.returncode != 0 and not results:
        results["*"] = {"error": (err.strip().splitlines() or ["exit status %d" % proc.returncode])[-1]}
    return results


def compare(keys: list[str], here: dict[str, dict], there: dict[str, dict]) -> tuple[list[str], int]:
    """One line per run (each table: identical / DIFFERENT) and how many runs are not identical
    (a scenario only this side ships is neither: its line says so)."""
    lines, bad = [], 0
    for k in keys:
        a, b = here.get(k, here.get("*", {"error": "no result"})), there.get(k, there.get("*", {"error": "no result"}))
        if "error" not in a and NEW_HERE in b.get("error", ""):
            lines.append(f"{k:24s} new here (not shipped there): not compared")
            continue
        if "error" in a or "error" in b:
            bad += 1
            side = "here" if "error" in a else "there"
            lines.append(f"{k:24s} FAILED {side}: {(a if 'error' in a else b)['error']}")
            continue
        same = {t: a[t] == b[t] for t in TABLES}
        bad += not all(same.values())
        lines.append(f"{k:24s} " + "  ".join(f"{t} {'identical' if same[t] else 'DIFFERENT'}" for t in TABLES)
                     + f"  ({a['requests'][:12]})")
    return lines, bad


@contextmanager
def checkout(commit: str):
    """``commit`` checked out (detached) in a temporary git worktree, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="priosim-against-") as d:
        path = Path(d) / "tree"
        done = subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(path), commit], cwd=ROOT,
                              capture_output=True, text=True)
        if done.returncode != 0:
            msg = (done.stderr.strip().splitlines() or ["git worktree add failed"])[-1]
            raise ValueError(f"--against {commit}: cannot check it out ({msg})")
        try:
            yield path
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT, capture_output=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scripts.identical_tables", description=__doc__.splitlines()[0])
    ap.add_argument("--against", required=True, metavar="COMMIT", help="the commit to compare with (e.g. main, HEAD~1)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="override for every run on both sides (repeatable)")
    ap.add_argument("--only", nargs="+", default=None, metavar="RUN", help="only these runs (scenario names, "
                    f"{', '.join(EXTRA)})")
    ap.add_argument("--fuzz", action="append", choices=KINDS, metavar="KIND",
                    help=f"the fuzz's random scenarios of this kind instead ({', '.join(KINDS)}; repeatable)")
    ap.add_argument("--start", type=int, default=0, help="with --fuzz: the first draw's seed (default 0)")
    ap.add_argument("--trials", type=int, default=30, help="with --fuzz: draws of each kind (default 30)")
    args = ap.parse_args(argv)
    try:
        if args.fuzz and (args.sets or args.only):
            raise ValueError("--fuzz draws whole scenarios: --set and --only apply to the shipped runs only")
        if args.trials < 1:
            raise ValueError(f"--trials {args.trials}: expected at least 1")
        todo = fuzz_runs(args.fuzz, args.start, args.trials) if args.fuzz else runs(args.only, args.sets)
        with checkout(args.against) as there_root:
            print(f"{len(todo)} runs, at {args.against} and here (both at once) ...", flush=True)
            there, here = start(there_root, todo), start(ROOT, todo)
            there_res, here_res = collect(there), collect(here)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    lines, bad = compare([k for k, _, _ in todo], here_res, there_res)
    new = sum(ln.endswith("new here (not shipped there): not compared") for ln in lines)
    print("\n".join(lines))
    print(f"{len(todo) - new - bad} of {len(todo) - new} runs byte-identical" + ("" if not bad else f"; {bad} not")
          + (f"; {new} new here, not compared" if new else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
