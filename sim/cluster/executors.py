"""Where a windowed cluster's partitions run (:mod:`sim.cluster.windows`).

An executor holds ``parts`` (each a list of replica indices) and ``owner`` (replica index ->
part number) and answers, for every window, ``advance(batches, until_ns)``: each part takes its
batch of routed requests, advances its replicas to ``until_ns`` and the parts' snapshots come
back together (a barrier: the next window's routing needs all of them). Three of them:

* :class:`InProcess`: every part in this process, one after another (``workers = 1`` is the
  single-process run; several parts here are how the tests check that partitioning changes
  nothing);
* :class:`Processes`: one local process per part (the default for ``workers > 1``), talking
  over pipes;
* :class:`RayActors`: one Ray actor per part (``--backend ray``), on a running Ray cluster
  (``address``) or a local one started here.

Requests cross to other processes pickled; the replicas' results come back as their telemetry
and run facts (:meth:`Partition.finish_remote`), merged in replica order as in one process.
"""
from __future__ import annotations

import multiprocessing as mp
import os

from sim.cluster.windows import Partition, split
from sim.rayenv import ray_runtime_env


class _Base:
    name = "base"
    windows = 0

    def __init__(self, n_replicas: int, workers: int) -> None:
        self.parts = split(n_replicas, workers)
        self.owner = {i: p for p, idx in enumerate(self.parts) for i in idx}

    def snapshot(self) -> list[tuple]:
        return self.advance(None, None)

    def close(self) -> None:
        pass


class InProcess(_Base):
    """Every part in this process, advanced one after another."""

    name = "inprocess"

    def __init__(self, sc, spec, workers: int = 1, *, trace_iterations: bool = False,
                 check_invariants: bool = False, on_end=None) -> None:
        super().__init__(spec.slots, workers)
        self.workers = [Partition(sc, spec, idx, trace_iterations=trace_iterations,
                                  check_invariants=check_invariants, on_end=on_end) for idx in self.parts]

    def advance(self, batches, until_ns):
        out: list = []
        for p, w in enumerate(self.workers):
            out += w.snapshot() if batches is None else w.advance(batches[p], until_ns)
        return out

    def end_ns(self) -> int:
        return max(w.end_ns() for w in self.workers)

    def finish(self, end_ns: int, per_replica: bool) -> list:
        return [s for w in self.workers for s in w.finish(end_ns, per_replica)]


def _serve(conn, sc, spec, idx, trace_iterations: bool, check_invariants: bool) -> None:
    """A local worker process: one partition, answering the coordinator's calls over ``conn``."""
    part = Partition(sc, spec, idx, trace_iterations=trace_iterations, check_invariants=check_invariants)
    while True:
        op, *args = conn.recv()
        if op == "advance":
            conn.send(part.snapshot() if args[0] is None else part.advance(*args))
        elif op == "end":
            conn.send(part.end_ns())
        elif op == "finish":
            conn.send(part.finish_remote(*args))
            return


class Processes(_Base):
    """One local process per part (forked where the platform allows: no re-import)."""

    name = "processes"

    def __init__(self, sc, spec, workers: int, *, trace_iterations: bool = False,
                 check_invariants: bool = False) -> None:
        super().__init__(spec.slots, workers)
        ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        self.conns, self.procs = [], []
        for idx in self.parts:
            a, b = ctx.Pipe()
            pr = ctx.Process(target=_serve, args=(b, sc, spec, idx, trace_iterations, check_invariants),
                             daemon=True)
            pr.start()
            self.conns.append(a)
            self.procs.append(pr)

    def _all(self, msgs) -> list:
        for c, m in zip(self.conns, msgs):
            c.send(m)
        return [c.recv() for c in self.conns]

    def advance(self, batches, until_ns):
        outs = self._all([("advance", None if batches is None else batches[p], until_ns)
                          for p in range(len(self.parts))])
        return [x for o in outs for x in o]

    def end_ns(self) -> int:
        return max(self._all([("end",)] * len(self.parts)))

    def finish(self, end_ns: int, per_replica: bool) -> list:
        reps = [r for o in self._all([("finish", end_ns, per_replica)] * len(self.parts)) for r in o]
        self.close()
        return reps

    def close(self) -> None:
        for pr in self.procs:
            pr.join(timeout=5)
            if pr.is_alive():
                pr.terminate()


class _Actor:
    """A Ray actor's body: one partition."""

    def __init__(self, sc, spec, idx, trace_iterations, check_invariants) -> None:
        self.part = Partition(sc, spec, idx, trace_iterations=trace_iterations, check_invariants=check_invariants)

    def advance(self, batch, until_ns):
        return self.part.snapshot() if batch is None else self.part.advance(batch, until_ns)

    def end_ns(self) -> int:
        return self.part.end_ns()

    def finish(self, end_ns: int, per_replica: bool) -> list:
        return self.part.finish_remote(end_ns, per_replica)


class RayActors(_Base):
    """One Ray actor per part, on the Ray cluster at ``address`` (None: the one this process
    is connected to, or a local one started here and stopped at the end)."""

    name = "ray"

    def __init__(self, sc, spec, workers: int, *, address: str | None = None, trace_iterations: bool = False,
                 check_invariants: bool = False) -> None:
        try:
            import ray
        except ImportError:
            raise RuntimeError("the ray backend needs Ray: pip install 'priosim[distributed]' "
                               "(or pip install 'ray[default]')") from None
        super().__init__(spec.slots, workers)
        self.ray = ray
        self.started = False
        if not ray.is_initialized():
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            ray.init(address=address, runtime_env=ray_runtime_env(), include_dashboard=False, log_to_driver=False)
            self.started = True
        actor = ray.remote(num_cpus=1)(_Actor)
        self.actors = [actor.remote(sc, spec, idx, trace_iterations, check_invariants) for idx in self.parts]

    def advance(self, batches, until_ns):
        refs = [a.advance.remote(None if batches is None else batches[p], until_ns)
                for p, a in enumerate(self.actors)]
        return [x for o in self.ray.get(refs) for x in o]

    def end_ns(self) -> int:
        return max(self.ray.get([a.end_ns.remote() for a in self.actors]))

    def finish(self, end_ns: int, per_replica: bool) -> list:
        reps = [r for o in self.ray.get([a.finish.remote(end_ns, per_replica) for a in self.actors]) for r in o]
        self.close()
        return reps

    def close(self) -> None:
        for a in self.actors:
            self.ray.kill(a)
        self.actors = []
        if self.started:
            self.ray.shutdown()
            self.started = False


def make_executor(sc, spec, *, backend: str = "local", workers: int = 1, address: str | None = None,
                  trace_iterations: bool = False, check_invariants: bool = False, on_end=None):
    """The executor for ``backend`` ("local": this process for one worker, else local processes;
    "inprocess": every part in this process; "ray": Ray actors) with ``workers`` parts."""
    if backend == "ray":
        return RayActors(sc, spec, workers, address=address, trace_iterations=trace_iterations,
                         check_invariants=check_invariants)
    if backend == "inprocess" or workers <= 1 or on_end is not None:
        return InProcess(sc, spec, workers, trace_iterations=trace_iterations, check_invariants=check_invariants,
                         on_end=on_end)
    return Processes(sc, spec, workers, trace_iterations=trace_iterations, check_invariants=check_invariants)
