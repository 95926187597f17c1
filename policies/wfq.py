"""Weighted fair queuing across classes, with start-time virtual clocks.

Each request is stamped once, at arrival, with a virtual start and finish time::

    S = max(V(now), F_prev[class])        F = S + cost / w[class]

where ``F_prev[class]`` is the finish stamp of the class's previous request and ``V(now)`` is the
system's virtual time: the smallest start stamp among requests still in the system (waiting or
running), or the last such value when the system is empty (monotone non-decreasing). Rank key:
``(F, arrival_s, request_id)`` for waiting and running requests alike, so the engine admits the
smallest F first and preempts the largest.

Under contention each backlogged class k receives about ``w_k / sum(w)`` of the admitted cost
(tokens, when cost is a token count and lengths are alike), and a class with a non-zero weight
never starves: its stamps grow only with its own service, so later arrivals of heavy classes
stamp past it.

Parameters:
    weights: class name -> weight (> 0). Classes not listed get ``default_weight``.
    default_weight: weight of unlisted classes (> 0, default 1).
    cost: what a request costs in virtual time, in tokens: ``"declared"`` = prompt + declared
        ``max_tokens`` (default), ``"prompt"`` = prompt tokens, ``"predicted"`` = prompt + the
        output length a predictor (``predictor``) estimates. Never the true output length.
    predictor: predictor name (see ``policies.PREDICTORS``) for ``cost = "predicted"``;
        ``predictor_params`` its parameters.
"""
from __future__ import annotations

import heapq
from typing import Any

from policies.base import RequestView
from policies.common import RankedPolicy, check_choice, check_number

COSTS = ("declared", "prompt", "predicted")


class WFQ(RankedPolicy):
    name = "wfq"
    description = "weighted fair queuing across classes: smallest virtual finish time S + cost/w first"

    def __init__(self, weights: dict | None = None, default_weight: float = 1.0,
                 cost: str = "declared", predictor: str | None = None,
                 predictor_params: dict | None = None) -> None:
        if not isinstance(weights, (dict, type(None))):
            raise ValueError(f"wfq: weights must be a table of class name -> weight (got {weights!r})")
        self.weights = dict(weights or {})
        for k, v in self.weights.items():
            check_number("wfq", f"weights.{k}", v, gt=0)
        self.default_weight = check_number("wfq", "default_weight", default_weight, gt=0)
        self.cost = check_choice("wfq", "cost", cost, COSTS)
        self.predictor = None
        if cost == "predicted":
            from policies.predictors import make_predictor
            self.predictor = make_predictor(predictor or "learned", **(predictor_params or {}))
            self.oracle = self.predictor.oracle
        elif predictor is not None or predictor_params:
            raise ValueError(f"wfq: predictor is used only with cost = 'predicted' (got cost = {cost!r})")
        self._v = 0.0
        self._starts: list[tuple[float, int]] = []  # heap of (S, id) of live requests
        self._live: set[int] = set()
        self._last_f: dict[str, float] = {}
        self._tags: dict[int, tuple[float, float]] = {}

    def bind(self, classes: dict[str, dict], seed: int) -> None:
        super().bind(classes, seed)
        unknown = sorted(set(self.weights) - set(classes))
        if unknown:
            raise ValueError(f"wfq: weights.{unknown[0]} names no class "
                             f"(expected one of {', '.join(classes)})")
        if self.predictor is not None:
            self.predictor.bind(seed)

    def weight(self, cls: str) -> float:
        return self.weights.get(cls, self.default_weight)

    def virtual_time(self) -> float:
        """V(now): the smallest start stamp of a live request (else the last value)."""
        while self._starts and self._starts[0][1] not in self._live:
            heapq.heappop(self._starts)
        if self._starts:
            self._v = max(self._v, self._starts[0][0])
        return self._v

    def request_cost(self, req: RequestView, now: float) -> float:
        if self.cost == "declared":
            return float(req.prompt_tokens + req.max_tokens)
        if self.cost == "prompt":
            return float(req.prompt_tokens)
        return float(req.prompt_tokens) + self.predictor.estimate(req, now)

    def on_arrival(self, req: RequestView, now: float) -> None:
        s = max(self.virtual_time(), self._last_f.get(req.cls, 0.0))
        f = s + self.request_cost(req, now) / self.weight(req.cls)
        self._last_f[req.cls] = f
        self._tags[req.request_id] = (s, f)
        self._live.add(req.request_id)
        heapq.heappush(self._starts, (s, req.request_id))

    def key(self, req: RequestView, now: float) -> tuple:
        tag = self._tags.get(req.request_id)
        if tag is None:  # a request the policy was not told about: stamp it now
            self.on_arrival(req, now)
            tag = self._tags[req.request_id]
        return (tag[1], req.arrival_s, req.request_id)

    def on_finish(self, req: RequestView, now: float) -> None:
        super().on_finish(req, now)
        self._live.discard(req.request_id)
        self._tags.pop(req.request_id, None)
        if self.predictor is not None:
            self.predictor.observe(req, now)

    def report(self) -> dict:
        out = super().report()
        out["virtual_time_end"] = self.virtual_time()
        if self.predictor is not None:
            out["predictor"] = self.predictor.report()
        return out
