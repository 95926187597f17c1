"""The roofline's step formulas, in one place: ``calibrate/roofline.py`` (the shipped analytic
profiles) and :mod:`sim.models.derive` (profiles derived from a config.json) both price a step
with :func:`step_terms`, so a dense model priced either way gets the same numbers.

One engine step on one GPU (seconds; T tokens in the step, ``l`` prefill chunk lengths, ``c``
their cached prefixes, ``ctx`` decoders' contexts)::

    t = base_s + n_ar * allreduce_latency_s + n_a2a * alltoall_latency_s
      + max(W(T) / BW', T * (2 * N_tok / F' + comm_bytes / link'))     # token_knots / token_s
      + sum(l^2) * A / F' + sum(l*c) * 2A / F'                          # prefill / chunk attention
      + sum(ctx) * max(kv_bytes / BW', ctx_flops / F')                  # decoders read their KV

with BW' = HBM bandwidth x hbm_efficiency, F' = peak FLOP/s of the weight format x
flops_efficiency, link' = NVLink x its efficiency. W(T), the weight bytes the step reads, is
constant for a dense model (the weights are streamed once per step): the token term is then the
three knots ``[0, knee, knee + 1000]`` (flat, then compute-bound). For a mixture of experts W(T) =
W_fixed + W_experts x (1 - (1 - k/E)^T), the expected share of this GPU's experts that T tokens
hit under uniform routing; the token term is then a piecewise-linear curve through knots on a
geometric grid (ratio 1.25) up to the crossing where compute binds, and one knot 1000 tokens
beyond it, so the engine's ``interp`` needs no new term.

Two costs of the grouped expert GEMMs that the roofline's max() leaves out are added for a
mixture of experts (see :func:`moe_tile_rows` and :func:`step_terms`):

* **tile padding**: the fused-MoE kernels sort each expert's tokens into tiles of ``BLOCK_M``
  rows and multiply whole tiles, so an expert hit by n tokens costs ``ceil(n / BLOCK_M) x
  BLOCK_M`` rows of FLOPs (vLLM's ``moe_align_block_size``; triton_kernels' ``matmul_ogs``
  likewise rounds tokens per expert up to its block);
* **the routed activations**: each token's k expert outputs (k x hidden) are written by the
  second GEMM and summed by a separate kernel (vLLM's ``moe_sum``), and, where the SwiGLU is not
  fused into the first GEMM, its k x 2I inputs are read and k x I outputs written by another
  kernel (``silu_and_mul``): bytes per token that stream through HBM outside the GEMMs, so they
  add to the step rather than overlap it.
"""
from __future__ import annotations

from dataclasses import dataclass

#: Tokens past the compute knee where the last knot sits (the last segment's slope extrapolates).
KNEE_TAIL = 1000.0
#: Ratio between successive knots of a mixture of experts' weights-read curve.
KNOT_RATIO = 1.25
#: A mixture of experts' knots continue up to at least this many tokens (two default 8192-token
#: prefill budgets), where the tile padding has settled, before the tail's slope extrapolates.
MOE_GRID_TOKENS = 16384.0
#: Smallest and largest tile (rows) of the grouped expert GEMMs: vLLM's default fused_moe config
#: uses BLOCK_SIZE_M 16 for batches up to the expert count and 64 above
#: (vllm/model_executor/layers/fused_moe/fused_moe.py, get_default_config); triton_kernels'
#: matmul_ogs picks the power of two at or above the tokens per expert, from 16.
TILE_M_MIN, TILE_M_MAX = 16, 64
#: FlashAttention-3's BF16 forward rate at head dimension 64 relative to head dimension 128 on
#: H100 SXM5: 497 vs 648 TFLOP/s at 16k tokens (0.74-0.77 from 2k to 16k; Shah et al.,
#: "FlashAttention-3", arXiv:2407.08608, Fig. 5). The profiles' FLOPs efficiency (assumed, or
#: fitted on H100-SXM) is that of head dimension 128 (every dense model the fidelity table fits
#: on), so head dimension 128 is the reference.
FA3_HEAD_DIM_64_RATE = 497.0 / 648.0


def attention_rate(head_dim: int) -> float:
    """Prefill attention's FLOP rate relative to head dimension 128 (FlashAttention-3's tiles
    multiply fewer columns per load at head dimension 64): ``FA3_HEAD_DIM_64_RATE`` at 64 or
    less, 1 at 128 and above (and in between, which no bundled model has)."""
    return FA3_HEAD_DIM_64_RATE if head_dim <= 64 else 1.0


@dataclass(frozen=True)
class StepInputs:
    """What the step formulas need of one GPU's shard (bytes, parameters, FLOPs; per GPU).

    Attributes:
        weight_bytes: weights read by every step (a dense model: all of them).
        expert_bytes: this GPU's routed experts' bytes, read only as tokens hit them (0: dense).
        miss: ``1 - k/E``, the chance one token misses a given expert (MoE only).
        flop_params: parameters one token multiplies with on this GPU (2 FLOPs each).
        peak_flops: the device's dense FLOP/s for the weight format.
        n_allreduce, allreduce_bytes: all-reduces per step and their bytes per token (ring).
        n_alltoall, alltoall_bytes: expert-parallel dispatch/combine per step, bytes per token.
        attn_flops_l2: prefill attention FLOPs per (chunk length)^2 (causal).
        kv_bytes_per_token: KV bytes one context token of a decoder reads.
        ctx_flops: decode attention FLOPs per context token.
        local_experts: routed experts held by this GPU (per MoE layer; 0: dense).
        expert_row_params: parameters one padded tile row multiplies with on this GPU (one
            expert's share here, summed over the MoE layers).
        moe_act_bytes: HBM bytes per token of the routed activations outside the GEMMs (the
            k-way combine, and the SwiGLU where it is not fused), summed over the MoE layers.
    """

    weight_bytes: float
    flop_params: float
    peak_flops: float
    attn_flops_l2: float
    kv_bytes_per_token: float
    expert_bytes: float = 0.0
    miss: float = 1.0
    n_allreduce: int = 0
    allreduce_bytes: float = 0.0
    n_alltoall: int = 0
    alltoall_bytes: float = 0.0
    ctx_flops: float = 0.0
    local_experts: int = 0
    expert_row_params: float = 0.0
    moe_act_bytes: float = 0.0


def ring_allreduce_bytes(n: int, hidden: int, act_bytes: float, tp: int) -> float:
    """Bytes per token one GPU moves in ``n`` ring all-reduces of the hidden state: each moves
    2 (tp-1)/tp x hidden x bytes."""
    return n * hidden * act_bytes * 2 * (tp - 1) / tp


def expected_hit(miss: float, tokens: float) -> float:
    """The expected fraction of experts T tokens hit (uniform routing): 1 - (1 - k/E)^T."""
    return 1.0 - miss ** tokens


def moe_tile_rows(tokens: float, experts_per_token: float, local_experts: int) -> float:
    """Expected rows one GPU's grouped expert GEMMs multiply per MoE layer for ``tokens`` tokens:
    each hit expert's tokens rounded up to whole tiles of ``BLOCK_M`` rows (``TILE_M_MIN`` ..
    ``TILE_M_MAX``, the power of two at or above the tokens a hit expert receives).

    Under uniform routing an expert is hit with probability h = 1 - (1 - k/E)^T and then receives
    n = T k / (E h) tokens on average; a hit expert costs max(1, n / BLOCK_M + 1/2) tiles (one
    partly filled tile when n is below a tile, half a tile of padding on average above)."""
    if tokens <= 0 or not local_experts:
        return 0.0
    miss = 1.0 - experts_per_token / local_experts
    hit = expected_hit(miss, tokens)
    per_hit = tokens * experts_per_token / local_experts / hit
    tile = TILE_M_MIN
    while tile < per_hit and tile < TILE_M_MAX:
        tile *= 2
    return local_experts * hit * tile * max(1.0, per_hit / tile + 0.5)


def step_terms(x: StepInputs, v: dict) -> dict:
    """The ``step`` section of a profile for shard ``x`` with constants ``v`` (values by key)."""
    bw = v["hbm_bytes_per_s"] * v["hbm_efficiency"]
    fl = x.peak_flops * v["flops_efficiency"]
    t_weights = x.weight_bytes / bw
    per_token = 2.0 * x.flop_params / fl
    base = v["base_s"]
    if x.n_allreduce:
        per_token += x.allreduce_bytes / (v["nvlink_bytes_per_s"] * v["nvlink_efficiency"])
        base += x.n_allreduce * v["allreduce_latency_s"]
    if x.n_alltoall:
        per_token += x.alltoall_bytes / (v["nvlink_bytes_per_s"] * v["alltoall_efficiency"])
        base += x.n_alltoall * v["alltoall_latency_s"]
    if x.expert_bytes:
        k = x.local_experts * (1.0 - x.miss)  # experts per token, as the shard sees them
        row_s = 2.0 * x.expert_row_params / fl

        def pad_s(T: float) -> float:  # the padded rows' FLOPs beyond the tokens' own
            return row_s * max(0.0, moe_tile_rows(T, k, x.local_experts) - T * k)

        knots, values = _moe_curve(t_weights, x.expert_bytes / bw, x.miss, per_token, pad_s,
                                   x.moe_act_bytes / bw)
    else:
        knee = t_weights / per_token
        knots = [0.0, knee, knee + KNEE_TAIL]
        values = [t_weights, t_weights, (knee + KNEE_TAIL) * per_token]
    ctx_s = x.kv_bytes_per_token / bw
    if x.ctx_flops / fl > ctx_s:  # (MLA's absorbed decode attention can be compute-bound)
        ctx_s = x.ctx_flops / fl
    return {
        "base_s": base,
        "token_knots": knots,
        "token_s": values,
        "prefill_token_s": 0.0,
        "prefill_attn_s": x.attn_flops_l2 / fl,
        "chunk_attn_s": 2.0 * x.attn_flops_l2 / fl,
        "decode_seq_s": 0.0,
        "decode_ctx_s": ctx_s,
    }


def _moe_curve(t_fixed: float, t_experts: float, miss: float, per_token: float,
               pad_s=lambda T: 0.0, act_s: float = 0.0) -> tuple[list, list]:
    """Knots of max(t_fixed + t_experts x hit(T), T x per_token + pad_s(T)) + T x act_s: a
    geometric grid up to the crossing T* where compute binds for good (T x per_token -
    weights(T) is convex and negative at 0, so it crosses once; the padding only moves it
    earlier) or ``MOE_GRID_TOKENS`` if later, then one knot ``KNEE_TAIL`` beyond, whose slope
    (compute and activations per token; the padding has settled by then) extrapolates."""
    def weights(T: float) -> float:
        return t_fixed + t_experts * expected_hit(miss, T)

    def f(T: float) -> float:
        return max(weights(T), T * per_token + pad_s(T)) + T * act_s

    lo, hi = 0.0, (t_fixed + t_experts) / per_token
    for _ in range(100):
        mid = (lo + hi) / 2
        if mid * per_token >= weights(mid):
            hi = mid
        else:
            lo = mid
    cross = hi
    end = max(cross, MOE_GRID_TOKENS)
    knots = [0.0]
    t = 1.0
    while t < end:
        knots.append(t)
        t = max(t + 1.0, float(round(t * KNOT_RATIO)))
    knots += [end, end + KNEE_TAIL]
    return knots, [f(T) for T in knots]
