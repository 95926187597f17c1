"""Routers: the load balancer in front of a cluster's replicas.

A router sees each request at its arrival instant together with the replicas that may serve it
(``candidates``: every replica, or, under ``class_aware``, the replicas of the groups dedicated to
the request's class) and returns one of them. It reads only what a real load balancer could know
at that instant: each replica's outstanding requests (running + queued + routed but not yet
taken in) and its KV-cache use. Routers are registered like policies (``ROUTERS``, a
``plumbing.registry.Registry``) and found by name or by ``pkg.mod:Class``. The registry sits here,
in the scenario's layer (beside the admission gate), because the scenario's validation
(``sim.tables``) builds the router it names; the cluster (``sim.cluster``) runs it.

The contract is :class:`policies.contracts.Router` (checked for every registered router by
``tests/test_cluster.py``):
  * ``route(req, candidates, now_ns)`` returns an element of ``candidates`` (a user's router is
    held to it as it runs: :class:`GuardedRouter`);
  * deterministic: the same seed and the same sequence of calls give the same answers;
  * stateless with respect to the request (it never mutates ``req`` or a replica).

``candidates`` are :class:`policies.contracts.ReplicaView` s: ``index`` (global replica number),
``group``, ``outstanding`` (int), ``kv_used`` (fraction of device KV blocks in use, 0..1),
``waiting``/``running`` counts and ``waiting_by_class``. A new router is one class reading only
those: in a user's own file, named ``router = "pkg.mod:Class"``
(``tests/plugins/tenant_affinity.py`` is one), or shipped here with its class in the
registration loop at the end.
"""
from __future__ import annotations

from operator import attrgetter
from typing import Callable, Sequence

import numpy as np

from plumbing.numbers import in_range
from plumbing.registry import Registry
from policies import contracts
from policies.base import RequestView
from policies.contracts import ReplicaView
from sim.core.errors import ScenarioError
from sim.core.guard import one_line_repr

ROUTERS = Registry("router")


class BaseRouter:
    """Defaults for a :class:`policies.contracts.Router`. ``bind(n_replicas, seed)`` is called
    once before the first ``route``."""

    name = "router"
    class_aware = False  # True: candidates are restricted to the groups serving the class
    # False: it never reads ``kv_used`` (a cluster's replicas may then run on past decoders'
    # last tokens between routing decisions; same results, fewer engine events)
    reads_kv = True

    def bind(self, n_replicas: int, seed: int) -> None:
        self.n = n_replicas
        self.seed = seed

    def route(self, req: RequestView, candidates: Sequence[ReplicaView],
              now_ns: int) -> ReplicaView:  # pragma: no cover - abstract
        raise NotImplementedError

    def report(self) -> dict:
        return {}


# The routers pick with min(): it keeps the first of equal keys, so ties go to the lowest index.
_OUTSTANDING = attrgetter("outstanding")


class RoundRobin(BaseRouter):
    """Each request to the next replica in turn (among its candidates)."""

    name = "round_robin"
    reads_kv = False

    def bind(self, n_replicas: int, seed: int) -> None:
        super().bind(n_replicas, seed)
        self.next = 0

    def route(self, req, candidates, now_ns):
        # the first candidate at or after the cursor (cyclically), so that a class-restricted
        # candidate set is still visited in turn
        n = self.n
        best = min(candidates, key=lambda c: (c.index - self.next) % n)
        self.next = (best.index + 1) % n
        return best

    def route_counts(self, outstanding: list[int]) -> int:
        """``route``'s choice when the candidates are every replica, in order (as a cluster asks
        it: ``_Cluster.routing_ready``): the replica at the cursor. It reads no count at all."""
        i = self.next
        self.next = (i + 1) % self.n
        return i


class LeastOutstanding(BaseRouter):
    """Join the replica with the fewest outstanding requests (JSQ); ties to the lowest index."""

    name = "least_outstanding"
    reads_kv = False

    def route(self, req, candidates, now_ns):
        # (read for every candidate at every arrival, so without a Python frame per candidate)
        return min(candidates, key=_OUTSTANDING)

    @staticmethod
    def route_counts(outstanding: list[int]) -> int:
        """``route``'s choice from the candidates' ``outstanding`` counts, in candidate order:
        the position of the first smallest (ties to the lowest, as ``route``). A cluster that
        keeps those counts in a list asks this instead of ``route`` (``min`` over a list of ints
        is several times cheaper than an attribute read per candidate, at every arrival)."""
        return outstanding.index(min(outstanding))


class LeastKV(BaseRouter):
    """The replica with the smallest fraction of KV blocks in use (ties: fewer outstanding)."""

    name = "least_kv"

    def route(self, req, candidates, now_ns):
        # min over (kv_used, outstanding), the first of equals; outstanding read only for a tie
        kv = [c.kv_used for c in candidates]
        low = min(kv)
        if kv.count(low) == 1:
            return candidates[kv.index(low)]
        return min((c for c, u in zip(candidates, kv) if u == low), key=_OUTSTANDING)

    @staticmethod
    def route_kv_bounds(bounds: list[tuple[float, float]]) -> int | None:
        """``route``'s choice where each candidate's ``kv_used`` is known only to lie in ``[lo,
        hi]`` (``bounds``, in candidate order): the position of the candidate whose ``hi`` is
        below every other's ``lo`` (its ``kv_used`` is then the one least), or None when the
        intervals leave it open and only the values can tell. A cluster whose replicas' KV use
        costs work to read exactly (a disaggregated decode replica allocates the blocks of the
        steps its run in flight has begun) asks this first."""
        best = 0
        for i in range(1, len(bounds)):
            if bounds[i][1] < bounds[best][1]:
                best = i
        hi = bounds[best][1]
        for i, (lo, _) in enumerate(bounds):
            if i != best and lo <= hi:
                return None
        return best


class PowerOfTwo(BaseRouter):
    """Power of two choices: sample ``d`` candidates (seeded), take the least outstanding."""

    name = "power_of_two"
    reads_kv = False

    def __init__(self, d: int = 2) -> None:
        if not in_range(d, ge=1, integer=True):
            raise ValueError(f"power_of_two: d must be an integer >= 1 (got {d!r})")
        self.d = d

    def bind(self, n_replicas: int, seed: int) -> None:
        super().bind(n_replicas, seed)
        self.rng = np.random.default_rng(seed)

    def route(self, req, candidates, now_ns):
        if len(candidates) <= self.d:
            picks = candidates
        else:
            idx = sorted(self.rng.choice(len(candidates), size=self.d, replace=False).tolist())
            picks = [candidates[i] for i in idx]
        return min(picks, key=_OUTSTANDING)


class ClassAware(BaseRouter):
    """Static partitioning: a request goes only to the groups that list its class (groups
    without ``classes`` take the classes no group lists), then by ``inner`` among them
    (default ``least_outstanding``)."""

    name = "class_aware"
    class_aware = True

    def __init__(self, inner: str = "least_outstanding", **inner_params) -> None:
        if inner == "class_aware":
            raise ValueError("class_aware: inner must be another router")
        self.inner_name = inner
        self.inner = ROUTERS.create_checked(inner, **inner_params)

    @property
    def reads_kv(self) -> bool:  # type: ignore[override]
        return getattr(self.inner, "reads_kv", True)

    def bind(self, n_replicas: int, seed: int) -> None:
        super().bind(n_replicas, seed)
        self.inner.bind(n_replicas, seed)

    def route(self, req, candidates, now_ns):
        return self.inner.route(req, candidates, now_ns)


def counts_router(router) -> Callable[[list[int]], int] | None:
    """The router's ``route_counts`` (its choice from the candidates' ``outstanding`` counts
    alone, the same as ``route``'s), or None: also when the class whose ``route`` the router
    runs does not define ``route_counts`` beside it (a subclass that overrides ``route`` only)."""
    return _beside_route(router, "route_counts")


def kv_bounds_router(router) -> Callable[[list[tuple[float, float]]], int | None] | None:
    """The router's ``route_kv_bounds`` (its choice from bounds of the candidates' ``kv_used``
    where they settle it, the same as ``route``'s: :meth:`LeastKV.route_kv_bounds`), or None,
    as :func:`counts_router`."""
    return _beside_route(router, "route_kv_bounds")


def _beside_route(router, name: str):
    """The router's method ``name`` where the class whose ``route`` it runs defines it too (so
    that the two answer alike), else None."""
    for klass in type(router).__mro__:
        if "route" in vars(klass):
            return getattr(router, name, None) if name in vars(klass) else None
    return None


def _summary(cls: type) -> str:
    """A class docstring's first paragraph on one line (what ``priosim routers`` prints)."""
    return " ".join((cls.__doc__ or "").strip().split("\n\n")[0].replace("``", "").split())


for _cls in (RoundRobin, LeastOutstanding, LeastKV, PowerOfTwo, ClassAware):
    ROUTERS.register(_cls.name, _cls, _summary(_cls))
del _cls


class RouterContractError(ScenarioError):
    """A user's router answered ``route`` with something that is not one of the candidates it
    was handed. One line."""


class GuardedRouter:
    """A user's router (its class defined outside this module: a dotted or file path, or one
    registered by name), its answers checked: ``route`` must return one of the candidates (the
    same object), else :class:`RouterContractError` names the router, the request and the value.
    Everything else it has is read through unchanged; its ``route_counts``, if any, is not used
    (``counts_router``: its ``route`` answers instead, the same choice, checked)."""

    def __init__(self, inner, who: str) -> None:
        self._inner = inner
        self._who = who

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("_inner", "_who"):
            raise AttributeError(name)
        return getattr(self._inner, name)

    def __repr__(self) -> str:
        return f"guarded({self._inner!r})"

    def route(self, req, candidates, now_ns):
        rep = self._inner.route(req, candidates, now_ns)
        for c in candidates:
            if c is rep:
                return rep
        raise RouterContractError(
            f"router '{self._who}': route() returned {one_line_repr(rep)} for request "
            f"{getattr(req, 'request_id', '?')}: expected one of the {len(candidates)} replicas it was handed "
            f"(an element of candidates)")


def make_router(name: str, **params) -> contracts.Router:
    """A router by registered name or ``pkg.mod:Class`` (KeyError / ValueError / TypeError on bad
    input, or for an object that is not a :class:`policies.contracts.Router`); a user's router
    (a class not shipped here) comes guarded (:class:`GuardedRouter`)."""
    router = ROUTERS.create_checked(name, **params)
    missing = [m for m in ("name", "class_aware", "reads_kv", "bind", "route", "report") if not hasattr(router, m)]
    if missing:
        raise KeyError(f"'{name}' is not a router: it has no {', '.join(missing)} "
                       f"(expected a policies.contracts.Router; sim.routers.BaseRouter has the defaults)")
    return router if type(router).__module__ == __name__ else GuardedRouter(router, name)
