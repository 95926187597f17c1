"""A loaded profile's step terms rescaled to another achieved bandwidth and FLOPs fraction.

The roofline (:mod:`calibrate.roofline`) prices every step term either by the HBM bandwidth it
streams (``BW x hbm_efficiency``) or by the dense FLOPs it computes (``FLOPs x flops_efficiency``).
A fit that finds the GPU reaches another fraction of its datasheet peak than the base profile
assumed scales each term by the ratio of the two fractions, relative to the base profile:

* **memory-bound**, times ``a = base hbm_efficiency / new hbm_efficiency``: the token term's
  flat floor (``token_s`` at token counts up to the knee: the weights read once per step) and
  ``decode_ctx_s`` (each decoder reads its KV cache: KV bytes per token / BW).
* **compute-bound**, times ``b = base flops_efficiency / new flops_efficiency``: the token term's
  rise beyond the knee (``2 x params`` FLOPs per token), ``prefill_attn_s`` and ``chunk_attn_s``
  (attention FLOPs of a prefill chunk, on itself and on its cached prefix) and
  ``prefill_token_s``.
* **unchanged**: ``base_s`` (scheduler and launches, tensor-parallel all-reduce latency),
  ``decode_seq_s``, the eager-step terms (``prefill_step_s``, ``prefill_chunk_s``,
  ``mixed_step_s``: launch costs), the swap terms (PCIe) and the all-reduce bytes over NVLink a
  tensor-parallel token term carries (neither HBM nor FLOPs).

An analytic profile (knots ``[0, knee, knee + 1000]``) is re-derived exactly as the roofline
derives it: weights time ``t_w x a``, compute slope ``s_c x b`` (plus the NVLink part), and a new
knee where they meet, so the result equals ``roofline_profile(..., hbm_efficiency=...,
flops_efficiency=...)``'s step terms. Any other token curve (a measured profile's knots) keeps
its knots: each value is its first knot's value (the floor: weights) times ``a`` plus its rise
above that floor times ``b``. A measured profile's table rows (pure decode and pure prefill
batches, interpolated by the cost model) are scaled as a whole, decode rows by ``a`` and prefill
rows by ``b``: an approximation, as those times also hold the CPU time that does not scale.
"""
from __future__ import annotations

import copy
import math

MEMORY_BOUND = ("token_s floor (weights read)", "decode_ctx_s")
COMPUTE_BOUND = ("token_s rise beyond the knee", "prefill_attn_s", "chunk_attn_s", "prefill_token_s")


def _const(doc: dict, key: str) -> float | None:
    c = (doc.get("meta", {}).get("constants") or {}).get(key)
    v = c.get("value") if isinstance(c, dict) else c
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def base_efficiencies(doc: dict) -> tuple[float, float, bool]:
    """``(hbm_efficiency, flops_efficiency, from_datasheet)`` the profile assumes: an analytic
    profile's own constants (fractions of the datasheet peak); else (1.0, 1.0, False): the
    fractions are then relative to the base profile's own measured speed."""
    h, f = _const(doc, "hbm_efficiency"), _const(doc, "flops_efficiency")
    if h and f:
        return h, f, True
    return 1.0, 1.0, False


def _nvlink_slope(doc: dict) -> float:
    """The part of an analytic tensor-parallel profile's per-token slope that is all-reduce
    bytes over NVLink, s per token (0 at tp 1 or when the constants are absent)."""
    m = doc.get("model") or {}
    tp = int(m.get("tp", doc.get("meta", {}).get("tp", 1)) or 1)
    nv, eta = _const(doc, "nvlink_bytes_per_s"), _const(doc, "nvlink_efficiency")
    if tp <= 1 or not nv or not eta:
        return 0.0
    ar_bytes = 2 * int(m.get("layers", 0)) * int(m.get("hidden", 0)) * int(m.get("dtype_bytes", 2)) * 2 * (tp - 1) / tp
    return ar_bytes / (nv * eta)


def is_roofline_curve(knots, values) -> bool:
    return (len(knots) == 3 and knots[0] == 0 and math.isclose(knots[2] - knots[1], 1000.0, rel_tol=1e-9)
            and math.isclose(values[0], values[1], rel_tol=1e-12) and values[2] > values[1])


def rescale_profile(doc: dict, hbm_efficiency: float, flops_efficiency: float) -> dict:
    """A copy of profile document ``doc`` priced at ``hbm_efficiency`` and ``flops_efficiency``
    (fractions on :func:`base_efficiencies`' scale); exactly ``doc``'s terms at the base's own."""
    h0, f0, datasheet = base_efficiencies(doc)
    a, b = h0 / hbm_efficiency, f0 / flops_efficiency
    out = copy.deepcopy(doc)
    step = out.get("step", {})
    knots, vals = list(step.get("token_knots", [])), list(step.get("token_s", []))
    if knots and is_roofline_curve(knots, vals):
        t_w = vals[0]
        slope = vals[2] / knots[2]  # (knee + 1000) x per-token slope
        nv = _nvlink_slope(doc)
        t_w2, slope2 = t_w * a, (slope - nv) * b + nv
        knee = t_w2 / slope2
        step["token_knots"] = [0.0, knee, knee + 1000.0]
        step["token_s"] = [t_w2, t_w2, (knee + 1000.0) * slope2]
    elif knots:
        floor = vals[0]
        step["token_s"] = [floor * a + (v - floor) * b for v in vals]
    for k in ("decode_ctx_s",):
        if k in step:
            step[k] = step[k] * a
    for k in ("prefill_attn_s", "chunk_attn_s", "prefill_token_s"):
        if k in step:
            step[k] = step[k] * b
    for row in out.get("rows", []) or []:
        if isinstance(row, dict) and isinstance(row.get("time_s"), (int, float)):
            row["time_s"] = row["time_s"] * (a if row.get("kind") == "decode" else b if row.get("kind") == "prefill" else 1.0)
    if datasheet:  # the profile's own record of the fractions it is priced at
        consts = out["meta"]["constants"]
        for key, v, v0 in (("hbm_efficiency", hbm_efficiency, h0), ("flops_efficiency", flops_efficiency, f0)):
            if v != v0:
                consts[key] = {"value": float(v), "source": "fitted by priosim calibrate --from-runs"}
    return out


__all__ = ["rescale_profile", "base_efficiencies", "MEMORY_BOUND", "COMPUTE_BOUND"]
