"""Request lists that reproduce a published benchmark's workload.

* ``fixed``: every request has the same prompt and output length (vLLM's latency benchmark,
  the Qwen speed tables).
* ``random``: lengths drawn uniformly within +-``spread`` of the nominal ones (``vllm bench
  serve --dataset-name random`` with a range ratio).
* ``sharegpt``: the benchmark samples ShareGPT conversations and keeps pairs passing its length
  filters. vLLM's ``benchmark_serving.py`` / ``vllm bench serve`` (and SGLang's ``bench_serving``)
  take the *first two turns* of each conversation of ``ShareGPT_V3_unfiltered_cleaned_split.json``
  with two turns or more: turn 0 is the prompt, turn 1's token count the requested output length;
  they shuffle with the seed and keep the first ``n`` pairs with prompt and output >= 4 tokens,
  prompt <= 1024 and prompt + output <= 2048. Only token counts are bundled
  (``sharegpt_v3_turns_cl100k.csv.gz``: both turns of 17,400 conversations, the first 125 MB of
  that file, cl100k BPE; how it was made: ``make_sharegpt_turns.py``); the same filters are applied
  and ``n`` pairs sampled uniformly without replacement, which is what the shuffle does. Their
  means come within a few per cent of the benchmarks' published token totals (about 220 prompt /
  200 output tokens); when a source publishes its totals, the sampled lengths are scaled to those
  means (the chat template's tokens, which the totals leave out, are in the row's prompt mean
  where it says so). The shape is the benchmark's: a median output of about 130 tokens, a tenth
  under 11 and a p99 near 770, which sets how fast a burst of requests frees its batch slots.

Each request's ``max_tokens`` is its own output length, as both benchmark clients send it (``vllm
bench serve``: ``max_tokens`` / ``max_completion_tokens``; ``sglang.bench_serving``:
``max_new_tokens``, the dataset's output length): the suite's request files map their output
column as ``max_tokens`` too (``columns``, csv and jsonl). SGLang's admission reserves what a
request may still generate, so a ``max_tokens`` of the run's longest output would hold back its
batch.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd


#: ShareGPT's first two turns as token counts (gzip CSV ``prompt,output``; make_sharegpt_turns.py).
SHAREGPT = Path(__file__).resolve().parent / "sharegpt_v3_turns_cl100k.csv.gz"


@lru_cache(maxsize=1)
def sharegpt_table() -> pd.DataFrame:
    """Prompt (turn 0) and output (turn 1) token counts of the bundled ShareGPT turns table."""
    return pd.read_csv(SHAREGPT, compression="gzip")[["prompt", "output"]]


def sharegpt_lengths(n: int, seed: int, *, min_len: int = 4, max_prompt: int = 1024,
                     max_total: int = 2048, prompt_mean: float | None = None,
                     output_mean: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``n`` (prompt, output) pairs in the order sent: the benchmark's filters (prompt and output
    >= ``min_len``, prompt <= ``max_prompt``, prompt + output <= ``max_total``), a sample of
    ``n`` pairs, then (optionally) each length scaled so that its mean is the published one.

    The sample is the median draw: the filtered pairs sorted by output length, the k-th of the
    ``n`` taken at the median position of the k-th smallest of ``n`` uniform draws ((k - 0.3) /
    (n + 0.4), Benard's approximation), then put in an order shuffled with ``seed``. A published
    run is one draw of 100 to 5000 pairs, and a burst's duration is set by its longest outputs
    (ShareGPT's p99 is about 770 tokens, its longest near 2000), which one plain draw of 200
    places anywhere between about 900 and 1500; the median draw gives the typical run, not a
    lucky one, and is the same for every seed but for the order."""
    t = sharegpt_table()
    ok = t[(t.prompt >= min_len) & (t.output >= min_len) & (t.prompt <= max_prompt)
           & (t.prompt + t.output <= max_total)]
    ok = ok.sort_values(["output", "prompt"], kind="stable")
    k = np.arange(1, n + 1)
    idx = np.minimum((len(ok) * (k - 0.3) / (n + 0.4)).astype(int), len(ok) - 1)
    idx = np.random.default_rng(seed).permutation(idx)
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

