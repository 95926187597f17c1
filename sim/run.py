"""One simulation: scenario -> workload -> engine(s) (SimPy) -> Results.

``simulate(scenario)`` is the one driver: it builds the request stream with ``workloads``, the
cost model from the profile, the policy from the registry, and runs the engine loop as one SimPy
process whose clock is integer nanoseconds; a scenario with a ``[cluster]`` table runs its
replicas behind the router instead (:mod:`sim.cluster`). Arrivals are pre-generated columnar
arrays that the loop ingests when the clock passes them (no process per request); closed-loop
users' next requests are pushed on a heap when their previous request ends. The setup both
share is :func:`sim.assembly.prepare`.
"""
from __future__ import annotations

from sim.assembly import build_engine, engine_run_info, prepare
from sim.config import Scenario
from sim.core.errors import ScenarioError
from sim.core.loop import replica_loop
from sim.results import Results


def simulate(scenario: Scenario, *, trace_iterations: bool = False, progress: bool | None = False,
             load_scale: float = 1.0, gate=None, check_invariants: bool = False,
             lenient: bool = False, workload=None, **distributed) -> Results:
    """Run ``scenario`` and return its Results (requests, summary, time series).

    ``load_scale`` multiplies every stream's arrival rate (traces: time compression).
    ``check_invariants`` verifies KV conservation after every engine event (tests use it).
    ``progress``: True a tqdm bar of simulated seconds, None that bar on a terminal and a line
    every 10 s elsewhere (:mod:`sim.progress`), False nothing. ``lenient``: skip bad trace rows
    (counted in the run's workload facts). ``gate``: an admission gate object instead of the one
    the scenario's tables build (one replica only). ``workload``: the request stream, built by
    the caller (:func:`sim.assembly.build_workload` with the same ``load_scale``; not modified).
    A scenario with a ``[cluster]`` table runs its replicas behind the router and returns a
    ``ClusterResults`` (:func:`sim.cluster.simulate_cluster`, which has the cluster's options;
    ``backend``, ``workers`` and ``address`` pass to it: a cluster in windows, docs/distributed.md).
    An exception a user's policy raises in its own code is a one-line
    :class:`~sim.policy_code.PolicyCodeError` (a ScenarioError) naming the policy, the hook and the line.
    """
    try:
        return _simulate(scenario, trace_iterations, progress, load_scale, gate, check_invariants, lenient,
                         workload, distributed)
    except Exception as exc:
        from sim.policy_code import policy_code_error, policy_files

        err = policy_code_error(exc, policy_files(scenario))
        if err is None:
            raise
        raise err from exc


def _simulate(scenario: Scenario, trace_iterations: bool, progress: bool | None, load_scale: float, gate,
              check_invariants: bool, lenient: bool, workload, distributed: dict) -> Results:
    if scenario.cluster:
        if gate is not None:
            raise ScenarioError(f"{scenario.source}: cluster: a custom gate is not available for a [cluster] "
                                f"scenario (expected a scenario without [cluster])")
        from sim.cluster import simulate_cluster
        return simulate_cluster(scenario, trace_iterations=trace_iterations, progress=progress,
                                load_scale=load_scale, check_invariants=check_invariants, lenient=lenient,
                                workload=workload, **distributed)
    return _simulate_replica(scenario, trace_iterations, progress, load_scale, gate, check_invariants,
                             lenient, workload)


#: a replica alone runs on a :class:`~sim.assembly.LoneClock` (a switch for the tests: False runs
#: it as a SimPy process on SimPy's event queue, with the same results)
LONE_CLOCK = True


def _simulate_replica(sc: Scenario, trace_iterations: bool, progress: bool | None, load_scale: float,
                      gate, check_invariants: bool, lenient: bool, workload) -> Results:
    """One replica serving the whole stream (see :func:`simulate`)."""
    setup = prepare(sc, sc.engine, load_scale=load_scale, lenient=lenient, workload=workload, progress=progress,
                    alone=LONE_CLOCK)
    trace: list | None = [] if trace_iterations else None
    engine = build_engine(sc, setup.env, setup.costs, trace=trace, gate=gate)
    if setup.closed_loop:  # closed-loop users send their next request when one ends
        engine.on_request_end = setup.source.on_request_end
    engine.through_finishes = not setup.closed_loop  # a finish sends no new request
    proc = replica_loop(setup.env, engine, setup.source, setup.stop_ns, setup.interval_ns, check_invariants,
                        setup.on_boundary)
    if not LONE_CLOCK:
        setup.env.process(proc)
    end_ns = setup.run(proc)
    engine.close(end_ns)
    run_info = {**engine_run_info(engine, end_ns), **setup.timing(), "workload": setup.workload.meta}
    return Results.build(sc, engine.costs, engine.tel, run_info, trace)

