"""GuideLLM's JSON report (``guidellm benchmark ... --output-path report.json``; 0.2 to 0.8):
``{"benchmarks": [{"config" | "args": {"strategy": {...}}, "requests": {"successful": [...],
...}, "metrics": {...}}]}``. A report may hold several benchmarks (a sweep); the first is read
(``benchmark = N`` picks another, :func:`read_run`'s ``index``), each by :func:`read_all`
(``calibrate --from-runs`` fits every one).

Per successful request: ``prompt_tokens``, ``output_tokens``, the send and end times
(``request_start_time``/``request_end_time``, or 0.2-0.3's ``start_time``/``end_time``; s, epoch),
``time_to_first_token_ms``, ``request_latency`` (s) and the first/last token times
(``info.timings.first_token_iteration``/``last_token_iteration``, or ``first_token_time``/
``last_token_time``). GuideLLM keeps no per-chunk gaps, so ``itl_s`` is None. Its own
per-request definitions (checked against real reports' numbers): TPOT = (last token - send)
/ output_tokens from 0.4 on (the first token's wait included), (last token - first token) /
output_tokens in 0.2-0.3 (metrics ``guidellm-0.3``); ITL = (last token - first token) /
(output_tokens - 1) in all. The strategy gives the settings: ``synchronous`` is one at a time,
``concurrent`` ``streams`` at a time, ``throughput`` all at once, ``constant``/``poisson`` a rate.

The request list may be a sample of the run's requests (``sample_size``, a stripped report):
a note says how many of how many; an empty list is refused. Requests outside 0.4+'s measured
window (``scheduler_metrics.measure_start_time``/``measure_end_time``; a request counts when
it finished after the window opened and was sent before it closed: warmup and cooldown
requests are still listed) are dropped, as GuideLLM's own metrics drop them; so is a successful request
with no first-token time. Each drop is noted.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from calibrate.runs.table import Run, RunError, RunFormat, frame, need, picked, register_run_format, settings


def detect(doc: Any) -> bool:
    return (isinstance(doc, dict) and isinstance(doc.get("benchmarks"), list)
            and any(isinstance(b, dict) and "requests" in b for b in doc["benchmarks"]))


def _num(r: dict, keys: tuple[str, ...], name: str, where: str, required: bool = True) -> float:
    for k in keys:
        node: Any = r
        for part in k.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            if isinstance(node, bool) or not isinstance(node, (int, float)) or not math.isfinite(node):
                raise RunError(f"{name}: {where}.{k}: must be a number (got {node!r})")
            return float(node)
    if required:
        raise RunError(f"{name}: {where}.{keys[0]}: missing (expected it in each GuideLLM request)")
    return math.nan


def _made(b: dict) -> int | None:
    """How many requests of the benchmark succeeded, by its own count (the request list may be
    a sample of them: ``--output-sampling`` / ``sample_size``, or a stripped report)."""
    counts = []
    for path in ("scheduler_metrics.requests_made.successful", "run_stats.requests_made.successful",
                 "request_totals.successful", "metrics.request_totals.successful"):
        node: Any = b
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, int) and not isinstance(node, bool):
            counts.append(node)
    # the largest: a stripped report may have edited one count and not the others
    return max(counts) if counts else None


def _window(b: dict) -> tuple[float, float] | None:
    """GuideLLM 0.4+'s measured window (``scheduler_metrics.measure_start_time`` /
    ``measure_end_time``, s, epoch): its metrics count only the requests that overlap it;
    warmup and cooldown requests are still listed."""
    sm = b.get("scheduler_metrics") if isinstance(b.get("scheduler_metrics"), dict) else {}
    lo, hi = sm.get("measure_start_time"), sm.get("measure_end_time")
    ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 for v in (lo, hi))
    return (float(lo), float(hi)) if ok and hi > lo else None


def _in_window(window: tuple[float, float] | None, start: float, end: float) -> bool:
    # GuideLLM counts a request that overlaps the window (it finished after the warmup ended and
    # was sent before the cooldown began): this rule gives its own request counts exactly
    return window is None or (end > window[0] and start < window[1])


def _strategy(b: dict) -> dict:
    for k in ("config", "args"):
        s = b.get(k, {}).get("strategy") if isinstance(b.get(k), dict) else None
        if isinstance(s, dict):
            return s
    return {}


def read(doc: Any, name: str, index: int = 0) -> Run:
    benches = need(doc, "benchmarks", name) if isinstance(doc, dict) else None
    if not isinstance(benches, list) or not benches:
        raise RunError(f"{name}: benchmarks: must be a non-empty list (a GuideLLM report)")
    if not 0 <= index < len(benches):
        raise RunError(f"{name}: benchmarks[{index}]: no such benchmark (the report has {len(benches)})")
    b = benches[index]
    reqs = need(b, "requests", name, f"benchmarks[{index}].")
    ok = reqs.get("successful") if isinstance(reqs, dict) else None
    made = _made(b)
    if isinstance(ok, list) and not ok:
        others = [k for k, o in enumerate(benches) if k != index and isinstance(o, dict)
                  and isinstance(o.get("requests"), dict) and o["requests"].get("successful")]
        raise RunError(f"{name}: benchmarks[{index}].requests.successful: empty (the report keeps no per-request "
                       f"records for this benchmark" + (f", though {made} succeeded" if made else "")
                       + (f"; benchmark {others[0]} has some)" if others else
                          "; expected a report saved with its requests, not stripped or sampled to none)"))
    if not isinstance(ok, list):
        raise RunError(f"{name}: benchmarks[{index}].requests.successful: must be a non-empty list of requests")
    cols: dict[str, list] = {k: [] for k in ("inp", "out", "start", "ttft", "e2e", "first", "last")}
    untimed = outside = 0
    window = _window(b)
    for i, r in enumerate(ok):
        where = f"benchmarks[{index}].requests.successful[{i}]"
        if not isinstance(r, dict):
            raise RunError(f"{name}: {where}: must be a request object (got {r!r})")
        counts = []  # (prompt, output): kept only with the request
        for key in ("prompt_tokens", "output_tokens"):
            v = r.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or v != int(v):
                raise RunError(f"{name}: {where}.{key}: must be a non-negative integer token count (got {v!r})")
            counts.append(int(v))
        start = _num(r, ("request_start_time", "info.timings.request_start", "start_time"), name, where)
        end = _num(r, ("request_end_time", "info.timings.request_end", "end_time"), name, where)
        first = _num(r, ("info.timings.first_token_iteration", "first_token_time"), name, where, False)
        last = _num(r, ("info.timings.last_token_iteration", "last_token_time"), name, where, False)
        ttft_ms = _num(r, ("time_to_first_token_ms",), name, where, False)
        ttft = ttft_ms / 1e3 if math.isfinite(ttft_ms) else first - start
        lat = _num(r, ("request_latency",), name, where, False)
        e2e = lat if math.isfinite(lat) else end - start
        if math.isnan(ttft):
            # no first-token time (GuideLLM 0.7+ leaves it null when no token was streamed)
            untimed += 1
            continue
        if not (ttft >= 0 and e2e >= 0):
            raise RunError(f"{name}: {where}: negative time to first token or latency ({ttft!r}, {e2e!r})")
        if not _in_window(window, start, end):
            outside += 1
            continue
        cols["inp"].append(counts[0])
        cols["out"].append(counts[1])
        cols["start"].append(start)
        cols["ttft"].append(ttft)
        cols["e2e"].append(e2e)
        cols["first"].append(first)
        cols["last"].append(last)
    if not cols["start"]:
        raise RunError(f"{name}: benchmarks[{index}].requests.successful: no request has a first-token time "
                       f"(expected time_to_first_token_ms or info.timings.first_token_iteration)")
    # 0.2-0.3 reports (top-level first_token_time) define TPOT from the first token, 0.4+ from the send
    legacy = "first_token_time" in ok[0] and "info" not in ok[0]
    start = np.asarray(cols["start"])
    t0 = float(start.min())
    df = frame(cols["inp"], cols["out"], start - t0, cols["ttft"], None, cols["e2e"])
    # GuideLLM's own TPOT needs the last token's time: kept beside the table for its definition
    df["last_token_s"] = np.asarray(cols["last"]) - np.asarray(cols["start"])
    st = _strategy(b)
    kind = st.get("type_")
    streams = st.get("streams") or st.get("max_concurrency")
    mc = 1 if kind == "synchronous" else (int(streams) if kind == "concurrent" and streams else None)
    rate = float(st["rate"]) if kind in ("constant", "poisson") and isinstance(st.get("rate"), (int, float)) else math.inf
    args = doc.get("args", {}) if isinstance(doc.get("args"), dict) else {}
    backend = b.get("config", {}).get("backend", {}) if isinstance(b.get("config"), dict) else {}
    worker = b.get("worker") if isinstance(b.get("worker"), dict) else {}  # 0.2-0.3: the worker names it
    model = (args.get("model") or (backend.get("model") if isinstance(backend, dict) else None)
             or worker.get("backend_model"))
    ends = start + np.asarray(cols["e2e"])
    run = Run(df, settings(request_rate=rate, burstiness=1.0 if kind == "poisson" else None, max_concurrency=mc,
                           num_prompts=len(ok), model=model, backend=args.get("backend"), date=None),
              {"strategy": kind, "benchmarks": len(benches), "successful": len(ok),
               "errored": len(reqs.get("errored") or []), "incomplete": len(reqs.get("incomplete") or [])},
              name, "guidellm", "guidellm-0.3" if legacy else "guidellm", float(ends.max() - t0))
    if made is not None and made > len(ok):
        run.notes.append(f"the report lists {len(ok)} of the {made} successful requests (a sample): measured "
                         f"metrics and the replay use the listed ones, so the load sent is thinner than the run's")
    if outside:
        run.notes.append(f"{outside} requests outside GuideLLM's measured window (its warmup/cooldown): dropped, "
                         f"as its own metrics drop them")
    if untimed:
        run.notes.append(f"{untimed} successful requests without a first-token time: dropped")
    if len(benches) > 1:
        run.notes.append(f"{len(benches)} benchmarks in the report: benchmark {index} was read")
    return run


def read_all(doc: Any, name: str, only: int | None = None) -> list[Run]:
    """Every benchmark of the report (a sweep's), or the ``only``-th, each a run numbered from 1
    (``Run.part``)."""
    n = len(need(doc, "benchmarks", name)) if isinstance(doc, dict) else 0
    if n <= 1 and only in (None, 1):
        return [read(doc, name)]
    runs = []
    for k in picked(n, only, name):
        run = read(doc, name, k - 1)
        run.notes = [m for m in run.notes if not m.endswith(f"benchmark {k - 1} was read")]
        run.part = k
        runs.append(run)
    return runs


register_run_format("guidellm", RunFormat(detect, read, "GuideLLM JSON report (benchmarks -> requests)", read_all))
