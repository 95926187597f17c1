"""Priority with aging: effective priority falls linearly with time in the system.

    p_eff(now) = p_base - alpha * (now - arrival_s)          (smaller is more urgent)

FCFS among equals. Every request ages at the same rate, so the order of any two requests never
changes with time; the rank key is therefore the time-invariant ``p_eff(now) + alpha * now``::

    key = (p_base + alpha * arrival_s, arrival_s, request_id)

and no re-keying is needed (``dynamic = False``, no ``next_change``). A class-``p_low`` request is
served before every class-``p_high`` request that arrived more than ``(p_low - p_high) / alpha``
seconds after it, so its extra wait over a more urgent class is bounded by that plus one service
time (non-preemptive). ``alpha = 0`` is strict priority. Running requests are ranked the same way.

Parameters:
    alpha: aging rate, priority levels per second (>= 0).
"""
from __future__ import annotations

from policies.base import RequestView
from policies.common import RankedPolicy, check_number


class Aging(RankedPolicy):
    name = "aging"
    description = "priority aging: p_base - alpha x time in system (smaller first), FCFS among equals"

    def __init__(self, alpha: float = 0.1) -> None:
        self.alpha = float(check_number("aging", "alpha", alpha, ge=0))

    def key(self, req: RequestView, now: float) -> tuple:
        return (req.priority + self.alpha * req.arrival_s, req.arrival_s, req.request_id)
