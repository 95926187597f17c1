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

The device table and the step formulas live in sim (sim/models/devices.py, sim/models/formulas.py),
where profiles derived from a model's config.json (sim/models/derive.py) use the very same ones.

The H200 x Llama-3-8B profile reproduces sim/core/profiles/h200-llama-3-8b.json (the hand-made
default) with one change: the parameter count is computed from the shape (8,030,261,248)
instead of the model card's rounded 8.03e9 (0.003% apart).
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import replace
from pathlib import Path

from calibrate.shapes import DTYPE_BYTES, Shape, get_shape
from sim.core.costs import PROFILE_DIRS
from sim.core.overhead import default_preset
from sim.engines.gpu import kv_capacity_bytes
from sim.models.devices import ASSUMPTIONS, DEVICES, Device, constants
from sim.models.devices import const as _c
from sim.models.formulas import StepInputs, ring_allreduce_bytes, step_terms

SCHEMA = "priosim.profile/1"
#: Shipped profiles live beside the cost model that reads them (sim/core/profiles).
PROFILE_DIR = PROFILE_DIRS[0]


#: The datasheet constants a roofline profile prices with and records (the device table has more:
#: FP8 / INT8 rates, which only profiles derived in other formats read, sim/models/derive.py).
ROOFLINE_KEYS = ("hbm_bytes_per_s", "bf16_flops", "hbm_bytes", "pcie_bytes_per_s", "nvlink_bytes_per_s")


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
    mine = Device(dev.key, dev.name, {k: c for k, c in dev.constants.items()
                                      if k in ROOFLINE_KEYS or k in ASSUMPTIONS})
    return constants(mine, overrides)


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
    # the step formulas derived profiles use too (sim/models/formulas.py): every weight is read
    # once per step, and a token multiplies with every parameter (embedding included)
    x = StepInputs(weight_bytes=params * b, flop_params=params, peak_flops=v["bf16_flops"],
                   attn_flops_l2=2.0 * sh.layers * sh.heads * sh.head_dim,   # 4 x layers x q_dim x l^2 / 2 (causal)
                   kv_bytes_per_token=sh.kv_bytes_per_token(dtype))
    if sh.tp > 1:
        # two ring all-reduces of the hidden state per layer
        x = replace(x, n_allreduce=2 * sh.layers,
                    allreduce_bytes=ring_allreduce_bytes(2 * sh.layers, sh.hidden, b, sh.tp))
    step = step_terms(x, v)
    kv_cap = kv_capacity_bytes(v["hbm_bytes"], v["gpu_memory_utilization"], params * b, v["activation_reserve_bytes"])
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
