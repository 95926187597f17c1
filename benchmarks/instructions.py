"""Instruction counts of a simulation, for comparing two versions of the engine on a noisy machine.

Wall and CPU times of the same run move by a few per cent between tries on a shared 2-core
machine (more within an hour), which hides the 0.5-2 % that one change to the event loop is
worth. Instructions executed, counted by valgrind's callgrind with hash randomisation off and
one thread per numerical library, repeat to about 0.1 %: this is how the engine's speed rounds
were measured (benchmarks/results.md).

Run by hand from the repository root (needs ``valgrind`` on the PATH; about 55 s for the default
case, 30 s of the 16-replica ServeGen cluster, of which some 20 s are imports and the workload)::

    python -m benchmarks.instructions                      # this checkout
    python -m benchmarks.instructions --tree ../before     # another checkout, e.g. a git worktree
    python -m benchmarks.instructions --horizon 30 --horizon 60   # the loop alone: the difference

Each ``--tree`` is a checkout whose ``sim`` is imported (``PYTHONPATH``), pure Python. Two
horizons print the difference as the event loop's own count (imports, the workload's fixed part
and start-up cancel). Instructions are not time (a C call that does more per instruction, or a
cache miss, differs), so confirm a kept change with timings too.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# the 16-replica ServeGen cluster of benchmarks.bench_paths, over the first HORIZON seconds
CASES = {
    "servegen16": '''
import sys
from benchmarks.core_scenario import servegen_overrides
from sim import load_scenario
from sim.cluster import simulate_cluster
sc = load_scenario("servegen_multitenant", overrides=servegen_overrides(float(sys.argv[1])))
simulate_cluster(sc, load_scale=2.0, per_replica=False)
''',
    "core": '''
import sys
from benchmarks.core_scenario import SATURATION_RPS_MEASURED, scenario
from sim import scenario_from_dict, simulate
load = 0.75  # (the benchmarks' core case: its horizon is the requests over load x the saturation rate)
simulate(scenario_from_dict(scenario(int(float(sys.argv[1]) * load * SATURATION_RPS_MEASURED["default"]), load=load)))
''',
}


def collected(stderr: str) -> int:
    """The total instruction count callgrind reports on stderr (``Collected : N``)."""
    m = re.search(r"Collected\s*:\s*(\d+)", stderr)
    if m is None:
        raise RuntimeError("callgrind printed no 'Collected' count:\n" + stderr[-2000:])
    return int(m.group(1))


def count(tree: Path, case: str, horizon: float) -> int:
    """Instructions executed by ``case`` over ``horizon`` simulated seconds with ``tree``'s code."""
    # one thread in each numerical library: their worker threads' start-up and spinning under
    # valgrind moved the count of an unchanged tree by 1.2 % between tries; pinned, 0.07 %
    env = dict(os.environ, PYTHONHASHSEED="0", PRIOSIM_PURE_PYTHON="1", OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(tree), str(ROOT)]))
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c", CASES[case],
           f"{horizon:g}"]
    out = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{tree}: the case failed under valgrind:\n" + out.stderr[-2000:])
    return collected(out.stderr)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", action="append", type=Path, help="a checkout to measure (repeatable; default: this one)")
    ap.add_argument("--case", choices=sorted(CASES), default="servegen16")
    ap.add_argument("--horizon", action="append", type=float, help="simulated seconds (repeatable; default 30)")
    args = ap.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("error: valgrind is not on the PATH (expected the callgrind tool: apt install valgrind)", file=sys.stderr)
        return 2
    trees = [t.resolve() for t in args.tree or [ROOT]]
    for t in trees:
        if not (t / "sim" / "__init__.py").is_file():
            print(f"error: --tree {t}: no sim/__init__.py there (expected a priosim checkout)", file=sys.stderr)
            return 2
    horizons = args.horizon or [30.0]
    for t in trees:
        got = [count(t, args.case, h) for h in horizons]
        line = ", ".join(f"{h:g} s: {n:,}" for h, n in zip(horizons, got))
        if len(got) == 2:
            line += f"; the loop from {horizons[0]:g} to {horizons[1]:g} s: {got[1] - got[0]:,}"
        print(f"{t} ({args.case}): {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
