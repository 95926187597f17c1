"""Measured against simulated: one run's metrics under its own client's definitions.

:func:`replay` simulates a :class:`~calibrate.runs.table.Run` (its scenario from
:mod:`calibrate.runs.scenario`) and returns a :class:`Comparison`: the metrics table, the
per-request table (measured and simulated side by side, one row per request of the file) and
the simulation's results. It is the unit a later fit of overhead terms over several runs loops
over. Definitions, each the client's own (docs/replay.md has their sources):

* TTFT, E2E: per successful request; ``vllm`` (also SGLang), ``guidellm``, ``genai-perf`` alike.
* TPOT: ``vllm``: (E2E - TTFT) / (output - 1) over requests with output > 1. ``guidellm``
  (0.4 on): (last token - send) / output, every request; ``guidellm-0.3`` (0.2-0.3 reports):
  (last token - first token) / output. ``genai-perf`` reports none: vLLM's is used.
* ITL: ``vllm``: every streamed chunk's gap, all requests' gaps pooled; simulated: every
  inter-token gap of the run pooled (``Results.itl_gaps``, one per step a request emitted in:
  a pure decode step's gap and a chunked prefill's long one each count as they happened).
  ``guidellm`` and ``genai-perf``: per request (last token - first token) / (output - 1),
  output > 1, simulated and measured alike.
* Percentiles: ``numpy.percentile`` (linear), as vLLM, SGLang and genai-perf compute them;
  GuideLLM's: the lower value where the CDF reaches p (``method="inverted_cdf"``), and from
  0.4 on TPOT weighted by each request's output tokens, ITL by its output tokens - 1.
* Throughput: completed requests and output tokens over the duration: the file's own
  ``duration`` when it has one (vLLM, SGLang), else first send to last answer; simulated: first
  arrival to last finish.
* A summary-only vLLM or SGLang file (no per-request lists): the measured side is the file's
  own summary (:func:`summary_metrics`), computed by the client under the definitions above.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np
import pandas as pd

from calibrate.runs.scenario import arrival_mode, redrawn_arrivals, row_order, scenario_dict
from calibrate.runs.table import Run

LATENCIES = ("ttft", "tpot", "itl", "e2e")
STATS = ("mean", "p50", "p90", "p99")
#: the metric names ``--json`` always has
REQUIRED = ("ttft_mean_ms", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "itl_p50_ms", "e2e_p50_ms",
            "request_throughput", "output_throughput")


@dataclass
class Comparison:
    """``metrics``: name -> {measured, simulated, error = (simulated - measured) / measured};
    ``requests``: one row per request of the run (``run_row``, lengths, ``*_measured_s`` and
    ``*_simulated_s`` for ttft and e2e, send times); ``scenario``, ``results``: the simulation."""

    metrics: dict[str, dict[str, float]]
    requests: pd.DataFrame
    mode: str
    scenario: Any = None
    results: Any = None
    notes: list[str] = field(default_factory=list)

    def table(self) -> str:
        lines = [f"{'metric':22s} {'measured':>12s} {'simulated':>12s} {'error':>9s}"]
        for name, m in self.metrics.items():
            err = m["error"]
            e = f"{err:+9.1%}" if err is not None and math.isfinite(err) else f"{'-':>9s}"
            lines.append(f"{name:22s} {_fmt(m['measured']):>12s} {_fmt(m['simulated']):>12s} {e}")
        return "\n".join(lines)


def _fmt(v: float | None) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:.4g}"


def _stats(values: np.ndarray, prefix: str, scale: float = 1e3, method: str = "linear") -> dict[str, float]:
    """Mean and percentiles (``numpy.percentile`` ``method``) of the finite values, in ms."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return {f"{prefix}_{s}_ms": math.nan for s in STATS}
    return {f"{prefix}_mean_ms": float(v.mean()) * scale,
            **{f"{prefix}_p{q}_ms": float(np.percentile(v, q, method=method)) * scale for q in (50, 90, 99)}}


def _weighted_stats(values_s: np.ndarray, counts: np.ndarray, prefix: str) -> dict[str, float]:
    """:func:`_stats` (linear percentiles) of the pool in which each of ``values_s`` (s,
    ascending) appears ``counts`` times, without making that pool: numpy's linear percentile
    of a sorted pool of N reads ranks floor(h) and floor(h) + 1 at h = (N - 1) q / 100."""
    n = int(counts.sum())
    if n == 0:
        return {f"{prefix}_{s}_ms": math.nan for s in STATS}
    cum = np.cumsum(counts)

    def at(rank: int) -> float:
        return float(values_s[np.searchsorted(cum, rank, side="right")])
    out = {f"{prefix}_mean_ms": float(np.dot(values_s, counts) / n) * 1e3}
    for q in (50, 90, 99):
        h = (n - 1) * q / 100
        lo = math.floor(h)
        v = at(lo)
        if lo + 1 < n:
            v += (h - lo) * (at(lo + 1) - v)
        out[f"{prefix}_p{q}_ms"] = v * 1e3
    return out


def client_metrics(definitions: str, ttft: np.ndarray, e2e: np.ndarray, out: np.ndarray, last: np.ndarray,
                   gaps: Iterable[list[float]] | None, duration_s: float,
                   pooled_gaps: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, float]:
    """The client's metrics (ms; throughput per s) from per-request seconds. ``last``: the
    last token's time after the send (GuideLLM's TPOT); ``gaps``: per-chunk gaps (vLLM's ITL),
    None for the per-request mean gap; ``pooled_gaps``: (distinct gaps in s, ascending; how
    many of each), vLLM's pooled ITL given as counts (a simulation's ``Results.itl_gaps``)."""
    ttft, e2e, out, last = (np.asarray(x, dtype=float) for x in (ttft, e2e, out, last))
    many = out > 1
    mean_gap = np.where(many, (last - ttft) / np.maximum(out - 1, 1), np.nan)
    if definitions == "guidellm":
        tpot = last / np.maximum(out, 1)
    elif definitions == "guidellm-0.3":  # GuideLLM 0.2-0.3: from the first token, not the send
        tpot = (last - ttft) / np.maximum(out, 1)
    else:
        tpot = np.where(many, (e2e - ttft) / np.maximum(out - 1, 1), np.nan)
    if definitions == "vllm" and gaps is not None:
        pooled = np.concatenate([np.asarray(g, dtype=float) for g in gaps] or [np.zeros(0)])
    elif definitions == "vllm":
        pooled = np.repeat(mean_gap[many], (out[many] - 1).astype(np.int64))
    elif definitions == "guidellm":
        # GuideLLM 0.4+ weighs each request's ITL by its gaps and its TPOT by its tokens
        pooled = np.repeat(mean_gap[many], (out[many] - 1).astype(np.int64))
        ok_tpot = np.isfinite(tpot)
        tpot = np.repeat(tpot[ok_tpot], out[ok_tpot].astype(np.int64))
    else:
        pooled = mean_gap
    # GuideLLM's percentiles are the lower value where the CDF reaches p (numpy's inverted_cdf)
    method = "inverted_cdf" if definitions.startswith("guidellm") else "linear"
    m: dict[str, float] = {}
    m.update(_stats(ttft, "ttft", method=method))
    m.update(_stats(tpot, "tpot", method=method))
    if definitions == "vllm" and pooled_gaps is not None:
        m.update(_weighted_stats(*pooled_gaps, "itl"))
    else:
        m.update(_stats(pooled, "itl", method=method))
    m.update(_stats(e2e, "e2e", method=method))
    ok = duration_s > 0 and math.isfinite(duration_s)
    m["request_throughput"] = len(ttft) / duration_s if ok else math.nan
    m["output_throughput"] = float(out.sum()) / duration_s if ok else math.nan
    return m


#: a summary-only file's keys for each latency (vLLM's ``e2el``, SGLang's ``e2e_latency``)
SUMMARY_KEYS = {"ttft": ("ttft",), "tpot": ("tpot",), "itl": ("itl",), "e2e": ("e2el", "e2e_latency")}


def summary_metrics(run: Run) -> dict[str, float]:
    """A summary-only vLLM or SGLang file's own metrics (ms; throughput per s): ``mean_X_ms``,
    ``median_X_ms`` (or ``p50_X_ms``), ``p90_X_ms``, ``p99_X_ms`` and the throughputs; NaN
    where the file has no such key (vLLM keeps the percentiles ``--metric-percentiles`` named,
    99 by default, and E2E only when ``--percentile-metrics`` names ``e2el``)."""
    doc = run.summary

    def value(*keys: str) -> float:
        for k in keys:
            v = doc.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                return float(v)
        return math.nan
    m: dict[str, float] = {}
    for name, keys in SUMMARY_KEYS.items():
        m[f"{name}_mean_ms"] = value(*(f"mean_{k}_ms" for k in keys))
        m[f"{name}_p50_ms"] = value(*(f"median_{k}_ms" for k in keys), *(f"p50_{k}_ms" for k in keys))
        m[f"{name}_p90_ms"] = value(*(f"p90_{k}_ms" for k in keys))
        m[f"{name}_p99_ms"] = value(*(f"p99_{k}_ms" for k in keys))
    e2e = run.requests["e2e_s"].to_numpy()
    if np.isfinite(e2e).all():  # (the per-request latencies the file kept: calibrate.runs.vllm.kept_latencies)
        m.update({k: v for k, v in _stats(e2e, "e2e").items() if not math.isfinite(m[k])})
    m["request_throughput"] = value("request_throughput")
    m["output_throughput"] = value("output_throughput")
    return m


def measured_metrics(run: Run) -> dict[str, float]:
    if run.summary_only:
        return summary_metrics(run)
    r = run.requests
    last = r["last_token_s"].to_numpy() if "last_token_s" in r.columns else r["e2e_s"].to_numpy()
    gaps = list(r["itl_s"]) if r["itl_s"].notna().all() else None
    dur = run.duration_s
    if not math.isfinite(dur):
        s = r["start_s"].to_numpy()
        dur = float(np.nanmax(s + r["e2e_s"].to_numpy()) - np.nanmin(s)) if run.has_starts else math.nan
    return client_metrics(run.metrics, r["ttft_s"].to_numpy(), r["e2e_s"].to_numpy(), r["output_tokens"].to_numpy(),
                          last, gaps, dur)


def simulated_metrics(definitions: str, sim: pd.DataFrame,
                      itl_gaps: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, float]:
    """``sim``: the simulated request table (seconds), finished requests; ``itl_gaps``: the
    run's pooled inter-token gaps (``Results.itl_gaps``, ns), vLLM's ITL where given."""
    dur = float(sim["finish_s"].max() - sim["arrival_s"].min()) if len(sim) else math.nan
    pooled = None if itl_gaps is None else (np.asarray(itl_gaps[0], dtype=float) / 1e9, itl_gaps[1])
    return client_metrics(definitions, sim["ttft_s"].to_numpy(), sim["e2e_s"].to_numpy(),
                          sim["generated_tokens"].to_numpy(), sim["e2e_s"].to_numpy(), None, dur, pooled)


def compare_metrics(measured: dict[str, float], simulated: dict[str, float]) -> dict[str, dict[str, float]]:
    out = {}
    for k, x in measured.items():
        y = simulated.get(k, math.nan)
        err = (y - x) / x if math.isfinite(x) and math.isfinite(y) and x != 0 else math.nan
        out[k] = {"measured": x, "simulated": y, "error": err}
    return out


def replay(run: Run, scenario_overrides: Iterable[str] = (), *, profile: str = "h200-llama-3-8b", seed: int = 0,
           mode: str | None = None, trace: bool = False) -> Comparison:
    """Simulate ``run`` on ``profile`` (``--set`` style ``scenario_overrides``) and compare;
    ``trace``: keep the iteration trace (``results.iterations``: each token's time, which
    :func:`calibrate.runs.export.simulated_table` writes out)."""
    from sim.config import scenario_from_dict
    from sim.run import simulate

    mode = mode or arrival_mode(run)
    sc = scenario_from_dict(scenario_dict(run, profile, seed, mode), source=f"replay of {run.source}" + (f"#{run.part}" if run.part else ""),
                            overrides=list(scenario_overrides))
    res = simulate(sc, trace_iterations=trace)
    sim = res.requests.sort_values("request_id").reset_index(drop=True)
    order = row_order(run, mode)
    n = min(len(order), len(sim))
    meas = run.requests.iloc[order[:n]].reset_index(drop=True)
    per = pd.DataFrame({"run_row": order[:n], "request_id": sim["request_id"][:n],
                        "input_tokens": meas["input_tokens"], "output_tokens": meas["output_tokens"],
                        "start_measured_s": meas["start_s"], "start_simulated_s": sim["arrival_s"][:n],
                        "ttft_measured_s": meas["ttft_s"], "ttft_simulated_s": sim["ttft_s"][:n],
                        "e2e_measured_s": meas["e2e_s"], "e2e_simulated_s": sim["e2e_s"][:n],
                        "status": sim["status"][:n]})
    done = sim[sim["status"] == "finished"]
    cmp = Comparison(compare_metrics(measured_metrics(run), simulated_metrics(run.metrics, done, res.itl_gaps)),
                     per, mode, sc, res)
    redrawn = redrawn_arrivals(run, mode, seed)
    if redrawn:
        cmp.notes.append(redrawn)
    if len(done) < len(run.requests):
        why = sim.loc[sim["status"] == "rejected", "reject_reason"].value_counts()
        refused = "".join(f"; {n} refused at arrival as {reason}" + (
            " (prompt + max_tokens over engine.max_model_len: the server's --max-model-len)"
            if reason == "too_long" else "") for reason, n in why.items())
        cmp.notes.append(f"{len(run.requests) - len(done)} of {len(run.requests)} requests did not finish in the "
                         f"simulation{refused}")
    return cmp


__all__ = ["Comparison", "replay", "client_metrics", "measured_metrics", "simulated_metrics", "summary_metrics",
           "REQUIRED"]
