"""SGLang's ``python -m sglang.bench_serving`` result: one JSON object per line, appended to
``--output-file`` run after run (the last line is the newest run and the one read; a file of one
object is read as it is). Its keys are vLLM's (``calibrate.runs.vllm``) but for
``mean_e2e_latency_ms`` (vLLM: ``mean_e2el_ms``), ``backend`` ``sglang*`` and
``total_output_tokens_retokenized``; with ``--output-details`` it saves ``input_lens``,
``output_lens``, ``ttfts``, ``itls`` and ``errors`` per request. Its TPOT, ITL and medians are
defined as vLLM's (``calculate_metrics`` in ``python/sglang/bench_serving.py``).
"""
from __future__ import annotations

from typing import Any

from calibrate.runs.table import Run, RunFormat, register_run_format
from calibrate.runs.vllm import last_result, read_each, read_last

REFUSED = "not an SGLang result (expected JSON objects, one per line)"


def detect(doc: Any) -> bool:
    d = last_result(doc)
    return isinstance(d, dict) and ("mean_e2e_latency_ms" in d or "total_output_tokens_retokenized" in d
                                    or str(d.get("backend", "")).startswith("sglang"))


def read(doc: Any, name: str) -> Run:
    return read_last(doc, name, "sglang", REFUSED, "result lines")


def read_all(doc: Any, name: str, only: int | None = None) -> list[Run]:
    return read_each(doc, name, "sglang", REFUSED, only)


register_run_format("sglang", RunFormat(detect, read, "SGLang bench_serving JSONL (--output-details)", read_all))
