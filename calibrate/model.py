"""A Llama-shaped decoder in plain PyTorch, with a preallocated KV cache, for timing real steps.

What is modelled: the work one serving-engine iteration does on one GPU (or CPU) for a batch that
mixes decoding sequences (one new token each, attending to their cached context) and prefill
chunks (``n`` new tokens on top of ``start`` cached ones; ``start = 0`` is a whole prompt).
As in vLLM, the dense parts (fused QKV projection, output projection, SwiGLU MLP) run once over
all ``T`` tokens of the step, flattened; attention runs per prefill chunk (causal, offset by the
cached prefix) and once for all decoders together (padded to the longest context and masked);
the LM head runs on the last token of each sequence only, and the next token is the argmax.

Weights are random (timing does not need trained ones; nothing is downloaded). GQA uses
``F.scaled_dot_product_attention(enable_gqa=True)``; RoPE is the rotate-half form; norms are
RMSNorm. The KV cache is contiguous per slot: ``k[layer]`` has shape
``(slots, kv_heads, max_len, head_dim)`` (a paged pool is what a server uses, but a step's cost
depends on tokens attended, not on their placement; the transfer measurements in
``measure.py`` use a paged layout, which is what swapping moves).

Every index tensor a step needs is built by :meth:`Decoder.plan` ahead of time, so
:meth:`Decoder.forward` is pure device work: it can be timed without host overhead in the
way and captured in a CUDA graph (decode under graphs, as serving engines run it).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from calibrate.shapes import Shape

#: Attention kernels the decoder may use: FlashAttention, memory-efficient and the math
#: fallback, not cuDNN's fused attention. On an H200 (torch 2.11, cuDNN 9) PyTorch picks cuDNN
#: first, and each call spent about 0.67 ms of host time on the execution plan of its shape:
#: 42 ms of a 78 ms mixed step, whose two attention calls per layer meet new shapes at nearly
#: every step of a serving loop. Serving engines run FlashAttention-style kernels.
SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Item:
    """One sequence's part in a step: ``n`` new tokens at positions ``start .. start+n-1``.

    A decoder is ``n = 1, start = context``; a prefill chunk is ``n = chunk, start = cached``.
    """

    slot: int
    n: int
    start: int = 0


def split_items(items: list[Item]) -> tuple[list[Item], list[Item]]:
    """``(decoders, prefill chunks)`` of a step, each in the given order: a decoder is one new
    token on a cached context (``n == 1 and start > 0``), anything else is a prefill chunk."""
    dec = [it for it in items if it.n == 1 and it.start > 0]
    pre = [it for it in items if not (it.n == 1 and it.start > 0)]
    return dec, pre


@dataclass
class Batch:
    """A planned step: device tensors and static metadata (see :meth:`Decoder.plan`)."""

    items: list[Item]
    tokens: torch.Tensor            # (T,) token ids, decoders first then prefill chunks
    cos: torch.Tensor               # (T, 1, head_dim)
    sin: torch.Tensor
    slot_t: torch.Tensor            # (T,) cache slot of each token
    pos_t: torch.Tensor             # (T,) cache position of each token
    last_t: torch.Tensor            # (items,) index of each item's last token, in item order
    n_dec: int = 0
    dec_slots: torch.Tensor | None = None
    dec_len: int = 0                # keys to read for decoders (max context + 1)
    dec_mask: torch.Tensor | None = None   # (D, 1, 1, dec_len) bool, None if all equal
    chunks: list[tuple[int, int, int, int, torch.Tensor | None]] = field(default_factory=list)
    # (token offset, n, slot, start, mask or None for a fresh causal prompt)

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.numel())


class Decoder:
    """Random-weight Llama-shaped decoder of ``shape`` on ``device`` in ``dtype``.

    Args:
        shape: model dimensions (calibrate.shapes.Shape).
        device: "cpu" or "cuda[:i]".
        dtype: "fp32" | "bf16" | "fp16".
        slots, max_len: KV cache size (sequences x tokens each); :meth:`alloc_cache` resizes.
        seed: weights' random seed.
    """

    def __init__(self, shape: Shape, device: str = "cpu", dtype: str = "fp32", slots: int = 1,
                 max_len: int = 256, seed: int = 0):
        self.shape, self.device, self.dtype_name = shape, torch.device(device), dtype
        self.dtype = TORCH_DTYPES[dtype]
        s = shape
        g = torch.Generator(device=self.device).manual_seed(seed)
        self._gen = g

        def w(rows: int, cols: int) -> torch.Tensor:
            t = torch.empty(rows, cols, device=self.device, dtype=self.dtype)
            return t.normal_(0.0, rows ** -0.5, generator=g)

        qkv_out = (s.heads + 2 * s.kv_heads) * s.head_dim
        self.embed = w(s.vocab, s.hidden)
        self.layers = [
            dict(attn_norm=torch.ones(s.hidden, device=self.device, dtype=self.dtype),
                 wqkv=w(s.hidden, qkv_out), wo=w(s.heads * s.head_dim, s.hidden),
                 mlp_norm=torch.ones(s.hidden, device=self.device, dtype=self.dtype),
                 w_gate_up=w(s.hidden, 2 * s.ffn), w_down=w(s.ffn, s.hidden))
            for _ in range(s.layers)
        ]
        self.final_norm = torch.ones(s.hidden, device=self.device, dtype=self.dtype)
        self.lm_head = w(s.hidden, s.vocab)
        self.k_cache: list[torch.Tensor] = []
        self.v_cache: list[torch.Tensor] = []
        self.slots = self.max_len = 0
        self.alloc_cache(slots, max_len)

    # ---- memory -----------------------------------------------------------------------------
    def weight_bytes(self) -> int:
        ts = [self.embed, self.final_norm, self.lm_head] + [t for l in self.layers for t in l.values()]
        return sum(t.numel() * t.element_size() for t in ts)

    def cache_bytes(self, slots: int, max_len: int) -> int:
        s = self.shape
        return 2 * s.layers * slots * s.kv_heads * max_len * s.head_dim * torch.finfo(self.dtype).bits // 8

    def alloc_cache(self, slots: int, max_len: int) -> None:
        """(Re)allocate the KV cache for ``slots`` sequences of up to ``max_len`` tokens."""
        if slots == self.slots and max_len == self.max_len:
            return
        self.k_cache = self.v_cache = []  # free the old cache before allocating the new one
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            check_free_memory(self.cache_bytes(slots, max_len), self.device, what="KV cache")
        s = self.shape
        shp = (slots, s.kv_heads, max_len, s.head_dim)
        self.k_cache = [torch.zeros(shp, device=self.device, dtype=self.dtype) for _ in range(s.layers)]
        self.v_cache = [torch.zeros(shp, device=self.device, dtype=self.dtype) for _ in range(s.layers)]
        self.slots, self.max_len = slots, max_len
        hd = s.head_dim
        inv = 1.0 / (s.rope_theta ** (torch.arange(0, hd, 2, device=self.device, dtype=torch.float32) / hd))
        ang = torch.outer(torch.arange(max_len, device=self.device, dtype=torch.float32), inv)
        ang = torch.cat([ang, ang], dim=-1)
        self._cos, self._sin = ang.cos().to(self.dtype), ang.sin().to(self.dtype)

    # ---- planning ---------------------------------------------------------------------------
    def plan(self, items: list[Item], tokens: list[int] | torch.Tensor | None = None,
             dec_len: int | None = None) -> Batch:
        """Build the device tensors of one step (decoders, ``n == 1 and start > 0``, go first).

        ``tokens`` are the new token ids in the order of the reordered items (random if None).
        Items keep their given order otherwise; ``Batch.items`` is the order used.
        ``dec_len`` pads the decoders' keys to that many and always masks them, so that the
        decode steps of a batch size whose contexts fall in one bucket (:func:`key_bucket`)
        have the same tensor shapes and kernels, and one captured CUDA graph serves them all
        (:class:`GraphedStep`); None reads exactly the longest context (masked only when the
        contexts differ).
        """
        dec, pre = split_items(items)
        order = dec + pre
        for it in order:
            if not (0 <= it.slot < self.slots) or it.start + it.n > self.max_len or it.n < 1:
                raise ValueError(f"item {it} does not fit the cache ({self.slots} slots x {self.max_len})")
        dev = self.device
        T = sum(it.n for it in order)
        if tokens is None:
            tok = torch.randint(0, self.shape.vocab, (T,), generator=None).to(dev)
        else:
            tok = torch.as_tensor(tokens, dtype=torch.long).to(dev)
        slot_l, pos_l, last_l = [], [], []
        off = 0
        for it in order:
            slot_l += [it.slot] * it.n
            pos_l += list(range(it.start, it.start + it.n))
            off += it.n
            last_l.append(off - 1)
        pos_t = torch.tensor(pos_l, dtype=torch.long, device=dev)
        b = Batch(items=order, tokens=tok, cos=self._cos[pos_t].unsqueeze(1),
                  sin=self._sin[pos_t].unsqueeze(1),
                  slot_t=torch.tensor(slot_l, dtype=torch.long, device=dev), pos_t=pos_t,
                  last_t=torch.tensor(last_l, dtype=torch.long, device=dev), n_dec=len(dec))
        if dec:
            ctx = [it.start + 1 for it in dec]
            b.dec_len = max(ctx)
            if dec_len is not None:
                if not b.dec_len <= dec_len <= self.max_len:
                    raise ValueError(f"dec_len {dec_len} must hold the longest context ({b.dec_len}) "
                                     f"and fit the cache ({self.max_len})")
                b.dec_len = dec_len
            b.dec_slots = torch.tensor([it.slot for it in dec], dtype=torch.long, device=dev)
            if dec_len is not None or min(ctx) != b.dec_len:
                ar = torch.arange(b.dec_len, device=dev)
                b.dec_mask = (ar[None, :] < torch.tensor(ctx, device=dev)[:, None])[:, None, None, :]
        off = len(dec)
        for it in pre:
            mask = None
            if it.start > 0:
                # query i (absolute position start+i) sees keys 0 .. start+i
                q = torch.arange(it.n, device=dev)[:, None] + it.start
                mask = torch.arange(it.start + it.n, device=dev)[None, :] <= q
            b.chunks.append((off, it.n, it.slot, it.start, mask))
            off += it.n
        return b

    # ---- compute ----------------------------------------------------------------------------
    @staticmethod
    def _rms(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w

    @staticmethod
    def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x.shape[-1] // 2
        rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
        return x * cos + rot * sin

    @torch.inference_mode()
    def forward(self, b: Batch) -> torch.Tensor:
        """Run one step; writes K/V into the cache and returns each item's next token id."""
        with sdpa_kernel(SDPA_BACKENDS):
            return self._forward(b)

    def _forward(self, b: Batch) -> torch.Tensor:
        s = self.shape
        H, KV, hd = s.heads, s.kv_heads, s.head_dim
        T = b.tokens.shape[0]
        x = self.embed[b.tokens]
        for li, L in enumerate(self.layers):
            h = self._rms(x, L["attn_norm"])
            qkv = h @ L["wqkv"]
            q = qkv[:, : H * hd].view(T, H, hd)
            k = qkv[:, H * hd: (H + KV) * hd].view(T, KV, hd)
            v = qkv[:, (H + KV) * hd:].view(T, KV, hd)
            q, k = self._rope(q, b.cos, b.sin), self._rope(k, b.cos, b.sin)
            kc, vc = self.k_cache[li], self.v_cache[li]
            kc[b.slot_t, :, b.pos_t] = k
            vc[b.slot_t, :, b.pos_t] = v
            outs = []
            if b.n_dec:
                qd = q[: b.n_dec].unsqueeze(2)                       # (D, H, 1, hd)
                kd = kc[b.dec_slots, :, : b.dec_len]                  # (D, KV, ctx, hd)
                vd = vc[b.dec_slots, :, : b.dec_len]
                od = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=b.dec_mask, enable_gqa=True)
                outs.append(od.reshape(b.n_dec, H * hd))
            for off, n, slot, start, mask in b.chunks:
                qc = q[off: off + n].transpose(0, 1).unsqueeze(0)     # (1, H, n, hd)
                kk = kc[slot: slot + 1, :, : start + n]
                vv = vc[slot: slot + 1, :, : start + n]
                oc = F.scaled_dot_product_attention(qc, kk, vv, attn_mask=mask,
                                                    is_causal=mask is None and n > 1, enable_gqa=True)
                outs.append(oc[0].transpose(0, 1).reshape(n, H * hd))
            attn = outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
            x = x + attn @ L["wo"]
            h = self._rms(x, L["mlp_norm"])
            gu = h @ L["w_gate_up"]
            x = x + (F.silu(gu[:, : s.ffn]) * gu[:, s.ffn:]) @ L["w_down"]
        last = self._rms(x[b.last_t], self.final_norm)
        return (last @ self.lm_head).argmax(dim=-1)

    def reference_forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Full-sequence logits without the cache (for tests: cached steps must match it)."""
        s = self.shape
        n = tokens.shape[0]
        x = self.embed[tokens]
        cos, sin = self._cos[:n].unsqueeze(1), self._sin[:n].unsqueeze(1)
        for L in self.layers:
            h = self._rms(x, L["attn_norm"])
            qkv = h @ L["wqkv"]
            qd, kd = s.heads * s.head_dim, s.kv_heads * s.head_dim
            q = qkv[:, :qd].view(n, s.heads, s.head_dim)
            k = qkv[:, qd: qd + kd].view(n, s.kv_heads, s.head_dim)
            v = qkv[:, qd + kd:].view(n, s.kv_heads, s.head_dim)
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            rep = s.heads // s.kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                               is_causal=True)
            x = x + o.transpose(0, 1).reshape(n, -1) @ L["wo"]
            h = self._rms(x, L["mlp_norm"])
            gu = h @ L["w_gate_up"]
            x = x + (F.silu(gu[:, : s.ffn]) * gu[:, s.ffn:]) @ L["w_down"]
        return self._rms(x, self.final_norm) @ self.lm_head


def check_free_memory(need_bytes: int, device: torch.device, what: str, margin: float = 1.1) -> None:
    """Raise a clear error before allocating ``need_bytes`` on a GPU that has less free."""
    free, total = torch.cuda.mem_get_info(device)
    if need_bytes * margin > free:
        raise MemoryError(f"{what} needs {need_bytes / 2**30:.2f} GiB (+{margin - 1:.0%} margin) but "
                          f"only {free / 2**30:.2f} of {total / 2**30:.2f} GiB is free on {device}; "
                          "use a smaller grid or shape")


def estimate_weight_bytes(shape: Shape, dtype: str) -> int:
    return shape.params * (torch.finfo(TORCH_DTYPES[dtype]).bits // 8)


def key_bucket(context: int, max_len: int) -> int:
    """Keys a graphed decode step reads for a longest context of ``context`` keys: the next
    multiple of 64 up to 512 keys, of 512 beyond, at most the cache's ``max_len``.

    Serving engines' decode kernels read each sequence's own context; a captured graph needs
    fixed shapes, so the keys are padded to a bucket and masked. The calibration rows and the
    serving loop pad alike, and the buckets keep the graphs few (16 batch sizes x 15 buckets
    for a 4k cache) while padding a short context by at most 63 keys.
    """
    step = 64 if context <= 512 else 512
    return min(max_len, -(-context // step) * step)


class GraphedStep:
    """A decode step captured in a CUDA graph, replayed with each step's own inputs (as serving
    engines run decode).

    The graph is captured on ``batch`` (a planned step, normally with its keys padded to a
    :func:`key_bucket`: its tensor shapes are fixed from then on). :meth:`run` plans the next
    step's items with the same shapes (same number of decoders, keys padded to the captured
    ``dec_len``), copies its inputs into the captured tensors and replays: the host work an
    engine does every step (building the inputs) is part of the step, as it is in eager steps.
    ``pool`` (``torch.cuda.graph_pool_handle()``)
    shares one memory pool among graphs that are replayed one at a time, as vLLM's decode
    graphs share theirs; each graph's output must be read before another graph replays.
    """

    #: the Batch tensors a step's inputs live in (copied into the captured ones at each run)
    INPUTS = ("tokens", "cos", "sin", "slot_t", "pos_t", "last_t", "dec_slots", "dec_mask")

    def __init__(self, model: Decoder, batch: Batch, warmup: int = 3, pool=None):
        if batch.chunks:
            raise ValueError("GraphedStep captures decode steps only (the batch has prefill chunks)")
        self.model, self.batch = model, batch
        s = torch.cuda.Stream(device=model.device)
        s.wait_stream(torch.cuda.current_stream(model.device))
        with torch.cuda.stream(s):
            for _ in range(warmup):
                model.forward(batch)
        torch.cuda.current_stream(model.device).wait_stream(s)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.out = model.forward(batch)
        torch.cuda.synchronize(model.device)

    def load(self, batch: Batch) -> None:
        """Copy ``batch``'s inputs into the captured tensors (shapes must match the capture)."""
        load_inputs(self.batch, batch)

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.out

    def run(self, items: list[Item], tokens: list[int] | torch.Tensor | None = None) -> torch.Tensor:
        """Plan ``items`` with the captured shapes, load them and replay; next token per item."""
        self.load(self.model.plan(items, tokens, dec_len=self.batch.dec_len))
        return self.replay()


def load_inputs(dst: Batch, src: Batch) -> None:
    """Copy the step inputs of ``src`` into ``dst``'s tensors in place (equal shapes required):
    what a captured graph reads at replay. A decode batch planned with a ``dec_len`` always
    has a mask when padded; one without is all keys (filled with True)."""
    if src.n_dec != dst.n_dec or src.dec_len != dst.dec_len or src.chunks or dst.chunks:
        raise ValueError(f"step of {src.n_dec} decoders x {src.dec_len} keys does not fit the captured "
                         f"{dst.n_dec} x {dst.dec_len} decode step")
    for name in GraphedStep.INPUTS:
        d, s = getattr(dst, name), getattr(src, name)
        if d is None:
            if s is not None:
                raise ValueError(f"captured step has no '{name}' (capture it with a padded dec_len)")
            continue
        if s is None:   # (dec_mask: every key is attended)
            d.fill_(True)
        else:
            d.copy_(s, non_blocking=True)
