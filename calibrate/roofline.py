"""Analytic roofline profiles: step and transfer costs from datasheet constants, when nothing
was measured. Every constant is stored in the profile's ``meta.constants`` with its source, and
the profile says ``kind = "analytic"``.

Model of one engine step on one GPU of a tensor-parallel group (seconds)::

    t = base_s                                   # scheduler + launches (+ 2 all-reduce latencies per layer)
      + max(W / (BW*eta_bw), T * 2*N / (F*eta_f))   # weights streamed once vs dense matmul FLOPs
      + T * allreduce_bytes_per_token / (NVLink*eta_nv)   # tensor parallelism only
      + sum(l^2) * 2*layers*heads*head_dim / (F*eta_f)     # causal prefill attention (QK^T and PV)
      + sum(l*c) * 4*layers*heads*head_dim / (F*eta_f)     # chunk attending to its cached prefix
      + sum(ctx) * kv_bytes_per_token / (BW*eta_bw)        # decoders read their KV

with W the shard's weight bytes, N its parameters, F dense bf16 FLOP/s, BW HBM bytes/s, and the
``eta`` efficiency factors parameters (defaults: 0.8 of bandwidth, 0.6 of FLOPs; a device may
carry its own fitted value, as H100-SXM does for FLOPs). The max is the
piecewise-linear token term with knots [0, knee, knee + 1000] (flat, then compute-bound).
KV capacity = HBM x gpu_memory_utilization - weights - activation reserve; swaps move blocks over
PCIe at pcie_eff x the per-direction datasheet rate, plus a fixed latency per transfer.

The H200 x Llama-3-8B profile reproduces sim/core/profiles/h200-llama-3-8b.json (the hand-made
default) with one change: the parameter count is computed from the shape (8,030,261,248)
instead of the model card's rounded 8.03e9 (0.003% apart).
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path

from calibrate.shapes import DTYPE_BYTES, Shape, get_shape
from sim.core.costs import PROFILE_DIRS
from sim.core.overhead import default_preset

SCHEMA = "priosim.profile/1"
#: Shipped profiles live beside the cost model that reads them (sim/core/profiles).
PROFILE_DIR = PROFILE_DIRS[0]


def _c(value: float, source: str) -> dict:
    return {"value": value, "source": source}


@dataclass(frozen=True)
class Device:
    """Datasheet constants of one GPU; each entry is ``{"value", "source"}``."""

    key: str
    name: str
    constants: dict = field(default_factory=dict)

    def v(self, k: str) -> float:
        return float(self.constants[k]["value"])


DEVICES: dict[str, Device] = {
    "a100-80gb": Device("a100-80gb", "NVIDIA A100-SXM4-80GB (HBM2e)", {
        "hbm_bytes_per_s": _c(2.039e12, "NVIDIA A100 datasheet: 2,039 GB/s HBM2e (80GB SXM)"),
        "bf16_flops": _c(312e12, "NVIDIA A100 datasheet: 312 TFLOP/s dense BF16 (624 is with sparsity)"),
        "hbm_bytes": _c(81920.0 * 2**20, "NVIDIA A100 80GB: 80 GiB (nvidia-smi reports 81,920 MiB; the datasheet's "
                                       "'80 GB' is binary)"),
        "pcie_bytes_per_s": _c(32e9, "PCIe Gen4 x16: 32 GB/s per direction"),
        "nvlink_bytes_per_s": _c(300e9, "A100 NVLink 3: 600 GB/s bidirectional = 300 GB/s per direction"),
    }),
    "h100-sxm": Device("h100-sxm", "NVIDIA H100-SXM5-80GB (HBM3)", {
        "hbm_bytes_per_s": _c(3.35e12, "NVIDIA H100 datasheet: 3.35 TB/s HBM3 (SXM)"),
        "bf16_flops": _c(989e12, "NVIDIA H100 datasheet: 989 TFLOP/s dense BF16 (1,979 is with sparsity)"),
        "hbm_bytes": _c(81559.0 * 2**20, "NVIDIA H100 SXM 80GB: nvidia-smi reports 81,559 MiB (the datasheet's "
                                       "'80 GB' is binary)"),
        "pcie_bytes_per_s": _c(64e9, "PCIe Gen5 x16: 64 GB/s per direction"),
        "nvlink_bytes_per_s": _c(450e9, "H100 NVLink 4: 900 GB/s bidirectional = 450 GB/s per direction"),
        # the 989 TFLOP/s datasheet figure is at boost clock; published H100 runs reach a smaller
        # fraction of it than A100 runs do of theirs (the 0.6 assumption over-predicts H100
        # prefill-heavy rows by up to 46 %)
        "flops_efficiency": _c(0.52, "fitted: python -m calibrate.fidelity.fit --flops-efficiency h100-sxm "
                                     "(soft-L1 relative error on the fidelity suite's 14 H100 fit rows, presets "
                                     "held fixed; 0.521, loss 0.046 vs 0.049 at 0.6; 2026-11-30)"),
    }),
    # no shipped profiles; one fidelity row (a run whose own decode speed shows a PCIe card)
    "h100-pcie": Device("h100-pcie", "NVIDIA H100 PCIe 80GB (HBM2e)", {
        "hbm_bytes_per_s": _c(2.0e12, "NVIDIA H100 PCIe datasheet: 2.0 TB/s HBM2e"),
        "bf16_flops": _c(756e12, "NVIDIA H100 PCIe datasheet: 756 TFLOP/s dense BF16 (1,513 is with sparsity)"),
        "hbm_bytes": _c(81559.0 * 2**20, "H100 80GB: nvidia-smi reports 81,559 MiB (as the SXM card)"),
        "pcie_bytes_per_s": _c(64e9, "PCIe Gen5 x16: 64 GB/s per direction"),
        "nvlink_bytes_per_s": _c(300e9, "H100 PCIe NVLink bridge: 600 GB/s bidirectional = 300 GB/s per direction"),
    }),
    "h200": Device("h200", "NVIDIA H200 (141 GB HBM3e)", {
        "hbm_bytes_per_s": _c(4.8e12, "NVIDIA H200 datasheet: 4.8 TB/s HBM3e"),
        "bf16_flops": _c(989e12, "NVIDIA H200 datasheet: 989 TFLOP/s dense BF16 (1,979 is with sparsity)"),
        "hbm_bytes": _c(141e9, "NVIDIA H200 datasheet: 141 GB"),
        "pcie_bytes_per_s": _c(64e9, "PCIe Gen5 x16: 64 GB/s per direction"),
        "nvlink_bytes_per_s": _c(450e9, "H200 NVLink 4: 900 GB/s bidirectional = 450 GB/s per direction"),
    }),
}

#: Efficiency factors and overheads (parameters of :func:`roofline_profile`), with sources.
ASSUMPTIONS = {
    "hbm_efficiency": _c(0.8, "assumed achievable fraction of peak bandwidth"),
    "flops_efficiency": _c(0.6, "assumed model FLOPs utilisation in prefill"),
    "gpu_memory_utilization": _c(0.9, "vLLM default"),
    "activation_reserve_bytes": _c(2e9, "assumed activations/workspace"),
    "pcie_efficiency": _c(0.8, "assumed achievable fraction with pinned memory"),
    "swap_latency_s": _c(2e-5, "assumed fixed cost per transfer (launch + sync)"),
    "base_s": _c(1e-3, "assumed per-step scheduler/launch overhead (vLLM V1 order of magnitude)"),
    "nvlink_efficiency": _c(0.7, "assumed achievable fraction of NVLink bandwidth in NCCL all-reduce"),
    "allreduce_latency_s": _c(1e-5, "assumed latency of one small NCCL all-reduce (two per layer)"),
}

#: The shipped grid: (device, shape name, tensor-parallel degree).
_SHIPPED_DEVICES = ("a100-80gb", "h100-sxm", "h200")
SHIPPED = [(d, s, 1) for d in _SHIPPED_DEVICES for s in ("llama-3-8b", "mistral-7b", "qwen2.5-7b")] + \
          [(d, "llama-3-70b", 4) for d in _SHIPPED_DEVICES] + [("h200", "llama-3-70b", 2)]
#: Profiles the fidelity suite needs for published measurements of other models (calibrate/fidelity).
FIDELITY = [("a100-80gb", "qwen2.5-14b", 1), ("a100-80gb", "qwen2.5-32b", 2), ("a100-80gb", "qwen2.5-72b", 4),
            ("h100-sxm", "qwen3-8b", 1), ("h100-sxm", "qwen3-14b", 1), ("a100-80gb", "qwen3-14b", 1),
            ("h100-sxm", "qwen3-32b", 1), ("a100-80gb", "qwen3-32b", 1), ("h100-pcie", "qwen3-32b", 1),
            ("h100-pcie", "qwen3-14b", 1)]
#: The grids ``python -m calibrate roofline --grid NAME`` writes.
GRIDS = {"shipped": SHIPPED, "fidelity": FIDELITY, "all": SHIPPED + FIDELITY}


def _constants(dev: Device, overrides: dict) -> dict:
    """The device's datasheet constants and the generic assumptions (a device's own value wins),
    with the caller's ``overrides`` applied and marked; each an entry with its value and source."""
    consts = {**dev.constants, **ASSUMPTIONS}
    # a device's own value (e.g. a fitted flops_efficiency) wins over the generic assumption
    consts.update({k: c for k, c in dev.constants.items() if k in ASSUMPTIONS})
    for k, val in overrides.items():
        if k not in consts:
            raise KeyError(f"unknown roofline constant {k!r} (expected one of {sorted(consts)})")
        consts[k] = _c(float(val), "overridden by caller")
    return consts


def roofline_profile(device: str | Device, shape: str | Shape, dtype: str = "bf16", tp: int = 1,
                     **overrides: float) -> dict:
    """An analytic profile document for ``shape`` (per-GPU shard at ``tp``) on ``device``.

    ``overrides`` replace any constant or assumption by key (e.g. ``flops_efficiency=0.5``);
    the profile's meta records the value used and marks it as overridden.
    """
    dev = DEVICES[device] if isinstance(device, str) else device
    sh = get_shape(shape, tp) if isinstance(shape, str) else shape.shard(tp)
    consts = _constants(dev, overrides)
    v = {k: float(c["value"]) for k, c in consts.items()}
    b = DTYPE_BYTES[dtype]
    params = float(sh.params)
    consts["params"] = _c(params, f"computed from the {sh.name} shape ({sh.source})")
    bw = v["hbm_bytes_per_s"] * v["hbm_efficiency"]
    fl = v["bf16_flops"] * v["flops_efficiency"]
    t_weights = params * b / bw
    per_token = 2.0 * params / fl
    base = v["base_s"]
    if sh.tp > 1:
        # two ring all-reduces of the hidden state per layer: 2 (tp-1)/tp x bytes each
        ar_bytes = 2 * sh.layers * sh.hidden * b * 2 * (sh.tp - 1) / sh.tp
        per_token += ar_bytes / (v["nvlink_bytes_per_s"] * v["nvlink_efficiency"])
        base += 2 * sh.layers * v["allreduce_latency_s"]
    knee = t_weights / per_token
    attn_flops_l2 = 2.0 * sh.layers * sh.heads * sh.head_dim   # 4 x layers x q_dim x l^2 / 2 (causal)
    step = {
        "base_s": base,
        "token_knots": [0.0, knee, knee + 1000.0],
        "token_s": [t_weights, t_weights, (knee + 1000.0) * per_token],
        "prefill_token_s": 0.0,
        "prefill_attn_s": attn_flops_l2 / fl,
        "chunk_attn_s": 2.0 * attn_flops_l2 / fl,
        "decode_seq_s": 0.0,
        "decode_ctx_s": sh.kv_bytes_per_token(dtype) / bw,
    }
    kv_cap = v["hbm_bytes"] * v["gpu_memory_utilization"] - params * b - v["activation_reserve_bytes"]
    if kv_cap <= 0:
        raise ValueError(f"{sh.name} weights ({params * b / 1e9:.1f} GB) leave no KV memory on "
                         f"{dev.name}; use a larger tensor-parallel degree")
    name = f"{dev.key}-{sh.name}"
    return {
        "schema": SCHEMA,
        "meta": {
            "kind": "analytic", "name": name, "device": dev.name, "dtype": dtype, "shape": sh.name,
            "tp": sh.tp, "source": "calibrate.roofline (datasheet constants x efficiency factors)",
            "date": _dt.date.today().isoformat(), "constants": consts,
            "formula": "t = base + max(weights/BW, 2*params*T/FLOPs) [+ T*allreduce bytes/NVLink] "
                       "+ attention FLOPs/FLOPs + KV bytes read/BW",
        },
        # the engine overhead shipped GPU profiles are priced with (sim/core/overheads.json)
        "overhead": default_preset(),
        "model": sh.to_profile_model(dtype),
        "memory": {"kv_capacity_bytes": kv_cap},
        "step": step,
        "swap": {"bytes_per_s": v["pcie_bytes_per_s"] * v["pcie_efficiency"],
                 "latency_s": v["swap_latency_s"]},
    }


def profile_filename(device: str, shape: str, tp: int = 1) -> str:
    name = f"{device}-{shape}" + (f"-tp{tp}" if tp > 1 else "")
    # sim ships its own hand-made h200-llama-3-8b; ours must not shadow it by name
    return name + ("-roofline" if name == "h200-llama-3-8b" else "") + ".json"


def write_roofline_profiles(out_dir: str | Path = PROFILE_DIR, dtype: str = "bf16", grid=None,
                            **overrides: float) -> list[Path]:
    """Write every profile in ``grid`` (default :data:`SHIPPED`) to ``out_dir``; returns the
    paths written."""
    from calibrate.measure import write_profile
    out = []
    for d, s, tp in (SHIPPED if grid is None else grid):
        doc = roofline_profile(d, s, dtype, tp, **overrides)
        path = Path(out_dir) / profile_filename(d, s, tp)
        doc["meta"]["name"] = path.stem
        out.append(write_profile(doc, path))
    return out


if __name__ == "__main__":
    for p in write_roofline_profiles():
        print(p)
