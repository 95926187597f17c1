"""Cost model: how long an engine step and a KV transfer take, read from a profile.

A *profile* (JSON, schema ``priosim.profile/1``) describes one device x model shape x dtype.
The simulator owns this format; ``calibrate`` writes measured and analytic profiles in it.

Step-time model (all terms in seconds; the aggregates describe one engine iteration)::

    t = base_s
      + interp(T; token_knots, token_s)      # piecewise-linear in T = P + D tokens in the step
      + prefill_token_s * P                  # P: prompt (and recompute) tokens in the step
      + [n_prefill > 0] * (prefill_step_s    # a step that runs any prefill chunk (eager, not graphed)
                   + prefill_chunk_s * n_prefill   # per prefill chunk (each attends on its own)
                   + [D > 0] * mixed_step_s)     # prefill and decoders in one step
      + prefill_attn_s  * sum(l_i ** 2)      # l_i: tokens of prefill chunk i
      + chunk_attn_s    * sum(l_i * c_i)     # c_i: tokens already cached before chunk i
      + decode_seq_s    * D                  # D: sequences decoding one token
      + overhead(S, T, A)                    # engine overhead (sim/core/overhead.py): S sequences,
                                             # T = P + D tokens, A prefill admissions in the step
      + decode_ctx_s    * sum(ctx_j)         # ctx_j: context length (tokens in KV) of decoder j
                                             # (times the overhead's KV re-read factor, if any)

With the overhead's ``cpu_overlap`` > 0 its CPU terms (per step, per sequence, per admission) are
left out of the sum above and the step takes ``t + cpu - cpu_overlap * min(t, cpu)``: an overlap
scheduler's CPU work hidden under the GPU's (sim/core/overhead.py).

The three terms of a step with prefill describe an engine that replays decode-only steps from
captured CUDA graphs and runs every step with prefill eagerly (vLLM V0, whose graphs cover
decode batches only; the calibration harness's serving loop): such a step pays a fixed launch
cost (``prefill_step_s``), a cost per prefill chunk (``prefill_chunk_s``: each chunk's attention
is launched on its own) and, when decoders share the step, the decode attention's launches too
(``mixed_step_s``). Measured GPU profiles fit them; analytic profiles leave them 0.

``interp`` is linear between knots and extrapolates the last segment's slope beyond the last
knot (0 below the first knot's value at T=0 when the first knot is 0). A profile without knots
has no such term. The inline ``kind = "linear"`` profile of a scenario maps onto the same model:
``base_s``, ``prefill_token_s``, ``decode_token_s`` (-> decode_seq_s) and ``context_token_s``
(-> decode_ctx_s).

The overhead is the profile's declared preset (key ``overhead`` of the profile document; none
when absent) unless the scenario's ``engine.overhead`` says otherwise; with ``none`` the
arithmetic is exactly the profile's alone.

KV transfers (swap): moving ``n`` blocks one way costs ``swap_latency_s + n * swap_block_s``
where ``swap_block_s`` is either given or derived as ``block_bytes / swap_bytes_per_s``.

Time is returned in integer nanoseconds: the engine keeps time as integers so that a
fast-forwarded run of k decode steps and k single steps give identical sums (exact fast-forward).
All step-time evaluation goes through :meth:`CostModel.step_ns`, so the single-step and the
fast-forward paths perform the same floating-point operations.
"""
from __future__ import annotations

import hashlib
from bisect import bisect_right
import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final

from plumbing.documents import DocumentError, loads_json, read_text, short
from plumbing.numbers import in_range, is_integer, is_number
from plumbing.suggest import did_you_mean
from sim.core.overhead import MAX_TERM_S, NONE as NO_OVERHEAD, Overhead, OverheadError, resolve_overhead
from sim.core.plan import StepShape


SCHEMA = "priosim.profile/1"
# (Final: the compiled build reads them as constants, not from the module's dict at every use)
NS: Final = 1_000_000_000  # nanoseconds per second: every engine time is an integer ns
# "no such time", in ns (73 years): below 2**62, so that the compiled build holds it, as every
# time, in a machine word (mypyc's ints are tagged words up to 2**62 - 1, objects beyond)
NEVER: Final = 2**61

#: Where shipped profiles live (by name), beside this cost model that reads them: analytic
#: rooflines and profiles measured by ``calibrate``, which writes this format.
#: (Located through ``sim/__init__``: a module compiled by mypyc has no ``__file__``.)
_CORE_DIR = Path(sys.modules["sim"].__file__ or ".").resolve().parent / "core"
PROFILE_DIRS = [_CORE_DIR / "profiles"]
DEFAULT_PROFILE = "h200-llama-3-8b"

#: Bytes per element of each KV dtype name a profile may declare (calibrate reads it from here).
DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2,
               "fp8": 1, "int8": 1}


class ProfileError(ValueError):
    """A profile is missing, malformed or inconsistent; the message names file and key."""


@dataclass(frozen=True)
class ModelShape:
    """A decoder's shape; only what costs and memory need.

    kv_bytes_per_token = 2 (K and V) x layers x kv_heads x head_dim x dtype bytes, unless the
    profile gives its own (``model.kv_bytes_per_token``: a derived profile of an MLA or
    sliding-window model, or one whose KV format differs from its activations').
    """

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    hidden: int = 0
    heads: int = 0
    ffn: int = 0
    vocab: int = 0
    params: float = 0.0
    kv_bytes: int = 0  # the profile's own KV bytes per token (0: the formula)

    @property
    def kv_bytes_per_token(self) -> int:
        if self.kv_bytes:
            return self.kv_bytes
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


@dataclass(frozen=True)
class StepCoefficients:
    """Coefficients of the step-time model, in seconds per unit (see module docstring)."""

    base_s: float = 0.0
    token_knots: tuple[float, ...] = ()
    token_s: tuple[float, ...] = ()
    prefill_token_s: float = 0.0
    prefill_step_s: float = 0.0
    prefill_chunk_s: float = 0.0
    mixed_step_s: float = 0.0
    prefill_attn_s: float = 0.0
    chunk_attn_s: float = 0.0
    decode_seq_s: float = 0.0
    decode_ctx_s: float = 0.0


class MeasuredTables:
    """Measured step times of pure batches, interpolated bilinearly (pure batches interpolate in
    the measured tables; every other step shape uses the fitted model).

    * decode: ``batch`` sequences each attending ``context`` cached tokens (rows of kind decode);
      a step with no prefill, D decoders and sum_ctx matches batch = D, context = sum_ctx/D - 1;
    * prefill: ``batch`` fresh prompts of ``length`` tokens each (rows of kind prefill); a step
      with no decoders and no cached prefix matches length = sum_l2 / P, batch = P / length.
    Only steps inside a table's measured ranges use it; the grid must be complete.
    """

    def __init__(self, rows: list[dict]) -> None:
        self.decode = self._grid(rows, "decode", "context")
        self.prefill = self._grid(rows, "prefill", "length")

    @staticmethod
    def _grid(rows, kind, col):
        pts = {(float(r["batch"]), float(r[col])): float(r["time_s"]) for r in rows
               if r.get("kind") == kind and col in r and "batch" in r and "time_s" in r}
        xs = sorted({b for b, _ in pts})
        ys = sorted({c for _, c in pts})
        if len(xs) < 2 or len(ys) < 2 or len(pts) != len(xs) * len(ys):
            return None
        return xs, ys, pts

    @staticmethod
    def _bilinear(grid, x: float, y: float) -> float | None:
        xs, ys, pts = grid
        if not (xs[0] <= x <= xs[-1] and ys[0] <= y <= ys[-1]):
            return None
        i = min(bisect_right(xs, x), len(xs) - 1)
        j = min(bisect_right(ys, y), len(ys) - 1)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[j - 1], ys[j]
        fx = (x - x0) / (x1 - x0)
        fy = (y - y0) / (y1 - y0)
        top = pts[(x0, y0)] + (pts[(x1, y0)] - pts[(x0, y0)]) * fx
        bot = pts[(x0, y1)] + (pts[(x1, y1)] - pts[(x0, y1)]) * fx
        return top + (bot - top) * fy

    def lookup(self, P, D, sum_l2, sum_lc, sum_ctx) -> float | None:
        if P == 0 and D > 0 and self.decode is not None:
            return self._bilinear(self.decode, D, sum_ctx / D - 1)
        if D == 0 and P > 0 and sum_lc == 0 and sum_l2 > 0 and self.prefill is not None:
            length = sum_l2 / P
            return self._bilinear(self.prefill, P / length, length)
        return None


#: The step coefficients :meth:`CostModel.scaled` multiplies (all but the knots, which are tokens).
_SCALED_STEP = ("base_s", "prefill_token_s", "prefill_step_s", "prefill_chunk_s", "mixed_step_s",
                "prefill_attn_s", "chunk_attn_s", "decode_seq_s", "decode_ctx_s")
#: The overhead terms that are times (the KV re-read, multi-step count and overlap are not).
_SCALED_OVERHEAD = ("step_s", "seq_s", "sample_s", "admit_s", "allreduce_latency_s", "frontend_s")


@dataclass
class CostModel:
    """Prices engine steps and KV transfers for one profile.

    Attributes:
        name: profile name or path.
        meta: the profile's provenance (kind: analytic | measured | linear, device, ...).
        shape: model shape (None for a bare linear profile: then swap costs need swap_block_s).
        step: step-time coefficients.
        kv_capacity_bytes: bytes of device memory available for KV cache (0 = unknown).
        swap_latency_s, swap_block_s, swap_bytes_per_s: transfer model (see module docstring).
        digest: sha256 of the profile's canonical JSON, for manifests.
    """

    name: str
    meta: dict
    shape: ModelShape | None
    step: StepCoefficients
    kv_capacity_bytes: float = 0.0
    swap_latency_s: float = 0.0
    swap_block_s: float | None = None
    swap_bytes_per_s: float | None = None
    digest: str = ""
    raw: dict = field(default_factory=dict, repr=False)
    tables: MeasuredTables | None = None
    #: engine overhead (sim/core/overhead.py); the coefficients below are derived from it
    overhead: Overhead = field(default=NO_OVERHEAD)
    #: (fixed, per sequence, per token, per admission) seconds, or None when there is no overhead
    _ov: tuple[float, float, float, float] | None = field(default=None, init=False, repr=False, compare=False)
    #: the same for a step without prefill (differs only under multi-step scheduling)
    _ov_dec: tuple[float, float, float, float] | None = field(default=None, init=False, repr=False,
                                                             compare=False)
    #: seconds per context token per decoder: the profile's, times the overhead's KV re-read factor
    _ctx_s: float = field(default=0.0, init=False, repr=False, compare=False)
    #: does a step with prefill pay the eager-step terms? (False: none set, the arithmetic of
    #: every other profile is untouched)
    _eager: bool = field(default=False, init=False, repr=False, compare=False)
    #: (fixed, per sequence, per admission) seconds of a step's CPU work priced apart, for a step
    #: with prefill and one without, when the overhead hides it under the GPU's (cpu_overlap);
    #: None otherwise (the CPU terms are then in _ov and simply added)
    _cpu: tuple[float, float, float] | None = field(default=None, init=False, repr=False, compare=False)
    _cpu_dec: tuple[float, float, float] | None = field(default=None, init=False, repr=False, compare=False)
    #: decode_line's memo: batch size -> (a, b)
    _decode_lines: dict[int, tuple[float, float]] = field(default_factory=dict, init=False, repr=False,
                                                          compare=False)

    def __post_init__(self) -> None:
        o = self.overhead
        sh = self.shape
        f = o.ctx_factor(sh.heads, sh.kv_heads) if sh is not None else 1.0
        # exactly the profile's coefficient when there is no re-read (byte-identical pricing)
        self._ctx_s = self.step.decode_ctx_s if f == 1.0 else self.step.decode_ctx_s * f
        c = self.step
        self._eager = bool(c.prefill_step_s or c.prefill_chunk_s or c.mixed_step_s)
        self._cpu = self._cpu_dec = None  # (set below when the overhead hides CPU work)
        if o.is_none:
            self._ov = self._ov_dec = None
            return
        tp = int(self.meta.get("tp", 1) or 1)
        args = (0, 0, 0, 0, 1) if sh is None else (sh.vocab * tp, sh.layers, sh.hidden, sh.dtype_bytes, tp)
        if o.hides_cpu:  # (the CPU terms priced apart and overlapped: step_ns)
            self._cpu, self._cpu_dec = o.cpu_coefficients()
            o = o.gpu_side()
        self._ov = o.coefficients(*args)
        self._ov_dec = o.decode_coefficients(*args)

    def scaled(self, factor: float) -> "CostModel":
        """This profile with every time it prices multiplied by ``factor`` (the uncertainty
        design's scale, docs/uncertainty.md): each step coefficient, the measured tables' times and
        the overhead's time terms (front end included; its all-reduce bandwidth divided), so the
        single-step, fast-forward and table paths stay consistent with one another. KV swaps are
        not scaled (a PCIe transfer no fidelity row measures). ``self`` itself for 1.0."""
        if factor == 1.0:
            return self
        c = self.step
        step = replace(c, **{k: getattr(c, k) * factor for k in _SCALED_STEP},
                       token_s=tuple(v * factor for v in c.token_s))
        o = self.overhead
        ov = replace(o, **{k: getattr(o, k) * factor for k in _SCALED_OVERHEAD},
                     allreduce_bytes_per_s=o.allreduce_bytes_per_s / factor, meta={**o.meta, "cost_scale": factor})
        tables = None
        if self.tables is not None:
            tables = MeasuredTables([{**r, "time_s": float(r["time_s"]) * factor}
                                     if isinstance(r, dict) and "time_s" in r else r for r in self.raw["rows"]])
        return replace(self, step=step, overhead=ov, tables=tables,
                       meta={**self.meta, "cost_scale": factor})

    def with_overhead(self, overhead: Overhead) -> "CostModel":
        """This profile priced with another engine overhead (a new CostModel)."""
        return replace(self, overhead=overhead)  # (its derived fields are derived anew)

    @property
    def overhead_on(self) -> bool:
        """Does this model add engine overhead to step times?"""
        return self._ov is not None

    def overhead_s(self, P: int, D: int, n_prefill: int = 0, n_admit: int = 0) -> float:
        """Engine overhead of a step, seconds (0.0 with no overhead): one fixed expression, so
        every caller gets bit-identical results for the same shape."""
        ov = self._ov if P else self._ov_dec
        if ov is None:
            return 0.0
        return ov[0] + ov[1] * (D + n_prefill) + ov[2] * (P + D) + ov[3] * n_admit

    # ---- memory -------------------------------------------------------------------------
    def block_bytes(self, block_size: int) -> int:
        if self.shape is None:
            return 0
        return self.shape.kv_bytes_per_token * block_size

    def kv_blocks(self, block_size: int) -> int:
        """KV blocks that fit in the profile's KV memory (0 when the profile does not say)."""
        bb = self.block_bytes(block_size)
        if bb <= 0 or self.kv_capacity_bytes <= 0:
            return 0
        return int(self.kv_capacity_bytes // bb)

    # ---- time ---------------------------------------------------------------------------
    def step_ns(self, P: int, D: int, sum_l2, sum_lc, sum_ctx, n_prefill: int = 0, n_admit: int = 0) -> int:
        """One step's duration in integer ns (at least 1, so that time always advances).

        ``P``: prefill tokens, ``D``: decoders (ints: counts, which the compiled build multiplies
        natively); ``sum_l2``, ``sum_lc``, ``sum_ctx``: the shape's sums (an estimate may pass
        floats); ``n_prefill``: prefill chunks in the step; ``n_admit``: requests whose prefill starts in
        it (only the engine overhead reads them). Plain Python arithmetic in a fixed order: every
        caller — a single step, each step of a fast-forwarded run, an estimate — gets
        bit-identical results for the same shape."""
        if self.tables is not None:
            m = self.tables.lookup(P, D, sum_l2, sum_lc, sum_ctx)
            if m is not None:
                if self._ov is not None:
                    m += self.overhead_s(P, D, n_prefill, n_admit)
                if self._cpu is not None:
                    m = self._with_cpu(m, 0.0, P, D, n_prefill, n_admit)
                ns = round(m * NS)
                return ns if ns > 1 else 1
        c = self.step
        t = c.base_s
        if c.token_knots:
            t += self._tokens_s(P + D)
        t += c.prefill_token_s * P
        if n_prefill and self._eager:   # (speculative decoders' draft tokens count in P, not here)
            t += c.prefill_step_s + c.prefill_chunk_s * n_prefill
            if D:
                t += c.mixed_step_s
        t += c.prefill_attn_s * sum_l2
        t += c.chunk_attn_s * sum_lc
        t += c.decode_seq_s * D
        if self._ov is not None:
            t += self.overhead_s(P, D, n_prefill, n_admit)
        if self._cpu is not None:
            t = self._with_cpu(t, self._ctx_s * sum_ctx, P, D, n_prefill, n_admit)
        else:
            t += self._ctx_s * sum_ctx
        ns = round(t * NS)
        return ns if ns > 1 else 1

    def _cpu_s(self, P: int, D: int, n_prefill: int, n_admit: int) -> float:
        """A step's CPU work priced apart (the overhead hides it under the GPU's), seconds."""
        c = self._cpu if P else self._cpu_dec
        assert c is not None  # (both are set together, for a model that hides CPU work)
        return c[0] + c[1] * (D + n_prefill) + c[2] * n_admit

    def _with_cpu(self, fixed: float, ctx: float, P: int, D: int, n_prefill: int, n_admit: int) -> float:
        """A step of GPU time ``fixed + ctx`` s (``ctx``: the context term) with its CPU work
        partly hidden under it: ``gpu + cpu - cpu_overlap * min(gpu, cpu)`` (the overhead's
        ``cpu_overlap``). Where the GPU's is the longer, summed as ``(fixed + (1 - f) cpu) + ctx``,
        the order of :meth:`decode_line`'s ``a + b * ctx``, so that the line prices it bit for bit."""
        cpu = self._cpu_s(P, D, n_prefill, n_admit)
        f = self.overhead.cpu_overlap
        gpu = fixed + ctx
        if gpu >= cpu:
            return fixed + (cpu - f * cpu) + ctx
        return gpu + cpu - f * gpu

    def price(self, shape: StepShape) -> int:
        """Duration of a step of this :class:`~sim.core.plan.StepShape`, integer ns
        (:meth:`step_ns` of its fields)."""
        return self.step_ns(shape.prefill_tokens, shape.decoders, shape.sum_l2, shape.sum_lc, shape.sum_ctx,
                            shape.prefill_chunks, shape.admitted)

    def decode_line(self, D: int) -> tuple[float, float] | None:
        """For pure decode steps of D sequences: ``(a, b)`` with ``step_ns(0, D, 0, 0, ctx)`` ==
        ``round((a + b * ctx) * NS)`` bit for bit for every context ``ctx >= 0`` (the zero prefill
        terms add exactly nothing), so fast-forwarded runs price a step with one multiply-add.
        None when measured tables price decode steps, when the overhead hides CPU work under the
        GPU's (``cpu_overlap``) and D's CPU time is longer than its GPU time at no context (a
        maximum of two lines there; from no context on the GPU's is the longer, the CPU's part
        that is not hidden a constant: a line), or when a step could round below 1 ns
        (``step_ns`` raises those to 1; a line with ``b >= 0`` and ``a * NS > 0.5`` never does)."""
        cache = self._decode_lines
        line = cache.get(D)
        if line is not None:  # (first: a fast-forwarded run asks again at every member's last token)
            return line
        if self.tables is not None and self.tables.decode is not None:
            return None  # (and the memo stays empty)
        c = self.step
        t = c.base_s
        if c.token_knots:
            t += self._tokens_s(D)
        t += c.decode_seq_s * D
        if self._ov is not None:
            t += self.overhead_s(0, D)
        if self._cpu is not None:  # (as _with_cpu sums it where the GPU's is the longer)
            cpu = self._cpu_s(0, D, 0, 0)
            if t < cpu:
                return None  # (a maximum: priced step by step, and the memo stays empty)
            t = t + (cpu - self.overhead.cpu_overlap * cpu)
        if self._ctx_s < 0 or t * NS <= 0.5:
            return None  # (a degenerate profile: priced by step_ns, and the memo stays empty)
        line = cache[D] = (t, self._ctx_s)
        return line

    def _tokens_s(self, T: float) -> float:
        """The piecewise-linear term: linear between knots, the last slope beyond the last knot,
        the first value below the first knot."""
        xs, ys = self.step.token_knots, self.step.token_s
        if T <= xs[0]:
            return ys[0]
        n = len(xs)
        if T >= xs[-1]:
            if n < 2:
                return ys[-1]
            return ys[-1] + (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) * (T - xs[-1])
        i = bisect_right(xs, T) - 1
        return ys[i] + (ys[i + 1] - ys[i]) * (T - xs[i]) / (xs[i + 1] - xs[i])

    def step_s(self, P=0, D=0, sum_l2=0, sum_lc=0, sum_ctx=0) -> float:
        """One step's duration in seconds (convenience for reports and admission estimates; a
        step with prefill counts as one chunk for the per-chunk term of an eager profile)."""
        if P and self._eager:
            return self.step_ns(P, D, sum_l2, sum_lc, sum_ctx, 1) / NS
        return self.step_ns(P, D, sum_l2, sum_lc, sum_ctx) / NS

    def prefill_s(self, tokens: int, cached: int = 0) -> float:
        """Seconds to prefill ``tokens`` new tokens on top of ``cached`` as one chunk, alone."""
        return self.step_s(P=tokens, sum_l2=tokens * tokens, sum_lc=tokens * cached)

    def swap_ns(self, blocks: int, block_size: int) -> int:
        """Integer ns to move ``blocks`` KV blocks one way between device and host."""
        if blocks <= 0:
            return 0
        per_block = self.swap_block_s
        if per_block is None:
            if not self.swap_bytes_per_s or self.shape is None:
                raise ProfileError(
                    f"profile '{self.name}': swap needs 'swap.block_s' or 'swap.bytes_per_s' "
                    "with a model shape"
                )
            per_block = self.block_bytes(block_size) / self.swap_bytes_per_s
        return int(round((self.swap_latency_s + blocks * per_block) * NS))


# ---- loading ------------------------------------------------------------------------------

def _num(d: dict, key: str, where: str, default: float | None = None, minimum: float = 0.0):
    """``d[key]``: a finite number >= ``minimum``, and at most MAX_TERM_S when it is a time (``*_s``)."""
    if key not in d:
        if default is None:
            raise ProfileError(f"{where}: missing key '{key}' (expected a number >= {minimum})")
        return default
    v = d[key]
    top = MAX_TERM_S if key.endswith("_s") and not key.endswith("_per_s") else None  # (rates are not times)
    if not in_range(v, ge=minimum, le=top):
        bound = f" and <= {MAX_TERM_S:g} s" if top else ""
        raise ProfileError(f"{where}.{key}: expected a finite number >= {minimum}{bound} (got {v!r})")
    return float(v)


def linear_profile(spec: dict, where: str = "engine.profile") -> CostModel:
    """The inline ``{kind = "linear", ...}`` profile of a scenario."""
    allowed = {"kind", "base_s", "prefill_token_s", "decode_token_s", "context_token_s",
               "swap_block_s", "kv_bytes_per_token"}
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise ProfileError(f"{where}: unknown key '{unknown[0]}' (expected one of {sorted(allowed)})")
    # every step term is required (0 is a value to write, not one to get by a forgotten key)
    step = StepCoefficients(
        base_s=_num(spec, "base_s", where),
        prefill_token_s=_num(spec, "prefill_token_s", where),
        decode_seq_s=_num(spec, "decode_token_s", where),
        decode_ctx_s=_num(spec, "context_token_s", where),
    )
    canon = json.dumps(spec, sort_keys=True)
    return CostModel(
        name="inline-linear", meta={"kind": "linear", "source": "scenario inline table"},
        shape=None, step=step, swap_block_s=_num(spec, "swap_block_s", where, 0.0),
        digest=hashlib.sha256(canon.encode()).hexdigest(), raw=dict(spec),
    )


def _terms(spec: dict, key: str, where: str) -> tuple[float, ...]:
    """A list of finite numbers >= 0 (a negative step time would be clamped to 1 ns at every
    step without a word; NaN would stop the run midway)."""
    raw = spec.get(key, ())
    if not isinstance(raw, (list, tuple)):
        raise ProfileError(f"{where}.{key}: expected a list of finite numbers >= 0 (got {raw!r})")
    for i, v in enumerate(raw):
        if not is_number(v) or v < 0 or (key != "token_knots" and v > MAX_TERM_S):
            bound = "" if key == "token_knots" else f" and <= {MAX_TERM_S:g} s"
            raise ProfileError(f"{where}.{key}[{i}]: expected a finite number >= 0{bound} (got {v!r})")
    return tuple(float(x) for x in raw)


def _int(m: dict, key: str, where: str, minimum: int, default: int | None = None) -> int:
    """``m[key]``: an integer (3 or 3.0) >= ``minimum``; ``default`` when absent (None: required)."""
    if key not in m and default is not None:
        return default
    if key not in m:
        raise ProfileError(f"{where}: missing key '{key}' (expected layers, kv_heads, head_dim)")
    v = m[key]
    if not (is_integer(v, integral_floats=True) and v >= minimum):
        raise ProfileError(f"{where}.{key}: expected an integer >= {minimum} (got {v!r})")
    return int(v)


def model_shape(m: dict, meta: dict, where: str) -> ModelShape:
    """The profile's ``model`` object: whole numbers of layers, heads, ... (a negative or NaN
    size would price every step and size the KV pool wrongly, or stop the run midway)."""
    if m.get("dtype_bytes"):
        dtype_bytes = _int(m, "dtype_bytes", where, 1)
    else:
        dtype = str(meta.get("dtype", "bf16"))
        if dtype not in DTYPE_BYTES:
            raise ProfileError(f"{where[:-len('.model')]}.meta.dtype: unknown dtype {dtype!r} (expected one of "
                               f"{', '.join(DTYPE_BYTES)}, or model.dtype_bytes)")
        dtype_bytes = DTYPE_BYTES[dtype]
    params = m.get("params", 0.0)
    if not in_range(params, ge=0):
        raise ProfileError(f"{where}.params: expected a finite number >= 0 (got {params!r})")
    return ModelShape(
        name=str(m.get("name", "")), layers=_int(m, "layers", where, 1), kv_heads=_int(m, "kv_heads", where, 1),
        head_dim=_int(m, "head_dim", where, 1), dtype_bytes=dtype_bytes, hidden=_int(m, "hidden", where, 0, 0),
        heads=_int(m, "heads", where, 0, 0), ffn=_int(m, "ffn", where, 0, 0), vocab=_int(m, "vocab", where, 0, 0),
        params=float(params), kv_bytes=_int(m, "kv_bytes_per_token", where, 1, 0),
    )


#: The measured tables' columns (:class:`MeasuredTables`) and the least value each may take.
_ROW_MINIMUM = {"batch": 1, "context": 0, "length": 1, "time_s": 0}


def _check_rows(rows, where: str) -> None:
    """A measured profile's ``rows``: a list of objects whose table columns (batch, context,
    length, time_s of the decode and prefill rows) are finite numbers at least their minimum."""
    if rows is None:
        return
    if not isinstance(rows, list):
        raise ProfileError(f"{where}: expected a list of row objects (got {short(rows)})")
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise ProfileError(f"{where}[{i}]: expected a row object (got {short(r)})")
        if r.get("kind") not in ("decode", "prefill"):
            continue
        for key, low in _ROW_MINIMUM.items():
            if key in r and not in_range(r[key], ge=low):
                raise ProfileError(f"{where}[{i}].{key}: expected a finite number >= {low} (got {r[key]!r})")


def profile_from_dict(data: dict, name: str, where: str) -> CostModel:
    """Build a CostModel from a parsed profile JSON document."""
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: expected a JSON object")
    if data.get("kind") == "linear" and "schema" not in data:
        return linear_profile(data, where)
    if data.get("schema") != SCHEMA:
        raise ProfileError(f"{where}: key 'schema' must be '{SCHEMA}' (got {data.get('schema')!r})")
    for key in ("meta", "step"):
        if not isinstance(data.get(key), dict):
            raise ProfileError(f"{where}: missing object '{key}'")
    shape = model_shape(data["model"], data["meta"], f"{where}.model") if isinstance(data.get("model"), dict) else None
    tp = data["meta"].get("tp", 1)
    if tp is not None and not (is_integer(tp, integral_floats=True) and tp >= 0):  # (0: unset, as 1)
        raise ProfileError(f"{where}.meta.tp: expected an integer >= 1 (got {tp!r})")
    if data["meta"].get("kind") == "measured":
        _check_rows(data.get("rows"), f"{where}.rows")
    s = data["step"]
    sw = f"{where}.step"
    knots = _terms(s, "token_knots", sw)
    vals = _terms(s, "token_s", sw)
    if len(knots) != len(vals):
        raise ProfileError(f"{sw}: token_knots and token_s must have the same length "
                           f"(got {len(knots)} and {len(vals)})")
    if any(b <= a for a, b in zip(knots, knots[1:])):
        raise ProfileError(f"{sw}.token_knots: must be strictly increasing (got {list(knots)})")
    step = StepCoefficients(
        base_s=_num(s, "base_s", sw, 0.0), token_knots=knots, token_s=vals,
        prefill_token_s=_num(s, "prefill_token_s", sw, 0.0),
        prefill_step_s=_num(s, "prefill_step_s", sw, 0.0),
        prefill_chunk_s=_num(s, "prefill_chunk_s", sw, 0.0),
        mixed_step_s=_num(s, "mixed_step_s", sw, 0.0),
        prefill_attn_s=_num(s, "prefill_attn_s", sw, 0.0),
        chunk_attn_s=_num(s, "chunk_attn_s", sw, 0.0),
        decode_seq_s=_num(s, "decode_seq_s", sw, 0.0),
        decode_ctx_s=_num(s, "decode_ctx_s", sw, 0.0),
    )
    mem = data.get("memory", {}) or {}
    swap = data.get("swap", {}) or {}
    canon = json.dumps(data, sort_keys=True)
    try:
        overhead = resolve_overhead(data.get("overhead"), f"{where}.overhead")
    except OverheadError as exc:
        raise ProfileError(str(exc)) from None
    return CostModel(
        name=name, meta=dict(data["meta"]), shape=shape, step=step,
        kv_capacity_bytes=_num(mem, "kv_capacity_bytes", f"{where}.memory", 0.0),
        swap_latency_s=_num(swap, "latency_s", f"{where}.swap", 0.0),
        swap_block_s=_num(swap, "block_s", f"{where}.swap") if "block_s" in swap else None,
        swap_bytes_per_s=_num(swap, "bytes_per_s", f"{where}.swap") if "bytes_per_s" in swap else None,
        digest=hashlib.sha256(canon.encode()).hexdigest(), raw=data,
        tables=MeasuredTables(data["rows"]) if data["meta"].get("kind") == "measured" and data.get("rows") else None,
        overhead=overhead,
    )


def find_profile(name: str) -> Path | None:
    """Path of a shipped profile by name, or None."""
    for d in PROFILE_DIRS:
        p = d / f"{name}.json"
        if p.is_file():
            return p
    return None


def list_profiles() -> list[tuple[str, Path]]:
    out = []
    for d in PROFILE_DIRS:
        if d.is_dir():
            out += [(p.stem, p) for p in sorted(d.glob("*.json"))]
    return out


def load_profile(spec: str | dict | Path | None, base_dir: Path | None = None,
                 where: str = "engine.profile", overhead=None, host_cpu: float = 1.0,
                 entrypoint: str = "server", scale: float = 1.0) -> CostModel:
    """Resolve a profile from a shipped name, a file path or an inline linear table, priced
    with ``overhead`` (a preset name or a table of terms, see sim/core/overhead.py; None: the
    profile's own declared preset, none when it declares none) on a host ``host_cpu`` times as
    slow as the presets' (its CPU terms scaled; 1.0: the very same pricing), behind an API
    server unless ``entrypoint`` is ``"offline"`` (vLLM's ``LLM`` class: no front-end terms),
    every time then multiplied by ``scale`` (:meth:`CostModel.scaled`; 1.0: the very same pricing)."""
    cm = _load_profile(spec, base_dir, where)
    if overhead is not None:
        try:
            cm = cm.with_overhead(resolve_overhead(overhead))
        except OverheadError as exc:
            raise ProfileError(str(exc)) from None
    if host_cpu != 1.0:
        cm = cm.with_overhead(cm.overhead.on_host(host_cpu))
    if entrypoint == "offline" and cm.overhead.without_frontend() is not cm.overhead:
        cm = cm.with_overhead(cm.overhead.without_frontend())
    return cm.scaled(scale)  # (``scale``: every priced time, see CostModel.scaled; 1.0: cm itself)


def _load_profile(spec, base_dir, where) -> CostModel:
    if spec is None:
        spec = DEFAULT_PROFILE
    if isinstance(spec, dict):
        if spec.get("schema") == SCHEMA:  # a whole profile document: one derived from engine.model
            meta = spec.get("meta")
            name = meta.get("name", "inline") if isinstance(meta, dict) else "inline"
            return profile_from_dict(spec, name=str(name), where=where)
        kind = spec.get("kind")
        if kind != "linear":
            raise ProfileError(f"{where}.kind: expected 'linear' for an inline profile (got {kind!r})")
        return linear_profile(spec, where)
    path = find_profile(str(spec)) if not str(spec).endswith(".json") else None
    if path is None:
        p = Path(spec)
        if not p.is_absolute() and base_dir is not None and not p.exists():
            p = base_dir / p
        if not p.is_file():
            names = [n for n, _ in list_profiles()]
            raise ProfileError(f"{where}: no profile named or at '{spec}' (expected a shipped name: "
                               f"{', '.join(names)}; or a path to a .json file){did_you_mean(spec, names)}")
        path = p
    try:
        data = loads_json(read_text(path))
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{path}: not valid JSON at line {exc.lineno}: {exc.msg}") from None
    except DocumentError as exc:
        raise ProfileError(f"{path}: {exc}") from None
    return profile_from_dict(data, name=str(spec), where=str(path))
