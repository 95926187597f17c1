"""vLLM's serving benchmark result (``vllm bench serve --save-result [--save-detailed]``, formerly
``benchmarks/benchmark_serving.py``): one JSON object.

Settings: ``request_rate`` (a number, or the string ``"inf"``; SGLang: ``"trace"``), ``burstiness``,
``max_concurrency`` (null: none), ``num_prompts``, ``model_id``, ``backend``, ``date``, and with
``--ramp-up-strategy`` ``ramp_up_strategy``/``ramp_up_start_rps``/``ramp_up_end_rps`` (setting
``ramp_up``). Summary:
``duration`` (s), ``completed``, ``request_throughput``, ``output_throughput`` and every
``{mean,median,std,pNN}_{ttft,tpot,itl,e2el}_ms`` key. A file written with ``--append-result``
holds one result per line: the last is read. With ``--save-detailed`` also per request
(one entry each, failed ones included with ``errors[i]`` non-empty): ``input_lens``,
``output_lens``, ``ttfts`` (s), ``itls`` (lists of s, one gap per streamed chunk after the first),
``errors`` and, in recent versions, ``start_times`` (s, the client's clock). vLLM saves no
per-request latency: it is ``ttft + sum(itls)``, as the client measured it (the last chunk's
time minus the send time). Failed requests are dropped, as vLLM's own metrics drop them.

Without ``--save-detailed`` (SGLang: ``--output-details``) the file is *summary-only*: no
per-request list, but ``completed``, ``total_input_tokens`` and ``total_output_tokens`` (the
successful requests' tokens). It is read as ``completed`` requests at the run's mean lengths
(:func:`mean_lengths`), its measured metrics the file's own summary keys
(:func:`calibrate.runs.compare.summary_metrics`; E2E from the ``latencies`` list recent vLLM
keeps, :func:`kept_latencies`), with a note saying so: a run of one prompt
and answer length (``--dataset-name random``, the default) is replayed as it ran, a mix of
lengths only in its means.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from calibrate.runs.table import (Run, RunError, RunFormat, frame, lengths, need, number_or_none, picked,
                                  register_run_format, seconds, settings)

DETAIL_KEYS = ("input_lens", "output_lens", "ttfts", "itls")


def last_result(doc: Any) -> Any:
    """The newest run of a file that may hold one result object per line (vLLM's
    ``--append-result``, SGLang's ``--output-file``): the last."""
    return doc[-1] if isinstance(doc, list) and doc else doc


def detect(doc: Any) -> bool:
    doc = last_result(doc)
    return (isinstance(doc, dict) and not str(doc.get("backend", "")).startswith("sglang")
            and "mean_e2e_latency_ms" not in doc
            and ("mean_ttft_ms" in doc or "ttfts" in doc) and ("num_prompts" in doc or "request_rate" in doc))


def read_detailed(doc: dict, name: str) -> tuple[np.ndarray, ...] | None:
    """The per-request lists (successful requests only), or None for a summary-only file."""
    present = [k for k in DETAIL_KEYS if k in doc]
    if not present:
        return None
    for k in DETAIL_KEYS:
        if k not in doc:
            # some forks keep input_lens/output_lens without --save-detailed, but no times
            raise RunError(f"{name}: {k}: missing (the file keeps {', '.join(present)} but not every per-request "
                           f"list: re-run with --save-detailed, or --output-details for SGLang)")
    n = len(doc["ttfts"]) if isinstance(doc["ttfts"], list) else -1
    if n < 0:
        raise RunError(f"{name}: ttfts: must be a list of times in seconds (got {type(doc['ttfts']).__name__})")
    inp = lengths(doc["input_lens"], "input_lens", name, n)
    out = lengths(doc["output_lens"], "output_lens", name, n)
    errors = doc.get("errors") or [""] * n
    if not isinstance(errors, list) or len(errors) != n:
        raise RunError(f"{name}: errors: must be a list of {n} strings, one per request")
    ok = np.array([not e for e in errors], dtype=bool)
    ttft = seconds([v if ok[i] else 0.0 for i, v in enumerate(doc["ttfts"])], "ttfts", name, n)
    itls = doc["itls"]
    if not isinstance(itls, list) or len(itls) != n:
        raise RunError(f"{name}: itls: must be a list of {n} lists of gaps in seconds, one per request")
    gaps = []
    for i, g in enumerate(itls):
        if not ok[i]:
            gaps.append([])
            continue
        if not isinstance(g, list):
            raise RunError(f"{name}: itls[{i}]: must be a list of gaps in seconds (got {g!r})")
        gaps.append(list(seconds(g, f"itls[{i}]", name, len(g))))
    start = None
    if "start_times" in doc:
        start = seconds(doc["start_times"], "start_times", name, n)
        start = start - start[ok].min() if ok.any() else start
    keep = np.flatnonzero(ok)
    e2e = np.array([ttft[i] + sum(gaps[i]) for i in range(n)])
    return (inp[keep], out[keep], None if start is None else start[keep], ttft[keep],
            [gaps[i] for i in keep], e2e[keep])


#: per-request list -> the summary keys (ms) its mean is, vLLM's then SGLang's
SUMMARY_MEANS = {"ttfts": ("mean_ttft_ms",), "itls": ("mean_itl_ms",), "e2e": ("mean_e2el_ms", "mean_e2e_latency_ms")}
#: a per-request mean this far (as a ratio) from the file's own summary is warned about
SUMMARY_TOLERANCE = 0.10


def summary_disagrees(doc: dict, name: str, ttft: np.ndarray, gaps: list[list[float]],
                      e2e: np.ndarray) -> list[str]:
    """Warnings where a per-request list (successful requests, s) and the file's own summary
    key for its mean (ms, computed by the client from the same requests) differ by more than
    :data:`SUMMARY_TOLERANCE`: a units mix-up (about 1000x: milliseconds saved where seconds
    belong, or the other way), or lists and summary from different runs."""
    pooled = [g for each in gaps for g in each]
    ours = {"ttfts": float(np.mean(ttft)) * 1e3 if len(ttft) else math.nan,
            "itls": float(np.mean(pooled)) * 1e3 if pooled else math.nan,
            "e2e": float(np.mean(e2e)) * 1e3 if len(e2e) else math.nan}
    out = []
    for key, summary_keys in SUMMARY_MEANS.items():
        k = next((k for k in summary_keys if k in doc), None)
        theirs = doc.get(k) if k else None
        if isinstance(theirs, bool) or not isinstance(theirs, (int, float)) or not theirs > 0:
            continue
        mine = ours[key]
        if not (math.isfinite(mine) and mine > 0) or abs(mine / theirs - 1) <= SUMMARY_TOLERANCE:
            continue
        ratio = mine / theirs
        why = ("the per-request times look like milliseconds where seconds belong" if 500 <= ratio <= 2000 else
               "the per-request times look like seconds where the summary has them in ms, or the summary was "
               "scaled" if 1 / 2000 <= ratio <= 1 / 500 else
               "the lists and the summary come from different runs, or one was edited")
        what = "ttft + sum(itls)" if key == "e2e" else key
        out.append(f"{name}: {what}: mean {mine:.4g} ms against the file's own {k} {theirs:.4g} ms ({ratio:.3g}x): "
                   f"{why} (the per-request values are the ones replayed)")
    return out


def detail_flag(fmt: str) -> str:
    """The client's flag that saves each request's lengths and times: SGLang's or vLLM's."""
    return "--output-details" if fmt == "sglang" else "--save-detailed"


def summary_only_warning(run: Run) -> str:
    """The warning for a summary-only run (no per-request lengths in the file): replayed at its
    mean lengths (or its dataset's), the requests of one length under a max_concurrency move in
    lockstep, which can distort TTFT 2-3x, and a fit absorbs that. Empty for a detailed run."""
    if not run.summary_only:
        return ""
    detail = detail_flag(run.format)
    how = "at their mean lengths" if run.lengths == "means" else "at lengths its dataset settings give"
    mc = run.settings.get("max_concurrency")
    lockstep = (f"; under max_concurrency {mc} requests of one length move in lockstep, which can distort TTFT "
                f"2-3x" if mc and run.lengths == "means" else "")
    return (f"summary-only result: the per-request lengths are not in the file (replayed {how}{lockstep}): "
            f"replaying or calibrating on it is unreliable (re-run the benchmark with {detail})")


def mean_lengths(doc: dict, name: str) -> tuple[np.ndarray, np.ndarray] | None:
    """A summary-only file's requests: ``completed`` of them whose prompt and output tokens add
    up to ``total_input_tokens`` and ``total_output_tokens``, spread as evenly as whole tokens
    allow (the first requests take the remainder, one token each); None when a key is absent."""
    keys = ("completed", "total_input_tokens", "total_output_tokens")
    if any(doc.get(k) is None for k in keys):
        return None
    for k in keys:
        v = doc[k]
        least = 1 if k == "completed" else 0
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or v < least:
            raise RunError(f"{name}: {k}: must be a whole number >= {least} (got {v!r})")
    n = int(doc["completed"])

    def spread(total: int) -> np.ndarray:
        q, r = divmod(int(total), n)
        a = np.full(n, q, dtype=np.int64)
        a[:r] += 1
        return a
    return spread(doc["total_input_tokens"]), spread(doc["total_output_tokens"])


def random_lengths(doc: dict, n: int) -> tuple[np.ndarray, np.ndarray] | None:
    """An SGLang summary line's lengths from its own dataset settings, where it ran its random
    dataset (``dataset_name = "random"``): SGLang draws each prompt uniformly from
    [max(int(L x r), 1), L] tokens and each answer from [int(L_out x r), L_out] (``random_input_len``,
    ``random_output_len``, ``random_range_ratio``; ``sample_random_requests`` in its
    bench_serving.py). Here the draws are that law's n evenly spaced quantiles, each list in its
    own fixed shuffled order (the two draws are independent), scaled to the line's token totals
    (special tokens and retokenisation move them a little). None when the line lacks those keys
    or its totals are more than 10 % off the law's mean (another version's rule ran)."""
    if doc.get("dataset_name") != "random":
        return None
    keys = ("random_input_len", "random_output_len", "random_range_ratio")
    vals = [doc.get(k) for k in keys]
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 for v in vals):
        return None
    L_in, L_out, r = int(vals[0]), int(vals[1]), float(vals[2])
    if L_in < 1 or not 0 <= r <= 1:
        return None
    rng = np.random.default_rng(0)
    q = (np.arange(n) + 0.5) / n
    out = []
    for lo, hi, total, least in ((max(int(L_in * r), 1), L_in, doc["total_input_tokens"], 1),
                                 (int(L_out * r), L_out, doc["total_output_tokens"], 0)):
        law = lo + np.floor(q * (hi - lo + 1)).astype(np.int64)
        if law.sum() <= 0 or abs(total / law.sum() - 1) > 0.10:
            return None
        out.append(_scaled_to(rng.permutation(law), int(total), least))
    return out[0], out[1]


def _scaled_to(a: np.ndarray, total: int, least: int) -> np.ndarray:
    """``a`` scaled to sum to ``total`` in whole tokens (largest remainders round up), each >= ``least``."""
    x = a * (total / a.sum())
    b = np.maximum(np.floor(x).astype(np.int64), least)
    short = total - int(b.sum())
    if short > 0:
        b[np.argsort(-(x - np.floor(x)), kind="stable")[:short]] += 1
    return b


def kept_latencies(doc: dict, name: str, n: int) -> np.ndarray:
    """A summary-only file's end-to-end latencies (s), one per request: recent vLLM keeps its
    ``latencies`` list without --save-detailed (its E2E summary keys only with
    ``--percentile-metrics ...e2el``). Used when every request succeeded (``failed`` 0: the list
    also holds failed requests, which the file no longer says); else NaN, unknown."""
    lat = doc.get("latencies")
    if not isinstance(lat, list) or len(lat) != n or doc.get("failed") not in (0, None):
        return np.full(n, np.nan)
    return seconds(lat, "latencies", name, n)


def _ramp(doc: dict, name: str) -> tuple[str, float, float] | None:
    """``vllm bench serve --ramp-up-strategy``: (``linear``/``exponential``, start, end req/s)."""
    kind = doc.get("ramp_up_strategy")
    if kind is None:
        return None
    lo, hi = doc.get("ramp_up_start_rps"), doc.get("ramp_up_end_rps")
    if kind not in ("linear", "exponential"):
        raise RunError(f"{name}: ramp_up_strategy: must be 'linear' or 'exponential' (got {kind!r})")
    for key, v in (("ramp_up_start_rps", lo), ("ramp_up_end_rps", hi)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or not math.isfinite(v):
            raise RunError(f"{name}: {key}: must be a rate > 0 in requests/s (got {v!r})")
    return str(kind), float(lo), float(hi)


def read_common(doc: dict, name: str, fmt: str) -> Run:
    """vLLM's and SGLang's result objects share these keys."""
    raw_rate = need(doc, "request_rate", name)
    # SGLang writes "trace" when it sent at a trace's own timestamps (--use-trace-timestamps),
    # which the result does not keep: sent as recorded if it has send times, else all at once
    traced = isinstance(raw_rate, str) and raw_rate.strip().lower() == "trace"
    rate = None if traced else number_or_none(raw_rate, "request_rate", name)
    burst = number_or_none(doc.get("burstiness", 1.0), "burstiness", name)
    mc = number_or_none(doc.get("max_concurrency"), "max_concurrency", name)
    if mc is not None and (mc < 1 or mc != int(mc)):
        raise RunError(f"{name}: max_concurrency: must be a whole number >= 1 or null (got {doc['max_concurrency']!r})")
    if rate is not None and rate <= 0:
        raise RunError(f"{name}: request_rate: must be > 0 or 'inf' (got {doc['request_rate']!r})")
    if burst is not None and not burst > 0:
        raise RunError(f"{name}: burstiness: must be > 0 (got {doc['burstiness']!r})")
    det = read_detailed(doc, name)
    law = None  # (a summary-only SGLang line's lengths from its dataset settings: random_lengths)
    if det is None:
        lens = mean_lengths(doc, name)
        if lens is None:
            raise RunError(f"{name}: input_lens: missing (a summary-only result without completed, "
                           f"total_input_tokens and total_output_tokens: re-run the benchmark with --save-detailed, "
                           f"or --output-details for SGLang, so each request's lengths are saved)")
        inp, out = lens
        if fmt == "sglang":
            law = random_lengths(doc, len(inp))
        if law is not None:
            inp, out = law
        start, ttft, gaps, e2e = None, np.full(len(inp), np.nan), None, kept_latencies(doc, name, len(inp))
    else:
        inp, out, start, ttft, gaps, e2e = det
    failed = sum(1 for e in doc.get("errors") or [] if e) if det is not None else 0
    if len(inp) == 0:
        raise RunError(f"{name}: errors: every request failed (expected at least one successful request)")
    summary = {k: v for k, v in doc.items() if not isinstance(v, (list, dict))}
    dur = doc.get("duration")
    run = Run(frame(inp, out, start, ttft, gaps, e2e),
              settings(request_rate=rate if rate is not None else math.inf, burstiness=burst if burst else 1.0,
                       max_concurrency=None if mc is None else int(mc), num_prompts=doc.get("num_prompts"),
                       model=doc.get("model_id") or doc.get("model"), backend=doc.get("backend"),
                       date=doc.get("date")),
              summary, name, fmt, "vllm", float(dur) if isinstance(dur, (int, float)) else math.nan,
              lengths="file" if det is not None else "law" if law is not None else "means")
    if run.summary_only:
        detail = detail_flag(fmt)
        if law is not None:
            r = float(doc["random_range_ratio"])
            how = (f"at its random dataset's lengths (prompts uniform in [{int(inp.min())}, {int(inp.max())}], "
                   f"answers in [{int(out.min())}, {int(out.max())}] tokens: --random-range-ratio {r:g}, scaled "
                   f"to the file's totals, {inp.mean():.1f} / {out.mean():.1f} a request)")
        else:
            how = (f"at their mean lengths, {inp.mean():.1f} prompt / {out.mean():.1f} output tokens (a mix of "
                   f"lengths is kept only in its means)")
        run.notes.append(f"summary-only result (no {detail}): its {len(inp)} requests replayed {how}, and compared "
                         f"with the file's own summary metrics (re-run with {detail} for each request's lengths "
                         f"and times)")
    if det is not None:
        run.warnings += summary_disagrees(doc, name, ttft, gaps, e2e)
    if failed:
        run.notes.append(f"{failed} of {failed + len(inp)} requests failed (errors[i] non-empty): dropped from the "
                         f"measured metrics, as {'SGLang' if fmt == 'sglang' else 'vLLM'}'s own drop them, and from "
                         f"the replay, though in the run each held a concurrency slot until it failed")
    ramp = _ramp(doc, name)
    if ramp is not None:
        run.settings["ramp_up"] = ramp
        if start is None and mc is None:
            run.notes.append(f"--ramp-up-strategy {ramp[0]} from {ramp[1]:g} to {ramp[2]:g} req/s: "
                             f"the replay's arrival process ramps the same way")
    if traced:
        run.notes.append("request_rate 'trace': sent at the file's send times" if start is not None else
                         "request_rate 'trace': the trace's send times are not in the file; sent all at once")
    return run


def read_last(doc: Any, name: str, definitions: str, refused: str, several: str) -> Run:
    """:func:`read_common` on the file's newest result (:func:`last_result`); ``refused``: what
    the one-line error says when that is not an object, ``several``: how the note names the
    results when the file holds more than one."""
    d = last_result(doc)
    if not isinstance(d, dict):
        raise RunError(f"{name}: {refused}")
    run = read_common(d, name, definitions)
    if isinstance(doc, list) and len(doc) > 1:
        run.notes.append(f"{len(doc)} {several}: the last one was read")
    return run


def read_each(doc: Any, name: str, definitions: str, refused: str, only: int | None = None) -> list[Run]:
    """Every result of a file that may hold several (one object per line), or the ``only``-th:
    :func:`read_common` on each, numbered (``Run.part``) when there are several; ``refused`` as
    in :func:`read_last`."""
    docs = doc if isinstance(doc, list) else [doc]
    if not docs:
        raise RunError(f"{name}: {refused}")
    runs = []
    for i in picked(len(docs), only, name):
        d = docs[i - 1]
        if not isinstance(d, dict):
            raise RunError(f"{name}" + (f" line {i}" if len(docs) > 1 else "") + f": {refused}")
        run = read_common(d, name if len(docs) == 1 else f"{name} line {i}", definitions)  # (in its errors)
        if len(docs) > 1:
            run.source, run.part = name, i
        runs.append(run)
    return runs


def read(doc: Any, name: str) -> Run:
    return read_last(doc, name, "vllm", _refused(doc), "results in the file (--append-result)")


def read_all(doc: Any, name: str, only: int | None = None) -> list[Run]:
    return read_each(doc, name, "vllm", _refused(doc), only)


def _refused(doc: Any) -> str:
    return f"not a vLLM result (expected one JSON object, got a {type(last_result(doc)).__name__})"


register_run_format("vllm", RunFormat(detect, read, "vLLM bench serve / benchmark_serving.py JSON (--save-detailed)",
                                      read_all))
