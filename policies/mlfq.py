"""Skip-join multi-level feedback queue, after FastServe (Wu et al. 2023, arXiv:2305.05920).

Levels ``0 .. levels-1`` (0 most urgent) have quanta ``q_i = base_quantum_s * ratio**i``. A new
request *skip-joins* the first level whose quantum covers its estimated prefill time
(``prompt_tokens * prefill_token_s``), so a long prompt does not block the top level. It is
demoted one level each time its attained service at its level (engine seconds of the steps it ran
in) uses up that level's quantum; the last level has no quantum. A request that has made no
progress for ``starve_limit_s`` seconds is promoted back to level 0 with a fresh quantum.
Within a level, FCFS. Rank key: ``(level, arrival_s, request_id)`` for waiting and running
requests, so under KV pressure the engine's victims are the most-demoted latest arrivals.

Keys change only at a quantum expiry of a request being served or at a starvation deadline; the
policy declares the earliest of these as ``next_change``, so the engine re-keys then and never
fast-forwards past it. (Whether a waiting request may evict a running one of the same class is the
engine's ``preempt_for_waiting`` setting, which is class-based: within one class the levels act
at admission and on victim choice.) A preempted request keeps its level and restarts its quantum.
Caveat: the engine reads ``next_change`` before a step, so a demotion that happens inside a
request's first step after admission (a quantum shorter than that step) is seen one step late.

FastServe's mechanism, and where this differs:

* skip-join by estimated prefill time: as the paper (``skip_join = false`` makes every request
  join level 0, the plain MLFQ the paper compares with);
* demotion by quantum, quanta doubling: as the paper, but the quantum is engine seconds of the
  steps a request ran in (the paper counts iteration time on its own profiler's table);
* starvation promotion to the top queue: as the paper (its threshold is a waiting time; here,
  time without progress, which is the same for a waiting request);
* token-level preemption: the engine's ``preempt_for_waiting = "policy"`` (a waiting request
  evicts a running one the policy ranks below it at any step);
* proactive KV swapping: the engine's ``preemption = "swap"`` with ``swap_overlap = true`` (KV
  transfers run beside the step's compute instead of adding to it). The paper also uploads a
  swapped request's KV *before* it is scheduled, from the queue order; priosim swaps in at
  admission, so with ``swap_overlap`` the upload is hidden only within the admitting step.
* the paper runs FastServe's own distributed engine (pipeline-parallel, its own batching);
  priosim models one replica with vLLM-style continuous batching.

Parameters:
    levels: number of levels (>= 1). base_quantum_s: level-0 quantum, s (> 0). ratio: quantum
    growth per level (>= 1). starve_limit_s: seconds without progress before promotion to the top
    (> 0; None disables). prefill_token_s: estimated prefill seconds per prompt token, for
    skip-join (>= 0; the default is about an H200 running an 8B model). skip_join: choose the first
    level by the prefill estimate (default true) or start every request at level 0 (false).
"""
from __future__ import annotations

import math

from policies.base import RequestView
from policies.common import RankedPolicy, StarvationClock, check_int, check_number


class MLFQ(RankedPolicy):
    name = "mlfq"
    description = "FastServe skip-join multi-level feedback queue: quanta grow by ratio; starvation promotion"

    def __init__(self, levels: int = 6, base_quantum_s: float = 0.05, ratio: float = 2.0,
                 starve_limit_s: float | None = 30.0, prefill_token_s: float = 3e-5,
                 skip_join: bool = True) -> None:
        self.levels = check_int("mlfq", "levels", levels, ge=1)
        self.base_quantum_s = check_number("mlfq", "base_quantum_s", base_quantum_s, gt=0)
        self.ratio = check_number("mlfq", "ratio", ratio, ge=1)
        self.starve_limit_s = check_number("mlfq", "starve_limit_s", starve_limit_s, gt=0, allow_none=True)
        self.prefill_token_s = check_number("mlfq", "prefill_token_s", prefill_token_s, ge=0)
        if not isinstance(skip_join, bool):
            raise ValueError(f"mlfq: skip_join must be true or false (got {skip_join!r})")
        self.skip_join = skip_join
        self.quanta = [self.base_quantum_s * self.ratio ** i for i in range(self.levels)]
        self._entry: dict[int, tuple[int, float]] = {}  # id -> (level entered, attained then)
        self._clock = StarvationClock(starve_limit_s) if starve_limit_s else None
        self._hot: dict[int, RequestView] = {}  # scheduled in the step that ended at _hot_t
        self._hot_t = -math.inf
        self.promotions = 0

    def join_level(self, req: RequestView) -> int:
        if not self.skip_join:
            return 0
        est = req.prompt_tokens * self.prefill_token_s
        for i, q in enumerate(self.quanta):
            if q >= est:
                return i
        return self.levels - 1

    def _level(self, req: RequestView) -> tuple[int, float]:
        """(current level, seconds of its quantum left; inf on the last level)."""
        j, a0 = self._entry[req.request_id]
        used = req.attained_s - a0
        while j < self.levels - 1 and used >= self.quanta[j] - 1e-12:
            used -= self.quanta[j]
            j += 1
        left = math.inf if j == self.levels - 1 else self.quanta[j] - used
        return j, left

    def on_arrival(self, req: RequestView, now: float) -> None:
        self._entry[req.request_id] = (self.join_level(req), req.attained_s)
        if self._clock is not None:
            self._clock.add(req, now)

    def key(self, req: RequestView, now: float) -> tuple:
        rid = req.request_id
        if rid not in self._entry:
            self.on_arrival(req, now)
        if self._clock is not None and self._clock.starved(req, now):
            if self._level(req)[0] > 0:
                self.promotions += 1
            self._entry[rid] = (0, req.attained_s)
            self._clock.reset(req, now)
        level, _ = self._level(req)
        return (level, req.arrival_s, rid)

    def on_scheduled(self, req: RequestView, tokens: int, service_s: float, now: float) -> None:
        if now != self._hot_t:
            self._hot = {}
            self._hot_t = now
        self._hot[req.request_id] = req

    def next_change(self, now: float) -> float | None:
        t = math.inf
        if self._hot_t == now:
            for r in self._hot.values():
                if r.request_id in self._entry:
                    t = min(t, now + self._level(r)[1])
        if self._clock is not None:
            d = self._clock.next_deadline(now)
            if d is not None:
                t = min(t, d)
        return None if t == math.inf else t

    def on_preempt(self, req: RequestView, now: float) -> None:
        super().on_preempt(req, now)
        # keep the level, restart its quantum: a waiting request then always holds a whole
        # quantum, which its first step after re-admission does not exhaust in the usual case
        self._entry[req.request_id] = (self._level(req)[0], req.attained_s)
        self._hot.pop(req.request_id, None)
        if self._clock is not None:
            self._clock.reset(req, now)

    def on_finish(self, req: RequestView, now: float) -> None:
        super().on_finish(req, now)
        self._entry.pop(req.request_id, None)
        self._hot.pop(req.request_id, None)
        if self._clock is not None:
            self._clock.remove(req)

    def report(self) -> dict:
        return {**super().report(), "promotions": self.promotions, "quanta_s": self.quanta}
