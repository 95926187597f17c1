"""What a profile says about its GPU and model: the device's name and memory, the weights each
GPU holds, and the KV capacity its memory setting leaves (the arithmetic real engines do).

vLLM: KV = memory x ``gpu_memory_utilization`` - weights - activations (the profile's own KV
capacity was derived that way with its ``gpu_memory_utilization``, so another fraction moves it by
memory x the difference). SGLang: ``mem_fraction_static`` covers weights and the KV pool together,
so KV = memory x fraction - weights.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

#: Device memory (bytes) as ``torch.cuda.get_device_properties().total_memory`` reports it, for
#: profiles that name a device but not its memory (nvidia-smi's MiB x 2**20).
DEVICE_MEMORY = {"a100-80": 81_920 * 2**20, "a100-40": 40_960 * 2**20, "h100": 81_559 * 2**20,
                 "h200": 143_771 * 2**20, "l40s": 46_068 * 2**20}


@dataclass(frozen=True)
class Gpu:
    """One GPU of a profile's replica and the model shard it holds.

    ``memory_bytes`` is 0 and ``weights_bytes`` 0 when the profile does not say."""

    name: str  # as the profile's meta.device has it, e.g. "NVIDIA H100-SXM5-80GB (HBM3)"
    memory_bytes: float
    weights_bytes: float  # the model's parameters on one GPU, bytes
    kv_capacity_bytes: float  # the profile's KV memory, bytes
    profile_memory_fraction: float  # the gpu_memory_utilization the profile's KV capacity assumes
    tp: int

    @property
    def key(self) -> str:
        return self.name.lower()

    def is_a100(self) -> bool:
        return "a100" in self.key

    def memory_gib(self) -> float:
        return self.memory_bytes / 2**30


def from_profile_json(data: dict) -> Gpu:
    """The GPU facts of a profile's JSON (``priosim.profile/1``)."""
    meta = data.get("meta", {}) if isinstance(data.get("meta"), dict) else {}
    consts = meta.get("constants", {}) if isinstance(meta.get("constants"), dict) else {}
    model = data.get("model", {}) if isinstance(data.get("model"), dict) else {}
    name = str(meta.get("device", meta.get("name", "")))

    def const(key: str, default: float) -> float:
        c = consts.get(key)
        v = c.get("value") if isinstance(c, dict) else c
        return float(v) if isinstance(v, (int, float)) else default

    memory = const("hbm_bytes", 0.0) or _memory_by_name(name)
    params, width = model.get("params"), model.get("dtype_bytes")
    weights = float(params) * float(width) if isinstance(params, (int, float)) and isinstance(width, (int, float)) else 0.0
    if isinstance(model.get("weights_bytes"), (int, float)):  # (a derived profile: formats differ by part)
        weights = float(model["weights_bytes"])
    kv = data.get("memory", {}).get("kv_capacity_bytes", 0.0) if isinstance(data.get("memory"), dict) else 0.0
    tp = int(model.get("tp", meta.get("tp", 1)) or 1)
    return Gpu(name, float(memory), weights, float(kv or 0.0), const("gpu_memory_utilization", 0.9), tp)


def document(profile, base_dir: Path) -> dict | None:
    """The JSON of an ``engine.profile`` value (a shipped name or a JSON path); None for an
    inline linear profile, or a file that does not read (the profile check reports it)."""
    if isinstance(profile, dict):  # an inline linear table names no GPU; a derived profile does
        return profile if profile.get("schema") else None
    from sim.core.costs import find_profile

    path = find_profile(str(profile)) if not str(profile).endswith(".json") else None
    if path is None:
        path = Path(profile)
        if not path.is_absolute() and not path.exists():
            path = Path(base_dir) / path
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def load(profile, base_dir: Path) -> Gpu | None:
    """The GPU facts of an ``engine.profile`` value (a shipped name or a JSON path); None for an
    inline linear profile, which names no GPU."""
    data = document(profile, base_dir)
    if data is None:
        return None
    try:
        return from_profile_json(data)
    except (ValueError, TypeError, AttributeError):
        return None  # the profile check reports what is wrong with the file


def fitted_overhead_engine(data: dict | None) -> str | None:
    """The engine whose runs a profile's own ``overhead`` table was fitted to
    (``priosim calibrate --from-runs`` records it in ``meta.fitted_from_runs.engine``), or None."""
    meta = data.get("meta") if isinstance(data, dict) else None
    fit = meta.get("fitted_from_runs") if isinstance(meta, dict) else None
    engine = fit.get("engine") if isinstance(fit, dict) else None
    return engine if isinstance(engine, str) and isinstance(data.get("overhead"), dict) else None


def _memory_by_name(name: str) -> float:
    key = name.lower()
    if "a100" in key:
        return DEVICE_MEMORY["a100-40" if "40gb" in key.replace(" ", "") else "a100-80"]
    for k in ("h200", "h100", "l40s"):
        if k in key:
            return DEVICE_MEMORY[k]
    return 0.0


def kv_capacity_bytes(memory: float, fraction: float, weights: float, reserve: float) -> float:
    """KV memory per GPU as vLLM sizes it from the device (bytes): memory x
    ``gpu_memory_utilization`` - weights - activation / CUDA-graph reserve (analytic and derived
    profiles record it as their ``memory.kv_capacity_bytes``)."""
    return memory * fraction - weights - reserve


def vllm_kv_bytes(gpu: Gpu, fraction: float) -> float:
    """vLLM's KV memory per GPU at ``gpu_memory_utilization = fraction`` (bytes; 0: unknown)."""
    if gpu.memory_bytes <= 0 or gpu.kv_capacity_bytes <= 0:
        return 0.0
    return gpu.kv_capacity_bytes + gpu.memory_bytes * (fraction - gpu.profile_memory_fraction)


def sglang_kv_bytes(gpu: Gpu, fraction: float) -> float:
    """SGLang's KV pool per GPU at ``mem_fraction_static = fraction`` (bytes; 0: unknown)."""
    if gpu.memory_bytes <= 0 or gpu.weights_bytes <= 0:
        return 0.0
    return gpu.memory_bytes * fraction - gpu.weights_bytes
