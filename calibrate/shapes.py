"""Model shapes as data: the dimensions of Llama-shaped decoders that calibration runs and prices.

A shape is what the cost model and the KV cache need to know of a model: layers, hidden size,
attention heads, KV heads (grouped-query attention), head dimension, SwiGLU FFN size and
vocabulary. Tensor parallelism is modelled as the per-GPU shard: heads, KV heads, FFN and vocab
are divided by the degree (KV heads never below 1); hidden size and layers are not.

Derived values (functions of the shape, never stored):

* ``kv_bytes_per_token = 2 (K and V) x layers x kv_heads x head_dim x dtype_bytes``;
  Llama-3-8B in bf16: 2 x 32 x 8 x 128 x 2 = 131,072 bytes.
* ``params``: embedding + untied LM head + per layer (Q, K, V, O projections, three SwiGLU
  matrices, two RMSNorm vectors) + final norm; Llama-3-8B gives 8.03e9 (Meta's model card).

Sources: the ``config.json`` of each model on the Hugging Face hub (meta-llama/Meta-Llama-3-8B,
meta-llama/Meta-Llama-3-70B, mistralai/Mistral-7B-v0.1, Qwen/Qwen2.5-7B), copied by hand; nothing
is downloaded.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from plumbing.suggest import did_you_mean
from sim.core.costs import DTYPE_BYTES  # noqa: F401  (one home: the profile format is sim's)


@dataclass(frozen=True)
class Shape:
    """A Llama-shaped decoder (one GPU's shard when ``tp > 1``).

    Attributes:
        name: registry name (with ``-tpN`` appended for a shard).
        layers: decoder layers.
        hidden: residual stream width.
        heads: query heads (per GPU).
        kv_heads: key/value heads (per GPU), ``heads % kv_heads == 0``.
        head_dim: dimension of one head.
        ffn: SwiGLU intermediate size (per GPU).
        vocab: vocabulary (per GPU: the LM head is sharded).
        rope_theta: RoPE base.
        tp: tensor-parallel degree this shard belongs to.
        source: where the numbers come from.
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    rope_theta: float = 500000.0
    tp: int = 1
    source: str = ""

    def kv_bytes_per_token(self, dtype: str | int = "bf16") -> int:
        """Bytes of K and V one token occupies across all layers."""
        b = dtype if isinstance(dtype, int) else DTYPE_BYTES[dtype]
        return 2 * self.layers * self.kv_heads * self.head_dim * b

    @property
    def params(self) -> int:
        """Parameter count of this shard (embedding and untied LM head included)."""
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.ffn
        per_layer = q + kv + o + mlp + 2 * self.hidden
        return 2 * self.vocab * self.hidden + self.layers * per_layer + self.hidden

    @property
    def matmul_params(self) -> int:
        """Parameters that take part in a matmul per token (the embedding is a lookup)."""
        return self.params - self.vocab * self.hidden - (2 * self.layers + 1) * self.hidden

    def shard(self, tp: int) -> "Shape":
        """This shape's per-GPU shard at tensor-parallel degree ``tp``."""
        if tp < 1 or self.heads % tp or self.ffn % tp:
            raise ValueError(f"'tp' must divide heads ({self.heads}) and ffn ({self.ffn}) (got {tp})")
        if tp == 1:
            return self
        return replace(self, name=f"{self.name}-tp{tp}", heads=self.heads // tp,
                       kv_heads=max(1, self.kv_heads // tp), ffn=self.ffn // tp,
                       vocab=-(-self.vocab // tp), tp=tp)

    def to_profile_model(self, dtype: str) -> dict:
        """The ``model`` section of a profile (sim/core/costs.py reads it)."""
        return {"name": self.name, "layers": self.layers, "hidden": self.hidden,
                "heads": self.heads, "kv_heads": self.kv_heads, "head_dim": self.head_dim,
                "ffn": self.ffn, "vocab": self.vocab, "dtype_bytes": DTYPE_BYTES[dtype],
                "params": float(self.params), "tp": self.tp}

    def as_dict(self) -> dict:
        return asdict(self)


SHAPES: dict[str, Shape] = {
    s.name: s for s in [
        # ~4.8 M parameters: runs in milliseconds per step on one CPU thread (CI, validation).
        Shape("tiny", layers=4, hidden=256, heads=8, kv_heads=2, head_dim=32, ffn=688, vocab=4096,
              rope_theta=10000.0, source="priosim test shape (not a real model)"),
        Shape("llama-3-8b", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128,
              ffn=14336, vocab=128256, source="meta-llama/Meta-Llama-3-8B config.json"),
        Shape("llama-3-70b", layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128,
              ffn=28672, vocab=128256, source="meta-llama/Meta-Llama-3-70B config.json"),
        Shape("mistral-7b", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128,
              ffn=14336, vocab=32000, rope_theta=10000.0,
              source="mistralai/Mistral-7B-v0.1 config.json"),
        Shape("qwen2.5-7b", layers=28, hidden=3584, heads=28, kv_heads=4, head_dim=128,
              ffn=18944, vocab=152064, rope_theta=1000000.0,
              source="Qwen/Qwen2.5-7B config.json (QKV biases ignored: <0.01% of params)"),
        # added for the fidelity suite (calibrate/fidelity): models of published measurements
        Shape("qwen2.5-14b", layers=48, hidden=5120, heads=40, kv_heads=8, head_dim=128,
              ffn=13824, vocab=152064, rope_theta=1000000.0,
              source="Qwen/Qwen2.5-14B-Instruct config.json (QKV biases ignored)"),
        Shape("qwen2.5-32b", layers=64, hidden=5120, heads=40, kv_heads=8, head_dim=128,
              ffn=27648, vocab=152064, rope_theta=1000000.0,
              source="Qwen/Qwen2.5-32B-Instruct config.json (QKV biases ignored)"),
        Shape("qwen2.5-72b", layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128,
              ffn=29568, vocab=152064, rope_theta=1000000.0,
              source="Qwen/Qwen2.5-72B-Instruct config.json (QKV biases ignored)"),
        Shape("qwen3-8b", layers=36, hidden=4096, heads=32, kv_heads=8, head_dim=128,
              ffn=12288, vocab=151936, rope_theta=1000000.0,
              source="Qwen/Qwen3-8B config.json (per-head Q/K norms ignored)"),
        Shape("qwen3-14b", layers=40, hidden=5120, heads=40, kv_heads=8, head_dim=128,
              ffn=17408, vocab=151936, rope_theta=1000000.0,
              source="Qwen/Qwen3-14B config.json (per-head Q/K norms ignored)"),
        Shape("qwen3-32b", layers=64, hidden=5120, heads=64, kv_heads=8, head_dim=128,
              ffn=25600, vocab=151936, rope_theta=1000000.0,
              source="Qwen/Qwen3-32B config.json (per-head Q/K norms ignored)"),
    ]
}


def get_shape(name: str, tp: int | None = None) -> Shape:
    """A registered shape by name; ``llama-3-70b-tp4`` or ``tp=4`` gives the per-GPU shard."""
    base, _, t = name.rpartition("-tp")
    if base and t.isdigit() and base in SHAPES:
        name, tp = base, int(t) if tp is None else tp
    if name not in SHAPES:
        hint = did_you_mean(name, SHAPES)
        raise KeyError(f"'shape' must be one of {sorted(SHAPES)} (got {name!r}){hint}")
    return SHAPES[name].shard(tp or 1)


def list_shapes() -> list[str]:
    return sorted(SHAPES)
