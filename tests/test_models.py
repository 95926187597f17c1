"""Profiles derived from a model's config.json (sim/models, docs/models.md): the dense ones
reproduce the shipped rooflines, and the MoE, MLA, sliding-window, FP8 and expert-parallel cases
match hand computations."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.config import load_scenario
from sim.core.costs import list_profiles, load_profile, profile_from_dict
from sim.models import bundled, derived, load_architecture
from sim.models.devices import DEVICES
from sim.models.formulas import expected_hit, moe_tile_rows

ROOT = Path(__file__).resolve().parents[1]
#: the bundled config of each shipped roofline shape (Llama 3.1 has Llama 3's shape)
CONFIG_OF = {"llama-3-8b": "llama-3.1-8b", "llama-3-70b": "llama-3.1-70b"}


def _analytic():
    for name, path in list_profiles():
        doc = json.loads(path.read_text())
        if doc["meta"].get("kind") == "analytic":
            yield pytest.param(doc, id=name)


def _device_key(name: str) -> str:
    return next(k for k in DEVICES if name.startswith(k + "-"))


def _cm(doc: dict, overhead: str | None = "none"):
    return load_profile(doc, overhead=overhead)


@pytest.mark.parametrize("shipped", list(_analytic()))
def test_derived_dense_profiles_reproduce_every_shipped_analytic_profile(shipped):
    """Every term within 1e-4 (Qwen's Q/K/V biases and Q/K norms, which the hand-copied shapes
    leave out, are the only difference: < 3e-5)."""
    model = shipped["model"]
    base = model["name"].split("-tp")[0]
    doc = derived(CONFIG_OF.get(base, base), _device_key(shipped["meta"]["name"]), tp=int(model.get("tp", 1)))
    for sec in ("step", "memory", "swap"):
        for key, want in shipped[sec].items():
            assert doc[sec][key] == pytest.approx(want, rel=1e-4), f"{sec}.{key}"
    assert doc["model"]["kv_bytes_per_token"] == 2 * model["layers"] * model["kv_heads"] * model["head_dim"] * 2


def test_every_bundled_config_reads_and_derives_on_its_smallest_fit():
    for name in bundled():
        a = load_architecture(name)
        for tp in (1, 2, 4, 8):
            try:
                doc = derived(name, "h200", tp=tp)
                break
            except ValueError:
                continue
        else:
            pytest.fail(f"{name} fits no H200 replica")
        assert profile_from_dict(doc, name, name).kv_blocks(16) > 0, name
        assert a.layers > 0 and doc["meta"]["constants"]["params"]["source"]


def test_readme_names_every_bundled_config_and_its_licence():
    text = (ROOT / "sim" / "models" / "configs" / "README.md").read_text()
    for name in bundled():
        assert f"`{name}`" in text, name


def test_opt_has_a_two_matrix_mlp_and_the_published_parameter_count():
    """OPT-13B (facebook/opt-13b: ffn_dim, a ReLU MLP of fc1 and fc2, biases everywhere) holds
    12,853,473,280 parameters; the derivation leaves out only the learned positions (2050 x 5120)
    and the MLP and LayerNorm biases: within 0.1 %. Its MHA KV is 40 layers x 2 x 5120 x 2 bytes."""
    a = load_architecture("opt-13b")
    assert (a.mlp_matrices, a.ffn, a.kv_heads, a.qkv_bias, a.tied) == (2, 20480, 40, True, True)
    assert load_architecture("llama-3.1-8b").mlp_matrices == 3
    doc = derived("opt-13b", "a100-80gb", dtype="fp16")
    c = {k: v["value"] for k, v in doc["meta"]["constants"].items()}
    assert c["params"] == pytest.approx(12_853_473_280, rel=1e-3)
    assert c["kv_bytes_per_token"] == 40 * 2 * 5120 * 2
    assert derived("opt-66b", "a100-80gb", dtype="fp16", tp=4)["meta"]["constants"]["params"]["value"] * 4 \
        == pytest.approx(65.7e9, rel=5e-3)


def test_moe_weights_read_follow_the_expected_distinct_experts():
    """Qwen3-30B-A3B on one H200: a step of T tokens reads the non-expert weights and
    48 layers x 128 experts x (1 - (1 - 8/128)^T) of the experts (bf16); compute adds the
    padded tile rows of the grouped expert GEMMs; the routed activations add their bytes."""
    doc = derived("qwen3-30b-a3b", "h200")
    c = {k: v["value"] for k, v in doc["meta"]["constants"].items()}
    expert = 3 * 2048 * 768 * 2  # bytes of one expert
    assert c["expert_bytes"] == 48 * 128 * expert
    assert c["expert_row_params"] == 48 * 3 * 2048 * 768
    # per token and MoE layer: the combine reads 8 outputs and writes one, the SwiGLU reads 2I
    # and writes I for each of the 8 experts, 2 bytes each
    assert c["moe_act_bytes_per_token"] == 48 * (9 * 2048 + 3 * 8 * 768) * 2
    bw = 4.8e12 * 0.8
    fl = 989e12 * 0.6
    cm = _cm(doc)
    for T in (1, 3, 8, 40, 150, 700, 5000):
        weights = (c["step_weight_bytes"] + c["expert_bytes"] * (1 - (1 - 8 / 128) ** T)) / bw
        pad = (moe_tile_rows(T, 8, 128) - 8 * T) * 2 * c["expert_row_params"] / fl
        compute = T * 2 * c["flop_params_per_token"] / fl + pad
        act = T * c["moe_act_bytes_per_token"] / bw
        assert cm._tokens_s(T) == pytest.approx(max(weights, compute) + act, rel=0.01), T
    # past the grid every expert is read and compute binds: slope 2 x active params / FLOPs
    # plus the activations' bytes (the padding has settled at half a tile per expert)
    knots = doc["step"]["token_knots"]
    assert cm._tokens_s(knots[-1] + 500) - cm._tokens_s(knots[-1]) == pytest.approx(
        500 * (2 * c["flop_params_per_token"] / fl + c["moe_act_bytes_per_token"] / bw), rel=1e-6)
    assert expected_hit(1 - 8 / 128, 1) == pytest.approx(8 / 128)


def test_grouped_expert_gemms_round_each_hit_expert_up_to_whole_tiles():
    """One token hits 8 of 128 experts, each a 16-row tile; 8192 tokens give every expert 512
    rows on average, in 64-row tiles with half a tile of padding."""
    assert moe_tile_rows(1, 8, 128) == pytest.approx(8 * 16)
    assert moe_tile_rows(8192, 8, 128) == pytest.approx(128 * (512 + 32), rel=1e-6)
    assert moe_tile_rows(0, 8, 128) == 0.0
    # never fewer rows than the tokens' own
    for T in (1, 5, 17, 64, 300, 2000, 20000):
        assert moe_tile_rows(T, 4, 32) >= 4 * T


def test_deepseek_v3_decode_step_at_batch_1_matches_the_docs_hand_computation():
    """docs/models.md works priosim profiles --model deepseek-v3 --gpu h200 --tp 8 by hand."""
    doc = derived("deepseek-v3", "h200", tp=8)
    c = {k: v["value"] for k, v in doc["meta"]["constants"].items()}
    assert doc["meta"]["dtype"] == "fp8-block"  # the checkpoint's own quantization_config
    assert c["step_weight_bytes"] == 3_380_852_736
    assert c["expert_bytes"] == 81_738_596_352
    assert c["flop_params_per_token"] == 5_596_077_056
    assert doc["model"]["kv_bytes_per_token"] == 61 * (512 + 64) * 2  # MLA: the latent, every GPU
    base = 1e-3 + 2 * 61 * 1e-5
    weights = (3_380_852_736 + 81_738_596_352 * 8 / 256) / 3.84e12
    ctx = 61 * 576 * 2 / 3.84e12
    assert doc["step"]["base_s"] == pytest.approx(base)
    assert doc["step"]["decode_ctx_s"] == pytest.approx(ctx)
    # the routed activations: per MoE layer the combine reads 8 x 7168 and writes 7168, the
    # SwiGLU reads 2 x 256 and writes 256 per expert (2048 / tp 8), 2 bytes each
    act = 58 * (9 * 7168 + 3 * 8 * 256) * 2 / 3.84e12
    step = _cm(doc).step_s(D=1, sum_ctx=1024)
    assert step == pytest.approx(base + weights + act + 1024 * ctx, abs=2e-9)
    assert round(step * 1e3, 3) == 3.786  # the figure docs/models.md prints


def test_mla_decode_attention_is_priced_by_flops_when_those_bind(tmp_path):
    """A GPU holding all 128 heads of DeepSeek-V3's attention (here a 4-layer cut of it, to fit
    one H200): 4 x 128 x 2 x (576 + 512) FLOPs per context token outweigh reading 4 x 576 bytes
    of FP8 latent."""
    cfg = json.loads((ROOT / "sim" / "models" / "configs" / "deepseek-v3.json").read_text())
    (tmp_path / "cut.json").write_text(json.dumps({**cfg, "num_hidden_layers": 4, "n_routed_experts": 16,
                                                   "first_k_dense_replace": 1}))
    doc = derived(str(tmp_path / "cut.json"), "h200", kv_dtype="fp8")
    flops = 4 * 128 * 2 * (576 + 512)
    assert doc["step"]["decode_ctx_s"] == pytest.approx(flops / (1979e12 * 0.6))
    assert doc["step"]["decode_ctx_s"] > 4 * 576 / (4.8e12 * 0.8)
    assert doc["model"]["kv_bytes_per_token"] == 4 * 576


def test_sliding_window_layers_count_their_window_at_the_typical_context():
    full = 2 * 8 * 64 * 2  # bytes per layer per token, gpt-oss
    doc = derived("gpt-oss-20b", "h200")  # 12 full layers, 12 with a 128-token window; context 4096
    assert doc["model"]["kv_bytes_per_token"] == math.ceil((12 + 12 * 128 / 4096) * full)
    long = derived("gpt-oss-20b", "h200", context=32768)
    assert long["model"]["kv_bytes_per_token"] == math.ceil((12 + 12 * 128 / 32768) * full)
    # Mistral-7B's 4096 window covers the whole typical context: exactly the full KV
    assert derived("mistral-7b", "h200")["model"]["kv_bytes_per_token"] == 2 * 32 * 8 * 128 * 2
    assert derived("mistral-7b", "h200", context=8192)["model"]["kv_bytes_per_token"] == 32 * 8 * 128 * 2
    # prefill attention: a window of w over c tokens covers w c - w^2 / 2 of a full layer's c^2 / 2 pairs
    r = 128 / 4096
    c = doc["meta"]["constants"]
    assert c["attn_flops_l2"]["value"] == pytest.approx((12 + 12 * (2 * r - r * r)) * 64 * 128)
    assert derived("mistral-7b", "h200", context=8192)["meta"]["constants"]["attn_flops_l2"]["value"] == \
        pytest.approx(32 * 0.75 * 32 * 256)


def test_fp8_weights_halve_the_linear_bytes_and_run_at_the_fp8_rate():
    bf16 = derived("llama-3.1-8b", "h200")["meta"]["constants"]
    fp8 = derived("llama-3.1-8b", "h200", dtype="fp8", kv_dtype="fp8")
    c = fp8["meta"]["constants"]
    sixteen = 2 * 128256 * 4096 + 65 * 4096  # embedding, LM head, norms stay 16-bit
    assert c["weights_bytes"]["value"] == pytest.approx(sixteen * 2 + (bf16["params"]["value"] - sixteen))
    assert c["peak_flops"]["value"] == 1979e12
    assert fp8["model"]["kv_bytes_per_token"] == 2 * 32 * 8 * 128
    # A100 has no FP8 tensor cores: weight-only FP8 at the BF16 rate
    a100 = derived("llama-3.1-8b", "a100-80gb", dtype="fp8")["meta"]["constants"]
    assert a100["peak_flops"]["value"] == 312e12 and "no FP8" in a100["peak_flops"]["source"]
    int4 = derived("llama-3.1-8b", "h200", dtype="int4")["meta"]["constants"]
    assert int4["weights_bytes"]["value"] < 0.3 * bf16["weights_bytes"]["value"] + sixteen * 2



def _quantised(tmp_path, q: dict, name: str = "m") -> str:
    """A qwen3-8b config.json with ``quantization_config = q``, written under ``tmp_path``."""
    cfg = json.loads((ROOT / "sim" / "models" / "configs" / "qwen3-8b.json").read_text())
    (tmp_path / name).mkdir()
    (tmp_path / name / "config.json").write_text(json.dumps({**cfg, "quantization_config": q}))
    return str(tmp_path / name / "config.json")


FP8_DYNAMIC = {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0": {
    "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
    "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}}}}


@pytest.mark.parametrize("q, quant", [
    (FP8_DYNAMIC, "fp8"),  # llm-compressor's FP8-dynamic checkpoints: W8A8 at the FP8 rate
    ({**FP8_DYNAMIC, "config_groups": {"group_0": {**FP8_DYNAMIC["config_groups"]["group_0"], "weights": {
        "num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]}}}}, "fp8-block"),
    ({**FP8_DYNAMIC, "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "int"},
                                                   "input_activations": {"num_bits": 8, "type": "int"}}}}, "int8"),
    ({**FP8_DYNAMIC, "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int", "group_size": 128}}}},
     "int4"),  # W4A16
    ({"quant_method": "gptq", "bits": 8, "group_size": 128}, "w8a16"),  # weight-only: not W8A8
    ({"quant_method": "awq", "bits": 8}, "w8a16"),
    ({"quant_method": "gptq", "bits": 4}, "int4"),
])
def test_a_checkpoints_quantization_config_gives_its_weight_format(tmp_path, q, quant):
    assert load_architecture(_quantised(tmp_path, q)).quant == quant


def test_eight_bit_gptq_weights_are_one_byte_at_the_16_bit_rate(tmp_path):
    """GPTQ / AWQ are weight-only: 8-bit weights (and a 16-bit scale per 128) multiplied at the BF16
    rate; they were taken as W8A8, priced at the INT8 rate."""
    c = derived(_quantised(tmp_path, {"quant_method": "gptq", "bits": 8}), "h200")["meta"]["constants"]
    bf16 = derived("qwen3-8b", "h200")["meta"]["constants"]
    assert c["peak_flops"]["value"] == bf16["peak_flops"]["value"] == 989e12
    assert c["weights_bytes"]["value"] < 0.6 * bf16["weights_bytes"]["value"]


@pytest.mark.parametrize("q, named", [
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "quant_method = 'bitsandbytes'"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 4, "type": "float"},
      "input_activations": {"num_bits": 4, "type": "float"}}}}, "compressed-tensors' with a scheme"),
    ({"quant_method": "gptq", "bits": 3}, "bits = 3"),
])
def test_an_unmodelled_quantization_is_priced_as_bf16_with_a_warning(tmp_path, q, named):
    import warnings

    from plumbing.notices import InputWarning

    path = _quantised(tmp_path, q)
    assert load_architecture(path).quant == "bf16"
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always", InputWarning)
        load_scenario(None, [f"engine.model={json.dumps(path)}", 'engine.gpu="h200"'])
        (w,) = [str(x.message) for x in got]
        assert named in w and "is not modelled: its weights are priced as bf16" in w
        got.clear()
        load_scenario(None, [f"engine.model={json.dumps(path)}", 'engine.gpu="h200"', 'engine.dtype="int4"'])
        assert got == []  # (a format given: nothing left to guess)

def test_attention_runs_in_the_kv_caches_format_not_the_weights():
    """FP8 weights with a BF16 KV cache: the GEMMs at the FP8 rate, attention at the BF16 rate;
    with an FP8 KV cache attention runs at the FP8 rate too."""
    bf16 = derived("llama-3.1-8b", "h200")["step"]
    w8 = derived("llama-3.1-8b", "h200", dtype="fp8")
    assert w8["step"]["prefill_attn_s"] == pytest.approx(bf16["prefill_attn_s"])
    assert w8["step"]["decode_ctx_s"] == pytest.approx(bf16["decode_ctx_s"])
    assert w8["meta"]["constants"]["attention_flops"]["value"] == 989e12
    w8kv8 = derived("llama-3.1-8b", "h200", dtype="fp8", kv_dtype="fp8")["step"]
    assert w8kv8["prefill_attn_s"] == pytest.approx(bf16["prefill_attn_s"] / 2)


def test_prefill_attention_at_head_dim_64_runs_at_flashattention3s_measured_rate():
    """FlashAttention-3 runs head dim 64 at 497 / 648 of head dim 128's rate: gpt-oss's prefill
    attention (head dim 64) is priced at that rate, head dim 128 models and MLA's 192 at 1."""
    doc = derived("gpt-oss-20b", "h200")
    c = {k: v["value"] for k, v in doc["meta"]["constants"].items()}
    assert c["attention_head_dim_rate"] == pytest.approx(497 / 648)
    assert doc["step"]["prefill_attn_s"] == pytest.approx(c["attn_flops_l2"] / (989e12 * 0.6 * 497 / 648))
    assert doc["step"]["chunk_attn_s"] == pytest.approx(2 * doc["step"]["prefill_attn_s"])
    for model in ("llama-3.1-8b", "qwen3-30b-a3b", "deepseek-v3"):
        assert "attention_head_dim_rate" not in derived(model, "h200", tp=8 if model == "deepseek-v3" else 1)[
            "meta"]["constants"]


def test_block_scaled_fp8_runs_the_non_expert_gemms_at_the_measured_block_fp8_rate():
    """Qwen3-235B-A22B at tp 4 on H100: routed experts at the FP8 rate, attention projections at
    0.68 x the BF16 rate (vLLM's CUTLASS block-FP8 GEMM), so past the knee one token costs
    2 x (experts' + 16-bit parameters) / F8' + 2 x linear parameters / (0.68 x BF16'), plus its
    routed activations and all-reduce bytes."""
    per = derived("qwen3-235b-a22b", "h100-sxm", dtype="fp8", tp=4)
    blk = derived("qwen3-235b-a22b", "h100-sxm", dtype="fp8-block", tp=4)
    c = {k: v["value"] for k, v in blk["meta"]["constants"].items()}
    assert c["weights_bytes"] == per["meta"]["constants"]["weights_bytes"]["value"]
    assert c["linear_rate_vs_bf16"] == 0.68 and "#23280" in blk["meta"]["constants"]["linear_rate_vs_bf16"]["source"]
    h, layers, heads, kvh, d = 4096, 94, 64 // 4, 4 // 4, 128
    linear = layers * (h * heads * d + 2 * h * kvh * d + heads * d * h)
    eff = c["flops_efficiency"]  # (H100-SXM's fitted fraction)
    f8, bf = 1979e12 * eff, 989e12 * eff
    slope = 2 * (c["flop_params_per_token"] - linear) / f8 + 2 * linear / (0.68 * bf) \
        + c["moe_act_bytes_per_token"] / (3.35e12 * 0.8) + c["allreduce_bytes_per_token"] / (450e9 * 0.7)
    k, v = blk["step"]["token_knots"], blk["step"]["token_s"]
    assert (v[-1] - v[-2]) / (k[-1] - k[-2]) == pytest.approx(slope, rel=1e-6)
    # the checkpoint's own block scales select the format
    assert load_architecture("deepseek-v3").quant == "fp8-block"


def test_mxfp4_experts_are_held_in_the_kernels_padded_layout():
    """vLLM pads MXFP4 experts for Marlin on GPUs without FP4 tensor cores (hidden to 256,
    intermediate to 128): gpt-oss-120b's 2880 x 2880 experts become 3072 x 2944, 65.85 GiB on
    one H100 where vLLM logs 65.97 GiB (vllm-project/vllm#23278)."""
    c = {k: v["value"] for k, v in derived("gpt-oss-120b", "h100-sxm")["meta"]["constants"].items()}
    one = 3 * 3072 * 2944 + 2 * 2880 + 2880  # padded matrices, the biases as they are
    assert c["expert_bytes"] == pytest.approx(36 * 128 * one * 4.25 / 8)
    assert c["weights_bytes"] / 2**30 == pytest.approx(65.97, rel=0.005)
    # Blackwell's kernels pad both to 256; BF16 experts are not padded
    b200 = derived("gpt-oss-120b", "b200")["meta"]["constants"]["expert_bytes"]["value"]
    assert b200 == pytest.approx(36 * 128 * (3 * 3072 * 3072 + 3 * 2880) * 4.25 / 8)
    assert derived("gpt-oss-20b", "h100-sxm", dtype="bf16")["meta"]["constants"]["expert_bytes"]["value"] == \
        24 * 32 * (3 * 2880 * 2880 + 3 * 2880) * 2


def test_expert_parallelism_adds_the_alltoall_and_splits_the_experts():
    tp = derived("qwen3-30b-a3b", "h100-sxm", tp=2)
    ep = derived("qwen3-30b-a3b", "h100-sxm", tp=2, ep=2)
    ct, ce = (d["meta"]["constants"] for d in (tp, ep))
    assert ce["expert_bytes"]["value"] == ct["expert_bytes"]["value"]  # half the experts, each whole
    a2a = 2 * 48 * 8 * 2048 * 2 * (2 - 1) / 2 / 2
    assert ce["alltoall_bytes_per_token"]["value"] == pytest.approx(a2a)
    assert ce["allreduce_bytes_per_token"]["value"] == pytest.approx((2 * 48 - 48) * 2048 * 2 * 2 * 1 / 2)
    assert ep["step"]["base_s"] == pytest.approx(1e-3 + 48 * 1e-5 + 96 * 2e-5)
    assert ep["meta"]["gpus"] == 2


def test_kv_capacity_is_what_the_engine_helper_computes():
    from sim.engines.gpu import from_profile_json, kv_capacity_bytes
    doc = derived("qwen3-30b-a3b", "h200")
    w = doc["model"]["weights_bytes"]
    assert doc["memory"]["kv_capacity_bytes"] == kv_capacity_bytes(141e9, 0.9, w, 2e9)
    assert from_profile_json(doc).weights_bytes == w


SCENARIO = """name = "m"
horizon_s = 5.0
[engine]
{engine}
[[classes]]
name = "chat"
priority = 0
[[streams]]
tenant = "t"
class = "chat"
arrival = {{ process = "poisson", rate = 4.0 }}
prompt_tokens = 300
output_tokens = 40
"""


def test_a_scenario_runs_on_a_bundled_model(tmp_path):
    res = CliRunner().invoke(main, ["run", "--set", 'engine.model="qwen3-30b-a3b"', "--set", 'engine.gpu="h200"',
                                    "--set", "horizon_s=2", "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert "profile=h200-qwen3-30b-a3b" in res.output
    written = json.loads((tmp_path / "o" / "scenario.json").read_text())["engine"]
    assert written["model"] == "qwen3-30b-a3b" and "profile" not in written  # derived again on reading


def test_a_users_config_json_from_another_folder(tmp_path):
    (tmp_path / "models" / "mine").mkdir(parents=True)
    cfg = json.loads((ROOT / "sim" / "models" / "configs" / "qwen3-8b.json").read_text())
    (tmp_path / "models" / "mine" / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 12}))
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "s.toml").write_text(SCENARIO.format(
        engine='model = "../models/mine/config.json"\ngpu = "l40s"\nengine = "vllm"'))
    sc = load_scenario(tmp_path / "runs" / "s.toml")
    assert sc.engine.profile["meta"]["name"] == "l40s-mine"
    assert sc.engine.profile["meta"]["config"] == "../models/mine/config.json"
    res = CliRunner().invoke(main, ["run", str(tmp_path / "runs" / "s.toml"), "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output


def test_set_model_replaces_the_files_profile_and_back():
    sc = load_scenario(None, ['engine.model="qwen3-8b"', 'engine.gpu="h100"'])
    assert sc.engine.profile["meta"]["name"] == "h100-sxm-qwen3-8b"
    assert load_scenario(None).engine.profile == "h200-llama-3-8b"


def test_a_group_of_a_cluster_may_run_another_model_and_counts_its_gpus(tmp_path):
    from sim.cluster.spec import parse_cluster
    (tmp_path / "s.toml").write_text(SCENARIO.format(engine='model = "qwen3-8b"\ngpu = "h200"') + """
[cluster]
groups = [{ replicas = 2 }, { replicas = 1, engine = { model = "llama-3.1-70b", tp = 4 } },
          { replicas = 1, engine = { profile = "h200-llama-3-8b" } },
          { replicas = 2, engine = { profile = "h200-llama-3-70b-tp4" } },
          { replicas = 1, gpus = 4, engine = { profile = "h200-llama-3-70b-tp4" } }]
""")
    spec = parse_cluster(load_scenario(tmp_path / "s.toml"))
    # (a shipped TP-4 profile is four GPUs a replica, as a derived one; gpus as written agrees)
    assert [g.gpus for g in spec.groups] == [1, 4, 1, 4, 4] and spec.gpus == 19
    assert spec.groups[1].engine.profile["meta"]["name"] == "h200-llama-3.1-70b-tp4"
    assert spec.groups[2].engine.profile == "h200-llama-3-8b"


def test_profiles_command_prints_every_constant_with_its_source():
    res = CliRunner().invoke(main, ["profiles", "--model", "deepseek-v3", "--gpu", "h200", "--tp", "8"])
    assert res.exit_code == 0, res.output
    doc = derived("deepseek-v3", "h200", tp=8)
    for key, c in doc["meta"]["constants"].items():
        assert key in res.output and c["source"] in res.output, key
    assert "3.7678 ms" in res.output  # decode, batch 1, context 1, the roofline alone
    listed = CliRunner().invoke(main, ["profiles", "--models"])
    assert "qwen3-30b-a3b" in listed.output and "mi300x" in listed.output
    as_json = CliRunner().invoke(main, ["profiles", "--model", "qwen3-8b", "--gpu", "h200", "--json"])
    assert json.loads(as_json.output) == derived("qwen3-8b", "h200")


def test_the_same_inputs_derive_the_same_document():
    a, b = derived("gpt-oss-120b", "b200"), derived("gpt-oss-120b", "b200")
    assert a == b and a is not b
    assert "date" not in a["meta"]
