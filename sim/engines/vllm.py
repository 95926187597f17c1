"""vLLM: the defaults each release applies on a GPU, and its ``vllm serve`` flags.

Defaults as read in vLLM's ``vllm/engine/arg_utils.py`` (``_set_default_args`` /
``get_batch_defaults``) of each era, for the OpenAI server (``entrypoint = "server"``, what
``vllm serve`` runs) and the offline ``LLM`` class (``"offline"``):

* V0 (before 0.8): at most 256 sequences; chunked prefill off unless asked for (vLLM turned it on
  by itself only for models of more than 32k context, with a 512-token budget: set it with
  ``--enable-chunked-prefill --max-num-batched-tokens 512``), budget 8192 tokens; a waiting request
  of higher priority may preempt running ones (V0's priority scheduler); overhead preset
  ``vllm-0.4`` before 0.5, else ``vllm-0.6``.
* V1 (0.8 and later): chunked prefill always, prefix caching on, block-level prefix hashes
  (16 tokens); waiting requests never preempt (V1 preempts only when a running request cannot grow);
  running requests take the step's token budget in the order they were admitted, whatever their
  priority (``Scheduler.schedule`` walks its ``running`` list, appended to at each admission;
  ``engine.running_order = "admission"``), and a request that must preempt itself ends the walk;
  overhead preset ``vllm-v1``. Batch limits by GPU: 0.8.x gave H100 / H200 a budget of 8192 tokens
  (16384 offline), other GPUs 2048 (8192); V1 started with 1024 sequences on every GPU, and 0.8.4
  (vLLM PR #16158, April 2025, after out-of-memory reports) went back to 256 except on H100 / H200;
  from 0.9 (vLLM PR #17885) a GPU of at least 70 GiB that is not an A100 gets 8192 tokens (16384
  offline) and 1024 sequences, the rest 2048 (8192) and 256.
* Async scheduling (``--async-scheduling`` from 0.10; on by default from 0.14, vLLM PR #27614):
  the scheduler forms step n+1 while the GPU runs step n, so a step's host-CPU work hides under
  its GPU work and a request arriving during a step joins the one after next. Overhead preset
  ``vllm-v1-async`` (``vllm-v1``'s terms, hidden) from 0.14, or where
  ``engine.overlap_scheduling`` (``--[no-]async-scheduling``) asks for it.
* ``gpu_memory_utilization`` 0.9, block size 16, recompute preemption.

Batching (``engine.batching``): V0 without chunked prefill (``_schedule_default`` in vllm-project/vllm
``vllm/core/scheduler.py``, 0.3 to 0.7) runs a step of prefills alone whenever it can schedule
one, and decodes otherwise: ``"prefill_first"``, V0's default. V0 with chunked prefill
(``_schedule_chunked_prefill``: the decodes, then prompt chunks in the same step) and V1 run
``"mixed"`` steps. A scenario that sets ``engine.chunked_prefill`` (or ``--enable-chunked-prefill``
/ ``--no-enable-chunked-prefill``) gets the matching batching unless it sets ``engine.batching``.
"""
from __future__ import annotations

from sim.engines import (ENGINES, EngineFamily, Flag, choice, fraction, kv_cache_dtype, positive_int, sixteen_bit,
                         token_count, version_tuple)
from sim.engines.gpu import Gpu

#: The release a vLLM scenario without ``engine_version`` models: the V1 preset's fit rows ran it
#: (later ones schedule asynchronously, a preset derived and not fitted: give their version)
LATEST = "0.11.0"


def batching(version: tuple, chunked_prefill: bool) -> str:
    """The ``engine.batching`` vLLM ``version`` uses with chunked prefill on or off."""
    return "prefill_first" if version < (0, 8, 0) and not chunked_prefill else "mixed"


#: The first release that schedules asynchronously unless told not to (vLLM PR #27614, merged
#: 2025-12; ``--async-scheduling`` from 0.10 turned it on before).
ASYNC_DEFAULT = (0, 14, 0)


def overhead(version: tuple, overlapped: bool) -> str:
    """The overhead preset of vLLM ``version``, scheduling asynchronously or not (V0 cannot)."""
    if overlapped and version < (0, 10, 0):
        raise ValueError(f"vLLM {'.'.join(map(str, version))} has no async scheduling (expected "
                         f"engine.overlap_scheduling = false, or engine_version 0.10 or later)")
    if version < (0, 8, 0):
        return "vllm-0.4" if version < (0, 5, 0) else "vllm-0.6"
    return "vllm-v1-async" if overlapped else "vllm-v1"


def defaults(version: tuple, gpu: Gpu, entrypoint: str, tp: int) -> dict:
    """Engine keys and the values vLLM ``version`` uses on ``gpu`` (see the module docstring)."""
    offline = entrypoint == "offline"
    out = {"block_size": 16, "preemption": "recompute", "gpu_memory_utilization": 0.9}
    if version < (0, 8, 0):
        out.update(overhead=overhead(version, False), max_num_seqs=256,
                   max_batched_tokens=8192, chunked_prefill=False, prefix_caching=False,
                   preempt_for_waiting="priority", batching=batching(version, False))
        return out
    out.update(overhead=overhead(version, version >= ASYNC_DEFAULT), chunked_prefill=True, prefix_caching=True,
               prefix_block_tokens=16, preempt_for_waiting="never", batching=batching(version, True),
               running_order="admission")
    if version < (0, 9, 0):
        big = "h100" in gpu.key or "h200" in gpu.key
        out.update(max_num_seqs=1024 if big or version < (0, 8, 4) else 256)
    else:
        big = gpu.memory_gib() >= 70 and not gpu.is_a100()
        out.update(max_num_seqs=1024 if big else 256)
    out["max_batched_tokens"] = (16384 if offline else 8192) if big else (8192 if offline else 2048)
    return out


def verify(cfg) -> str | None:
    """Why vLLM would refuse these settings at start-up (its ``SchedulerConfig``: every sequence
    in a step takes a token of the budget), or what the release cannot do (V1 has no swap: its
    scheduler's ``_preempt_request`` frees the blocks and recomputes), or None."""
    version = version_tuple(cfg.engine_version, LATEST)
    if cfg.preemption == "swap" and version >= (0, 8, 0):
        return (f"engine.preemption = \"swap\": vLLM {'.'.join(map(str, version))} (V1) preempts by recompute only "
                f"(expected \"recompute\", or an engine_version before 0.8 for V0's swap)")
    if cfg.max_batched_tokens < cfg.max_num_seqs:
        return (f"engine.max_batched_tokens = {cfg.max_batched_tokens} is less than engine.max_num_seqs = "
                f"{cfg.max_num_seqs}, which vLLM refuses at start-up (expected --max-num-batched-tokens >= "
                f"--max-num-seqs)")
    return None


FLAGS = {
    "--max-num-seqs": Flag("engine.max_num_seqs", positive_int),
    "--max-num-batched-tokens": Flag("engine.max_batched_tokens", positive_int),
    "--gpu-memory-utilization": Flag("engine.gpu_memory_utilization", fraction),
    "--block-size": Flag("engine.block_size", positive_int),
    "--enable-prefix-caching": Flag("engine.prefix_caching", None, True),
    "--no-enable-prefix-caching": Flag("engine.prefix_caching", None, False),
    # (V0: the batching follows, mixed with chunked prefill, prefill_first without; see batching())
    "--enable-chunked-prefill": Flag("engine.chunked_prefill", None, True),
    "--no-enable-chunked-prefill": Flag("engine.chunked_prefill", None, False),
    "--long-prefill-token-threshold": Flag("engine.max_prefill_chunk", positive_int),
    "--preemption-mode": Flag("engine.preemption", choice("recompute", "swap")),
    # how a waiting request may preempt follows the era (V0: by priority; V1: never)
    "--scheduling-policy": Flag("policy.name", choice("fcfs", "priority")),
    "--kv-cache-dtype": Flag("engine.kv_dtype", kv_cache_dtype),
    "--max-model-len": Flag("engine.max_model_len", token_count),
    "--dtype": Flag("engine.dtype", sixteen_bit),  # (16-bit or auto: the profile's; else not modelled)
    "--tensor-parallel-size": Flag("engine.tp", positive_int),
    "-tp": Flag("engine.tp", positive_int),
    "--async-scheduling": Flag("engine.overlap_scheduling", None, True),
    "--no-async-scheduling": Flag("engine.overlap_scheduling", None, False),
}
#: Flags that change no simulated time: where the server listens, what it logs, names and paths.
INERT = frozenset({
    "--host", "--port", "--served-model-name", "--disable-log-requests", "--disable-log-stats",
    "--api-key", "--trust-remote-code", "--download-dir", "--uvicorn-log-level", "--model", "--tokenizer",
    "--seed", "--enable-log-requests", "--disable-uvicorn-access-log", "--chat-template", "--hf-token",
    "--max-log-len", "--disable-fastapi-docs", "--enable-auto-tool-choice", "--tool-call-parser", "--revision",
    "--tokenizer-revision", "--response-role", "--root-path", "--allowed-origins", "--ssl-keyfile",
    "--ssl-certfile", "--enable-prompt-tokens-details", "--enable-request-id-headers",
})

ENGINES.register("vllm", EngineFamily("vllm", LATEST, defaults, "gpu_memory_utilization", FLAGS, INERT,
                                     batching, overhead, verify),
                 "vLLM (V0 before 0.8, V1 from 0.8)")
