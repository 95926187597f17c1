"""Shortest remaining processing time with the true output length: the unattainable bound.

Rank key: ``(remaining output tokens, arrival_s, request_id)`` where *remaining* is taken when
the request enters the system. A request that never ran makes no progress while it waits, so
for admission among fresh requests this is exact SRPT. Keys stay constant between events, as the
engine's key cache requires, without re-keying every step; a running request keeps its arrival
key (its true remaining only shrinks), so its victim rank is conservative.

A preempted request also keeps its key. (Re-keying it to its smaller remaining would be the
textbook rule, but the engine's admission loop pops the heap top after evicting for a waiter,
assuming the waiter is still on top: a victim re-queued with a smaller key would be popped in the
waiter's place. Set ``rekey_on_preempt = True`` once the engine is fixed.)
Reads ``true_output_tokens``: ``oracle = True``. No parameters.
"""
from __future__ import annotations

from policies.base import RequestView
from policies.common import RankedPolicy


class SRPTOracle(RankedPolicy):
    name = "srpt_oracle"
    description = "shortest remaining output first, using the true length (simulation-only bound)"
    oracle = True

    rekey_on_preempt = False

    def __init__(self) -> None:
        self._remaining: dict[int, int] = {}

    def on_arrival(self, req: RequestView, now: float) -> None:
        self._remaining[req.request_id] = req.true_output_tokens - req.generated

    def on_preempt(self, req: RequestView, now: float) -> None:
        super().on_preempt(req, now)
        if self.rekey_on_preempt:
            self._remaining[req.request_id] = req.true_output_tokens - req.generated

    def on_finish(self, req: RequestView, now: float) -> None:
        super().on_finish(req, now)
        self._remaining.pop(req.request_id, None)

    def key(self, req: RequestView, now: float) -> tuple:
        rem = self._remaining.get(req.request_id)
        if rem is None:
            rem = self._remaining[req.request_id] = req.true_output_tokens - req.generated
        return (rem, req.arrival_s, req.request_id)
