"""The SimPy process of one replica (:func:`replica_loop`): the engine's step loop.

It lives apart from :mod:`sim.run` (which builds a run) so that it can be compiled with the
engine (:mod:`sim.native`): it runs once per engine event.
"""
from __future__ import annotations

import simpy

from sim.core.costs import NEVER, NS
from sim.core.engine import Engine
from sim.core.errors import StallError
from sim.core.observe import PROGRESS_EVERY
from sim.core.simpy_adapter import clock_ns
from sim.core.source import RequestStream


# (112 lines: the SimPy process itself; its waits are yields, so it reads as one loop)
def replica_loop(env: simpy.Environment, engine: Engine, source: RequestStream, stop_ns: int, interval_ns: int,
                 check_invariants: bool = False, on_boundary=None):
    """The SimPy process of one replica: at each step boundary take the arrivals that are due,
    record the time-series samples of the stretch that just ended, re-rank, plan, price,
    fast-forward where exact, and apply.

    ``source`` (:class:`~sim.core.source.RequestStream`) provides ``pop_due(now)`` (requests that
    have arrived) and ``next_arrival_ns()`` (when the next may arrive; a lower bound is enough,
    it only stops fast-forward early), and may provide ``on_run(now, durations)``, told of each
    run of steps as it starts, and ``sleep(delay)``, the event to wait on for ``delay`` ns (in
    place of ``env.timeout``).
    When the replica is idle it sleeps until the next arrival, or on ``source.wakeup`` (a SimPy
    event) when the source has one (a router in front of several replicas).

    Samples (every ``interval_ns``) read the state at their instant (:class:`Telemetry`'s time
    series): one at a boundary reads the step planned there; one inside a step (runs end with
    the step that holds the next sample, so only their last step can hold one) reads that
    step's running set and blocks, held when the run is applied; one inside an idle wait reads
    the idle state, held before it. Each is recorded at the boundary ending its stretch; the
    requests taken in there (or later: a front end's delay) are added to the waiting of those
    at or after their arrival.
    """
    tel = engine.tel
    cfg = engine.cfg
    q = engine.queues
    stepper = engine.stepper
    on_run = getattr(source, "on_run", None)
    # A cluster replica's source may let a run go past arrivals routed elsewhere: ``hold(now, plan,
    # dur0, run)`` takes the run (a :class:`~sim.core.fastforward.OpenRun` bounded by the
    # replica's own next change, not the next arrival, or None for the planned step alone),
    # prices it as it likes and returns the event that fires where the run ends (cut short when
    # a request is routed here meanwhile); ``held()`` the durations it took.
    hold = getattr(source, "hold", None)
    held = getattr(source, "held", None)
    wakeup = getattr(source, "wakeup", None)
    finished = getattr(source, "finished", None)
    sleep = getattr(source, "sleep", None) or env.timeout  # (a source may give cheaper waits)
    swap_overlap = cfg.swap_overlap  # (read once: a setting, not a per-event attribute lookup)
    next_sample = 0  # the first sample instant not recorded yet (ns)
    # next event count at which to check progress (and the max_events stop)
    check_at = min(PROGRESS_EVERY, cfg.max_events or NEVER)
    # Overlap scheduling (the overhead's overlap_schedule): the batch of the next step was formed
    # when the step that just ended started, so a request the engine saw only after that start
    # is held back one step (``deferred``). ``last_start`` / ``last_end``: that step's start and
    # end; after idling (last_end != now) nothing was formed ahead and every request is taken in.
    ahead = engine.costs.overhead.overlap_schedule == 1
    # (when the engine saw a request: its arrival plus the front end's latency; a request that
    # waited in the front end's queue, frontend_busy_s, was seen later than that)
    seen_after = round(engine.costs.overhead.frontend_s * NS)
    last_start = last_end = -1
    deferred: list = []
    # (one replica fed open arrivals: a run goes on through the step an arrival waits out, rather
    # than stopping where it would only be held back: Stepper.durations_deferring)
    next_open = getattr(source, "next_open_arrival_ns", None) if ahead and hold is None else None
    while True:
        now = clock_ns(env)  # (always an int: every delay is in ns)
        due = source.pop_due(now)
        if ahead:
            due = deferred + due
            deferred = [r for r in due if r.arrival_ns + seen_after > last_start] if last_end == now else []
            if deferred:
                due = [r for r in due if r.arrival_ns + seen_after <= last_start]
        for req in due:
            engine.admit_arrival(req, now)
        if next_sample < now:  # samples inside the stretch that just ended: its held state
            next_sample = tel.settle(next_sample, now, engine)
        if due:  # ... in which these waited since their arrival (rejected ones never did)
            tel.taken_in(due)
        if on_boundary is not None:
            on_boundary(now)
        if now >= stop_ns:
            break
        engine.refresh_ranking(now)
        # (a source that holds runs bounds them itself: it is asked only when nothing runs)
        next_arrival = source.next_arrival_ns() if hold is None or not q.running else NEVER
        if deferred and not q.running and not q.waiting:
            last_end = -1  # nothing runs: no batch was formed ahead, take them in now
            continue
        if not q.running and not q.waiting:
            engine.idle()
            if wakeup is not None:
                if finished is not None and finished() and next_arrival >= NEVER:
                    break
                tel.hold(engine)  # (idle: the samples until it wakes read this)
                yield wakeup(min(next_arrival, stop_ns))
                continue
            if next_arrival >= NEVER:
                break
            # (a closed-loop user answered by a rejection at its arrival instant, before this
            # boundary, may already have sent its next request: then take it in at once)
            wait = max(min(next_arrival, stop_ns) - now, 0)
            if next_sample < now + wait:
                tel.hold(engine)
            yield sleep(wait)
            continue
        plan = engine.plan(now)
        if plan.empty and plan.preempted:
            continue  # every running request gave way; admission happens in the next plan
        if plan.empty:
            # Nothing can run (e.g. waiters blocked by reservations): wait for a change.
            engine.idle()
            if deferred:
                last_end = -1  # nothing can run: take them in now
                continue
            if hold is not None:
                next_arrival = source.next_arrival_ns()
            if next_arrival >= NEVER and engine.next_change_ns >= NEVER:
                raise StallError(f"engine.stalled: at t={now / NS:.6f}s {len(q.waiting)} requests wait "
                                 f"and none can be admitted, and nothing will change "
                                 f"({engine.describe_live()})")
            wake = max(min(next_arrival, engine.next_change_ns, stop_ns), now)
            tel.idle_with_work_ns += wake - now
            if next_sample < wake:
                tel.hold(engine)
            yield sleep(wake - now)
            continue
        if next_sample == now:  # the step planned here, before a run takes its later steps' blocks
            tel.sample(now, engine)
            next_sample += interval_ns
        compute = engine.compute_ns(plan)
        transfer = engine.transfer_ns(plan)
        # proactive swapping overlaps the copies with the step's kernels (separate copy engine)
        dur0 = max(compute, transfer) if swap_overlap else compute + transfer
        # the next arrival, sample or stop, whichever comes first (compared: min() is a call)
        next_event = next_arrival if hold is None else NEVER
        if next_sample < next_event:
            next_event = next_sample
        if stop_ns < next_event:
            next_event = stop_ns
        if deferred:
            next_event = now  # they join at the next boundary: one step only
        engine.events += 1
        if engine.events > check_at:  # (one comparison per event)
            if cfg.max_events and engine.events > cfg.max_events:
                raise StallError(f"engine.max_events: the run exceeded {cfg.max_events} engine events at "
                                 f"t={now / NS:.3f}s (a safety stop; raise it or set 0 for none)")
            engine.check_progress(now)  # raises StallError when nothing has progressed for long
            check_at = min(engine.events + PROGRESS_EVERY, cfg.max_events or NEVER)
        if hold is None:
            arrived = next_open() if next_open is not None and not deferred and next_event == next_arrival else NEVER
            if arrived < NEVER:
                durations = stepper.durations_deferring(engine, plan, now, next_arrival, arrived + seen_after,
                                                        min(next_sample, stop_ns), dur0)
            else:
                durations = stepper.durations(engine, plan, now, next_event, dur0)
            if on_run is not None:
                on_run(now, durations)
            yield sleep(sum(durations))
        else:
            assert held is not None  # (a source that holds runs says what it held)
            yield hold(now, plan, dur0, stepper.open_run(engine, plan, now, next_event, dur0))
            durations = held()  # (the held run allocates its blocks as it goes)
        if ahead:
            last_end = now + sum(durations)
            last_start = last_end - durations[-1]
        engine.apply(plan, now, durations, compute, next_sample)  # (holds the last step's state for it)
        if check_invariants:
            engine.check_invariants()
    if next_sample == now:  # the end: a sample at this boundary reads the state the run ends in
        tel.sample(now, engine)
