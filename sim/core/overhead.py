"""Engine overhead: what a real serving engine spends per step besides the model's forward pass.

A profile prices the GPU work of a step (weights, attention, KV reads). A real engine adds CPU
and communication time that the roofline does not see: the scheduler and input preparation,
per-sequence bookkeeping (block tables, detokenisation, output objects), sampling over the
vocabulary, admitting a request, and in tensor parallelism the all-reduces' small-message
latency. Each term is a function of step aggregates the engine already keeps, so a step's price
stays O(1) however large the batch (the lazily-advanced decode cohort keeps working) and stays
inside the one integer-nanosecond step function (fast-forward stays exact)::

    overhead = step_s                                    # per step (CPU scheduler, launches)
             + (seq_s + sample_s * vocab) * S            # S = D + prefill chunks: sequences in the step
             + admit_s * A                               # A: requests whose prefill starts in the step
             + [tp > 1] * 2 * layers * allreduce_latency_s
             + [tp > 1] * T * 2 * layers * ar_bytes / allreduce_bytes_per_s   # T = P + D tokens

and, outside the step function, the API server in front of the engine (HTTP handling, chat
template, tokenisation, hand-off to the engine process, detokenising and streaming back), which
overlaps with GPU work rather than occupying it, so it never adds to a step:

* ``frontend_s``: its latency, from a request's arrival until the engine sees it at no load; it
  delays admission and adds to TTFT and end-to-end time (a per-request path latency: the
  streamed chunks' way back is counted in it too, once, which is all a TTFT or an end-to-end
  time sees of it; inter-token gaps do not change).
* ``frontend_busy_s``: its throughput limit. vLLM's API server is one asyncio process, so each
  request's front-end CPU work is done one request after another: a single FIFO server of
  ``frontend_busy_s`` per request ahead of the engine. Request i starts service at
  ``s_i = max(a_i, s_(i-1) + frontend_busy_s)`` (Lindley's recursion on arrival times) and the
  engine sees it at ``s_i + frontend_s``: under a burst requests queue at the front end; with
  requests further apart than ``frontend_busy_s`` nothing changes (0, the default: no limit).

Neither applies to an engine run without an API server (``engine.entrypoint = "offline"``,
vLLM's ``LLM`` class: :meth:`Overhead.without_frontend`).

The CPU-side terms (``step_s``, ``seq_s``, ``admit_s`` and the front end's two) depend on the
host CPU the engine runs on as much as on the engine: a scenario's ``engine.host_cpu`` (default 1.0, the
hosts the presets were fitted on) multiplies them, > 1 for a slower host (:meth:`Overhead.on_host`;
docs/fidelity.md says how to estimate it from a run).

Two terms change how the profile's own GPU work is priced rather than adding to it, for engine
eras whose kernels or scheduler differ from what the roofline assumes:

* ``kv_reread`` (a fraction, 0..1): decode attention that reads the KV cache once per *query*
  head instead of once per KV head. A grouped-query model has ``heads / kv_heads`` query heads
  per KV head; vLLM's own paged-attention decode kernel (vLLM up to 0.4, before decode moved to
  FlashAttention) runs one thread block per query head, so each KV head's cache is read that many
  times, the repeats partly served from L2. The profile's per-context-token decode cost is
  multiplied by ``1 + kv_reread * (heads / kv_heads - 1)``: 0 reads the KV cache once (today's
  kernels), 1 reads it once per query head.
* ``scheduler_steps`` (an integer >= 1): multi-step scheduling (vLLM 0.6 ``--num-scheduler-steps
  N``): the scheduler and input preparation run once and the model then runs N decode steps, so
  ``step_s`` of a step without prefill is paid once per N steps (``/ N``). ``seq_s`` stays per
  step: the engine still takes every sampled token of every sequence through its output
  processing (append, incremental detokenisation, stop checks: vLLM 0.6's
  ``MultiStepOutputProcessor`` walks the window's N tokens one by one), which is most of V0's
  per-sequence work; the per-sequence part of the scheduler call, also amortised, is the smaller
  share the rows cannot tell apart. Sampling and all-reduces are GPU work and stay per step; a
  step with prefill is a single step and pays in full. 1 (the default) is ordinary step-by-step
  scheduling.
* ``overlap_schedule`` (0 or 1): the scheduler forms the next batch while the GPU runs the
  current one (SGLang's overlap scheduler, on by default since SGLang 0.4; TensorRT-LLM's too).
  A request that reaches the engine after the running step started cannot join the batch already
  formed for the next step: it waits one step more (a TTFT cost). Not a step price: the replica's
  step loop (sim/core/loop.py) applies it. 0 (the default): the batch is formed at each step
  boundary.
* ``cpu_overlap`` (a fraction, 0..1): how much of a step's host-CPU work (``step_s``, ``seq_s``
  and ``admit_s``, after ``engine.host_cpu``) is hidden under its GPU work. An overlap scheduler
  prepares the next batch while the GPU runs the current one, so a step takes the longer of the
  two rather than their sum: with CPU time ``c`` and GPU time ``g`` (the profile's step and the
  GPU-side terms: sampling, all-reduces) a step takes ``g + c - cpu_overlap * min(g, c)``;
  1 is ``max(g, c)``, 0 (the default: every fitted preset) the sum. Small batches are then GPU-bound
  and large ones CPU-bound: SGLang 0.4's inter-token gaps on four H200s are the GPU's with up to
  about 50 requests running and about 0.2 ms per running request with hundreds
  (docs/fidelity-model.md). A batch whose GPU time at no context is already the longer has a
  linear decode line (the CPU's part not hidden is a constant); one whose CPU time may be the
  longer has none, so fast-forwarded runs price its steps one by one (the same bytes, more time).

With ``vocab`` the model's full vocabulary and ``ar_bytes = hidden x dtype bytes x 2 (tp-1)/tp``
(one ring all-reduce of a token's hidden state). The all-reduce terms come *on top of* the
profile's own tensor-parallel pricing (analytic profiles charge 10 us per all-reduce and NVLink
bandwidth at 70 %); a bandwidth of 0 means no bytes term. A profile without a model shape (the
inline linear profile) has no vocabulary and no tensor parallelism: only ``step_s``, ``seq_s``
and ``admit_s`` apply to it.

Presets (``sim/core/overheads.json``) are named by engine and era; each carries its sources and how
its values were obtained (``calibrate/fidelity/fit.py`` fits them to published measurements).
``none`` is no overhead at all: exactly the pricing of the profile alone.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from plumbing.numbers import in_range, is_integer

#: The largest time one step or overhead term may take, s (profiles too): no GPU step is an hour,
#: and a larger term would overflow the engine's integer nanoseconds once multiplied by a step's tokens.
MAX_TERM_S = 3600.0

#: The preset file (located through ``sim/__init__``: a mypyc-compiled module has no __file__).
PRESETS_PATH = Path(sys.modules["sim"].__file__ or ".").resolve().parent / "core" / "overheads.json"

#: The terms (seconds unless said otherwise; see the module docstring), with what each multiplies.
TERMS = {
    "step_s": "s per step",
    "seq_s": "s per sequence in the step (decoders + prefill chunks)",
    "sample_s": "s per sequence per vocabulary entry",
    "admit_s": "s per request whose prefill starts in the step",
    "allreduce_latency_s": "s per all-reduce (2 per layer per step), tensor parallelism only",
    "allreduce_bytes_per_s": "bytes/s of all-reduce bus bandwidth (0: no bytes term)",
    "frontend_s": "s from a request's arrival until the engine sees it (API server; not GPU time)",
    "frontend_busy_s": "s of the API server's serial work per request (one server ahead of the engine; 0: no limit)",
    "kv_reread": "fraction (0..1) of the per-query-head repeat KV reads of a decode step that reach memory",
    "scheduler_steps": "decode steps per scheduler call (integer >= 1; multi-step scheduling)",
    "overlap_schedule": "1: the next batch is formed while the current step runs (0 or 1)",
    "cpu_overlap": "fraction (0..1) of a step's host-CPU terms hidden under its GPU work (1: the longer of the two)",
}
#: The terms spent on the host CPU (the scheduler, per-sequence bookkeeping, admitting a request,
#: the API server): ``engine.host_cpu`` scales them. Sampling, the KV re-read and the all-reduces
#: are GPU (or interconnect) work and do not depend on the host.
CPU_TERMS = ("step_s", "seq_s", "admit_s", "frontend_s", "frontend_busy_s")
#: The API server's terms (not there when the engine runs without one: ``entrypoint = "offline"``).
FRONTEND_TERMS = ("frontend_s", "frontend_busy_s")
#: The terms that price steps (all but the front end's and the multi-step count, which only
#: divides terms already counted).
STEP_TERMS = tuple(k for k in TERMS if k not in (*FRONTEND_TERMS, "scheduler_steps", "overlap_schedule",
                                                 "cpu_overlap"))
#: The CPU-side terms that price a step (``cpu_overlap`` hides them under the GPU's work).
STEP_CPU_TERMS = tuple(k for k in CPU_TERMS if k not in FRONTEND_TERMS)


class OverheadError(ValueError):
    """A bad preset name or term; the message is one line naming the valid choices."""


@dataclass(frozen=True)
class Overhead:
    """One engine's overhead terms (seconds; see the module docstring) and their provenance."""

    name: str = "none"
    step_s: float = 0.0
    seq_s: float = 0.0
    sample_s: float = 0.0
    admit_s: float = 0.0
    allreduce_latency_s: float = 0.0
    allreduce_bytes_per_s: float = 0.0
    frontend_s: float = 0.0
    frontend_busy_s: float = 0.0
    kv_reread: float = 0.0
    scheduler_steps: int = 1
    overlap_schedule: int = 0
    cpu_overlap: float = 0.0
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def is_none(self) -> bool:
        """True when no term prices steps: the profile's pricing is left exactly as it is."""
        return not any(getattr(self, k) for k in STEP_TERMS)

    def terms(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in TERMS}

    @property
    def hides_cpu(self) -> bool:
        """Is part of a step's CPU work hidden under its GPU work (``cpu_overlap`` > 0 and a
        CPU term to hide)?"""
        return self.cpu_overlap > 0 and any(getattr(self, k) for k in STEP_CPU_TERMS)

    def gpu_side(self) -> "Overhead":
        """These terms without the step's CPU ones (:data:`STEP_CPU_TERMS`), which a step with
        :attr:`hides_cpu` prices apart (:meth:`cpu_coefficients`)."""
        return replace(self, **{k: 0.0 for k in STEP_CPU_TERMS})

    def cpu_coefficients(self) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
        """The step's CPU work as ``(fixed, per_seq, per_admit)`` seconds, for a step with
        prefill and for one without (multi-step scheduling pays ``step_s`` once per
        ``scheduler_steps`` decode steps, as :meth:`decode_coefficients`)."""
        n = self.scheduler_steps
        full = (self.step_s, self.seq_s, self.admit_s)
        return full, full if n == 1 else (self.step_s / n, self.seq_s, self.admit_s)

    def coefficients(self, vocab: int, layers: int, hidden: int, dtype_bytes: int,
                     tp: int) -> tuple[float, float, float, float]:
        """``(fixed, per_seq, per_token, per_admit)`` seconds for a model of this shape: the
        overhead of a step with S sequences, T tokens and A admissions is
        ``fixed + per_seq * S + per_token * T + per_admit * A``."""
        fixed = self.step_s
        per_token = 0.0
        if tp > 1 and layers > 0:
            n_ar = 2 * layers
            fixed += n_ar * self.allreduce_latency_s
            if self.allreduce_bytes_per_s > 0:
                per_token = n_ar * hidden * dtype_bytes * 2 * (tp - 1) / tp / self.allreduce_bytes_per_s
        return fixed, self.seq_s + self.sample_s * vocab, per_token, self.admit_s

    def decode_coefficients(self, vocab: int, layers: int, hidden: int, dtype_bytes: int,
                            tp: int) -> tuple[float, float, float, float]:
        """:meth:`coefficients` for a step without prefill: with multi-step scheduling the
        scheduler's ``step_s`` is paid once per ``scheduler_steps`` steps (``seq_s``, each
        token's output processing, stays per step). The very same tuple when
        ``scheduler_steps`` is 1."""
        full = self.coefficients(vocab, layers, hidden, dtype_bytes, tp)
        n = self.scheduler_steps
        if n == 1:
            return full
        fixed, per_seq, per_token, per_admit = full
        return fixed - self.step_s + self.step_s / n, per_seq, per_token, per_admit

    def on_host(self, host_cpu: float) -> "Overhead":
        """These terms on a host ``host_cpu`` times as slow as the one they were measured on:
        the CPU terms (:data:`CPU_TERMS`) multiplied by it, the GPU terms unchanged. ``self``
        itself for 1.0 (so the default prices every step exactly as before)."""
        if host_cpu == 1.0:
            return self
        scaled = {k: getattr(self, k) * host_cpu for k in CPU_TERMS}
        return replace(self, **scaled, meta={**self.meta, "host_cpu": host_cpu})

    def without_frontend(self) -> "Overhead":
        """These terms for an engine run without an API server (vLLM's ``LLM`` class,
        ``engine.entrypoint = "offline"``): no front-end latency or throughput limit. ``self``
        itself when it has neither."""
        if not any(getattr(self, k) for k in FRONTEND_TERMS):
            return self
        return replace(self, **{k: 0.0 for k in FRONTEND_TERMS}, meta={**self.meta, "entrypoint": "offline"})

    def ctx_factor(self, heads: int, kv_heads: int) -> float:
        """Multiplier of the profile's per-context-token decode cost (``kv_reread``); exactly
        1.0 when ``kv_reread`` is 0 or the model has no grouped heads."""
        if not self.kv_reread or heads <= kv_heads or kv_heads <= 0:
            return 1.0
        return 1.0 + self.kv_reread * (heads / kv_heads - 1.0)


NONE = Overhead()
#: Each term's neutral value (what a preset or table that leaves it out gets).
_DEFAULTS = {k: getattr(NONE, k) for k in TERMS}


def _presets() -> dict[str, dict]:
    data = json.loads(PRESETS_PATH.read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def preset_names() -> list[str]:
    """Preset names, ``none`` first."""
    return ["none"] + sorted(n for n in _presets() if n != "none")


def default_preset() -> str:
    """The preset shipped GPU profiles use (``_default`` in the preset file)."""
    return str(json.loads(PRESETS_PATH.read_text())["_default"])


def _term(v, where: str, key: str) -> float:
    if key == "scheduler_steps":
        if not (is_integer(v, integral_floats=True) and v >= 1):
            raise OverheadError(f"{where}.{key}: expected an integer >= 1 (got {v!r}; "
                                f"terms: {', '.join(TERMS)})")
        return int(v)
    if key == "overlap_schedule":
        if not (is_integer(v, integral_floats=True) and v in (0, 1)):
            raise OverheadError(f"{where}.{key}: expected 0 or 1 (got {v!r}; terms: {', '.join(TERMS)})")
        return int(v)
    if key in ("kv_reread", "cpu_overlap") and in_range(v, gt=1):
        raise OverheadError(f"{where}.{key}: expected a fraction between 0 and 1 (got {v!r}; "
                            f"terms: {', '.join(TERMS)})")
    top = None if key.endswith("_per_s") else MAX_TERM_S  # (a rate is not a time)
    if not in_range(v, ge=0, le=top):
        raise OverheadError(f"{where}.{key}: expected a finite number >= 0{f' and <= {top:g} s' if top else ''} (got {v!r}; "
                            f"terms: {', '.join(TERMS)})")
    return float(v)


def resolve_overhead(spec, where: str = "engine.overhead") -> Overhead:
    """An Overhead from a preset name, an inline table of terms (optionally ``preset = name`` to
    start from; missing terms are 0 or the preset's), or an Overhead."""
    if isinstance(spec, Overhead):
        return spec
    if spec is None or spec == "none":
        return NONE
    presets = _presets()
    choices = ", ".join(preset_names())
    if isinstance(spec, str):
        if spec not in presets:
            raise OverheadError(f"{where}: no overhead preset '{spec}' (expected one of: {choices}; "
                                "or a table of terms)")
        p = presets[spec]
        terms = {k: _term(p.get("terms", {}).get(k, _DEFAULTS[k]), f"{PRESETS_PATH.name}:{spec}", k)
                 for k in TERMS}
        return Overhead(name=spec, **terms, meta=dict(p.get("meta", {})))
    if not isinstance(spec, dict):
        raise OverheadError(f"{where}: expected a preset name ({choices}) or a table of terms (got {spec!r})")
    unknown = sorted(set(spec) - set(TERMS) - {"preset"})
    if unknown:
        raise OverheadError(f"{where}: unknown key '{unknown[0]}' (expected 'preset' or terms: {', '.join(TERMS)})")
    base = resolve_overhead(spec.get("preset", "none"), f"{where}.preset")
    terms = base.terms()
    for k in TERMS:
        if k in spec:
            terms[k] = _term(spec[k], where, k)
    name = "inline" if base.name == "none" else f"{base.name}+inline"
    return Overhead(name=name, **terms, meta={"source": "scenario inline table", "preset": base.name})


def describe(o: Overhead) -> str:
    """One line: the non-zero terms in microseconds (bandwidth in GB/s)."""
    parts = []
    for f in fields(Overhead):
        if f.name not in TERMS:
            continue
        v = getattr(o, f.name)
        if not v:
            continue
        if f.name == "scheduler_steps":
            if v > 1:
                parts.append(f"{v} decode steps per scheduler call")
            continue
        if f.name == "overlap_schedule":
            parts.append("overlap scheduling (next batch formed during the step)")
            continue
        if f.name == "kv_reread":
            parts.append(f"KV re-read {v:.3g} per extra query head")
            continue
        if f.name == "cpu_overlap":
            parts.append(f"{v:.3g} of the step's CPU work hidden under the GPU's")
            continue
        if f.name == "allreduce_bytes_per_s":
            parts.append(f"allreduce {v / 1e9:.0f} GB/s")
        elif f.name == "sample_s":
            parts.append(f"sample {v * 1e12:.3g} ps/vocab entry")
        elif v >= 1e-3:
            parts.append(f"{f.name.removesuffix('_s')} {v * 1e3:.3g} ms")
        else:
            parts.append(f"{f.name.removesuffix('_s')} {v * 1e6:.3g} us")
    return ", ".join(parts) or "no overhead"
