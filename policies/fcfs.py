"""First come, first served: rank by arrival time, then id.

Running requests are ranked the same way, so a preemption victim is the latest arrival — vLLM's
FCFS rule (its V1 scheduler pops the last request of the running queue).
"""
from __future__ import annotations

from policies.base import RequestView
from policies.common import RankedPolicy


class FCFS(RankedPolicy):
    name = "fcfs"
    description = "first come, first served (arrival time, then id); no parameters"

    def key(self, req: RequestView, now: float) -> tuple:
        return (req.arrival_s, req.request_id)
