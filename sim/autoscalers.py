"""Autoscaling policies: how many replicas a cluster group wants, decided at fixed ticks.

A group with ``autoscale = {policy = ..., min, max, interval_s, provision_s}`` (docs/autoscaling.md)
is resized by :mod:`sim.cluster.autoscale` every ``interval_s`` seconds of simulated time. At a
tick the controller hands the group's policy an :class:`Observation` (what a real autoscaler
could scrape then: each serving replica's running and waiting counts and KV use, and the
requests that ended in the group recently) and the policy returns the number of replicas it
wants. The controller clamps that to ``[min, max]`` and provisions or drains the difference; a
policy never touches a replica.

Policies are registered like routers (``AUTOSCALERS``, a :class:`plumbing.registry.Registry`)
and found by name or by ``pkg.mod:Class``. A policy is one class with ``desired(obs) -> int``;
its parameters are its ``__init__``'s keyword arguments, checked there (``ValueError``). The
registry sits in the scenario's layer because the scenario's validation builds the policy it
names (:mod:`sim.tables`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from plumbing.numbers import in_range
from plumbing.registry import Registry

AUTOSCALERS = Registry("autoscaler")


@dataclass(frozen=True)
class ReplicaState:
    """One serving replica at a tick: requests running and waiting (queued or routed, not yet
    taken in), its running-slot limit (``engine.max_num_seqs``) and the fraction of its device
    KV blocks in use (0..1)."""

    running: int
    waiting: int
    max_running: int
    kv_used: float


@dataclass(frozen=True)
class Ended:
    """A request of the group that ended (finished) before the tick: when (s), its class, its
    TTFT (s) and TPOT (s; NaN with fewer than two tokens)."""

    end_s: float
    cls: str
    ttft_s: float
    tpot_s: float


@dataclass(frozen=True)
class Observation:
    """What a group's policy sees at a tick at ``now_s``: its ``serving`` replicas' states,
    how many are still provisioning (count toward the current size) and draining (do not),
    and the requests that ended in the group over the controller's look-back (``ended``, oldest
    first; the SLO policy keeps those inside its own window)."""

    now_s: float
    serving: Sequence[ReplicaState]
    provisioning: int
    draining: int
    ended: Sequence[Ended] = field(default_factory=tuple)

    @property
    def current(self) -> int:
        """The replicas the group has or is bringing up (serving + provisioning)."""
        return len(self.serving) + self.provisioning


class BaseAutoscaler:
    """Defaults: ``look_back_s`` (how far back the controller keeps ended requests for this
    policy; 0: none), ``class_params`` (the parameters that name classes: a class name or a list
    of them, checked against the scenario's when it is read; none) and ``report`` (nothing)."""

    name = "base"
    look_back_s = 0.0
    class_params: tuple[str, ...] = ()

    def desired(self, obs: Observation) -> int:  # pragma: no cover - the contract
        raise NotImplementedError

    def report(self) -> dict:
        return {}


def _check(name: str, v, expected: str, **bound) -> None:
    if not in_range(v, **bound):
        raise ValueError(f"{name}: expected {expected} (got {v!r})")


class TargetUtilisation(BaseAutoscaler):
    """Keep the mean utilisation of the serving replicas at ``target``: KV use (``metric =
    "kv"``) or running slots (``"running"``, running / max_num_seqs); wants ceil(serving x
    mean / target), as Kubernetes' HPA does. Tolerance ``tolerance`` (0.1): no change while
    mean / target is within 1 +- tolerance."""

    name = "target_utilisation"

    def __init__(self, target: float = 0.7, metric: str = "kv", tolerance: float = 0.1) -> None:
        _check("target", target, "a number in (0, 1]", gt=0, le=1)
        if metric not in ("kv", "running"):
            raise ValueError(f"metric: expected 'kv' or 'running' (got {metric!r})")
        _check("tolerance", tolerance, "a number in [0, 1)", ge=0, lt=1)
        self.target, self.metric, self.tolerance = float(target), metric, float(tolerance)

    def utilisation(self, r: ReplicaState) -> float:
        return r.kv_used if self.metric == "kv" else r.running / max(r.max_running, 1)

    def desired(self, obs: Observation) -> int:
        if not obs.serving:
            return obs.current
        mean = sum(self.utilisation(r) for r in obs.serving) / len(obs.serving)
        ratio = mean / self.target
        if abs(ratio - 1) <= self.tolerance:
            return obs.current
        return math.ceil(len(obs.serving) * ratio - 1e-9)


class QueueLength(BaseAutoscaler):
    """Keep ``target`` requests per replica: outstanding (running + waiting, ``metric =
    "outstanding"``) or waiting only (``"waiting"``, KEDA's queue-length scaler); wants
    ceil(total / target)."""

    name = "queue_length"

    def __init__(self, target: float = 8.0, metric: str = "outstanding") -> None:
        _check("target", target, "a number > 0", gt=0)
        if metric not in ("outstanding", "waiting"):
            raise ValueError(f"metric: expected 'outstanding' or 'waiting' (got {metric!r})")
        self.target, self.metric = float(target), metric

    def desired(self, obs: Observation) -> int:
        total = sum(r.waiting + (r.running if self.metric == "outstanding" else 0) for r in obs.serving)
        return math.ceil(total / self.target - 1e-9)


class SLO(BaseAutoscaler):
    """Scale on an observed latency percentile: the ``percentile`` of ``metric`` ("ttft" or
    "tpot") over the requests (of ``classes``, default all) that ended in the last ``window_s``
    seconds, against ``target_s``: above it, ``step`` replicas more; below ``low`` x target_s,
    one fewer; else (or with fewer than ``min_samples`` requests in the window) no change."""

    name = "slo"
    class_params = ("classes",)

    def __init__(self, target_s: float = 1.0, metric: str = "ttft", percentile: float = 99.0,
                 window_s: float = 60.0, low: float = 0.5, step: int = 1, min_samples: int = 10,
                 classes: list[str] | None = None) -> None:
        _check("target_s", target_s, "a number > 0 (seconds)", gt=0)
        if metric not in ("ttft", "tpot"):
            raise ValueError(f"metric: expected 'ttft' or 'tpot' (got {metric!r})")
        _check("percentile", percentile, "a number in (0, 100]", gt=0, le=100)
        _check("window_s", window_s, "a number > 0 (seconds)", gt=0)
        _check("low", low, "a number in [0, 1)", ge=0, lt=1)
        _check("step", step, "an integer >= 1", integer=True, ge=1)
        _check("min_samples", min_samples, "an integer >= 1", integer=True, ge=1)
        if classes is not None and not (isinstance(classes, list) and all(isinstance(c, str) for c in classes)):
            raise ValueError(f"classes: expected a list of class names (got {classes!r})")
        self.target_s, self.metric, self.percentile = float(target_s), metric, float(percentile)
        self.window_s, self.low, self.step, self.min_samples = float(window_s), float(low), step, min_samples
        self.classes = set(classes) if classes is not None else None
        self.look_back_s = self.window_s

    def observed(self, obs: Observation) -> float | None:
        """The percentile over the window (s), or None with too few samples."""
        since = obs.now_s - self.window_s
        xs = [e.ttft_s if self.metric == "ttft" else e.tpot_s for e in obs.ended
              if e.end_s > since and (self.classes is None or e.cls in self.classes)]
        xs = [x for x in xs if x == x]  # (TPOT is NaN for one-token answers)
        if len(xs) < self.min_samples:
            return None
        # (numpy's default, linear interpolation: the percentile the results report)
        return float(np.percentile(np.asarray(xs), self.percentile))

    def desired(self, obs: Observation) -> int:
        p = self.observed(obs)
        if p is None:
            return obs.current
        if p > self.target_s:
            return obs.current + self.step
        if p < self.low * self.target_s:
            return obs.current - 1
        return obs.current


class Schedule(BaseAutoscaler):
    """Replica count by time of day: ``table = [[t_s, replicas], ...]`` (t_s from the start of
    the run, increasing, the first at 0); the count of the last row at or before the tick.
    ``period_s`` (optional) repeats the table (e.g. 86400 for a day, or a compressed day's
    length)."""

    name = "schedule"

    def __init__(self, table: list | None = None, period_s: float | None = None) -> None:
        ok = isinstance(table, list) and bool(table) and all(
            isinstance(r, (list, tuple)) and len(r) == 2 and in_range(r[0], ge=0)
            and in_range(r[1], integer=True, ge=0) for r in table)
        if not ok or table is None:
            raise ValueError(f"table: expected a non-empty list of [t_s, replicas] pairs (got {table!r})")
        ts = [float(r[0]) for r in table]
        if ts[0] != 0 or any(b <= a for a, b in zip(ts, ts[1:])):
            raise ValueError(f"table: expected times increasing from 0 (got {ts})")
        if period_s is not None:
            _check("period_s", period_s, "a number > 0 (seconds)", gt=0)
            if ts[-1] >= period_s:
                raise ValueError(f"table: times must be below period_s={period_s} (got {ts[-1]})")
        self.times, self.counts = ts, [int(r[1]) for r in table]
        self.period_s = float(period_s) if period_s is not None else None

    def desired(self, obs: Observation) -> int:
        t = obs.now_s % self.period_s if self.period_s else obs.now_s
        k = 0
        for i, t0 in enumerate(self.times):
            if t0 <= t + 1e-9:
                k = i
        return self.counts[k]


for _cls in (TargetUtilisation, QueueLength, SLO, Schedule):
    # (the docstring's first paragraph on one line, what ``priosim autoscalers`` prints)
    AUTOSCALERS.register(_cls.name, _cls, " ".join((_cls.__doc__ or "").split("\n\n")[0].replace("``", "").split()))
del _cls


def make_autoscaler(name: str, **params) -> BaseAutoscaler:
    """A policy by registered name or ``pkg.mod:Class`` (KeyError / ValueError / TypeError on bad
    input, or for an object without ``desired``)."""
    policy = AUTOSCALERS.create_checked(name, **params)
    if not callable(getattr(policy, "desired", None)):
        raise KeyError(f"'{name}' is not an autoscaler: it has no desired(obs) method "
                       f"(sim.autoscalers.BaseAutoscaler has the defaults)")
    return policy
