"""A replay of a 10M-row trace with a 10 s horizon: reading stops past the last row needed.

    python -m benchmarks.bench_trace_stream [--rows N]      (from the repository root)

Writes a generic CSV trace (``t,p,o``: 100 requests/s, so 10M rows span about 28 hours, about
170 MB) into a temporary folder, then times ``priosim run`` on a scenario that replays it for
10 s (nothing needs the whole file), under ``/usr/bin/time -v``
where there is one (max RSS). Prints the wall time, the max RSS, and the bytes held per row
used (a second run with a 1000 s horizon, the difference in RSS per extra row). The figures
go in docs/workloads.md ("Large traces") by hand; nothing here is asserted.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RATE = 100.0  # requests/s of the generated trace

SCENARIO = """name = "bench_trace_stream"
horizon_s = {horizon}
drain = false
[engine]
profile = {{ kind = "linear", base_s = 0.01, prefill_token_s = 1e-5, decode_token_s = 1e-4, context_token_s = 0.0 }}
kv_blocks = 4000
[policy]
name = "fcfs"
[[classes]]
name = "chat"
priority = 0
[[streams]]
tenant = "a"
class = "chat"
trace = {{ format = "csv", path = "big.csv", time_unit = "s", columns = {{ arrival_s = "t", prompt_tokens = "p", output_tokens = "o" }} }}
"""


def write_trace(path: Path, rows: int, seed: int = 0) -> None:
    """``rows`` rows at RATE requests/s, written in blocks (the generator's memory stays small)."""
    rng = np.random.default_rng(seed)
    t0 = 0.0
    with open(path, "w") as f:
        f.write("t,p,o\n")
        for start in range(0, rows, 1_000_000):
            n = min(1_000_000, rows - start)
            t = t0 + np.cumsum(rng.exponential(1.0 / RATE, n))
            t0 = float(t[-1])
            p = rng.integers(1, 4000, n)
            o = rng.integers(1, 64, n)
            f.write("".join(f"{a:.6f},{b},{c}\n" for a, b, c in zip(t, p, o)))


def run(folder: Path, horizon: float) -> tuple[float, float | None]:
    """(wall s, max RSS MB or None) of one ``priosim run``."""
    (folder / "s.toml").write_text(SCENARIO.format(horizon=horizon))
    out = folder / f"out-{horizon:g}"
    cmd = [sys.executable, "-m", "sim.cli", "run", str(folder / "s.toml"), "--no-plots", "--out", str(out)]
    timer = shutil.which("time") or ("/usr/bin/time" if os.path.exists("/usr/bin/time") else None)
    if timer:
        cmd = [timer, "-v", *cmd]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    return wall, (int(m[1]) / 1024 if m else None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        t = time.perf_counter()
        write_trace(folder / "big.csv", args.rows)
        size = (folder / "big.csv").stat().st_size / 1e6
        print(f"trace: {args.rows:,} rows, {size:.0f} MB, written in {time.perf_counter() - t:.1f} s")
        wall, rss = run(folder, 10.0)
        print(f"priosim run, horizon 10 s: {wall:.2f} s wall, max RSS {rss if rss is None else f'{rss:.0f} MB'}")
        wall2, rss2 = run(folder, 1000.0)
        print(f"priosim run, horizon 1000 s: {wall2:.2f} s wall, max RSS {rss2 if rss2 is None else f'{rss2:.0f} MB'}")
        if rss is not None and rss2 is not None:
            extra = (1000.0 - 10.0) * RATE
            print(f"memory grows by about {(rss2 - rss) * 1024 * 1024 / extra:.0f} bytes per row used "
                  f"(engine and results included)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
