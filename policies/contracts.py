"""The serving contracts beside the ranking ones: what a router and an admission gate are.

A *router* picks, at a request's arrival instant, the replica of a cluster that serves it; it
reads each candidate through a :class:`ReplicaView` (what a real load balancer could know at
that instant) and never the replica's engine. A *gate* decides at the arrival instant whether a
replica takes the request in at all. Both are found by name in a registry, like policies (the
simulator's ``sim.routers.ROUTERS``; the gate is built from the scenario's admission
tables); a user's router loads by ``pkg.mod:Class``.

These are Protocols: an implementation needs no base class (``sim.routers.BaseRouter``
supplies the defaults), and ``isinstance`` checks the methods are there.
"""
from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from policies.base import RequestView


@runtime_checkable
class ReplicaView(Protocol):
    """What a router may read of one replica, at the current instant (read-only).

    Attributes:
        index: the replica's number in the cluster, 0..n-1 (groups in order).
        group: the name of its replica group.
        outstanding: requests it holds: running + waiting (routed, not yet finished).
        running: requests in its running batch.
        waiting: requests queued for the batch, including those routed to it at this instant.
        kv_used: fraction of its device KV blocks in use, 0..1.
        waiting_by_class: waiting requests per class name (every class of the scenario).
    """

    @property
    def index(self) -> int: ...

    @property
    def group(self) -> str: ...

    @property
    def outstanding(self) -> int: ...

    @property
    def running(self) -> int: ...

    @property
    def waiting(self) -> int: ...

    @property
    def kv_used(self) -> float: ...

    @property
    def waiting_by_class(self) -> Mapping[str, int]: ...


@runtime_checkable
class Router(Protocol):
    """A cluster's load balancer.

    ``bind(n_replicas, seed)`` is called once before the first ``route``; ``route(req,
    candidates, now_ns)`` returns one of ``candidates`` (the replicas that may serve ``req``:
    every replica, or under a class-aware router those of the groups serving its class), is
    deterministic for a seed, and changes neither the request nor a replica. ``class_aware``:
    candidates are restricted to the groups serving the request's class. ``reads_kv``: whether
    it reads ``kv_used`` (when it does not, a replica may run on past its decoders' last tokens
    between routing decisions: same results, fewer engine events). ``report()``: facts for
    summary.json.
    """

    name: str
    class_aware: bool
    reads_kv: bool

    def bind(self, n_replicas: int, seed: int) -> None: ...

    def route(self, req: RequestView, candidates: Sequence[ReplicaView], now_ns: int) -> ReplicaView: ...

    def report(self) -> dict: ...


@runtime_checkable
class Gate(Protocol):
    """An admission gate in front of one replica's scheduler.

    ``check(req, now_s, view)`` answers at the request's arrival instant: ``""`` admits it,
    anything else rejects it with that reason (the request's ``reject_reason``); ``view`` is the
    replica's :class:`sim.core.engine.GateView` (its step limits, cost model, KV pool to read,
    the policy's key, the waiting and running requests), for gates that estimate from the load.
    ``on_finish(req, now_s)`` is told of every admitted request that ends. ``bind(view)``
    (optional) is called once the replica exists; ``report()`` (optional) gives facts for
    summary.json.
    """

    def check(self, req: RequestView, now_s: float, view: Any = None) -> str: ...

    def on_finish(self, req: RequestView, now_s: float) -> None: ...
