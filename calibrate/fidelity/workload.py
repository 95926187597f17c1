"""Request lists that reproduce a published benchmark's workload.

* ``fixed``: every request has the same prompt and output length (vLLM's latency benchmark,
  the Qwen speed tables).
* ``random``: lengths drawn uniformly within +-``spread`` of the nominal ones (``vllm bench
  serve --dataset-name random`` with a range ratio).
* ``sharegpt``: the benchmark samples ShareGPT conversations and keeps pairs passing its length
  filters. Only token counts are bundled (the Sarathi-Serve ShareGPT length table, Llama-2
  tokenizer, already filtered by its publishers to 8k tokens); the same filters are re-applied
  to it and ``n`` rows sampled. The benchmarks tokenise the *first two turns* of
  ShareGPT_V3 with a Llama-3 or Qwen tokenizer, which gives shorter requests than this table
  (its filtered rows average about 380 prompt / 420 output tokens where the benchmarks report
  about 200-230 / 180-220), so when a source publishes its token totals (or a run with the same
  sampler does) the sampled lengths are scaled to those means; the row says which.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pandas as pd

from workloads.traces import DATA_DIR

#: The bundled ShareGPT length table (gzip; see workloads/data/README.md).
SHAREGPT = DATA_DIR / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv.gz"


@lru_cache(maxsize=1)
def sharegpt_table() -> pd.DataFrame:
    """Prompt and output token counts of the bundled ShareGPT table."""
    df = pd.read_csv(SHAREGPT, compression="gzip")
    return df[["num_prefill_tokens", "num_decode_tokens"]].rename(
        columns={"num_prefill_tokens": "prompt", "num_decode_tokens": "output"})


def sharegpt_lengths(n: int, seed: int, *, min_len: int = 4, max_prompt: int = 1024,
                     max_total: int = 2048, prompt_mean: float | None = None,
                     output_mean: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``n`` (prompt, output) pairs: the benchmark's filters (prompt and output >= ``min_len``,
    prompt <= ``max_prompt``, prompt + output <= ``max_total``), a uniform sample without
    replacement, then (optionally) each length scaled so that its mean is the published one."""
    t = sharegpt_table()
    ok = t[(t.prompt >= min_len) & (t.output >= min_len) & (t.prompt <= max_prompt)
           & (t.prompt + t.output <= max_total)]
    idx = np.random.default_rng(seed).choice(len(ok), size=n, replace=n > len(ok))
    p = ok.prompt.to_numpy()[idx].astype(float)
    o = ok.output.to_numpy()[idx].astype(float)
    if prompt_mean:
        p *= prompt_mean / p.mean()
    if output_mean:
        o *= output_mean / o.mean()
    return np.maximum(1, np.rint(p)).astype(int), np.maximum(1, np.rint(o)).astype(int)


def lengths(row: dict, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and output lengths of a fidelity row's requests."""
    n = int(row["n"])
    ds = row["dataset"]
    if ds == "fixed":
        return np.full(n, int(row["prompt_tokens"])), np.full(n, int(row["output_tokens"]))
    if ds == "random":
        rng = np.random.default_rng(seed)
        s = float(row.get("spread") or 0.0)
        p0, o0 = int(row["prompt_tokens"]), int(row["output_tokens"])
        p = rng.integers(int(p0 * (1 - s)), int(p0 * (1 + s)) + 1, size=n)
        o = rng.integers(max(1, int(o0 * (1 - s))), int(o0 * (1 + s)) + 1, size=n)
        return p, o
    if ds == "sharegpt":
        return sharegpt_lengths(n, seed, prompt_mean=_num(row.get("prompt_mean")),
                                output_mean=_num(row.get("output_mean")))
    raise ValueError(f"fidelity row {row['id']}: dataset must be fixed, random or sharegpt (got {ds!r})")


def arrivals(row: dict, n: int, seed: int) -> np.ndarray:
    """Arrival times (s): all at 0, or Poisson at the row's rate (exponential gaps, first at 0)."""
    if row["scenario"] == "poisson":
        gaps = np.random.default_rng(seed + 1).exponential(1.0 / float(row["rate"]), size=n)
        gaps[0] = 0.0
        return np.cumsum(gaps)
    return np.zeros(n)


def _num(v) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if f == f and f > 0 else None
