"""A ranking policy as the engine calls it: its optional parts read once, when it is bound.

A policy (:class:`policies.base.Policy`) may leave out most of what the engine could ask of it
(hooks, a declared next change, its own waiting structure, prefix information). The engine
asks :class:`BoundPolicy` instead: every optional attribute is looked up here, once, so the
engine's per-step paths call what is there without ``getattr`` fallbacks, and hooks a policy
does not override are None (skipped) rather than called to do nothing.
"""
from __future__ import annotations

from array import array
from typing import Any

from policies.base import BasePolicy, listens_before_ranking
from sim.core.request import Request

__all__ = ["BoundPolicy", "FinishBooks"]


def _overrides(policy: Any, hook: str) -> bool:
    """Does ``policy`` have ``hook`` of its own (not BasePolicy's, which does nothing)?"""
    if policy is None:
        return False
    own = getattr(type(policy), hook, None)
    return own is not None and own is not getattr(BasePolicy, hook)


def _no_change(now_s: float) -> None:
    """No change declared (a policy without ``next_change``)."""
    return None


def _nothing(req: Any, now_s: float) -> None:
    """A hook the policy does not have."""


def _no_report() -> dict:
    """No books to report (a policy without ``report``)."""
    return {}


class BoundPolicy:
    """The engine's view of ``policy`` (a :class:`policies.base.Policy`).

    Attributes: ``policy`` (the object itself), ``name``, ``report()`` (its books), ``key(req,
    now_s)`` (its ranking key), ``next_change(now_s)``, ``on_preempt`` / ``on_finish``
    (always called), ``on_arrival`` / ``on_scheduled`` / ``on_scheduled_run`` /
    ``before_ranking`` (None when the policy keeps no such books), ``dynamic`` (re-key
    before every plan), ``static_ranking`` (keys never change on their own: not dynamic and
    no declared next change), ``oracle`` (may read true output lengths), ``prefix_info``
    (wants each waiting request's cached prefix before a re-key), ``own_queues`` (its own
    waiting structure, or None for the engine's heap).
    """

    __slots__ = ("policy", "name", "key", "next_change", "on_preempt", "on_finish", "on_arrival",
                 "on_scheduled", "on_scheduled_run", "before_ranking", "dynamic", "static_ranking",
                 "oracle", "prefix_info", "own_queues", "report")

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.name: str = getattr(policy, "name", type(policy).__name__)
        self.key: Any = getattr(policy, "key", None)
        self.next_change = getattr(policy, "next_change", _no_change)
        self.on_preempt = getattr(policy, "on_preempt", _nothing)
        self.on_finish = getattr(policy, "on_finish", _nothing)
        # a policy whose hooks only record each finished request (policies.common.RankedPolicy)
        # hands over its records' storage: the engine writes them without a Python call
        # (its class's own: a wrapper that forwards attributes, the guard, keeps its hooks)
        storage = policy.native_books() if getattr(type(policy), "native_books", None) is not None else None
        if storage is not None:
            native = FinishBooks(*storage)
            self.on_preempt = native.on_preempt
            self.on_finish = native.on_finish
        self.report = getattr(policy, "report", _no_report)
        self.prefix_info = bool(getattr(policy, "needs_prefix_info", False))
        # a policy may keep the waiting set in its own structure (the fairness accountant's
        # per-tenant queues): then pushes and pops go to it and a re-key is its own
        queues = getattr(policy, "waiting_queues", None)
        self.own_queues = queues() if queues is not None and not self.prefix_info else None
        self.dynamic = bool(getattr(policy, "dynamic", False))
        self.oracle = bool(getattr(policy, "oracle", False))
        # told before each re-key when it listens (its own hook, or the default that keeps
        # older prefix-aware policies' queue_len)
        hook = getattr(policy, "before_ranking", None)
        self.before_ranking = hook if listens_before_ranking(policy) or (hook is not None and self.prefix_info) else None
        self.on_arrival = policy.on_arrival if _overrides(policy, "on_arrival") else None
        self.on_scheduled = policy.on_scheduled if _overrides(policy, "on_scheduled") else None
        # (optional: a policy that books each step of a fast-forwarded run, not the run's totals)
        self.on_scheduled_run = getattr(policy, "on_scheduled_run", None) if self.on_scheduled is not None else None
        self.static_ranking = not self.dynamic and (not hasattr(policy, "next_change")
                                                     or not _overrides(policy, "next_change"))

    def key_tuple(self, req: Any, now_s: float) -> tuple:
        """The policy's key of ``req`` at ``now_s``, as a tuple."""
        k = self.key(req, now_s)
        return k if type(k) is tuple else tuple(k)


class FinishBooks:
    """What :class:`policies.common.RankedPolicy`'s ``on_preempt`` and ``on_finish`` do, written
    by the engine into the policy's own records (``arrival``, ``admitted``, ``size``: typed arrays;
    ``first_admit``: request id -> first admission, s, of a preempted request not finished yet):
    in the compiled build a native call per finished request, not a Python frame (about 1 % of a
    million-request run). The same values in the same order as the policy's hooks write."""

    def __init__(self, arrival: array, admitted: array, size: array, first_admit: dict) -> None:
        self.arrival = arrival
        self.admitted = admitted
        self.size = size
        self.first_admit: dict[int, float] = first_admit

    def on_preempt(self, req: Request, now_s: float) -> None:
        first = self.first_admit
        if req.request_id not in first:
            first[req.request_id] = req.admitted_s

    def on_finish(self, req: Request, now_s: float) -> None:
        self.arrival.append(req.arrival_s)
        first = self.first_admit
        self.admitted.append(first.pop(req.request_id, req.admitted_s) if first else req.admitted_s)
        self.size.append(req.generated)
