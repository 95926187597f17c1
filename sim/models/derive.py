"""Architecture x device x weight format x KV format x TP / EP -> a ``priosim.profile/1`` document.

Per GPU of a replica of ``tp`` GPUs (attention heads, dense FFNs, shared experts and the
vocabulary split ``tp`` ways; KV heads never below 1; routed experts split ``ep`` ways, each
expert's matrices over the ``tp / ep`` GPUs of its group; MLA's latent KV replicated on every GPU)
this module counts, from first principles:

* the weights each GPU holds, by part and format (embedding, LM head, norms and routers stay in
  16 bits; attention, dense FFNs and shared experts in the weight format; routed experts in the
  format's expert width);
* the weights a step reads: all but the routed experts, plus the share of them the step's tokens
  hit (:func:`sim.models.formulas.expected_hit`);
* the FLOPs per token: 2 x (all non-expert parameters + MoE layers x k x one expert / tp);
* attention: prefill FLOPs per l^2 = layers' x heads x (d_qk + d_v); decode per context token
  reads layers' x KV bytes per layer and multiplies layers' x heads x 2 (d_qk + d_v) (MLA decodes
  absorbed: d_qk = kv_lora_rank + qk_rope_head_dim, d_v = kv_lora_rank), where layers' counts a
  windowed layer as min(1, window / typical context) = r of a layer (in prefill attention 2r - r^2,
  the share of a full layer's causal query-key pairs its window covers);
* communication: 2 ring all-reduces per layer under TP (an MoE layer's second one replaced by the
  dispatch and combine all-to-alls under EP), priced by bytes over NVLink and a latency each;
* KV memory as vLLM sizes it (:func:`sim.engines.gpu.kv_capacity_bytes`).

docs/models.md writes the formulas out and works one example by hand.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from sim.core.overhead import default_preset
from sim.engines.gpu import kv_capacity_bytes
from sim.models.config import Architecture
from sim.models.devices import EP_ASSUMPTIONS, Device, const, constants, get_device
from sim.models.formulas import StepInputs, attention_rate, ring_allreduce_bytes, step_terms

SCHEMA = "priosim.profile/1"
#: Bytes of an activation (all-reduces, all-to-alls) and of the 16-bit parts (embedding, norms).
ACT_BYTES = 2


@dataclass(frozen=True)
class WeightFormat:
    """Bytes per weight of the linear layers and of the routed experts, and the tensor-core rate
    the matmuls run at (``bf16_flops``: weight-only quantisation dequantises to BF16)."""

    linear: float
    expert: float
    flops: str
    note: str
    #: the experts' kernels fuse the SwiGLU into the first GEMM (no separate activation pass)
    fused_act: bool = False
    #: the attention / dense-FFN / shared-expert GEMMs run at this fraction of the BF16 rate
    #: instead of the ``flops`` rate (None: at the ``flops`` rate), where the device has that rate
    linear_vs_bf16: float | None = None


WEIGHT_FORMATS = {
    "bf16": WeightFormat(2.0, 2.0, "bf16_flops", "16-bit weights"),
    "fp16": WeightFormat(2.0, 2.0, "bf16_flops", "16-bit weights (FP16 tensor cores run at the BF16 rate)"),
    "fp8": WeightFormat(1.0, 1.0, "fp8_flops", "FP8 weights and activations (W8A8); block scales ignored "
                                                "(< 0.01 % of the bytes)"),
    "fp8-block": WeightFormat(1.0, 1.0, "fp8_flops",
                              "FP8 weights with a scale per 128 x 128 block (W8A8, DeepSeek-V3 / Qwen3-FP8 "
                              "checkpoints): routed experts at the FP8 rate (DeepGEMM grouped GEMMs), the other "
                              "GEMMs at 0.68 of the BF16 rate (CUTLASS block-FP8 GEMMs)",
                              linear_vs_bf16=0.68),
    "int8": WeightFormat(1.0, 1.0, "int8_flops", "INT8 weights and activations (W8A8)"),
    "w8a16": WeightFormat(1.0 + 2 / 128, 1.0 + 2 / 128, "bf16_flops",
                          "8-bit weights with a 16-bit scale per group of 128, 16-bit activations (GPTQ / AWQ "
                          "8-bit, weight-only FP8 or INT8: W8A16): the matmuls dequantise to BF16 and run at its "
                          "rate"),
    "int4": WeightFormat(0.5 + 2 / 128, 0.5 + 2 / 128, "bf16_flops",
                         "4-bit weights with a 16-bit scale per group of 128 (GPTQ / AWQ, W4A16)"),
    "mxfp4": WeightFormat(2.0, 4.25 / 8, "bf16_flops", "MXFP4 routed experts (4 bits + an 8-bit scale per 32), "
                                                        "16-bit elsewhere (gpt-oss's checkpoint), BF16 compute",
                         fused_act=True),
}
#: Bytes per KV element.
KV_FORMATS = {"bf16": 2, "fp16": 2, "fp8": 1}
#: Context (tokens) at which windowed layers' KV is averaged when the scenario says none.
DEFAULT_CONTEXT = 4096


@dataclass(frozen=True)
class Shard:
    """What one GPU of the replica holds and does (see the module docstring)."""

    params: float
    weights_bytes: float
    fixed_bytes: float  # read by every step
    expert_bytes: float  # routed experts, read as hit
    flop_params: float
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    layers_eff: float
    kv_bytes_per_token: int
    attn_flops_l2: float
    ctx_flops: float
    local_experts: int = 0
    expert_row_params: float = 0.0
    moe_act_bytes: float = 0.0
    linear_params: float = 0.0  # attention, dense FFN and shared experts (the weight format's GEMMs)


def _check_parallel(a: Architecture, tp: int, ep: int) -> None:
    if tp < 1 or a.heads % tp:
        raise ValueError(f"tp: expected a divisor of the {a.heads} attention heads (got {tp})")
    if a.dense_layers and a.ffn % tp:
        raise ValueError(f"tp: expected a divisor of intermediate_size {a.ffn} (got {tp})")
    if ep < 1 or tp % ep:
        raise ValueError(f"ep: expected a divisor of tp = {tp} (experts spread over the replica's GPUs) (got {ep})")
    if ep > 1 and not a.moe:
        raise ValueError(f"ep: {a.name} has no experts (expected 1) (got {ep})")
    if a.moe and a.experts % ep:
        raise ValueError(f"ep: expected a divisor of the {a.experts} experts (got {ep})")


def expert_padding(fmt: WeightFormat, device_key: str) -> tuple[int, int]:
    """Multiples (hidden, per-GPU expert intermediate) the engine pads an expert's matrices to.

    vLLM holds MXFP4 experts in its kernels' layout (model_executor/layers/quantization/mxfp4.py,
    create_weights): without FP4 tensor cores (A100, H100, H200, L40S, L4) its universal MXFP4
    kernel is Marlin's W4A16 MoE, which needs n % 256 and k % 128 in both GEMMs, so hidden is
    padded to 256 and the intermediate to 128; on Blackwell (TRT-LLM kernels) and on ROCm both to
    256. gpt-oss-120b on one H100: 60.7 GiB of checkpoint experts and 16-bit parts become 65.85
    GiB, vLLM logs 'Model loading took 65.9651 GiB' (vllm-project/vllm#23278, Marlin).
    Other formats: no padding."""
    if fmt.note.startswith("MXFP4"):
        if device_key in ("b200", "gb200", "mi300x", "mi325x"):
            return 256, 256
        return 256, 128
    return 1, 1


def _round_up(n: float, m: int) -> float:
    return -(-n // m) * m


def shard(a: Architecture, fmt: WeightFormat, kv_bytes: int, tp: int = 1, ep: int = 1,
          context: int = DEFAULT_CONTEXT, pad: tuple[int, int] = (1, 1)) -> Shard:
    """One GPU's share of ``a`` at ``tp`` / ``ep`` in weight format ``fmt`` and ``kv_bytes`` per
    KV element, the experts' matrices padded to multiples ``pad`` = (hidden, intermediate per
    GPU) (:func:`expert_padding`; ValueError for a degree that does not divide the model)."""
    _check_parallel(a, tp, ep)
    h, L = a.hidden, a.layers
    heads, kvh = a.heads // tp, max(1, a.kv_heads // tp)
    vocab = -(-a.vocab // tp)
    ffn = a.ffn // tp
    sixteen = vocab * h * (1 if a.tied else 2) + (a.norms_per_layer * L + 1) * h  # embedding, head, norms
    if a.qk_norm:
        sixteen += 2 * a.head_dim * L
    if a.attention_sinks:
        sixteen += heads * L
    if a.mla:
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        q = (h * a.q_lora_rank + a.q_lora_rank * heads * qk) if a.q_lora_rank else h * heads * qk
        attn = q + h * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank * heads * (a.qk_nope_head_dim + a.v_head_dim) \
            + heads * a.v_head_dim * h
        sixteen += (a.q_lora_rank + a.kv_lora_rank) * L
        d_qk, d_v = qk, a.v_head_dim
        dec_qk, dec_v = a.kv_lora_rank + a.qk_rope_head_dim, a.kv_lora_rank
        kv_layer = (a.kv_lora_rank + a.qk_rope_head_dim) * kv_bytes
    else:
        attn = h * heads * a.head_dim + 2 * h * kvh * a.head_dim + heads * a.head_dim * h
        if a.qkv_bias:
            attn += (heads + 2 * kvh) * a.head_dim
        if a.o_bias:
            attn += h
        d_qk = d_v = dec_qk = dec_v = a.head_dim
        kv_layer = 2 * kvh * a.head_dim * kv_bytes
    linear = L * attn + a.dense_layers * a.mlp_matrices * h * ffn
    experts = flop_experts = row = act = 0.0
    local = 0
    if a.moe:
        m = a.moe_layers
        sixteen += m * h * a.experts + (m * a.experts if a.expert_bias else 0)  # routers
        linear += m * 3 * h * a.shared_ffn // tp
        one = 3 * h * a.expert_ffn + ((2 * a.expert_ffn + h) if a.expert_bias else 0)  # one whole expert
        group = tp // ep  # GPUs one expert's matrices are split over
        # held (and streamed) as the engine lays them out: padded to its kernels' multiples
        held = one / group + 3 * (_round_up(h, pad[0]) * _round_up(a.expert_ffn / group, pad[1])
                                  - h * a.expert_ffn / group)
        experts = m * (a.experts // ep) * held
        # the kernels multiply the padded matrices too
        flop_experts = m * a.experts_per_token * held / ep
        local, row = a.experts // ep, m * held
        # routed activations through HBM outside the GEMMs, per token (ACT_BYTES each): the
        # combine reads this GPU's k/ep expert outputs and writes the sum; an unfused SwiGLU
        # reads 2I and writes I per (token, expert), I split over the tp GPUs
        combine = a.experts_per_token * h / ep + h
        swiglu = 0.0 if fmt.fused_act else 3 * a.experts_per_token * a.expert_ffn / tp
        act = m * (combine + swiglu) * ACT_BYTES
    params = sixteen + linear + experts
    fixed = sixteen * ACT_BYTES + linear * fmt.linear
    r = min(1.0, a.sliding_window / context) if a.window_layers else 0.0
    layers_eff = (L - a.window_layers) + a.window_layers * r
    # prefill: a windowed layer's causal attention over a prompt of `context` tokens covers
    # w x context - w^2 / 2 query-key pairs where a full layer covers context^2 / 2: 2r - r^2 of it
    attn_layers = (L - a.window_layers) + a.window_layers * (2 * r - r * r)
    return Shard(
        params=float(params), weights_bytes=fixed + experts * fmt.expert, fixed_bytes=fixed,
        expert_bytes=experts * fmt.expert, flop_params=float(sixteen + linear + flop_experts), heads=heads,
        kv_heads=1 if a.mla else kvh, head_dim=(a.kv_lora_rank + a.qk_rope_head_dim) if a.mla else a.head_dim,
        ffn=ffn, vocab=vocab, layers_eff=layers_eff, kv_bytes_per_token=math.ceil(layers_eff * kv_layer),
        attn_flops_l2=attn_layers * heads * (d_qk + d_v), ctx_flops=layers_eff * heads * 2 * (dec_qk + dec_v),
        local_experts=local, expert_row_params=float(row), moe_act_bytes=float(act), linear_params=float(linear),
    )


def derive_profile(a: Architecture, device: str | Device, dtype: str | None = None, kv_dtype: str = "bf16",
                   tp: int = 1, ep: int = 1, context: int | None = None, **overrides: float) -> dict:
    """The profile document of ``a`` on ``device`` (``dtype`` None: the checkpoint's own format).
    ValueError (one line) for an unknown format or device, a degree that does not divide the
    model, or weights that leave no KV memory."""
    dev = device if isinstance(device, Device) else get_device(device)
    dtype = dtype or a.quant
    if dtype not in WEIGHT_FORMATS:
        raise ValueError(f"dtype: expected one of {', '.join(WEIGHT_FORMATS)} (got {dtype!r})")
    if kv_dtype not in KV_FORMATS:
        raise ValueError(f"kv_dtype: expected one of {', '.join(KV_FORMATS)} (got {kv_dtype!r})")
    fmt = WEIGHT_FORMATS[dtype]
    ctx = DEFAULT_CONTEXT if context is None else int(context)
    sh = shard(a, fmt, KV_FORMATS[kv_dtype], tp, ep, ctx, expert_padding(fmt, dev.key))
    consts = constants(dev, overrides, EP_ASSUMPTIONS if ep > 1 else None)
    v = {k: float(c["value"]) for k, c in consts.items()}
    rate_key = fmt.flops if dev.has(fmt.flops) else "bf16_flops"
    # attention multiplies BF16 queries with the BF16 KV cache whatever the weights are; an FP8
    # KV cache is attended in FP8 where the device has FP8 tensor cores (FlashAttention-3)
    attn_key = "fp8_flops" if kv_dtype == "fp8" and dev.has("fp8_flops") else "bf16_flops"
    attn_scale = v[rate_key] / v[attn_key]
    # prefill attention at the model's head dimension: FlashAttention-3 runs head dim 64 slower
    # than the head dim 128 the efficiency was measured on (MLA's prefill heads are 192 / 128)
    prefill_hd = a.qk_nope_head_dim + a.qk_rope_head_dim if a.mla else a.head_dim
    hd_rate = attention_rate(prefill_hd)
    # block-scaled FP8: the non-expert GEMMs run at a measured fraction of the BF16 rate, priced
    # as extra parameters at the format's rate (the recorded parameter counts stay the real ones)
    lin_scale = 1.0
    if fmt.linear_vs_bf16 is not None and rate_key == fmt.flops:
        lin_scale = v[rate_key] / (v["bf16_flops"] * fmt.linear_vs_bf16)
    rate_note = "" if rate_key == fmt.flops else f" ({dev.key} has no {fmt.flops.split('_')[0].upper()} " \
                                                 f"tensor cores: the matmuls run at the BF16 rate)"
    n_ar = 0
    ar = a2a = 0.0
    n_a2a = 0
    if tp > 1:
        n_ar = 2 * a.layers - (a.moe_layers if ep > 1 else 0)
        ar = ring_allreduce_bytes(n_ar, a.hidden, ACT_BYTES, tp)
    if ep > 1:
        n_a2a = 2 * a.moe_layers  # dispatch and combine
        # each GPU sources 1/ep of the tokens; each token goes to k experts, (ep-1)/ep of them elsewhere
        a2a = n_a2a * a.experts_per_token * a.hidden * ACT_BYTES * (ep - 1) / ep / ep
    x = StepInputs(weight_bytes=sh.fixed_bytes, expert_bytes=sh.expert_bytes,
                   miss=1.0 - a.experts_per_token / a.experts if a.moe else 1.0,
                   flop_params=sh.flop_params + (lin_scale - 1.0) * sh.linear_params,
                   peak_flops=v[rate_key], n_allreduce=n_ar, allreduce_bytes=ar, n_alltoall=n_a2a,
                   alltoall_bytes=a2a, attn_flops_l2=sh.attn_flops_l2 * attn_scale / hd_rate,
                   kv_bytes_per_token=sh.kv_bytes_per_token, ctx_flops=sh.ctx_flops * attn_scale, local_experts=sh.local_experts,
                   expert_row_params=sh.expert_row_params, moe_act_bytes=sh.moe_act_bytes)
    step = step_terms(x, v)
    kv_cap = kv_capacity_bytes(v["hbm_bytes"], v["gpu_memory_utilization"], sh.weights_bytes,
                               v["activation_reserve_bytes"])
    if kv_cap <= 0:
        raise ValueError(f"tp: {a.name} weights in {dtype} ({sh.weights_bytes / 1e9:.1f} GB per GPU at tp = {tp}) leave "
                         f"no KV memory on {dev.name} (expected a larger tp or a smaller weight format)")
    src = f"computed from {a.name}'s config.json"
    consts.update({
        "params": const(sh.params, f"{src}: parameters on one GPU (tp = {tp}, ep = {ep})"),
        "weights_bytes": const(sh.weights_bytes, f"{src}: weight bytes on one GPU ({fmt.note})"),
        "step_weight_bytes": const(sh.fixed_bytes, f"{src}: bytes every step reads (all but routed experts)"),
        "expert_bytes": const(sh.expert_bytes, f"{src}: this GPU's routed experts, read as tokens hit them"),
        "flop_params_per_token": const(sh.flop_params, f"{src}: parameters one token multiplies with (2 FLOPs each)"),
        "peak_flops": const(v[rate_key], f"{rate_key} of {dev.key}{rate_note}"),
        **({"attention_flops": const(v[attn_key], f"{attn_key} of {dev.key}: attention runs in the KV cache's "
                                                   f"format ({kv_dtype}), not the weights'")}
           if attn_key != rate_key else {}),
        **({"linear_rate_vs_bf16": const(fmt.linear_vs_bf16, "measured: vLLM's CUTLASS block-FP8 GEMM on H100 reaches "
                                                              "427-490 TFLOP/s where torch BF16 reaches 648-716 at "
                                                              "M = 2048-8192 (N 2112, K 7168; vllm-project/vllm PR "
                                                              "#23280): the non-expert GEMMs of a block-scaled "
                                                              "checkpoint")}
           if lin_scale != 1.0 else {}),
        **({"attention_head_dim_rate": const(hd_rate, f"measured: FlashAttention-3 (BF16 forward, H100 SXM5) runs "
                                                      f"head dim {prefill_hd} at 497 TFLOP/s where head dim 128 "
                                                      f"runs at 648 (16k tokens; arXiv:2407.08608, Fig. 5): "
                                                      f"prefill attention's rate relative to head dim 128")}
           if hd_rate != 1.0 else {}),
        "kv_bytes_per_token": const(float(sh.kv_bytes_per_token), f"{src}: KV bytes per token on one GPU "
                                                                 f"({kv_dtype})"),
        "attn_flops_l2": const(sh.attn_flops_l2, f"{src}: prefill attention FLOPs per chunk length^2 (causal)"),
        "ctx_flops": const(sh.ctx_flops, f"{src}: decode attention FLOPs per context token"),
        **({"expert_row_params": const(sh.expert_row_params, f"{src}: parameters one padded tile row of the "
                                                            f"grouped expert GEMMs multiplies with ({sh.local_experts} "
                                                            f"experts here; rows per hit expert rounded up to tiles of "
                                                            f"16..64)"),
            "moe_act_bytes_per_token": const(sh.moe_act_bytes, f"{src}: routed activations per token through HBM "
                                                               f"outside the GEMMs (k-way combine"
                                                               f"{'' if fmt.fused_act else ' and SwiGLU'}), added to the step")}
           if a.moe else {}),
        "allreduce_bytes_per_token": const(ar, f"{n_ar} ring all-reduces of the hidden state per step"),
        "alltoall_bytes_per_token": const(a2a, f"{n_a2a} expert-parallel all-to-alls per step"),
    })
    if a.window_layers:
        consts["typical_context"] = const(float(ctx), "engine.typical_context: windowed layers' KV is "
                                                      "averaged at this context (the KV pool is per token)")
    name = f"{dev.key}-{a.name}" + (f"-tp{tp}" if tp > 1 else "") + (f"-ep{ep}" if ep > 1 else "") + \
        (f"-{dtype}" if dtype != "bf16" else "") + (f"-kv{kv_dtype}" if kv_dtype != "bf16" else "")
    model = {"name": a.name, "layers": a.layers, "hidden": a.hidden, "heads": sh.heads, "kv_heads": sh.kv_heads,
             "head_dim": sh.head_dim, "ffn": sh.ffn, "vocab": sh.vocab, "dtype_bytes": ACT_BYTES,
             "params": sh.params, "tp": tp, "ep": ep, "kv_bytes_per_token": sh.kv_bytes_per_token,
             "weights_bytes": sh.weights_bytes}
    return {
        "schema": SCHEMA,
        "meta": {
            "kind": "analytic", "name": name, "device": dev.name, "dtype": dtype, "kv_dtype": kv_dtype,
            "shape": a.name, "architecture": a.kind, "tp": tp, "ep": ep, "gpus": tp,
            "context_length": a.context_length,  # (tokens, or None: a named engine's max_model_len default)
            "source": "sim.models.derive (Hugging Face config.json x device table x efficiency factors)",
            "config": a.source, "constants": consts,
            "formula": "t = base + max(weights read(T)/BW, T*(2*params per token/FLOPs + comm bytes/link)) "
                       "+ attention FLOPs/FLOPs + max(KV bytes, decode attention FLOPs) read",
        },
        "overhead": default_preset(),
        "model": model,
        "memory": {"kv_capacity_bytes": kv_cap},
        "step": step,
        "swap": {"bytes_per_s": v["pcie_bytes_per_s"] * v["pcie_efficiency"], "latency_s": v["swap_latency_s"]},
    }
