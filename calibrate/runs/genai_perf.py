"""genai-perf's raw export (``profile_export.json``, written by perf_analyzer under genai-perf):
``{"experiments": [{"experiment": {"mode": "concurrency" | "request_rate", "value": N},
"requests": [{"timestamp": ns, "request_inputs": {"payload": "<JSON>"}, "response_timestamps":
[ns, ...], "response_outputs": [{"response": "data: {...}"}, ...]}]}], ...}``.

The file has texts, not token counts (genai-perf counts them with the model's tokenizer,
which priosim does not load). So, documented approximations: a request's output tokens are its
streamed chunks that carry text (one token per chunk, as servers stream; empty and ``[DONE]``
chunks dropped, as genai-perf drops them), and its input tokens are the prompt's
whitespace-separated words (genai-perf's synthetic prompts are words of its corpus); a payload
with an integer ``input_tokens`` (or ``prompt_tokens``) field is read exactly. Times: TTFT =
first text chunk - send; latency = last chunk - send; ITL = the gaps between text chunks.
genai-perf's own "inter token latency" is per request (latency - TTFT) / (output tokens - 1),
vLLM's TPOT; its throughput divides by the span from the first send to the last response.
"""
from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from calibrate.runs.table import Run, RunError, RunFormat, frame, register_run_format, settings


def detect(doc: Any) -> bool:
    if not isinstance(doc, dict) or not isinstance(doc.get("experiments"), list) or not doc["experiments"]:
        return False
    e = doc["experiments"][0]
    return isinstance(e, dict) and isinstance(e.get("requests"), list)


def _chunk_text(resp: Any) -> str:
    """The text a streamed chunk carries ('' for role-only, usage-only and [DONE] chunks)."""
    raw = resp.get("response", "") if isinstance(resp, dict) else resp
    if not isinstance(raw, str):
        return ""
    text = []
    for line in raw.splitlines():
        line = line.strip()
        if not line.startswith("data:"):
            continue
        body = line[5:].strip()
        if body == "[DONE]":
            continue
        try:
            obj = json.loads(body)
        except json.JSONDecodeError:
            continue
        for ch in obj.get("choices") or []:
            delta = ch.get("delta") or {}
            text.append(str(delta.get("content") or ch.get("text") or ""))
    return "".join(text)


def _prompt_tokens(payload: Any) -> int | None:
    try:
        body = json.loads(payload) if isinstance(payload, str) else payload
    except json.JSONDecodeError:
        return None
    if not isinstance(body, dict):
        return None
    for key in ("input_tokens", "prompt_tokens"):
        if isinstance(body.get(key), int) and not isinstance(body.get(key), bool):
            return int(body[key])
    if isinstance(body.get("prompt"), str):
        return len(body["prompt"].split())
    msgs = body.get("messages")
    if isinstance(msgs, list):
        return sum(len(str(m.get("content", "")).split()) for m in msgs if isinstance(m, dict))
    return None


def read(doc: Any, name: str, index: int = 0) -> Run:
    if not detect(doc):
        raise RunError(f"{name}: experiments: missing or empty (expected a genai-perf profile_export.json)")
    exps = doc["experiments"]
    if not 0 <= index < len(exps):
        raise RunError(f"{name}: experiments[{index}]: no such experiment (the file has {len(exps)})")
    e = exps[index]
    reqs = e["requests"]
    if not reqs:
        raise RunError(f"{name}: experiments[{index}].requests: empty (expected at least one request)")
    inp, out, start, ttft, gaps, e2e = [], [], [], [], [], []
    for i, r in enumerate(reqs):
        where = f"experiments[{index}].requests[{i}]"
        ts = r.get("timestamp") if isinstance(r, dict) else None
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or ts < 0:
            raise RunError(f"{name}: {where}.timestamp: must be a send time in ns >= 0 (got {ts!r})")
        rts = r.get("response_timestamps")
        outs = r.get("response_outputs", [])
        if not isinstance(rts, list) or not rts:
            raise RunError(f"{name}: {where}.response_timestamps: must be a non-empty list of ns times")
        if not isinstance(outs, list) or len(outs) != len(rts):
            raise RunError(f"{name}: {where}.response_outputs: must be a list of {len(rts)} responses, one per timestamp")
        times = [t for t, o in zip(rts, outs) if _chunk_text(o)]
        if not times:
            raise RunError(f"{name}: {where}.response_outputs: no chunk carries text (expected a streamed answer)")
        if any(isinstance(t, bool) or not isinstance(t, (int, float)) or t < ts for t in times):
            raise RunError(f"{name}: {where}.response_timestamps: must be ns times after the send time {ts}")
        p = _prompt_tokens((r.get("request_inputs") or {}).get("payload"))
        if p is None:
            raise RunError(f"{name}: {where}.request_inputs.payload: no prompt to count (expected a JSON "
                           f"payload with 'prompt' or 'messages')")
        inp.append(max(p, 1))
        out.append(len(times))
        start.append(float(ts) / 1e9)
        ttft.append((times[0] - ts) / 1e9)
        e2e.append((times[-1] - ts) / 1e9)
        gaps.append(list(np.diff(np.asarray(times, dtype=float)) / 1e9))
    s = np.asarray(start)
    t0 = float(s.min())
    exp = e.get("experiment") or {}
    mode, value = exp.get("mode"), exp.get("value")
    mc = int(value) if mode == "concurrency" and isinstance(value, (int, float)) else None
    rate = float(value) if mode == "request_rate" and isinstance(value, (int, float)) else math.inf
    ends = s + np.asarray(e2e)
    run = Run(frame(inp, out, s - t0, ttft, gaps, e2e),
              settings(request_rate=rate, burstiness=None, max_concurrency=mc, num_prompts=len(reqs),
                       model=doc.get("model"), backend=doc.get("service_kind"), date=None),
              {"mode": mode, "value": value, "experiments": len(exps), "endpoint": doc.get("endpoint")},
              name, "genai-perf", "genai-perf", float(ends.max() - t0))
    run.notes.append("token counts approximated: output = text chunks, input = prompt words")
    return run


register_run_format("genai-perf", RunFormat(detect, read, "genai-perf profile_export.json (per-request ns timestamps)"))
