"""Strict priority by class: rank = (class priority, arrival, id); 0 is most urgent.

FCFS within a class. Running requests are ranked the same way, so the engine's victims are the
least urgent class's latest arrivals — vLLM V0's ``(priority, arrival)`` rule. Whether a waiting
request may take a slot or KV blocks from a running one is the engine's ``preempt_for_waiting``
setting; with ``"never"`` priority acts only at admission (non-preemptive priority).
"""
from __future__ import annotations

from policies.base import RequestView
from policies.common import RankedPolicy


class Priority(RankedPolicy):
    name = "priority"
    description = "strict priority by class (0 most urgent), FCFS within a class; no parameters"

    def key(self, req: RequestView, now: float) -> tuple:
        return (req.priority, req.arrival_s, req.request_id)
