"""genai-perf's raw export (``profile_export.json``, written by perf_analyzer under genai-perf):
``{"experiments": [{"experiment": {"mode": "concurrency" | "request_rate", "value": N},
"requests": [{"timestamp": ns, "request_inputs": {"payload": "<JSON>"}, "response_timestamps":
[ns, ...], "response_outputs": [{"response": "data: {...}"}, ...]}]}], ...}``.

A response is a server-sent-events chunk (``data: {...}``, ``--streaming``), or, without
``--streaming`` (genai-perf's default), the whole answer as one bare JSON body
(``chat.completion`` / ``text_completion``); Triton's own service kind writes
``{"text_output": "..."}`` and ``request_inputs: {"text_input": ...}``. A chunk split across two
responses (a "splintered" SSE event, no ``data:`` prefix) is joined to the one before, as
genai-perf's parser does.

The file has texts, not token counts (genai-perf counts them with the model's tokenizer, which
priosim does not load). So: a ``usage`` object in a response (``stream_options.include_usage``,
or any non-streamed OpenAI answer) gives the exact ``prompt_tokens`` and ``completion_tokens``;
without one, documented approximations: output tokens are the streamed chunks that carry text
(one token per chunk, as servers stream; empty, role-only and ``[DONE]`` chunks dropped, as
genai-perf drops them), or the answer's words when it came in one piece; input tokens are the
prompt's whitespace-separated words (genai-perf's synthetic prompts are words of its corpus),
exact for an integer ``input_tokens`` (or ``prompt_tokens``) field in the payload. Times: TTFT =
first text chunk - send; latency = last chunk - send; ITL = the gaps between text chunks.
Requests with no response or no text (failed; genai-perf skips them too) are dropped with a note.
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


def _raw(resp: Any) -> str:
    raw = resp.get("response", "") if isinstance(resp, dict) else resp
    return raw if isinstance(raw, str) else ""


def _join_splinters(outs: list) -> list:
    """genai-perf's fix for an SSE event split across two responses: a response that does not
    start with ``data:`` belongs (up to its first ``data:``) to the one before."""
    raws = [_raw(o) for o in outs]
    if not any(r.lstrip().startswith("data:") for r in raws):
        return list(outs)  # not streamed: each response is a whole body
    fixed = list(outs)
    for i in range(len(raws) - 1, 0, -1):
        r = raws[i]
        if not r.strip() or r.lstrip().startswith("data:") or r.lstrip().startswith(":"):
            continue
        if "data:" not in raws[i - 1]:
            continue
        cut = r.find("data: ")
        head, tail = (r, "") if cut < 0 else (r[:cut], r[cut:])
        raws[i - 1] += head
        raws[i] = tail
    for i, o in enumerate(outs):
        if isinstance(o, dict) and "response" in o:
            fixed[i] = {**o, "response": raws[i]}
    return fixed


def _bodies(raw: str) -> list[Any]:
    """The JSON objects one response carries: its SSE ``data:`` events, or one bare body."""
    text = raw.strip()
    if not text:
        return []
    if not text.startswith("data:") and "\ndata:" not in text:
        try:
            return [json.loads(text)]
        except json.JSONDecodeError:
            return []
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("data:"):
            continue
        body = line[5:].strip()
        if body == "[DONE]":
            continue
        try:
            out.append(json.loads(body))
        except json.JSONDecodeError:
            continue
    return out


def _chunk(resp: Any) -> tuple[str, dict | None]:
    """The text one response carries ('' for role-only, usage-only, error and [DONE] chunks)
    and its ``usage`` object, if any."""
    if isinstance(resp, dict) and "response" not in resp and isinstance(resp.get("text_output"), str):
        return resp["text_output"], None  # Triton's own service kind
    text, usage = [], None
    for obj in _bodies(_raw(resp)):
        if not isinstance(obj, dict):
            continue
        if isinstance(obj.get("usage"), dict):
            usage = obj["usage"]
        for ch in obj.get("choices") or []:
            if not isinstance(ch, dict):
                continue
            for part in (ch.get("delta"), ch.get("message")):
                if isinstance(part, dict):
                    # reasoning text is generated tokens too: its chunks are timed like the answer's
                    for key in ("content", "reasoning_content", "reasoning"):
                        if isinstance(part.get(key), str):
                            text.append(part[key])
            if isinstance(ch.get("text"), str):
                text.append(ch["text"])
        if isinstance(obj.get("text_output"), str):
            text.append(obj["text_output"])
    return "".join(text), usage


def _words(content: Any) -> int:
    """Whitespace words of a message's content: a string, or a list of parts whose text counts."""
    if isinstance(content, str):
        return len(content.split())
    if isinstance(content, list):
        return sum(len(str(p.get("text", "")).split()) for p in content if isinstance(p, dict))
    return 0


def _prompt_tokens(inputs: Any) -> int | None:
    if not isinstance(inputs, dict):
        return None
    if isinstance(inputs.get("text_input"), (str, list)):  # Triton's own service kind
        t = inputs["text_input"]
        return _words(t if isinstance(t, str) else " ".join(map(str, t)))
    payload = inputs.get("payload")
    try:
        body = json.loads(payload) if isinstance(payload, str) else payload
    except json.JSONDecodeError:
        return None
    if isinstance(body, list) and len(body) == 1:
        body = body[0]
    if not isinstance(body, dict):
        return None
    for key in ("input_tokens", "prompt_tokens"):
        if isinstance(body.get(key), int) and not isinstance(body.get(key), bool):
            return int(body[key])
    if isinstance(body.get("prompt"), (str, list)):
        p = body["prompt"]
        return _words(p if isinstance(p, str) else " ".join(map(str, p)))
    msgs = body.get("messages")
    if isinstance(msgs, list):
        return sum(_words(m.get("content")) for m in msgs if isinstance(m, dict))
    return None


def _payload_model(reqs: list) -> str | None:
    """The model the requests asked for: the first payload's ``model`` (genai-perf sends every
    request to one model; the export itself has no top-level ``model`` key)."""
    for r in reqs[:50]:
        inputs = r.get("request_inputs") if isinstance(r, dict) else None
        payload = inputs.get("payload") if isinstance(inputs, dict) else None
        try:
            body = json.loads(payload) if isinstance(payload, str) else payload
        except json.JSONDecodeError:
            continue
        if isinstance(body, list) and len(body) == 1:
            body = body[0]
        if isinstance(body, dict) and isinstance(body.get("model"), str) and body["model"].strip():
            return body["model"]
    return None


def _usage_count(usage: dict | None, key: str) -> int | None:
    v = usage.get(key) if isinstance(usage, dict) else None
    return int(v) if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


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
    dropped, exact_out, exact_in = 0, 0, 0
    for i, r in enumerate(reqs):
        where = f"experiments[{index}].requests[{i}]"
        ts = r.get("timestamp") if isinstance(r, dict) else None
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or ts < 0:
            raise RunError(f"{name}: {where}.timestamp: must be a send time in ns >= 0 (got {ts!r})")
        rts = r.get("response_timestamps")
        outs = r.get("response_outputs", [])
        if not isinstance(rts, list):
            raise RunError(f"{name}: {where}.response_timestamps: must be a list of ns times (got {rts!r})")
        if not rts:
            dropped += 1  # no response: a failed request, which genai-perf skips too
            continue
        if not isinstance(outs, list) or len(outs) != len(rts):
            raise RunError(f"{name}: {where}.response_outputs: must be a list of {len(rts)} responses, "
                           f"one per timestamp")
        chunks = [_chunk(o) for o in _join_splinters(outs)]
        times = [t for t, (text, _) in zip(rts, chunks) if text]
        if not times:
            dropped += 1  # an error body, or an answer with no text: nothing to time
            continue
        if any(isinstance(t, bool) or not isinstance(t, (int, float)) or t < ts for t in times):
            raise RunError(f"{name}: {where}.response_timestamps: must be ns times after the send time {ts}")
        usage = next((u for _, u in reversed(chunks) if isinstance(u, dict)), None)
        n_out = _usage_count(usage, "completion_tokens")
        if n_out is not None:
            exact_out += 1
        elif len(times) == 1:  # the answer in one piece: its words stand for its tokens
            n_out = max(1, len("".join(text for text, _ in chunks).split()))
        else:
            n_out = len(times)
        p = _usage_count(usage, "prompt_tokens")
        if p is not None:
            exact_in += 1
        else:
            p = _prompt_tokens(r.get("request_inputs"))
        if p is None:
            raise RunError(f"{name}: {where}.request_inputs.payload: no prompt to count (expected a JSON "
                           f"payload with 'prompt' or 'messages')")
        inp.append(max(p, 1))
        out.append(n_out)
        start.append(float(ts) / 1e9)
        ttft.append((times[0] - ts) / 1e9)
        e2e.append((times[-1] - ts) / 1e9)
        gaps.append(list(np.diff(np.asarray(times, dtype=float)) / 1e9))
    if not inp:
        raise RunError(f"{name}: experiments[{index}].requests: no request has a response with text "
                       f"(expected at least one answered request; {dropped} failed or empty)")
    s = np.asarray(start)
    t0 = float(s.min())
    exp = e.get("experiment") or {}
    mode, value = exp.get("mode"), exp.get("value")
    num = isinstance(value, (int, float)) and not isinstance(value, bool)
    mc = int(value) if mode == "concurrency" and num and value >= 1 else None
    # request_rate 0 is perf_analyzer's "no rate set" (e.g. session runs): sent as recorded
    rate = float(value) if mode == "request_rate" and num and value > 0 else math.inf
    ends = s + np.asarray(e2e)
    run = Run(frame(inp, out, s - t0, ttft, gaps, e2e),
              settings(request_rate=rate, burstiness=None, max_concurrency=mc, num_prompts=len(reqs),
                       model=doc.get("model") or _payload_model(reqs), backend=doc.get("service_kind"), date=None),
              {"mode": mode, "value": value, "experiments": len(exps), "endpoint": doc.get("endpoint"),
               "dropped": dropped},
              name, "genai-perf", "genai-perf", float(ends.max() - t0))
    n = len(inp)
    if exact_out < n or exact_in < n:
        run.notes.append(f"token counts approximated for requests without a usage object (output: {n - exact_out}, "
                         f"input: {n - exact_in} of {n}): output = text chunks (or words of a one-piece "
                         f"answer), input = prompt words")
    if dropped:
        run.notes.append(f"{dropped} of {len(reqs)} requests had no response with text (failed): dropped")
    if len(exps) > 1:
        run.notes.append(f"{len(exps)} experiments in the file: experiment {index} was read")
    return run


register_run_format("genai-perf", RunFormat(detect, read, "genai-perf profile_export.json (per-request ns timestamps)"))
