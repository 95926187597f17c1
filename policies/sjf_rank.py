"""Shortest job first by a predicted rank, with an optional starvation guard.

After Fu et al. 2024 (arXiv:2408.15792) and vllm-ltr: a predictor scores each request once, at
arrival, and the scheduler serves the smallest predicted output length first. Only the order of
scores matters. Rank key::

    (tier, predicted tokens, arrival_s, request_id)

``tier`` is 1 normally and 0 once the starvation guard has promoted the request: a request that
has made no progress (not arrived, not scheduled) for ``starve_limit_s`` seconds moves ahead of
every unpromoted request and stays there until it finishes (promoted requests are ordered
among themselves by predicted tokens, then arrival). The policy declares the next such promotion as its ``next_change``, so
fast-forward stays exact.

Parameters:
    predictor: ``oracle`` | ``noisy`` | ``learned`` | ``ranker`` | ``pkg.mod:Class`` (or a ``{name = ...}``
        table); remaining keyword parameters (e.g. ``tau = 0.7``) go to the predictor.
    starve_limit_s: seconds without progress before promotion (> 0), or None (default) for no
        guard.
"""
from __future__ import annotations

from typing import Any

from policies.base import RequestView
from policies.common import RankedPolicy, StarvationClock, check_number
from policies.predictors import make_predictor


class SJFRank(RankedPolicy):
    name = "sjf_rank"
    description = "shortest predicted output first (oracle / noisy tau / learned ranker), starvation guard"

    def __init__(self, predictor: Any = "oracle", starve_limit_s: float | None = None,
                 **predictor_params: Any) -> None:
        self.predictor = make_predictor(predictor, **predictor_params)
        self.oracle = self.predictor.oracle
        self.starve_limit_s = check_number("sjf_rank", "starve_limit_s", starve_limit_s, gt=0,
                                           allow_none=True)
        self._clock = StarvationClock(starve_limit_s) if starve_limit_s else None
        self._promoted: set[int] = set()
        self.promotions = 0

    def bind(self, classes: dict[str, dict], seed: int) -> None:
        super().bind(classes, seed)
        self.predictor.bind(seed)

    def on_arrival(self, req: RequestView, now: float) -> None:
        self.predictor.estimate(req, now)
        if self._clock is not None:
            self._clock.add(req, now)

    def key(self, req: RequestView, now: float) -> tuple:
        rid = req.request_id
        if self._clock is not None and rid not in self._promoted and self._clock.starved(req, now):
            self._promoted.add(rid)
            self._clock.remove(req)
            self.promotions += 1
        tier = 0 if rid in self._promoted else 1
        return (tier, self.predictor.estimate(req, now), req.arrival_s, rid)

    def next_change(self, now: float) -> float | None:
        return None if self._clock is None else self._clock.next_deadline(now)

    def on_preempt(self, req: RequestView, now: float) -> None:
        super().on_preempt(req, now)
        if self._clock is not None:
            self._clock.reset(req, now)

    def on_finish(self, req: RequestView, now: float) -> None:
        super().on_finish(req, now)
        self.predictor.observe(req, now)
        self._promoted.discard(req.request_id)
        if self._clock is not None:
            self._clock.remove(req)

    def report(self) -> dict:
        return {**super().report(), "predictor": self.predictor.report(), "promotions": self.promotions}
