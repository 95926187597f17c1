"""How many steps a plan runs for: the reference stepper, and the fast one that must equal it.

The loop (:func:`sim.core.loop.replica_loop`) plans a step, prices it, and asks the engine's
stepper how long the plan runs:

* :class:`ReferenceStepper` is the specification: one iteration per event, every request
  stepped (with ``engine.lazy_batch = false`` no request is in a cohort). What the engine does
  is what the planner (:mod:`sim.core.planner`) decides and apply (:mod:`sim.core.apply`)
  carries out, one step at a time.
* :class:`FastStepper` runs the same plan for as many steps as nothing could change
  (:mod:`sim.core.fastforward`), pricing each step exactly; with the cohort
  (:mod:`sim.core.cohort`) and a cluster's held runs (:mod:`sim.cluster.replicas`) it is the
  speed layer. Its results must equal the reference's byte for byte
  (``tests/test_exactness.py``).

``engine.fast_forward`` chooses between them (true: fast).
"""
from __future__ import annotations

from sim.core import fastforward
from sim.core.fastforward import OpenRun
from sim.core.parts import EngineParts as Engine
from sim.core.plan import StepPlan

__all__ = ["Stepper", "ReferenceStepper", "FastStepper", "make_stepper"]


class Stepper:
    """How many steps a plan runs for (see the module docstring)."""

    def durations(self, eng: Engine, plan: StepPlan, now_ns: int, next_event_ns: int, dur0: int) -> list[int]:
        """The durations (ns) of the steps to take for ``plan`` planned at ``now_ns`` (its first
        step takes ``dur0``), none of which starts at or after ``next_event_ns``; the KV
        blocks the steps after the first need are taken."""
        raise NotImplementedError

    def open_run(self, eng: Engine, plan: StepPlan, now_ns: int, next_event_ns: int, dur0: int) -> OpenRun | None:
        """The run a cluster replica may hold open for ``plan`` (priced as the clock reaches
        it), or None for the planned step alone."""
        raise NotImplementedError

    def durations_deferring(self, eng: Engine, plan: StepPlan, now_ns: int, visible_ns: int, seen_ns: int,
                            next_event_ns: int, dur0: int) -> list[int]:
        """:meth:`durations` for an overlap-scheduled replica whose next request becomes visible
        at ``visible_ns`` (before ``next_event_ns``): the steps that start before it, and the
        next one too when that request, seen at ``seen_ns``, would still be held back at the
        boundary between (the step it waits out: ``replica_loop``)."""
        raise NotImplementedError


class ReferenceStepper(Stepper):
    """One step per event."""

    def durations(self, eng: Engine, plan: StepPlan, now_ns: int, next_event_ns: int, dur0: int) -> list[int]:
        return [dur0]

    def open_run(self, eng: Engine, plan: StepPlan, now_ns: int, next_event_ns: int, dur0: int) -> OpenRun | None:
        return None

    def durations_deferring(self, eng: Engine, plan: StepPlan, now_ns: int, visible_ns: int, seen_ns: int,
                            next_event_ns: int, dur0: int) -> list[int]:
        return [dur0]  # (the loop holds the request back at the boundary itself)


class FastStepper(Stepper):
    """Runs of steps where nothing can change, priced exactly (:mod:`sim.core.fastforward`)."""

    def durations(self, eng: Engine, plan: StepPlan, now_ns: int, next_event_ns: int, dur0: int) -> list[int]:
        durations = fastforward.run_length(eng, plan, now_ns, next_event_ns, dur0)
        fastforward.allocate_run(eng, plan, len(durations))
        return durations

    def open_run(self, eng: Engine, plan: StepPlan, now_ns: int, next_event_ns: int, dur0: int) -> OpenRun | None:
        return fastforward.start_run(eng, plan, now_ns, next_event_ns, dur0)

    def durations_deferring(self, eng: Engine, plan: StepPlan, now_ns: int, visible_ns: int, seen_ns: int,
                            next_event_ns: int, dur0: int) -> list[int]:
        run = fastforward.start_run(eng, plan, now_ns, next_event_ns, dur0)
        if run is None:
            return [dur0]
        run.extend(visible_ns)
        # stopped by the arrival, at a boundary where it would be held back (it was seen after
        # the last step started): nothing happens there, and the run takes the next step too
        if not run.done and seen_ns > run.ends[-1] - run.durs[-1]:
            run.extend(run.start + 1)
        fastforward.allocate_run(eng, plan, len(run.durs))
        return run.durs


def make_stepper(fast: bool) -> Stepper:
    """The fast stepper, or the reference when ``fast`` is False (``engine.fast_forward``)."""
    return FastStepper() if fast else ReferenceStepper()
