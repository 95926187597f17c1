"""The generated result files of tests/data/runs/: a synthetic request list replayed by priosim
on one profile, its simulated side exported in each client's schema (calibrate.runs.export).

``python -m tests.replay_files DIR`` writes them into DIR (new files only)."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.runs.compare import replay
from calibrate.runs.export import export_text, simulated_table
from calibrate.runs.table import Run, frame, read_run, settings

PROFILE = "h200-llama-3-8b"
MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"
#: file name -> (format, request_rate, max_concurrency, requests)
FILES = {
    "vllm_concurrency8.json": ("vllm", math.inf, 8, 60),
    "sglang_rate8.jsonl": ("sglang", 8.0, None, 60),
    "guidellm_concurrent4.json": ("guidellm", math.inf, 4, 40),
    "genai_perf_concurrency4.json": ("genai-perf", math.inf, 4, 30),
}


def base_run(n: int, rate: float, mc: int | None, seed: int = 7) -> Run:
    """``n`` requests with ShareGPT-like lengths and placeholder times (only the lengths and
    the settings matter: the replay makes the times)."""
    rng = np.random.default_rng(seed)
    inp = np.clip(rng.lognormal(5.5, 0.6, n).round(), 8, 2000).astype(int)
    out = np.clip(rng.lognormal(3.8, 0.5, n).round(), 2, 120).astype(int)
    zeros = np.zeros(n)
    df = frame(inp, out, None, zeros, None, zeros)
    return Run(df, settings(request_rate=rate, burstiness=1.0, max_concurrency=mc, num_prompts=n, model=MODEL,
                            backend="vllm"), {}, "synthetic", "synthetic", "vllm")


def simulated_file(fmt: str, rate: float, mc: int | None, n: int) -> str:
    """The simulated side of the base run, as a file of format ``fmt`` (its text)."""
    import tempfile

    run = base_run(n, rate, mc)
    with tempfile.TemporaryDirectory() as tmp:  # (a replay reads its run from a file)
        path = Path(tmp) / "base.json"
        table = run.requests.assign(start_s=0.0)
        path.write_text(export_text("vllm", table, run.settings))
        doc = read_run(path)
        doc.requests["start_s"] = np.nan  # (placeholder times: the client's own process sends)
        # served by the engine the exported file names (an SGLang file's backend is sglang)
        cmp = replay(doc, [f'engine.engine="{"sglang" if fmt == "sglang" else "vllm"}"'], profile=PROFILE, trace=True)
    return export_text(fmt, simulated_table(cmp), run.settings)


def main(out: str) -> None:
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    for name, (fmt, rate, mc, n) in FILES.items():
        p = d / name
        if p.exists():
            print(f"kept {p} (exists)")
            continue
        p.write_text(simulated_file(fmt, rate, mc, n))
        print(f"wrote {p}")


if __name__ == "__main__":
    main(sys.argv[1])
