"""Longest cached prefix first (SGLang's ``lpm``): reuse the prefix cache while it is warm.

rank = (class priority, -cached prefix tokens, arrival, id) — with ``respect_priority = false``
the class is ignored, as in SGLang. The cached prefix length of a waiting request is what the
engine's prefix cache holds for it *now* (the ranking context's ``cached_prefix_tokens``, given
before each re-key to policies that set ``needs_prefix_info``; a running request keeps the
length it had when it was last ranked while waiting); the ranking therefore changes whenever
the cache does (``dynamic``). When more than ``fcfs_above`` requests wait,
matching prefixes costs more than it saves and the policy falls back to arrival order, as SGLang
does (its threshold is 128).

Measure the trade with the same scenario under ``fcfs``: hit rate (``prefix_hit_rate`` per class)
against the order the classes and arrivals asked for.
"""
from __future__ import annotations

from policies.base import RankingContext, RequestView
from policies.common import RankedPolicy, check_int


class LongestPrefixMatch(RankedPolicy):
    name = "lpm"
    description = "longest cached prefix first (SGLang), FCFS when the queue is long; optional class priority first"
    dynamic = True
    needs_prefix_info = True

    def __init__(self, fcfs_above: int = 128, respect_priority: bool = True) -> None:
        super().__init__()
        self.fcfs_above = check_int("lpm", "fcfs_above", fcfs_above, ge=0)
        if not isinstance(respect_priority, bool):
            raise ValueError(f"lpm: respect_priority must be true or false (got {respect_priority!r})")
        self.respect_priority = respect_priority
        self.queue_len = 0  # waiting requests at the last re-key
        self.cached: dict[int, int] = {}  # request id -> cached prefix tokens when last ranked waiting

    def before_ranking(self, ctx: RankingContext) -> None:
        self.queue_len = ctx.queue_len
        self.cached.update(ctx.cached_prefix_tokens)

    def on_finish(self, req: RequestView, now: float) -> None:
        super().on_finish(req, now)
        self.cached.pop(req.request_id, None)

    def key(self, req: RequestView, now: float) -> tuple:
        cached = 0 if self.queue_len > self.fcfs_above else self.cached.get(req.request_id, 0)
        head = (req.priority,) if self.respect_priority else ()
        return (*head, -cached, req.arrival_s, req.request_id)
