"""Write a request table back as a client's result file (vLLM, SGLang, GuideLLM, genai-perf), in
that client's schema as :mod:`calibrate.runs` reads it: a simulated run exported and read again
replays to itself (the tests' round trip), and a later fit can generate runs to check itself on.

``requests``: ``input_tokens``, ``output_tokens`` (tokens), ``start_s``, ``ttft_s``, ``e2e_s``
(seconds); optional ``token_s``, each output token's time after the send (s). Without it a
request's chunks are spread evenly between its first token and its end (a simulation keeps no
per-token times). ``settings``: :data:`calibrate.runs.table.SETTINGS`.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

#: the epoch second the exported clocks start at (any fixed value: files carry absolute times)
T0 = 1_700_000_000.0


def simulated_table(cmp) -> pd.DataFrame:
    """A :class:`~calibrate.runs.compare.Comparison`'s simulated side as a request table; with
    the replay's iteration trace (``replay(..., trace=True)``) also each token's time after the
    send (``token_s``: the first at TTFT, then the end of every decode step it took part in, a
    step's tokens sharing its end), so a client's per-chunk gaps are the simulated steps'."""
    r = cmp.requests
    df = pd.DataFrame({"input_tokens": r["input_tokens"], "output_tokens": r["output_tokens"],
                       "start_s": r["start_simulated_s"], "ttft_s": r["ttft_simulated_s"],
                       "e2e_s": r["e2e_simulated_s"]})
    it = getattr(cmp.results, "iterations", None)
    if it is not None and len(it):
        df["token_s"] = _token_times(it, r)
    return df


def _token_times(it: pd.DataFrame, r: pd.DataFrame) -> list:
    """Per row of ``r`` (a replay's per-request table): its tokens' times after the send (s),
    or None where the trace does not give one per output token (a request that was preempted
    and recomputed samples tokens at prefill steps too)."""
    dec = it[it["kind"] == "decode"]
    ends = {rid: np.repeat(g["end_s"].to_numpy(), g["tokens"].to_numpy())
            for rid, g in dec.sort_values("iteration").groupby("request_id", sort=False)}
    out = []
    for row in r.itertuples():
        arrival = row.start_simulated_s
        times = np.concatenate([[row.ttft_simulated_s], ends.get(row.request_id, np.zeros(0)) - arrival])
        out.append(times if len(times) == int(row.output_tokens) else None)
    return out


def _chunk_times(row) -> np.ndarray:
    """Each output token's time after the send, s: the row's own (``token_s``) where it has them,
    else the first at TTFT, the last at E2E and the others evenly between."""
    own = getattr(row, "token_s", None)
    if own is not None and not (isinstance(own, float) and math.isnan(own)) and len(own) == int(row.output_tokens):
        return np.asarray(own, dtype=float)
    n = int(row.output_tokens)
    if n <= 1:
        return np.array([row.e2e_s])
    return row.ttft_s + (row.e2e_s - row.ttft_s) * np.arange(n) / (n - 1)


def _chunks(times: np.ndarray) -> np.ndarray:
    """The streamed chunks' times: tokens emitted at one instant (a speculative step's) come in
    one chunk, as vLLM and SGLang stream them (their ITL has one gap per chunk)."""
    return times[np.r_[True, np.diff(times) > 0]] if len(times) > 1 else times


def _rate(settings: dict):
    r = settings.get("request_rate", math.inf)
    return "inf" if r is None or not math.isfinite(r) else r


def _duration(df: pd.DataFrame) -> float:
    return float((df["start_s"] + df["e2e_s"]).max() - df["start_s"].min())


def vllm(df: pd.DataFrame, settings: dict, backend: str = "vllm") -> dict:
    """``vllm bench serve --save-result --save-detailed``'s object (with ``start_times``)."""
    itls = [np.diff(_chunks(_chunk_times(r))).tolist() for r in df.itertuples()]
    dur = _duration(df)
    doc = {"date": settings.get("date") or "20250101-000000", "backend": backend,
           "model_id": settings.get("model") or "unknown", "tokenizer_id": settings.get("model") or "unknown",
           "num_prompts": len(df), "request_rate": _rate(settings), "burstiness": settings.get("burstiness") or 1.0,
           "max_concurrency": settings.get("max_concurrency"), "duration": dur, "completed": len(df), "failed": 0,
           "total_input_tokens": int(df["input_tokens"].sum()), "total_output_tokens": int(df["output_tokens"].sum()),
           "request_throughput": len(df) / dur if dur > 0 else None,
           "output_throughput": float(df["output_tokens"].sum()) / dur if dur > 0 else None,
           "mean_ttft_ms": float(df["ttft_s"].mean() * 1e3), "median_ttft_ms": float(df["ttft_s"].median() * 1e3),
           "input_lens": [int(x) for x in df["input_tokens"]], "output_lens": [int(x) for x in df["output_tokens"]],
           "ttfts": [float(x) for x in df["ttft_s"]], "itls": itls, "errors": [""] * len(df),
           "start_times": [float(T0 + x) for x in df["start_s"]]}
    return doc


def sglang(df: pd.DataFrame, settings: dict) -> str:
    """``sglang.bench_serving --output-details``: one JSON line."""
    doc = vllm(df, settings, backend="sglang")
    doc.pop("start_times")
    doc.pop("date")
    doc["mean_e2e_latency_ms"] = float(df["e2e_s"].mean() * 1e3)
    doc["total_output_tokens_retokenized"] = doc["total_output_tokens"]
    if not math.isfinite(settings.get("request_rate", math.inf) or math.inf):
        doc["request_rate"] = math.inf  # (SGLang dumps the float: Infinity)
    return json.dumps(doc) + "\n"


def guidellm(df: pd.DataFrame, settings: dict) -> dict:
    """GuideLLM 0.5's report, one benchmark, the fields :mod:`calibrate.runs.guidellm` reads."""
    mc = settings.get("max_concurrency")
    rate = settings.get("request_rate", math.inf)
    if mc == 1:
        strategy = {"type_": "synchronous"}
    elif mc:
        strategy = {"type_": "concurrent", "streams": int(mc), "max_concurrency": int(mc)}
    elif rate is not None and math.isfinite(rate):
        strategy = {"type_": "poisson", "rate": rate}
    else:
        strategy = {"type_": "throughput"}
    reqs = []
    for i, r in enumerate(df.itertuples()):
        s = T0 + r.start_s
        first, last = s + r.ttft_s, s + r.e2e_s
        n = int(r.output_tokens)
        reqs.append({"type_": "generative_request_stats", "request_id": f"req-{i}",
                     "info": {"timings": {"request_start": s, "first_token_iteration": first,
                                          "last_token_iteration": last, "request_end": last}},
                     "request_start_time": s, "request_end_time": last, "request_latency": r.e2e_s,
                     "prompt_tokens": int(r.input_tokens), "output_tokens": n,
                     "time_to_first_token_ms": r.ttft_s * 1e3,
                     "time_per_output_token_ms": r.e2e_s * 1e3 / max(n, 1),
                     "inter_token_latency_ms": (r.e2e_s - r.ttft_s) * 1e3 / (n - 1) if n > 1 else 0.0})
    return {"metadata": {"version": 1, "guidellm_version": "0.5.0"},
            "args": {"model": settings.get("model") or "unknown", "backend": "openai_http", "profile": strategy["type_"]},
            "benchmarks": [{"type_": "generative_benchmark", "config": {"strategy": strategy},
                            "requests": {"successful": reqs, "errored": [], "incomplete": []}}]}


def genai_perf(df: pd.DataFrame, settings: dict) -> dict:
    """genai-perf's ``profile_export.json``: one experiment, chat-completions chunks, one token
    of text each; prompts of ``input_tokens`` words."""
    mc = settings.get("max_concurrency")
    rate = settings.get("request_rate", math.inf)
    exp = ({"mode": "concurrency", "value": int(mc)} if mc else
           {"mode": "request_rate", "value": rate} if rate is not None and math.isfinite(rate) else
           {"mode": "concurrency", "value": len(df)})
    reqs = []
    for r in df.itertuples():
        send = int(round((T0 + r.start_s) * 1e9))
        times = [send + int(round(t * 1e9)) for t in _chunk_times(r)]
        payload = {"messages": [{"role": "user", "content": " ".join(["word"] * int(r.input_tokens))}],
                   "model": settings.get("model") or "unknown", "stream": True}
        chunk = 'data: {"choices":[{"delta":{"content":"tok "}}]}\n\n'
        reqs.append({"timestamp": send, "request_inputs": {"payload": json.dumps(payload)},
                     "response_timestamps": times + [times[-1]],
                     "response_outputs": [{"response": chunk}] * len(times) + [{"response": "data: [DONE]\n\n"}]})
    return {"service_kind": "openai", "endpoint": "v1/chat/completions",
            "experiments": [{"experiment": exp, "requests": reqs}], "version": ""}


def export_text(fmt: str, df: pd.DataFrame, settings: dict) -> str:
    """The file's text in format ``fmt`` (``vllm``, ``sglang``, ``guidellm``, ``genai-perf``)."""
    if fmt == "sglang":
        return sglang(df, settings)
    doc = {"vllm": vllm, "guidellm": guidellm, "genai-perf": genai_perf}[fmt](df, settings)
    return json.dumps(doc, allow_nan=False)


FORMATS = ("vllm", "sglang", "guidellm", "genai-perf")
__all__ = ["export_text", "simulated_table", "FORMATS"]
