"""The SimPy process of one replica (:func:`replica_loop`): the engine's step loop.

It lives apart from :mod:`sim.run` (which builds a run) so that it can be compiled with the
engine (:mod:`sim.native`): it runs once per engine event.
"""
from __future__ import annotations

import simpy

from sim.costs import NS
from sim.engine import NEVER, Engine


def replica_loop(env: simpy.Environment, engine: Engine, source, stop_ns: int, interval_ns: int,
                 check_invariants: bool = False, on_boundary=None):
    """The SimPy process of one replica: at each step boundary take the arrivals that are due,
    sample telemetry, re-rank, plan, price, fast-forward where exact, and apply.

    ``source`` provides ``pop_due(now)`` (requests that have arrived) and ``next_arrival_ns()``
    (when the next may arrive; a lower bound is enough, it only stops fast-forward early), and
    may provide ``on_run(now, durations)``, told of each run of steps as it starts.
    When the replica is idle it sleeps until the next arrival, or on ``source.wakeup`` (a SimPy
    event) when the source has one (a router in front of several replicas).
    """
    tel = engine.tel
    cfg = engine.cfg
    on_run = getattr(source, "on_run", None)
    # A cluster replica's source may let a run go past arrivals routed elsewhere: ``run_bound_ns()``
    # replaces the next arrival as the run's bound and ``hold(now, durations)`` is the event that
    # ends the run, cut short (``held()``) when a request is routed here meanwhile.
    run_bound = getattr(source, "run_bound_ns", None)
    hold = getattr(source, "hold", None)
    next_sample = 0
    while True:
        now = int(env.now)  # (always an int: every delay is in ns)
        for req in source.pop_due(now):
            engine.admit_arrival(req, now)
        while next_sample <= now:
            tel.sample(next_sample, engine)
            next_sample += interval_ns
        if on_boundary is not None:
            on_boundary(now)
        if now >= stop_ns:
            break
        engine.refresh_ranking(now)
        next_arrival = source.next_arrival_ns()
        if not engine.running and not engine.waiting:
            wakeup = getattr(source, "wakeup", None)
            if wakeup is not None:
                if source.finished() and next_arrival >= NEVER:
                    break
                yield wakeup(min(next_arrival, stop_ns))
                continue
            if next_arrival >= NEVER:
                break
            yield env.timeout(min(next_arrival, stop_ns) - now)
            continue
        plan = engine.plan(now)
        if plan.empty and plan.preempted:
            continue  # every running request gave way; admission happens in the next plan
        if plan.empty:
            # Nothing can run (e.g. waiters blocked by reservations): wait for a change.
            if next_arrival >= NEVER and engine._next_change_ns >= NEVER:
                raise RuntimeError(f"engine stalled at t={now / NS:.6f}s with "
                                   f"{len(engine.waiting)} waiting and nothing runnable")
            wake = min(next_arrival, engine._next_change_ns, stop_ns)
            tel.idle_with_work_ns += wake - now
            yield env.timeout(wake - now)
            continue
        compute = engine.compute_ns(plan)
        dur0 = compute + engine.transfer_ns(plan)
        next_event = min(next_arrival if run_bound is None else run_bound(), next_sample, stop_ns)
        durations = engine.run_length(plan, now, next_event, dur0)
        engine.events += 1
        if cfg.max_events and engine.events > cfg.max_events:
            raise RuntimeError(f"engine.max_events={cfg.max_events} exceeded")
        if hold is None:
            engine.allocate_run(plan, len(durations))
            if on_run is not None:
                on_run(now, durations)
            yield env.timeout(sum(durations))
        else:
            yield hold(now, plan, durations)
            durations = source.held()  # (the held run allocates its blocks as it goes)
        engine.apply(plan, now, durations, compute)
        if check_invariants:
            engine.check_invariants()
