"""Measure real step and KV-transfer costs on a device and write a profile (schema in sim/core/costs.py).

What is measured, per device x shape x dtype (each row: the step's aggregates and its median,
p10 and p90 time):

* ``prefill``: batch x prompt length (``B`` fresh prompts of ``L`` tokens in one step);
* ``chunk``: one chunk of ``c`` tokens on top of a cached prefix of ``p`` tokens;
* ``decode``: batch x context (``B`` sequences, one token each, with a populated cache);
  under CUDA graphs when asked (as serving engines run decode);
* ``dense``: a sweep of tokens per step (one prompt of ``T`` tokens) to place the knots of the
  piecewise-linear token term;
* ``mixed``: decoders plus one prefill chunk in the same step (what chunked prefill produces);
* ``swap``: moving ``N`` KV blocks device->host (``d2h``) and host->device (``h2d``), both as
  one copy per block per layer (how vLLM V0 swapped) and as gather-into-staging then one copy.
  On CUDA the host side is pinned and copies are ``non_blocking``; on CPU both sides are host
  memory, so the row is a plain host memcpy and the profile says so.

Recompute is not measured separately: the simulator prices it as prefill of prompt plus
generated tokens, which the prefill and chunk rows cover.

The rows go into the profile's ``rows`` key, the fitted coefficients (calibrate.fit) into
``step`` and ``swap``, the fit report into ``fit``, and the provenance into ``meta``.
"""
from __future__ import annotations

import datetime as _dt
import itertools
import json
import math
import platform
import random
import time
from pathlib import Path

import torch

from calibrate import fit as _fit
from calibrate import timing
from calibrate.model import (Decoder, GraphedStep, Item, check_free_memory, estimate_weight_bytes, key_bucket,
                             split_items)
from calibrate.shapes import Shape, get_shape
from calibrate.timing import configure_cpu, time_call, time_interleaved
from sim import jsonout

SCHEMA = "priosim.profile/1"

#: Grids: ``quick`` finishes in well under a minute for ``tiny`` on one CPU thread; ``full`` is
#: sized for a 7-8B model on an 80-141 GB GPU, about 3 minutes on an H200 (cells whose KV cache
#: would not fit are skipped): prefill 128..8k tokens, chunks on prefixes up to 8k, decode at
#: batch 1..256 x context 32..8k, mixed steps, and transfers of 1..512 blocks.
GRIDS: dict[str, dict] = {
    "quick": dict(
        prefill=dict(batch=[1, 2, 4], length=[16, 64, 128]),
        chunk=dict(chunk=[16, 64], prefix=[64, 192]),
        decode=dict(batch=[1, 4, 16], context=[32, 128, 256]),
        dense=dict(tokens=[4, 8, 32, 96, 192, 256, 384, 512]),
        mixed=dict(cells=[(4, 128, 64), (8, 64, 32), (16, 128, 128), (2, 256, 16), (8, 256, 128),
                           (12, 128, 16), (4, 64, 256), (8, 192, 64)]),
        swap=dict(blocks=[1, 8, 32, 128]),
        warmup=2, repeats=25, min_time_s=0.08, max_tokens_in_cache=1 << 15,
    ),
    "full": dict(
        prefill=dict(batch=[1, 2, 4, 8], length=[128, 256, 512, 1024, 2048, 4096, 8192]),
        chunk=dict(chunk=[64, 256, 1024, 2048], prefix=[256, 1024, 4096, 8192]),
        decode=dict(batch=[1, 4, 8, 16, 32, 64, 128, 256], context=[32, 128, 512, 2048, 8192]),
        dense=dict(tokens=[1, 16, 32, 64, 128, 192, 256, 384, 512, 768, 1024, 2048, 4096, 8192]),
        mixed=dict(cells=[(4, 64, 16), (8, 128, 64), (16, 256, 128), (12, 128, 256), (32, 1024, 512),
                          (64, 2048, 256), (128, 1024, 1024), (16, 4096, 2048)]),
        swap=dict(blocks=[1, 4, 16, 64, 256, 512]),
        warmup=3, repeats=10, min_time_s=0.2, max_tokens_in_cache=1 << 19,
    ),
}


def _cells(grid: dict) -> list[tuple[str, dict]]:
    """Every measurement of a grid as (kind, parameters), in the order they run."""
    out = []
    for L in grid["prefill"]["length"]:
        for B in grid["prefill"]["batch"]:
            if B * L <= 16384:
                out.append(("prefill", dict(batch=B, length=L)))
    for p in grid["chunk"]["prefix"]:
        for c in grid["chunk"]["chunk"]:
            out.append(("chunk", dict(chunk=c, prefix=p)))
    for B in grid["decode"]["batch"]:
        for ctx in grid["decode"]["context"]:
            if B * (ctx + ctx // 2 + 2) <= grid["max_tokens_in_cache"]:
                out.append(("decode", dict(batch=B, context=ctx)))
    for T in grid["dense"]["tokens"]:
        out.append(("dense", dict(tokens=T)))
    for D, ctx, L in grid["mixed"]["cells"]:
        out.append(("mixed", dict(batch=D, context=ctx, chunk=L)))
    for n in grid["swap"]["blocks"]:
        for method in ("per_block_layer", "gather"):
            for direction in ("d2h", "h2d"):
                out.append(("swap", dict(blocks=n, method=method, direction=direction)))
    return out


def _items(kind: str, p: dict) -> tuple[list[Item], int, int]:
    """Items of a step cell and the cache (slots, max_len) it needs."""
    if kind == "prefill":
        return [Item(i, p["length"], 0) for i in range(p["batch"])], p["batch"], p["length"]
    if kind == "chunk":
        return [Item(0, p["chunk"], p["prefix"])], 1, p["prefix"] + p["chunk"]
    if kind == "decode":
        ctx = _spread(p["batch"], p["context"])
        return [Item(i, 1, c) for i, c in enumerate(ctx)], p["batch"], max(ctx) + 1
    if kind == "dense":
        T = p["tokens"]
        return [Item(0, T, 0)], 1, T
    if kind == "mixed":
        D, L = p["batch"], p["chunk"]
        ctx = _spread(D, p["context"])
        return [Item(i, 1, c) for i, c in enumerate(ctx)] + [Item(D, L, 0)], D + 1, max(max(ctx) + 1, L)
    raise ValueError(kind)


def _spread(batch: int, context: int) -> list[int]:
    """Decode contexts of a batch with mean ``context``, spread evenly over [0.5, 1.5] x context.

    In a serving batch contexts differ, so attention runs padded and masked; timing equal
    contexts would miss that cost.
    """
    if batch == 1:
        return [context]
    lo, hi = context - context // 2, context + context // 2
    ctx = [lo + round(i * (hi - lo) / (batch - 1)) for i in range(batch)]
    ctx[-1] += batch * context - sum(ctx)   # keep sum(ctx) = batch x context exactly
    return ctx


def aggregates(items: list[Item]) -> dict:
    """The step's aggregates as sim/core/costs.py and sim/core/engine.py define them (P, D, sum_l2,
    sum_lc, sum_ctx); a decoder's context is the keys it attends: its cached tokens + 1."""
    dec, pre = split_items(items)
    return {"P": sum(it.n for it in pre), "D": len(dec),
            "sum_l2": sum(it.n * it.n for it in pre), "sum_lc": sum(it.n * it.start for it in pre),
            "sum_ctx": sum(it.start + 1 for it in dec),   # keys attended, as sim/core/engine.py counts
            "chunks": len(pre)}


def _alloc(model: Decoder, slots: int, max_len: int) -> None:
    """Allocate the model's KV cache and fill it with values (a populated cache)."""
    model.alloc_cache(slots, max_len)
    for kc, vc in zip(model.k_cache, model.v_cache):
        kc.normal_(0.0, 1.0)
        vc.normal_(0.0, 1.0)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return "CPU: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU: " + (platform.processor() or platform.machine())


class _Transfers:
    """A paged KV block pool on the device and a host pool, for timing swap-out and swap-in.

    Layout per layer: ``(blocks, 2 [K,V], block_size, kv_heads, head_dim)``, the vLLM layout.
    """

    def __init__(self, shape: Shape, device: torch.device, dtype: torch.dtype, block_size: int,
                 max_blocks: int, seed: int = 0):
        self.device = device
        per = (2, block_size, shape.kv_heads, shape.head_dim)
        pin = device.type == "cuda"
        self.dev = torch.empty((shape.layers, 2 * max_blocks) + per, device=device, dtype=dtype).normal_()
        self.host = torch.empty((shape.layers, max_blocks) + per, dtype=dtype, pin_memory=pin)
        self.stage = torch.empty((shape.layers, max_blocks) + per, dtype=dtype, device=device)
        g = torch.Generator().manual_seed(seed)
        self.perm = torch.randperm(2 * max_blocks, generator=g)   # scattered, as in a busy pool
        self.layers = shape.layers

    def fn(self, blocks: int, method: str, direction: str):
        idx_cpu = self.perm[:blocks].sort().values
        idx = idx_cpu.to(self.device)
        ids = idx_cpu.tolist()
        dev, host, stage, L = self.dev, self.host, self.stage, self.layers
        if method == "per_block_layer" and direction == "d2h":
            def f():
                for l in range(L):
                    for i, b in enumerate(ids):
                        host[l, i].copy_(dev[l, b], non_blocking=True)
        elif method == "per_block_layer":
            def f():
                for l in range(L):
                    for i, b in enumerate(ids):
                        dev[l, b].copy_(host[l, i], non_blocking=True)
        elif direction == "d2h":
            def f():
                torch.index_select(dev, 1, idx, out=stage[:, :blocks])
                host[:, :blocks].copy_(stage[:, :blocks], non_blocking=True)
        else:
            def f():
                stage[:, :blocks].copy_(host[:, :blocks], non_blocking=True)
                dev.index_copy_(1, idx, stage[:, :blocks])
        return f


def measure_rows(shape: Shape, device: str | torch.device, dtype: str, grid: str | dict,
                 cuda_graphs: bool = False, block_size: int = 16, progress: bool | None = True,
                 seed: int = 0) -> list[dict]:
    """Run every cell of ``grid`` and return the measured rows."""
    device = torch.device(device)
    g = dict(GRIDS[grid] if isinstance(grid, str) else grid)
    model = _step_model(shape, device, dtype, g, seed)
    cells = _cells(g)
    from sim.progress import progress_bar

    bar = progress_bar(progress, total=len(cells), desc=f"calibrate {shape.name} {dtype} on {device}", unit="cells",
                       leave=True)
    rows: list[dict] = []
    timing_kw = dict(warmup=g["warmup"], repeats=g["repeats"], min_time_s=g["min_time_s"])
    steps = [(k, p, *_items(k, p)) for k, p in cells if k != "swap"]
    slots = max(s[3] for s in steps)
    max_len = max(s[4] for s in steps)
    if slots * max_len <= g["max_tokens_in_cache"] and not (cuda_graphs and device.type == "cuda"):
        # the whole grid fits one cache: time it round-robin (see timing.time_interleaved)
        _alloc(model, slots, max_len)
        rows += _time_steps_interleaved(model, steps, device, g)
        if bar is not None:
            bar.update(len(steps))
        steps = []
    rows += _time_steps_one_by_one(model, steps, device, g, cuda_graphs, timing_kw, bar)
    # free the step cache before the transfer pools
    model.k_cache = model.v_cache = []
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    swaps = [p for k, p in cells if k == "swap"]
    if swaps:
        rows += _time_swaps(shape, device, dtype, block_size, swaps, seed, timing_kw, bar)
    if bar is not None:
        bar.close()
    return rows


def _step_model(shape: Shape, device: torch.device, dtype: str, g: dict, seed: int) -> Decoder:
    """The model whose steps are timed; on CUDA, checks the weights fit and caps the grid's
    ``max_tokens_in_cache`` (tokens) to what the KV cache may use."""
    if device.type == "cuda":
        check_free_memory(estimate_weight_bytes(shape, dtype), device, what=f"{shape.name} weights")
    model = Decoder(shape, device=str(device), dtype=dtype, slots=1, max_len=16, seed=seed)
    if device.type == "cuda":
        # the KV cache of any cell may use 60% of what the weights left free; larger cells are
        # skipped (activations and CUDA-graph pools need the rest)
        free, _ = torch.cuda.mem_get_info(device)
        cap = int(0.6 * free // shape.kv_bytes_per_token(dtype))
        g["max_tokens_in_cache"] = min(g["max_tokens_in_cache"], cap)
    return model


#: Each decode and mixed cell is timed over this many batches (see :func:`_variants`).
VARIANTS = 8


def _variants(items: list[Item], n: int = VARIANTS, seed: int = 0) -> list[list[Item]]:
    """``n`` batches of the same step: ``items`` and ``n - 1`` others whose decoders' contexts
    are moved between them (same sum, within the cell's shortest and longest context).

    A serving batch never repeats: its contexts change every step, and with them the attention
    tensors' shapes. A cell timed on one batch alone measured low against the serving loop
    (15-35 % on one CPU host; GPU steps of new shapes likewise cost more), so a cell's calls
    cycle through batches with the cell's aggregates (D, sum of contexts, the prefill chunk).
    Cells with fewer than two decoders have one batch.
    """
    dec, rest = split_items(items)
    if len(dec) < 2:
        return [items]
    lo, hi = min(it.start for it in dec), max(it.start for it in dec)
    rng = random.Random(seed)
    out = [items]
    for _ in range(n - 1):
        ctx = [it.start for it in dec]
        for _ in range(len(ctx)):
            i, j = rng.randrange(len(ctx)), rng.randrange(len(ctx))
            d = rng.randint(0, min(ctx[i] - lo, hi - ctx[j]))
            ctx[i] -= d
            ctx[j] += d
        out.append([Item(it.slot, 1, c) for it, c in zip(dec, ctx)] + rest)
    return out


def _cycling(call, items: list[Item]):
    """A no-argument function calling ``call(batch)`` on the next of the cell's batches, and
    how many batches it cycles through."""
    batches = _variants(items)
    it = itertools.cycle(batches)
    return (lambda: call(next(it))), len(batches)


def _eager_step(model: Decoder, items: list[Item]) -> list[int]:
    """One step as the serving loop (calibrate.validate) runs it: an engine prepares its inputs
    every step and reads the sampled tokens back, so planning, the forward pass and the read-back
    are timed together."""
    return model.forward(model.plan(items)).tolist()


def _time_steps_interleaved(model: Decoder, steps: list, device: torch.device, g: dict) -> list[dict]:
    """Time every step cell round-robin in one cache (see timing.time_interleaved); their rows."""
    rows = []
    fns = [_cycling(lambda it: _eager_step(model, it), items)[0] for _, _, items, _, _ in steps]
    # (warm-up: every batch of every cell at least once)
    timings = time_interleaved(fns, device, warmup=max(g["warmup"], VARIANTS), rounds=g["repeats"])
    for (kind, p, items, _, _), t in zip(steps, timings):
        rows.append({"kind": kind, **p, **aggregates(items), "cuda_graph": False,
                     "interleaved": True, **t.as_row()})
    return rows


def _time_steps_one_by_one(model: Decoder, steps: list, device: torch.device, g: dict, cuda_graphs: bool,
                           timing_kw: dict, bar) -> list[dict]:
    """Time each step cell on its own, growing the cache as needed (decodes under CUDA graphs
    when asked); their rows."""
    rows = []
    for kind, p, items, slots, max_len in steps:
        if model.slots < slots or model.max_len < max_len:
            need = (max(slots, model.slots), max(max_len, model.max_len))
            if need[0] * need[1] > g["max_tokens_in_cache"]:
                need = (slots, max_len)
            _alloc(model, *need)
        graphed = cuda_graphs and device.type == "cuda" and kind == "decode"
        if graphed:
            # keys padded to their bucket and masked, as the serving loop's graphs run them
            keys = key_bucket(max(it.start for it in items) + 1, model.max_len)
            step = GraphedStep(model, model.plan(items, dec_len=keys))
            fn, n = _cycling(lambda it: step.run(it).tolist(), items)   # inputs built, loaded, replayed
        else:
            fn, n = _cycling(lambda it: _eager_step(model, it), items)
        # (warm-up: every batch of the cell at least once)
        t = time_call(fn, device, **{**timing_kw, "warmup": max(timing_kw["warmup"], n)})
        rows.append({"kind": kind, **p, **aggregates(items), "cuda_graph": graphed,
                     "interleaved": False, **t.as_row()})
        if graphed:
            del step
        if bar is not None:
            bar.update(1)
    return rows


def _time_swaps(shape: Shape, device: torch.device, dtype: str, block_size: int, swaps: list[dict], seed: int,
                timing_kw: dict, bar) -> list[dict]:
    """Time each swap cell's KV block transfer between device and host pools; their rows."""
    rows = []
    max_blocks = max(p["blocks"] for p in swaps)
    tdtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    if device.type == "cuda":
        blk = shape.kv_bytes_per_token(dtype) * block_size
        check_free_memory(4 * max_blocks * blk, device, what="transfer pools")
    pools = _Transfers(shape, device, tdtype, block_size, max_blocks, seed)
    blk_bytes = shape.kv_bytes_per_token(dtype) * block_size
    for p in swaps:
        t = time_call(pools.fn(**p), device, **timing_kw)
        rows.append({"kind": "swap", **p, "bytes": p["blocks"] * blk_bytes,
                     "host_side": "pinned, non_blocking" if device.type == "cuda"
                     else "host memory (CPU: plain host copy, no device transfer)",
                     **t.as_row()})
        if bar is not None:
            bar.update(1)
    del pools
    return rows


def build_profile(rows: list[dict], shape: Shape, dtype: str, meta: dict,
                  kv_capacity_bytes: float, block_size: int) -> dict:
    """Fit ``rows`` and assemble a profile document."""
    step, report = _fit.fit_step(rows)
    swap, swap_report = _fit.fit_swap(rows, shape.kv_bytes_per_token(dtype) * block_size)
    report["swap"] = swap_report
    meta = dict(meta)
    meta["fit_loo_rel_err_median"] = report.get("loo_rel_err_median")
    meta["fit_loo_rel_err_p90"] = report.get("loo_rel_err_p90")
    return {"schema": SCHEMA, "meta": meta, "model": shape.to_profile_model(dtype),
            "memory": {"kv_capacity_bytes": float(kv_capacity_bytes)}, "step": step,
            "swap": swap, "fit": report, "rows": rows}


def calibrate_profile(device: str, shape: str, dtype: str | None = None, grid: str = "quick",
                      out_path: str | Path | None = None, progress: bool | None = True, *,
                      threads: int = 1, cuda_graphs: bool | None = None, block_size: int = 16,
                      kv_capacity_bytes: float | None = None, seed: int = 0) -> dict:
    """Measure ``shape`` on ``device``, fit, and write the profile JSON to ``out_path``.

    Args:
        device: "cpu" | "cuda" | "cuda:N" | "auto" (cuda when available).
        shape: a calibrate.shapes name, e.g. "tiny", "llama-3-8b", "llama-3-70b-tp4".
        dtype: "fp32" | "bf16" | "fp16"; default fp32 on CPU, bf16 on CUDA.
        grid: "quick" | "full" (see GRIDS).
        out_path: where to write the JSON (None: do not write).
        progress: True a tqdm bar and a closing fit line on stdout; None the bar on a terminal,
            a line every 10 s on stderr elsewhere (sim.progress); False nothing.
        threads: CPU intra-op threads (1: see calibrate.timing).
        cuda_graphs: time decode under CUDA graphs (default: True on CUDA).
        block_size: KV block size in tokens, for transfers and the profile's meta.
        kv_capacity_bytes: KV memory the profile declares. Default on CUDA: 90% of device memory
            minus weights minus 2 GB of activations (vLLM's gpu_memory_utilization); on CPU
            64 MiB (the validation loop's pool, see calibrate.validate).
    Returns:
        the profile document (as written).
    """
    t0 = time.perf_counter()
    dev, dtype = _resolve_device(device, dtype, grid)
    sh = get_shape(shape)
    if dev.type == "cpu":
        threads = configure_cpu(threads)
        cuda_graphs = False
    else:
        threads = torch.get_num_threads()
        cuda_graphs = True if cuda_graphs is None else cuda_graphs
    torch.manual_seed(seed)
    rows = measure_rows(sh, dev, dtype, grid, cuda_graphs=cuda_graphs, block_size=block_size,
                        progress=progress, seed=seed)
    if kv_capacity_bytes is None:
        kv_capacity_bytes = _default_kv_capacity(dev, sh, dtype)
    meta = _profile_meta(dev, sh, dtype, grid, out_path, threads, cuda_graphs, block_size)
    doc = build_profile(rows, sh, dtype, meta, kv_capacity_bytes, block_size)
    doc["meta"]["wall_s"] = round(time.perf_counter() - t0, 2)
    if out_path is not None:
        write_profile(doc, out_path)
    if progress:
        f = doc["fit"]
        print(f"fit: {f['rows']} step rows, LOO relative error median {f['loo_rel_err_median']:.1%}, "
              f"p90 {f['loo_rel_err_p90']:.1%}, max {f['loo_rel_err_max']:.1%}; "
              f"wall {doc['meta']['wall_s']} s" + (f" -> {out_path}" if out_path else ""))
    return doc


def _resolve_device(device: str, dtype: str | None, grid: str) -> tuple[torch.device, str]:
    """The device ("auto" resolved) and dtype (its default), after checking dtype and grid."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("'device' is cuda but torch sees no CUDA device (use --device cpu)")
    dtype = dtype or ("bf16" if dev.type == "cuda" else "fp32")
    if dtype not in ("fp32", "bf16", "fp16"):
        raise ValueError(f"'dtype' must be fp32, bf16 or fp16 (got {dtype!r})")
    if grid not in GRIDS:
        raise ValueError(f"'grid' must be one of {sorted(GRIDS)} (got {grid!r})")
    return dev, dtype


def _default_kv_capacity(dev: torch.device, sh: Shape, dtype: str) -> float:
    """KV memory (bytes) a profile declares when not told: on CUDA 90% of device memory minus
    weights minus 2 GB of activations; on CPU 64 MiB."""
    if dev.type == "cuda":
        total = torch.cuda.get_device_properties(dev).total_memory
        return max(0.0, 0.9 * total - estimate_weight_bytes(sh, dtype) - 2e9)
    return 64 * 2**20


def _profile_meta(dev: torch.device, sh: Shape, dtype: str, grid: str, out_path, threads: int,
                  cuda_graphs: bool | None, block_size: int) -> dict:
    """The profile's ``meta``: what was measured, on what, how and when."""
    return {
        "kind": "measured", "name": Path(out_path).stem if out_path else f"{dev.type}-{sh.name}",
        "device": device_name(dev), "device_type": dev.type, "torch": torch.__version__,
        "cuda": torch.version.cuda if dev.type == "cuda" else None,
        "driver": _cuda_driver() if dev.type == "cuda" else None, "dtype": dtype,
        "threads": threads, "cuda_graphs": bool(cuda_graphs), "shape": sh.name,
        "block_size": block_size, "grid": grid, "grid_spec": GRIDS[grid],
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "clock": ("cuda events" if dev.type == "cuda" else
                  "thread CPU time (time.thread_time)" if timing.CPU_CLOCK == "thread" else "wall time"),
        "swap_note": ("pinned host memory, non_blocking copies" if dev.type == "cuda"
                      else "CPU device: swap rows time a plain host-to-host copy"),
        "base_s_note": "fit: the constant of the token term is reported as base_s",
    }


def _cuda_driver() -> str | None:
    """The NVIDIA driver's version as nvidia-smi reports it (None where it cannot be read)."""
    import subprocess
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def write_profile(doc: dict, path: str | Path) -> Path:
    """Write a profile as JSON after checking that sim.core.costs reads it and it prices a step."""
    from sim.core.costs import profile_from_dict
    path = Path(path)
    cm = profile_from_dict(doc, name=str(path), where=str(path))
    t = cm.step_s(P=128, sum_l2=128 * 128)
    if not (math.isfinite(t) and t > 0):
        raise ValueError(f"{path}: profile prices a 128-token prefill at {t} s")
    from sim.outdir import write_file

    path.parent.mkdir(parents=True, exist_ok=True)
    return write_file(path, jsonout.dumps(doc, indent=1, default=_json_default) + "\n")


def _json_default(o):
    if isinstance(o, tuple):
        return list(o)
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o)}")
