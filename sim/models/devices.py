"""The device table: datasheet constants of the GPUs priosim can derive profiles for, each with its
source, and the achieved fractions (assumptions, marked as such) the roofline multiplies them by.

Units: bytes, bytes/s (per direction for links), FLOP/s (dense, without 2:4 sparsity). A device's
own efficiency entry (``flops_efficiency`` on H100-SXM, fitted) wins over :data:`ASSUMPTIONS`.
``fp8_flops`` is absent on GPUs without FP8 tensor cores (A100): FP8 weights there run as
weight-only quantisation at the BF16 rate. ``host_link_bytes_per_s`` is the GPU's link to host
memory (swap): PCIe, or NVLink-C2C on GB200. A GPU without NVLink or xGMI (L40S, L4) all-reduces
over PCIe.

``calibrate/roofline.py`` prices its analytic profiles with this table too (one home).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from plumbing.suggest import did_you_mean


def const(value: float, source: str) -> dict:
    """One constant: ``{"value", "source"}`` (what a profile's ``meta.constants`` records)."""
    return {"value": value, "source": source}


_c = const


@dataclass(frozen=True)
class Device:
    """Datasheet constants of one GPU; each entry is ``{"value", "source"}``."""

    key: str
    name: str
    constants: dict = field(default_factory=dict)

    def v(self, k: str) -> float:
        return float(self.constants[k]["value"])

    def has(self, k: str) -> bool:
        return k in self.constants


_PCIE4 = _c(32e9, "PCIe Gen4 x16: 32 GB/s per direction")
_PCIE5 = _c(64e9, "PCIe Gen5 x16: 64 GB/s per direction")
_NVL4 = "NVLink 4: 900 GB/s bidirectional = 450 GB/s per direction"
_NVL5 = "NVLink 5: 1.8 TB/s bidirectional = 900 GB/s per direction"
_XGMI = ("AMD Infinity Fabric: 7 links x 128 GB/s bidirectional to the other GPUs of an 8-GPU platform "
         "= 448 GB/s per direction")

DEVICES: dict[str, Device] = {d.key: d for d in [
    Device("a100-40gb", "NVIDIA A100-SXM4-40GB (HBM2)", {
        "hbm_bytes_per_s": _c(1.555e12, "NVIDIA A100 datasheet: 1,555 GB/s HBM2 (40GB)"),
        "bf16_flops": _c(312e12, "NVIDIA A100 datasheet: 312 TFLOP/s dense BF16 (624 is with sparsity)"),
        "int8_flops": _c(624e12, "NVIDIA A100 datasheet: 624 TOPS dense INT8"),
        "hbm_bytes": _c(40960.0 * 2**20, "NVIDIA A100 40GB: nvidia-smi reports 40,960 MiB"),
        "pcie_bytes_per_s": _PCIE4,
        "nvlink_bytes_per_s": _c(300e9, "A100 NVLink 3: 600 GB/s bidirectional = 300 GB/s per direction"),
    }),
    Device("a100-80gb", "NVIDIA A100-SXM4-80GB (HBM2e)", {
        "hbm_bytes_per_s": _c(2.039e12, "NVIDIA A100 datasheet: 2,039 GB/s HBM2e (80GB SXM)"),
        "bf16_flops": _c(312e12, "NVIDIA A100 datasheet: 312 TFLOP/s dense BF16 (624 is with sparsity)"),
        "int8_flops": _c(624e12, "NVIDIA A100 datasheet: 624 TOPS dense INT8"),
        "hbm_bytes": _c(81920.0 * 2**20, "NVIDIA A100 80GB: 80 GiB (nvidia-smi reports 81,920 MiB; the datasheet's "
                                       "'80 GB' is binary)"),
        "pcie_bytes_per_s": _PCIE4,
        "nvlink_bytes_per_s": _c(300e9, "A100 NVLink 3: 600 GB/s bidirectional = 300 GB/s per direction"),
    }),
    Device("h100-sxm", "NVIDIA H100-SXM5-80GB (HBM3)", {
        "hbm_bytes_per_s": _c(3.35e12, "NVIDIA H100 datasheet: 3.35 TB/s HBM3 (SXM)"),
        "bf16_flops": _c(989e12, "NVIDIA H100 datasheet: 989 TFLOP/s dense BF16 (1,979 is with sparsity)"),
        "fp8_flops": _c(1979e12, "NVIDIA H100 datasheet: 1,979 TFLOP/s dense FP8 (3,958 is with sparsity)"),
        "int8_flops": _c(1979e12, "NVIDIA H100 datasheet: 1,979 TOPS dense INT8"),
        "hbm_bytes": _c(81559.0 * 2**20, "NVIDIA H100 SXM 80GB: nvidia-smi reports 81,559 MiB (the datasheet's "
                                       "'80 GB' is binary)"),
        "pcie_bytes_per_s": _PCIE5,
        "nvlink_bytes_per_s": _c(450e9, "H100 " + _NVL4),
        # the 989 TFLOP/s datasheet figure is at boost clock; published H100 runs reach a smaller
        # fraction of it than A100 runs do of theirs (the 0.6 assumption over-predicts H100
        # prefill-heavy rows by up to 46 %)
        "flops_efficiency": _c(0.585, "fitted: python -m calibrate.fidelity.fit --flops-efficiency h100-sxm "
                                      "(soft-L1 relative error on the fidelity suite's 24 H100 fit rows, presets "
                                      "held fixed; 0.585, loss 0.066 vs 0.131 at 0.52 and 0.137 at 0.67; "
                                      "2026-12-06)"),
    }),
    # no shipped profiles; one fidelity row (a run whose own decode speed shows a PCIe card)
    Device("h100-pcie", "NVIDIA H100 PCIe 80GB (HBM2e)", {
        "hbm_bytes_per_s": _c(2.0e12, "NVIDIA H100 PCIe datasheet: 2.0 TB/s HBM2e"),
        "bf16_flops": _c(756e12, "NVIDIA H100 PCIe datasheet: 756 TFLOP/s dense BF16 (1,513 is with sparsity)"),
        "fp8_flops": _c(1513e12, "NVIDIA H100 PCIe datasheet: 1,513 TFLOP/s dense FP8 (3,026 is with sparsity)"),
        "int8_flops": _c(1513e12, "NVIDIA H100 PCIe datasheet: 1,513 TOPS dense INT8"),
        "hbm_bytes": _c(81559.0 * 2**20, "H100 80GB: nvidia-smi reports 81,559 MiB (as the SXM card)"),
        "pcie_bytes_per_s": _PCIE5,
        "nvlink_bytes_per_s": _c(300e9, "H100 PCIe NVLink bridge: 600 GB/s bidirectional = 300 GB/s per direction"),
    }),
    Device("h200", "NVIDIA H200 (141 GB HBM3e)", {
        "hbm_bytes_per_s": _c(4.8e12, "NVIDIA H200 datasheet: 4.8 TB/s HBM3e"),
        "bf16_flops": _c(989e12, "NVIDIA H200 datasheet: 989 TFLOP/s dense BF16 (1,979 is with sparsity)"),
        "fp8_flops": _c(1979e12, "NVIDIA H200 datasheet: 1,979 TFLOP/s dense FP8 (3,958 is with sparsity)"),
        "int8_flops": _c(1979e12, "NVIDIA H200 datasheet: 1,979 TOPS dense INT8"),
        "hbm_bytes": _c(141e9, "NVIDIA H200 datasheet: 141 GB"),
        "pcie_bytes_per_s": _PCIE5,
        "nvlink_bytes_per_s": _c(450e9, "H200 " + _NVL4),
    }),
    Device("b200", "NVIDIA B200 (HGX B200, 180 GB HBM3e)", {
        "hbm_bytes_per_s": _c(8.0e12, "NVIDIA HGX B200 datasheet: 64 TB/s HBM3e per 8 GPUs = 8 TB/s per GPU"),
        "bf16_flops": _c(2.25e15, "NVIDIA HGX B200 datasheet: 36 PFLOP/s BF16 with sparsity per 8 GPUs = "
                                  "2.25 PFLOP/s dense per GPU"),
        "fp8_flops": _c(4.5e15, "NVIDIA HGX B200 datasheet: 72 PFLOP/s FP8 with sparsity per 8 GPUs = "
                                "4.5 PFLOP/s dense per GPU"),
        "int8_flops": _c(4.5e15, "NVIDIA HGX B200 datasheet: 72 POPS INT8 with sparsity per 8 GPUs = 4.5 dense"),
        "hbm_bytes": _c(180e9, "NVIDIA HGX B200 datasheet: 1,440 GB per 8 GPUs = 180 GB per GPU"),
        "pcie_bytes_per_s": _PCIE5,
        "nvlink_bytes_per_s": _c(900e9, "B200 " + _NVL5),
    }),
    Device("gb200", "NVIDIA GB200 (one Blackwell GPU of a GB200 NVL72, 186 GB HBM3e)", {
        "hbm_bytes_per_s": _c(8.0e12, "NVIDIA GB200 NVL72 datasheet: 576 TB/s HBM3e per 72 GPUs = 8 TB/s per GPU"),
        "bf16_flops": _c(2.5e15, "NVIDIA GB200 NVL72 datasheet: 360 PFLOP/s FP16/BF16 with sparsity per 72 GPUs "
                                 "= 2.5 PFLOP/s dense per GPU"),
        "fp8_flops": _c(5.0e15, "NVIDIA GB200 NVL72 datasheet: 720 PFLOP/s FP8 with sparsity per 72 GPUs = "
                                "5 PFLOP/s dense per GPU"),
        "int8_flops": _c(5.0e15, "NVIDIA GB200 NVL72 datasheet: 720 POPS INT8 with sparsity per 72 GPUs = 5 dense"),
        "hbm_bytes": _c(186e9, "NVIDIA GB200 NVL72 datasheet: 13.4 TB HBM3e per 72 GPUs = 186 GB per GPU"),
        "pcie_bytes_per_s": _c(450e9, "NVLink-C2C to the Grace CPU: 900 GB/s bidirectional = 450 GB/s per "
                                      "direction (the host link swaps use)"),
        "nvlink_bytes_per_s": _c(900e9, "GB200 " + _NVL5),
    }),
    Device("l40s", "NVIDIA L40S (48 GB GDDR6)", {
        "hbm_bytes_per_s": _c(864e9, "NVIDIA L40S datasheet: 864 GB/s GDDR6"),
        "bf16_flops": _c(362.05e12, "NVIDIA L40S datasheet: 362.05 TFLOP/s dense BF16 (733 is with sparsity)"),
        "fp8_flops": _c(733e12, "NVIDIA L40S datasheet: 733 TFLOP/s dense FP8 (1,466 is with sparsity)"),
        "int8_flops": _c(733e12, "NVIDIA L40S datasheet: 733 TOPS dense INT8"),
        "hbm_bytes": _c(46068.0 * 2**20, "NVIDIA L40S: nvidia-smi reports 46,068 MiB"),
        "pcie_bytes_per_s": _PCIE4,
        "nvlink_bytes_per_s": _c(32e9, "no NVLink: tensor parallelism all-reduces over PCIe Gen4 x16 (32 GB/s "
                                       "per direction)"),
    }),
    Device("l4", "NVIDIA L4 (24 GB GDDR6)", {
        "hbm_bytes_per_s": _c(300e9, "NVIDIA L4 datasheet: 300 GB/s GDDR6"),
        "bf16_flops": _c(121e12, "NVIDIA L4 datasheet: 121 TFLOP/s dense BF16 (242 is with sparsity)"),
        "fp8_flops": _c(242.5e12, "NVIDIA L4 datasheet: 242.5 TFLOP/s dense FP8 (485 is with sparsity)"),
        "int8_flops": _c(242.5e12, "NVIDIA L4 datasheet: 242.5 TOPS dense INT8"),
        "hbm_bytes": _c(24e9, "NVIDIA L4 datasheet: 24 GB"),
        "pcie_bytes_per_s": _PCIE4,
        "nvlink_bytes_per_s": _c(32e9, "no NVLink: tensor parallelism all-reduces over PCIe Gen4 x16 (32 GB/s "
                                       "per direction)"),
    }),
    Device("mi300x", "AMD Instinct MI300X (192 GB HBM3)", {
        "hbm_bytes_per_s": _c(5.3e12, "AMD MI300X datasheet: 5.3 TB/s HBM3"),
        "bf16_flops": _c(1307.4e12, "AMD MI300X datasheet: 1,307.4 TFLOP/s dense BF16 (2,614.9 is with sparsity)"),
        "fp8_flops": _c(2614.9e12, "AMD MI300X datasheet: 2,614.9 TFLOP/s dense FP8 (5,229.8 is with sparsity)"),
        "int8_flops": _c(2614.9e12, "AMD MI300X datasheet: 2,614.9 TOPS dense INT8"),
        "hbm_bytes": _c(192e9, "AMD MI300X datasheet: 192 GB"),
        "pcie_bytes_per_s": _PCIE5,
        "nvlink_bytes_per_s": _c(448e9, _XGMI),
    }),
    Device("mi325x", "AMD Instinct MI325X (256 GB HBM3E)", {
        "hbm_bytes_per_s": _c(6.0e12, "AMD MI325X datasheet: 6 TB/s HBM3E"),
        "bf16_flops": _c(1307.4e12, "AMD MI325X datasheet: 1,307.4 TFLOP/s dense BF16 (2,614.9 is with sparsity)"),
        "fp8_flops": _c(2614.9e12, "AMD MI325X datasheet: 2,614.9 TFLOP/s dense FP8 (5,229.8 is with sparsity)"),
        "int8_flops": _c(2614.9e12, "AMD MI325X datasheet: 2,614.9 TOPS dense INT8"),
        "hbm_bytes": _c(256e9, "AMD MI325X datasheet: 256 GB"),
        "pcie_bytes_per_s": _PCIE5,
        "nvlink_bytes_per_s": _c(448e9, _XGMI),
    }),
]}

#: Other spellings of a device key (``engine.gpu = "h100"`` is the SXM card).
ALIASES = {"a100": "a100-80gb", "a100-80": "a100-80gb", "a100-40": "a100-40gb", "h100": "h100-sxm",
           "h100-sxm5": "h100-sxm"}

#: Efficiency factors and overheads (assumptions, each with its reason; a device's own entry wins).
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

#: Assumptions only derived profiles of mixture-of-experts models with expert parallelism read
#: (kept out of :data:`ASSUMPTIONS` so that the roofline's recorded constants stay as they were).
EP_ASSUMPTIONS = {
    "alltoall_efficiency": _c(0.5, "assumed achievable fraction of link bandwidth in an expert-parallel "
                                   "all-to-all (many small messages)"),
    "alltoall_latency_s": _c(2e-5, "assumed latency of one all-to-all (dispatch or combine) per MoE layer"),
}


def get_device(name: str) -> Device:
    """The device ``name`` (a key or an alias, any case); KeyError naming the choices otherwise."""
    key = str(name).lower()
    key = ALIASES.get(key, key)
    if key not in DEVICES:
        raise KeyError(f"expected one of {', '.join(DEVICES)} (got {name!r}){did_you_mean(str(name), list(DEVICES))}")
    return DEVICES[key]


def constants(dev: Device, overrides: dict | None = None, extra: dict | None = None) -> dict:
    """The device's datasheet constants and the assumptions (a device's own value wins), with
    ``extra`` assumptions added and the caller's ``overrides`` applied and marked; each an entry
    with its value and source."""
    consts = {**dev.constants, **ASSUMPTIONS, **(extra or {})}
    # a device's own value (e.g. a fitted flops_efficiency) wins over the generic assumption
    consts.update({k: c for k, c in dev.constants.items() if k in ASSUMPTIONS})
    for k, val in (overrides or {}).items():
        if k not in consts:
            raise KeyError(f"unknown roofline constant {k!r} (expected one of {sorted(consts)})")
        consts[k] = _c(float(val), "overridden by caller")
    return consts
