"""A model is its Hugging Face ``config.json``: the architecture fields read from it, and the
bundled configs by name.

:func:`architecture` turns a config document into an :class:`Architecture`: layers, widths,
heads, the feed-forward kind of every layer (dense or mixture of experts), the attention kind
(grouped-query / multi-query, or DeepSeek's multi-head latent attention) and which layers attend
only to a sliding window. Nothing else of the checkpoint is read and nothing is downloaded.

Fields read (the first present name wins; a multimodal config's ``text_config`` is read):

* shape: ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``
  (default: the heads), ``head_dim`` (default hidden / heads), ``intermediate_size`` (OPT:
  ``ffn_dim``), ``vocab_size``, ``tie_word_embeddings`` (Hugging Face's default: true), ``attention_bias``
  (Qwen2 always has Q/K/V biases);
* the feed-forward's kind: gated (SwiGLU/GeGLU, three matrices) except for ``model_type = "opt"``,
  whose feed-forward is two matrices with a ReLU between (``fc1``, ``fc2``) and whose projections
  all carry biases (``enable_bias``, default true);
* mixture of experts: ``num_local_experts`` | ``num_experts`` | ``n_routed_experts``;
  ``num_experts_per_tok`` | ``experts_per_token``; ``moe_intermediate_size`` (else
  ``intermediate_size``); ``n_shared_experts`` (x the expert size) or
  ``shared_expert_intermediate_size``; ``first_k_dense_replace``; ``decoder_sparse_step`` and
  ``mlp_only_layers``;
* MLA: ``kv_lora_rank``, ``q_lora_rank`` (null: a full query projection), ``qk_nope_head_dim``,
  ``qk_rope_head_dim``, ``v_head_dim``;
* sliding window: ``sliding_window`` (null or absent: none; Qwen2's ``use_sliding_window =
  false`` turns it off) on the layers ``layer_types`` marks ``sliding_attention``, else every
  layer but each ``sliding_window_pattern``-th (Gemma 3), else every layer (Mistral-7B-v0.1);
* weights: ``quantization_config.quant_method`` (fp8, fbgemm_fp8, mxfp4; awq / gptq with
  ``bits`` 4 or 8, weight-only; compressed-tensors by its ``config_groups``) gives the default
  weight format (another method: bf16, and a warning where the profile is derived);
* context: ``max_position_embeddings`` (or ``n_positions``, ``max_seq_len``, ``seq_length``).
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from plumbing.documents import DocumentError, loads_json, read_text
from plumbing.suggest import did_you_mean
from sim.core.errors import ScenarioError

#: The bundled configs (one ``<name>.json`` each; their sources and licences in the README there).
#: (Located through ``sim/__init__``, as the profiles are.)
CONFIG_DIR = Path(sys.modules["sim"].__file__ or ".").resolve().parent / "models" / "configs"


@dataclass(frozen=True)
class Architecture:
    """A decoder's architecture, as its config.json gives it (whole model, not a shard).

    Attributes (counts and widths; ``0`` where a feature is absent):
        name, source: what it is and where it was read.
        layers, hidden, heads, kv_heads, head_dim, ffn, vocab: the shape (``ffn``: a dense
            layer's MLP intermediate size).
        mlp_matrices: matrices of hidden x ffn in a dense layer's MLP (3 gated; OPT's plain MLP 2).
        tied: the LM head shares the embedding matrix.
        qkv_bias, o_bias: projection biases.
        norms_per_layer: RMSNorm vectors per layer (2; Gemma 3: 4); qk_norm: per-head Q/K norms.
        experts, experts_per_token, expert_ffn, shared_ffn: routed experts, the number each token
            uses, one expert's intermediate size, the always-used shared experts' total size.
        moe_layers: layers whose feed-forward is the mixture of experts (the others are dense).
        expert_bias: experts and router carry biases (gpt-oss).
        kv_lora_rank, q_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim: MLA (on when
            ``kv_lora_rank > 0``).
        sliding_window, window_layers: the window (tokens) and how many layers use it.
        attention_sinks: a learned sink logit per head (gpt-oss).
        quant: the checkpoint's own weight format (``bf16`` unless its quantization_config says).
        quant_unmodelled: what the quantization_config names that priosim does not model (its
            weights then priced as ``bf16``), "" otherwise.
        context_length: the longest sequence the model takes, tokens (``max_position_embeddings``
            and its aliases; None when the config does not say): a named engine's default
            ``max_model_len``.
    """

    name: str
    source: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    mlp_matrices: int = 3
    tied: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    norms_per_layer: int = 2
    qk_norm: bool = False
    experts: int = 0
    experts_per_token: int = 0
    expert_ffn: int = 0
    shared_ffn: int = 0
    moe_layers: int = 0
    expert_bias: bool = False
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    sliding_window: int = 0
    window_layers: int = 0
    attention_sinks: bool = False
    quant: str = "bf16"
    quant_unmodelled: str = ""
    context_length: int | None = None

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def moe(self) -> bool:
        return self.experts > 0 and self.moe_layers > 0

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    @property
    def kind(self) -> str:
        """A short description: ``dense GQA``, ``MoE 128x8 GQA``, ``MoE 256x8 MLA``, ..."""
        parts = [f"MoE {self.experts}x{self.experts_per_token}" if self.moe else "dense",
                 "MLA" if self.mla else ("MQA" if self.kv_heads == 1 else
                                          "MHA" if self.kv_heads == self.heads else "GQA")]
        if self.window_layers:
            parts.append(f"sliding window {self.sliding_window} on {self.window_layers}/{self.layers} layers")
        return " ".join(parts)


class _Reader:
    """Typed reads of a config document; errors name the file and the key."""

    def __init__(self, doc: dict, where: str) -> None:
        self.doc, self.where = doc, where

    def get(self, *names: str, default=None):
        for n in names:
            if n in self.doc and self.doc[n] is not None:
                return self.doc[n]
        return default

    def int(self, *names: str, default: int | None = None, minimum: int = 1) -> int:
        v = self.get(*names)
        if v is None:
            if default is None:
                raise ScenarioError(f"{self.where}: missing key '{names[0]}' (expected an integer >= {minimum})")
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or v < minimum:
            raise ScenarioError(f"{self.where}: {names[0]}: expected an integer >= {minimum} (got {v!r})")
        return int(v)

    def bool(self, name: str, default: bool) -> bool:
        v = self.doc.get(name, default)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise ScenarioError(f"{self.where}: {name}: expected true or false (got {v!r})")
        return v


_QUANT = {"fp8": "fp8", "mxfp4": "mxfp4", "fbgemm_fp8": "fp8"}


def _quant(r: _Reader) -> tuple[str, str]:
    """The checkpoint's weight format (a key of ``sim.models.derive.WEIGHT_FORMATS``) from its
    ``quantization_config``, and, when that names a scheme priosim does not model (priced as
    bf16), what it names (``quant_method = 'bitsandbytes'``); "" otherwise."""
    q = r.doc.get("quantization_config")
    if not isinstance(q, dict):
        return "bf16", ""
    method = str(q.get("quant_method", "")).lower()
    if method == "fp8" and q.get("weight_block_size"):
        return "fp8-block", ""  # DeepSeek-V3, Qwen3-*-FP8: a scale per 128 x 128 block
    if method in _QUANT:
        return _QUANT[method], ""
    # GPTQ and AWQ are weight-only: the weights are dequantised and multiplied in 16 bits
    if method in ("awq", "gptq") and q.get("bits") in (4, 8):
        return ("int4" if q["bits"] == 4 else "w8a16"), ""
    if method == "compressed-tensors":
        found = _compressed_tensors(q)
        if found is not None:
            return found, ""
        return "bf16", "quant_method = 'compressed-tensors' with a scheme priosim does not model"
    if method in ("awq", "gptq"):
        return "bf16", f"quant_method = {method!r} with bits = {q.get('bits')!r} (4 and 8 are modelled)"
    return "bf16", f"quant_method = {method!r}" if method else "no quant_method"


#: The config keys that bound a model's sequence length (vLLM reads each and takes the least).
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length",
                "max_seq_length", "seq_len")


def _context_length(r: _Reader) -> int | None:
    """The longest sequence the model takes, tokens, as vLLM derives ``--max-model-len``'s default
    from the config: the least of :data:`CONTEXT_KEYS` it has, and under YaRN rope scaling the
    original length times the factor (DeepSeek-V3: 4096 x 40). None when it has none."""
    found = [v for k in CONTEXT_KEYS if isinstance(v := r.doc.get(k), int) and not isinstance(v, bool) and v > 0]
    if not found:
        return None
    rope = r.doc.get("rope_scaling")
    if isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) == "yarn":
        base, factor = rope.get("original_max_position_embeddings"), rope.get("factor")
        if isinstance(base, int) and isinstance(factor, (int, float)) and base > 0 and factor >= 1:
            return int(base * factor)
    return min(found)


def _compressed_tensors(q: dict) -> str | None:
    """The weight format of an llm-compressor checkpoint (``quant_method = 'compressed-tensors'``)
    from its ``config_groups``: every group's ``weights`` (``num_bits``, ``type`` float or int,
    ``strategy``) and ``input_activations`` (8-bit of the same type: W8A8, the matmuls at the
    FP8 / INT8 rate; none: weight-only, at the BF16 rate). None for another scheme (4-bit
    floats, mixed groups)."""
    groups = q.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        return None
    found = set()
    for g in groups.values():
        w = g.get("weights") if isinstance(g, dict) else None
        if not isinstance(w, dict):
            return None
        act = g.get("input_activations")
        bits, kind = w.get("num_bits"), w.get("type")
        w8a8 = isinstance(act, dict) and act.get("num_bits") == 8 and act.get("type") == kind
        if act is not None and not w8a8:
            return None  # (activations quantised otherwise: not a scheme priced here)
        if bits == 8 and kind == "float":
            found.add(("fp8-block" if w.get("strategy") == "block" else "fp8") if w8a8 else "w8a16")
        elif bits == 8 and kind == "int":
            found.add("int8" if w8a8 else "w8a16")
        elif bits == 4 and kind == "int" and not w8a8:
            found.add("int4")
        else:
            return None
    return found.pop() if len(found) == 1 else None


def architecture(doc: dict, name: str, where: str, source: str | None = None) -> Architecture:
    """The architecture a config.json document describes (ScenarioError naming ``where`` and the
    key for a missing or bad field); ``source`` (default ``where``) is what profiles record."""
    if not isinstance(doc, dict):
        raise ScenarioError(f"{where}: expected a JSON object (a Hugging Face config.json)")
    outer = doc
    if isinstance(doc.get("text_config"), dict):  # a multimodal model: its language model
        doc = {**doc["text_config"], **{k: v for k, v in doc.items() if k == "quantization_config"}}
        where = f"{where}: text_config"
    r = _Reader(doc, where)
    model_type = str(r.get("model_type", default=outer.get("model_type", "")))
    layers = r.int("num_hidden_layers", "n_layer")
    hidden = r.int("hidden_size", "n_embd")
    heads = r.int("num_attention_heads", "n_head")
    kv_heads = r.int("num_key_value_heads", default=1 if r.get("multi_query") else heads)
    if heads % kv_heads:
        raise ScenarioError(f"{where}: num_key_value_heads: expected a divisor of num_attention_heads "
                            f"({heads}) (got {kv_heads})")
    head_dim = r.int("head_dim", default=hidden // heads)
    vocab = r.int("vocab_size")
    # -- mixture of experts
    experts = r.int("num_local_experts", "num_experts", "n_routed_experts", default=0, minimum=0)
    k = r.int("num_experts_per_tok", "experts_per_token", default=0, minimum=0) if experts else 0
    if experts and not 1 <= k <= experts:
        raise ScenarioError(f"{where}: num_experts_per_tok: expected an integer in 1..{experts} (got {k})")
    ffn = r.int("intermediate_size", "ffn_dim", default=0 if experts else None, minimum=0 if experts else 1)
    expert_ffn = r.int("moe_intermediate_size", default=ffn, minimum=1) if experts else 0
    shared = 0
    moe_layers = 0
    if experts:
        shared = r.int("n_shared_experts", default=0, minimum=0) * expert_ffn or \
            r.int("shared_expert_intermediate_size", default=0, minimum=0)
        first_dense = r.int("first_k_dense_replace", default=0, minimum=0)
        step = r.int("decoder_sparse_step", "moe_layer_freq", default=1)
        dense_only = r.get("mlp_only_layers", default=[]) or []
        if not isinstance(dense_only, list):
            raise ScenarioError(f"{where}: mlp_only_layers: expected a list of layer indexes (got {dense_only!r})")
        moe_layers = sum(1 for i in range(layers)
                         if i >= first_dense and (i + 1) % step == 0 and i not in dense_only)
        if moe_layers < layers and ffn < 1:
            raise ScenarioError(f"{where}: intermediate_size: expected an integer >= 1 for the "
                                f"{layers - moe_layers} dense layers (got {ffn})")
    # -- MLA
    kv_lora = r.int("kv_lora_rank", default=0, minimum=0)
    mla = {}
    if kv_lora:
        mla = dict(kv_lora_rank=kv_lora, q_lora_rank=r.int("q_lora_rank", default=0, minimum=0),
                   qk_nope_head_dim=r.int("qk_nope_head_dim"), qk_rope_head_dim=r.int("qk_rope_head_dim"),
                   v_head_dim=r.int("v_head_dim"))
    # -- sliding window
    window = r.int("sliding_window", default=0, minimum=0)
    if doc.get("use_sliding_window") is False:
        window = 0
    window_layers = 0
    if window:
        types = doc.get("layer_types")
        pattern = r.int("sliding_window_pattern", default=0, minimum=0)
        if isinstance(types, list) and types:
            if len(types) != layers:
                raise ScenarioError(f"{where}: layer_types: expected {layers} entries (got {len(types)})")
            window_layers = sum(1 for t in types if t == "sliding_attention")
        elif pattern:
            window_layers = layers - layers // pattern  # every pattern-th layer attends globally
        else:
            window_layers = layers
    gemma = model_type.startswith("gemma")
    # OPT (and GPT-2-era decoders like it): a plain two-matrix ReLU MLP, biases on every projection
    opt = model_type == "opt"
    opt_bias = opt and r.bool("enable_bias", True)
    quant, unmodelled = _quant(r)
    return Architecture(
        name=name, source=source or where, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
        head_dim=head_dim, ffn=ffn, vocab=vocab, mlp_matrices=2 if opt else 3,
        tied=r.bool("tie_word_embeddings", True),
        qkv_bias=opt_bias or r.bool("attention_bias", model_type.startswith("qwen2") and not experts or
                                    model_type == "qwen2_moe"),
        o_bias=opt_bias or r.bool("attention_bias", False) and model_type == "gpt_oss",
        norms_per_layer=4 if gemma else 2, qk_norm=model_type.startswith(("qwen3", "gemma3")),
        experts=experts, experts_per_token=k, expert_ffn=expert_ffn, shared_ffn=shared,
        moe_layers=moe_layers, expert_bias=model_type == "gpt_oss", sliding_window=window,
        window_layers=window_layers, attention_sinks=model_type == "gpt_oss", quant=quant,
        quant_unmodelled=unmodelled, context_length=_context_length(r), **mla,
    )


def bundled() -> list[str]:
    """The names of the bundled configs."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


def config_path(model: str, base_dir: Path | str | None = None) -> Path:
    """The config.json ``engine.model`` names: a bundled name, or a path ending in ``.json``
    (relative to ``base_dir``, the scenario's folder). ScenarioError when there is none."""
    text = str(model)
    if not text.endswith(".json"):
        p = CONFIG_DIR / f"{text.lower()}.json"
        if p.is_file():
            return p
        names = bundled()
        raise ScenarioError(f"engine.model: no bundled model '{text}' (expected one of {', '.join(names)}, or a "
                            f"path to a config.json){did_you_mean(text, names)}")
    p = Path(text).expanduser()
    if not p.is_absolute() and base_dir is not None:
        p = Path(base_dir) / p
    if not p.is_file():
        raise ScenarioError(f"engine.model: no file '{text}' (expected a Hugging Face config.json; a relative "
                            f"path is read from the scenario's folder {base_dir})")
    return p


def load_architecture(model: str, base_dir: Path | str | None = None) -> Architecture:
    """The architecture of ``engine.model`` (a bundled name or a config.json path)."""
    p = config_path(model, base_dir)
    try:
        doc = loads_json(read_text(p))
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"{p}: not valid JSON at line {exc.lineno}: {exc.msg}") from None
    except (DocumentError, OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{p}: {exc}") from None
    if p.parent == CONFIG_DIR:
        name, source = p.stem, f"bundled:{p.stem}"
    else:  # (the path as written: a profile must not depend on the folder it was derived in)
        name, source = (p.parent.name if p.name == "config.json" else p.stem), str(model)
    return architecture(doc, name.lower(), str(p), source)
