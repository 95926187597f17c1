"""Real benchmark runs from the calibration harness, written as `vllm bench serve` result files.

    python -m scripts.harness_runs --profile P.json --loads 0.3,0.6,0.9 --out DIR [--requests 300]

The harness's serving loop (:func:`calibrate.validate.run_real`: continuous batching on a
random-weight decoder, executed for real on the profile's device) serves the built-in two-class
trace once per load (``utilization`` of :func:`calibrate.validate.builtin_trace`: Poisson
arrivals at that fraction of the replica's estimated capacity), and each run is written as
``DIR/harness-load<L>.json`` in the schema of ``vllm bench serve --save-result --save-detailed``
(per request: lengths, TTFT, the gaps between its real token times, its send time). Those files
are what a user's own engine would give `priosim calibrate --from-runs` and `priosim replay`:
calibrate on some loads, replay the others (docs/calibration.md, "Calibrate-then-replay on a
real GPU"). The engine settings to give both: ``--engine-args "--max-num-seqs 16
--max-num-batched-tokens 256 --enable-chunked-prefill"`` (the loop's defaults,
:data:`calibrate.validate.DEFAULT_ENGINE`); its KV cache is sized for the trace, never full.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd


def run_file(real: pd.DataFrame, load: float, meta: dict) -> dict:
    """One harness run (``run_real``'s table, one repeat) as a vLLM result document."""
    from calibrate.runs.export import vllm

    df = pd.DataFrame({"input_tokens": real["prompt_tokens"], "output_tokens": real["output_tokens"],
                       "start_s": real["arrival_s"], "ttft_s": real["ttft_s"], "e2e_s": real["e2e_s"],
                       "token_s": real["token_s"]})
    span = float(real["arrival_s"].max() - real["arrival_s"].min())
    rate = (len(real) - 1) / span if span > 0 else float("inf")
    doc = vllm(df, {"request_rate": rate, "burstiness": 1.0, "max_concurrency": None,
                    "model": meta.get("shape"), "date": time.strftime("%Y%m%d-%H%M%S")})
    doc["backend"] = "priosim-harness"
    doc["harness"] = {"utilization": load, "device": meta.get("device"), "shape": meta.get("shape"),
                      "dtype": meta.get("dtype"), "engine": "calibrate.validate.DEFAULT_ENGINE"}
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", required=True, help="a measured profile (its device, shape and dtype are run)")
    ap.add_argument("--loads", default="0.3,0.6,0.9", help="utilizations, comma-separated")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="folder for the files (files already there are never replaced)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    a = ap.parse_args(argv)
    from calibrate.validate import builtin_trace, run_real

    loads = [float(x) for x in a.loads.split(",")]
    out = Path(a.out)
    paths = [out / f"harness-load{x:g}.json" for x in loads]
    taken = [p for p in paths if p.exists()]
    if taken:
        ap.error(f"--out {a.out}: {taken[0].name} exists (choose another folder)")
    try:
        meta = json.loads(Path(a.profile).read_text())["meta"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        ap.exit(2, f"error: --profile {a.profile}: not a measured profile ({exc}); expected a priosim calibrate "
                   f"output\n")
    out.mkdir(parents=True, exist_ok=True)
    for i, (load, path) in enumerate(zip(loads, paths)):
        trace = builtin_trace(a.profile, n=a.requests, utilization=load, seed=a.seed + i)
        try:
            real = run_real(a.profile, trace, repeats=1, progress=not a.no_progress)
        except RuntimeError as exc:  # (e.g. a CUDA profile where torch sees no GPU)
            ap.exit(2, f"error: {exc}\n")
        path.write_text(json.dumps(run_file(real, load, meta), allow_nan=False))
        print(f"wrote {path}: {len(real)} requests at utilization {load:g}, "
              f"TTFT p50 {real['ttft_s'].median() * 1e3:.1f} ms, E2E p50 {real['e2e_s'].median() * 1e3:.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
