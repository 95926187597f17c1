"""The terms ``priosim calibrate --from-runs`` fits, each bounded to a physical range.

Engine overhead (:mod:`sim.core.overhead`, seconds):

* ``step_s`` 0 - 5 ms: the per-step CPU work (scheduler, input preparation, kernel launches).
  The largest shipped preset (vLLM 0.4) spends 1.5 ms; an engine at 5 ms a step is CPU-bound
  at a rate no release has shown.
* ``seq_s`` 0 - 200 us: per sequence in a step (block tables, detokenisation, output objects);
  the presets span 36 - 111 us.
* ``admit_s`` 0 - 2 ms: per request whose prefill starts in the step (the engine's CPU work to
  schedule a new request: block allocation, input preparation); the presets' own bound, as in
  calibrate/fidelity/fit.py (tokenisation is the front end's, not the step's).
* ``frontend_s`` 0 - 100 ms: arrival to engine (HTTP, chat template, tokenisation; not GPU
  time). The presets stay under 30 ms; 100 ms allows a long prompt's tokenisation behind a
  proxy or gateway, which a user's own deployment may have.
* ``allreduce_latency_s`` 0 - 100 us, only for a tensor-parallel profile: the latency of each of a
  step's 2 x layers all-reduces (on top of the profile's own 10 us). Every step pays it whatever
  its batch, so it is most of a TP step's floor: a host with a faster all-reduce path (NVLink,
  custom all-reduce kernels) than the preset's shows lower inter-token gaps at light load than
  ``step_s`` (bounded below by 0) alone could reach. It and ``step_s`` both price a step's fixed
  time, which runs of one model cannot split: for a TP profile this term carries it and
  ``step_s`` is held at the base's (:data:`calibrate.runs.fit.TIED_STEP`).
* ``cpu_overlap`` 0 - 1, only for an engine with an overlap scheduler (SGLang 0.4 and later: the
  base overhead's ``overlap_schedule``): the share of the step's CPU work (``step_s``, ``seq_s``,
  ``admit_s``) hidden under its GPU work (:mod:`sim.core.overhead`). Such a scheduler prepares
  the next batch while the GPU runs, so at 1 a step is the longer of the two: small batches are
  the GPU's and large ones the CPU's.
* ``frontend_busy_s`` 0 - 50 ms: the API server's serial CPU work per request (one process takes
  requests in one at a time), which caps the request rate of a burst without slowing the GPU's
  steps: runs of many short requests sent at once show it, where a per-admission term would
  slow every running request's tokens too. The presets stay under 25 ms; one publisher's
  single-GPU hosts spend about 25 ms a chat request (the fidelity table's ``host`` rows), so a
  slower host still fits.

The profile's achieved fractions (:mod:`calibrate.runs.rescale`):

* ``hbm_efficiency`` 0.3 - 1.0 of the datasheet HBM bandwidth: above 1 is impossible, below 0.3
  a GPU is throttled or shared; ``flops_efficiency`` 0.3 - 1.0 of the dense BF16 FLOP/s, alike.
  For a base profile without datasheet constants (a measured one) both are relative to the
  base's own speed (1.0: as measured), bounded 0.3 - 3.0.

KV capacity (``memory.kv_capacity_bytes``), only where the runs show its limit
(:func:`calibrate.runs.fit.kv_shown`): from the largest request's KV (one must fit) to the GPU's
memory less the weights (no engine can hold more).
"""
from __future__ import annotations

from dataclasses import dataclass

MS, US = 1e-3, 1e-6


@dataclass(frozen=True)
class Term:
    """One fitted term: its name, bounds (in its unit), the unit shown and why the bounds."""

    name: str
    lo: float
    hi: float
    unit: str
    scale: float  # the shown value is value / scale (e.g. 1e-3 for ms)
    why: str
    kind: str  # "overhead", "efficiency" or "kv"


def _engine_bound(name: str) -> tuple[float, float]:
    """The engine-physics range the presets are fitted within (calibrate/fidelity/fit.py BOUNDS):
    one table for both fits."""
    from calibrate.fidelity.fit import BOUNDS

    return BOUNDS[name]


OVERHEAD_TERMS = (
    Term("step_s", *_engine_bound("step_s"), "ms", MS, "per-step CPU: 0-5 ms (largest preset 1.5 ms)", "overhead"),
    Term("seq_s", *_engine_bound("seq_s"), "us", US, "per sequence per step: 0-200 us (presets 30-111 us)",
         "overhead"),
    Term("admit_s", *_engine_bound("admit_s"), "ms", MS, "per admitted request: 0-2 ms (scheduling a new request)",
         "overhead"),
    # wider than the presets' 30 ms: a user's own deployment may put a gateway or proxy in front
    Term("frontend_s", 0.0, 100 * MS, "ms", MS, "API server, arrival to engine: 0-100 ms (presets <= 30 ms)",
         "overhead"),
    Term("frontend_busy_s", 0.0, 50 * MS, "ms", MS,
         "API server's serial work per request: 0-50 ms (presets <= 25 ms)", "overhead"),
)


#: Fitted only when the base profile is tensor-parallel (a 1-GPU step has no all-reduce).
ALLREDUCE_TERM = Term("allreduce_latency_s", *_engine_bound("allreduce_latency_s"), "us", US,
                      "per all-reduce, 2 per layer per step, TP only: 0-100 us (NVLink 10-30, PCIe up to 100)",
                      "overhead")


#: Fitted only for an engine with an overlap scheduler (the base overhead's overlap_schedule).
OVERLAP_TERM = Term("cpu_overlap", 0.0, 1.0, "", 1.0,
                    "share of the step's CPU work hidden under the GPU's: 0 (added) - 1 (the longer of the two)",
                    "overhead")


def efficiency_terms(datasheet: bool) -> tuple[Term, Term]:
    hi = 1.0 if datasheet else 3.0
    what = "of the datasheet peak" if datasheet else "relative to the base profile's measured speed"
    return (Term("hbm_efficiency", 0.3, hi, "", 1.0, f"achieved HBM bandwidth {what}: 0.3-{hi:g}", "efficiency"),
            Term("flops_efficiency", 0.3, hi, "", 1.0, f"achieved dense FLOPs {what}: 0.3-{hi:g}", "efficiency"))


def kv_term(lo: float, hi: float) -> Term:
    return Term("kv_capacity_bytes", lo, hi, "GB", 1e9,
                "KV memory: the largest request's KV to the GPU memory less the weights", "kv")


__all__ = ["Term", "OVERHEAD_TERMS", "ALLREDUCE_TERM", "OVERLAP_TERM", "efficiency_terms", "kv_term"]
