"""Run every shipped scenario with two checkouts of priosim and compare the request tables.

    python scripts/compare_requests.py OTHER_CHECKOUT [--out DIR] [--only NAME ...]

Each scenario runs in a subprocess from each checkout's root (``python -m sim.cli run NAME
--no-plots``); the two ``requests.parquet`` tables are compared as CSV bytes. Scenarios whose
data a checkout lacks are reported as skipped. Exit status 1 when any table differs.
"""
from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent.parent


def run_one(root: Path, name: str, out: Path) -> str | None:
    """The request table's CSV digest, or None when the run failed (message printed)."""
    done = subprocess.run([sys.executable, "-m", "sim.cli", "run", name, "--no-plots", "--no-progress",
                           "--out", str(out)], cwd=root, capture_output=True, text=True)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        print(f"  {root}: {name}: exit {done.returncode}: {lines[-1] if lines else ''}")
        return None
    csv = pd.read_parquet(out / "requests.parquet").to_csv(index=False).encode()
    return hashlib.sha256(csv).hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("other", type=Path, help="the other checkout's root (e.g. the main branch)")
    ap.add_argument("--out", type=Path, default=None, help="where runs go (default: a temporary folder)")
    ap.add_argument("--only", nargs="*", default=None, help="scenario names (default: every shipped one)")
    args = ap.parse_args()
    names = args.only or sorted(p.stem for p in (HERE / "workloads" / "scenarios").glob("*.toml"))
    out = args.out or Path(tempfile.mkdtemp(prefix="priosim-compare-"))
    differ = 0
    for name in names:
        a = run_one(HERE, name, out / "this" / name)
        b = run_one(args.other.resolve(), name, out / "other" / name)
        if a is None or b is None:
            print(f"{name:24s} skipped (a run failed)")
        elif a == b:
            print(f"{name:24s} identical ({a[:12]})")
        else:
            differ += 1
            print(f"{name:24s} DIFFERENT ({a[:12]} vs {b[:12]})")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
