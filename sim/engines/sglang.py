"""SGLang: the defaults each release applies on a GPU, and its ``sglang.launch_server`` flags.

As read in SGLang's ``python/sglang/srt/server_args.py`` (``__post_init__`` and, from 0.4, its
GPU-memory settings):

* ``chunked_prefill_size`` (priosim's token budget per step): 8192 before 0.4; from 0.4 by GPU
  memory: 2048 below 35 GiB, 4096 below 60 GiB, 8192 below 160 GiB, else 16384.
* ``mem_fraction_static`` (the share of GPU memory for weights and the KV pool together): before
  0.5 by tensor-parallel degree (0.88 at TP 1, 0.87 at 2, 0.85 at 4, 0.81 at 8); from 0.5 computed
  from what is not KV: 512 MiB + 1.5 MiB per chunk token + 128 MiB per TP rank, at least 10 GiB on
  a GPU of more than 60 GiB (CUDA-graph memory, which SGLang adds too, is left out: an estimate).
* the running requests in the order they were admitted (``engine.running_order``: SGLang goes on
  with its one chunked request before it takes new ones, and decodes its whole batch),
* page size 1 token (priosim's block size), the radix prefix cache on (16-token prefix hashes),
  waiting requests never preempt (priority scheduling is off unless asked for), at most 4096
  running requests: SGLang's own cap (``max_running_requests`` unset) is the smaller of half its
  KV pool's tokens and its request-slot pool, which holds KV tokens / context length x 512
  requests, at least 2048 and at most 4096 (``model_runner.py`` / ``tp_worker.py``). priosim
  takes the slot pool's largest size: its KV blocks bind first wherever requests are long, and
  a 128k-context model with short requests may have a cap of 2048 that priosim does not apply.
* overhead preset ``sglang`` before 0.4, else ``sglang-0.5`` (overlap scheduling).
* its conservative admission (``engine.admission_estimate = "sglang"``: each waiter's output
  reserved, the running requests' scaled by ``new_token_ratio``; :mod:`sim.core.reserve`) and
  its retraction order (``engine.victim = "sglang"``: fewest outputs first, then the longest
  prompt; the victim waits again at the end of the queue), every version's.

Batching: SGLang forms a prefill batch whenever it can and decodes otherwise (``get_next_batch_to_run``
in sgl-project/sglang ``python/sglang/srt/managers/scheduler.py``): ``engine.batching =
"prefill_first"``, every version's default; ``--enable-mixed-chunk`` puts decodes beside a prefill
chunk (``"mixed"``). A scenario with ``[engine.speculative]`` keeps ``"mixed"`` (priosim does not
model speculative decoding with prefill-only steps).
"""
from __future__ import annotations

from sim.engines import (ENGINES, EngineFamily, Flag, choice, fraction, kv_cache_dtype, non_negative_int, positive_int,
                         sixteen_bit)
from sim.engines.gpu import Gpu

LATEST = "0.5.5"
#: ``--priority-scheduling-preemption-threshold``'s default: with priority scheduling on, a waiting
#: request preempts a running one only when their priority values differ by more than this
PREEMPTION_THRESHOLD = 10


def chunk_tokens(version: tuple, gpu: Gpu) -> int:
    if version < (0, 4, 0) or gpu.memory_bytes <= 0:
        return 8192
    gib = gpu.memory_gib()
    return 2048 if gib < 35 else 4096 if gib < 60 else 8192 if gib < 160 else 16384


def mem_fraction(version: tuple, gpu: Gpu, tp: int, chunk: int) -> float:
    if version < (0, 5, 0) or gpu.memory_bytes <= 0:
        return 0.88 if tp < 2 else 0.87 if tp < 4 else 0.85 if tp < 8 else 0.81
    mib = gpu.memory_bytes / 2**20
    reserved = 512 + 1.5 * chunk + tp / 8 * 1024
    if mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((mib - reserved) / mib, 3)


def defaults(version: tuple, gpu: Gpu, entrypoint: str, tp: int) -> dict:
    """Engine keys and the values SGLang ``version`` uses on ``gpu`` (see the module docstring)."""
    chunk = chunk_tokens(version, gpu)
    return {"overhead": overhead(version, version >= (0, 4, 0)), "max_num_seqs": 4096,
            "max_batched_tokens": chunk, "chunked_prefill": True, "block_size": 1, "prefix_caching": True,
            "prefix_block_tokens": 16, "preempt_for_waiting": "never", "preempt_threshold": PREEMPTION_THRESHOLD,
            "preemption": "recompute", "running_order": "admission", "admission_estimate": "sglang", "victim": "sglang",
            "mem_fraction_static": mem_fraction(version, gpu, tp, chunk), "batching": batching(version, True)}


def overhead(version: tuple, overlapped: bool):
    """The overhead preset of SGLang ``version`` with its overlap scheduler on or off (on by
    default from 0.4; ``--disable-overlap-schedule``): the era's preset, its ``overlap_schedule``
    term set to match (the CPU terms stay as fitted, added to the GPU's)."""
    preset = "sglang" if version < (0, 4, 0) else "sglang-0.5"
    if overlapped == (preset == "sglang-0.5"):
        return preset
    return {"preset": preset, "overlap_schedule": int(overlapped)}


def batching(version: tuple, chunked_prefill: bool) -> str:
    """The ``engine.batching`` SGLang uses, chunked prefill on or off: a prefill batch alone
    whenever one can be formed (``--enable-mixed-chunk``, a flag, sets "mixed")."""
    return "prefill_first"


def _priority_on(_: bool) -> dict:
    """``--enable-priority-scheduling``: strict priority, and SGLang's preemption of running requests
    by waiting ones more than ``--priority-scheduling-preemption-threshold`` (10, the defaults')
    more urgent. The gap is between the priority values the requests carry: priosim's class
    priorities, which rank lower values first, as SGLang does with
    ``--schedule-low-priority-values-first`` (by default SGLang serves larger values first: give
    priosim's classes the same values in the reverse order, keeping their gaps)."""
    return {"engine.preempt_for_waiting": "threshold"}


FLAGS = {
    "--max-running-requests": Flag("engine.max_num_seqs", positive_int),
    "--chunked-prefill-size": Flag("engine.max_batched_tokens", positive_int),
    "--mem-fraction-static": Flag("engine.mem_fraction_static", fraction),
    "--page-size": Flag("engine.block_size", positive_int),
    "--disable-radix-cache": Flag("engine.prefix_caching", None, False),
    # decodes beside prefill chunks in one batch; without it SGLang runs a prefill batch alone
    # whenever it can form one (engine.batching = "prefill_first", the defaults' batching)
    "--enable-mixed-chunk": Flag("engine.batching", None, "mixed"),
    "--schedule-policy": Flag("policy.name", choice("fcfs", "lpm")),
    "--enable-priority-scheduling": Flag("policy.name", None, "priority", also=_priority_on),
    "--priority-scheduling-preemption-threshold": Flag("engine.preempt_threshold", non_negative_int),
    "--disable-priority-preemption": Flag("engine.preempt_for_waiting", None, "never"),
    "--kv-cache-dtype": Flag("engine.kv_dtype", kv_cache_dtype),
    "--context-length": Flag("engine.max_model_len", positive_int),
    "--dtype": Flag("engine.dtype", sixteen_bit),  # (16-bit or auto: the profile's; else not modelled)
    "--tp-size": Flag("engine.tp", positive_int),
    "--tp": Flag("engine.tp", positive_int),
    "--tensor-parallel-size": Flag("engine.tp", positive_int),
    "--disable-overlap-schedule": Flag("engine.overlap_scheduling", None, False),
    "--enable-overlap-schedule": Flag("engine.overlap_scheduling", None, True),  # (before 0.4: off by default)
}
INERT = frozenset({
    "--host", "--port", "--served-model-name", "--log-level", "--api-key", "--trust-remote-code",
    "--download-dir", "--model-path", "--model", "--tokenizer-path", "--random-seed", "--log-requests",
    "--log-level-http", "--enable-metrics", "--show-time-cost", "--chat-template", "--tool-call-parser",
    "--revision", "--log-requests-level", "--enable-cache-report",
    # (priosim's class priorities rank lower values first, as this flag has SGLang do: _priority_on)
    "--schedule-low-priority-values-first",
})

ENGINES.register("sglang", EngineFamily("sglang", LATEST, defaults, "mem_fraction_static", FLAGS, INERT,
                                       batching, overhead),
                 "SGLang (overlap scheduling from 0.4)")
