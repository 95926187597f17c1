"""Shared pieces of the shipped policies: parameter checks, the SRPT-order score, a starvation clock.

``RankedPolicy`` is :class:`~policies.base.BasePolicy` plus one per-run figure every shipped
policy reports: how close its admission order came to SRPT's (``srpt_order_tau``, below).
"""
from __future__ import annotations

import heapq
import math
from array import array
from typing import Any

import numpy as np

from plumbing.numbers import bounds_text, in_range
from policies.base import BasePolicy, RequestView


# ---- parameter validation: "<policy>: <param> must be ... (got ...)" -----------------------
def check_number(policy: str, name: str, value: Any, *, gt: float | None = None,
                 ge: float | None = None, le: float | None = None, allow_none: bool = False) -> Any:
    """Return ``value`` if it is a finite number within bounds, else raise ``ValueError``."""
    if value is None and allow_none:
        return None
    if not in_range(value, gt=gt, ge=ge, le=le):
        what = bounds_text(gt=gt, ge=ge, le=le)
        expect = "a finite number" + (" " + what if what else "")
        raise ValueError(f"{policy}: {name} must be {expect} (got {value!r})")
    return value


def check_int(policy: str, name: str, value: Any, *, ge: int) -> int:
    if not in_range(value, ge=ge, integer=True):
        raise ValueError(f"{policy}: {name} must be an integer >= {ge} (got {value!r})")
    return value


def check_choice(policy: str, name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{policy}: {name} must be one of {', '.join(map(repr, choices))} (got {value!r})")
    return value


# ---- how close an admission order came to SRPT's ----------------------------------------------
def srpt_order_tau(arrival: np.ndarray, admitted: np.ndarray, size: np.ndarray,
                   max_pairs: int = 2_000_000, seed: int = 0, chunk_pairs: int = 1 << 13) -> tuple[float, int]:
    """Kendall-type agreement between the order requests were admitted in and SRPT's order.

    Only pairs that competed are compared: both were waiting at the same moment (each arrived
    before the other was first admitted). SRPT admits the shorter of such a pair first, so a pair
    is concordant when the one admitted earlier has the smaller size, discordant when it has the
    larger. Pairs tied in admission time or size are not counted.
    tau = (concordant - discordant) / (concordant + discordant): 1 = SRPT's order, about 0 for an
    order blind to size (FCFS), -1 = longest first. Returns (tau, pairs); tau is NaN with no pairs.
    When more than ``max_pairs`` pairs exist, a seeded sample of rows is used. ``chunk_pairs``:
    about how many pairs are compared at a time (memory and speed only, never the result).
    """
    order = np.argsort(arrival, kind="stable")
    a, t, s = arrival[order], admitted[order], size[order]
    n = len(a)
    hi = np.searchsorted(a, t, side="left")  # rows j >= i+1 with a_j < t_i competed with i
    counts = np.maximum(hi - np.arange(n) - 1, 0)
    rows = np.arange(n)
    total = int(counts.sum())
    if total > max_pairs:
        keep = max(1, int(n * max_pairs / total))
        rows = np.sort(np.random.default_rng(seed).choice(n, size=keep, replace=False))
    # every pair (i, j), i in rows, i < j < hi[i], as two index arrays, for a run of rows of about
    # ``chunk_pairs`` pairs at a time: each run's temporaries (64 KiB) are reused heap memory, not
    # fresh pages the kernel maps and zeroes as ~9 MB arrays of all ~1M pairs of a replica are (and
    # chunks of 128 KiB and more are), and stay in cache: half the time; the counts are exact
    # integers, so the chunking changes nothing
    rows = rows[counts[rows] > 0]
    reps = counts[rows]
    ends = np.cumsum(reps)
    cuts = np.searchsorted(ends, np.arange(chunk_pairs, int(ends[-1]) if len(ends) else 0, chunk_pairs))
    bounds = [0, *np.unique(cuts + 1).tolist(), len(rows)]
    conc = disc = 0
    for lo, hi_ in zip(bounds[:-1], bounds[1:]):
        if lo < hi_:
            c, d = _pair_signs(t, s, rows[lo:hi_], reps[lo:hi_])
            conc, disc = conc + c, disc + d
    pairs = conc + disc
    return ((conc - disc) / pairs if pairs else math.nan), pairs


def _pair_signs(t: np.ndarray, s: np.ndarray, rows: np.ndarray, reps: np.ndarray) -> tuple[int, int]:
    """Concordant and discordant pairs (i, i + 1 + k), k < reps of row i, for the given rows."""
    # the k-th pair of row i has j = i + 1 + k; rows' own values repeated (contiguous, not
    # gathered), signs as int8: a third less time than float signs of gathered pairs
    first = np.cumsum(reps) - reps
    j = np.arange(int(reps.sum())) + np.repeat(rows + 1 - first, reps)
    dt = t[j] - np.repeat(t[rows], reps)
    ds = s[j] - np.repeat(s[rows], reps)
    prod = ((dt > 0).view(np.int8) - (dt < 0).view(np.int8)) * ((ds > 0).view(np.int8) - (ds < 0).view(np.int8))
    return int(np.count_nonzero(prod > 0)), int(np.count_nonzero(prod < 0))


class RankedPolicy(BasePolicy):
    """BasePolicy that records each finished request's first admission and true length (known
    once it has finished) and reports ``srpt_order_tau`` (see :func:`srpt_order_tau`)."""

    # the records, made at first use (subclasses need not call an __init__): per finished
    # request its arrival, first admission and size (three typed arrays: numpy reads them as
    # they are, where a list's million Python numbers, scattered over the heap by the time the
    # run ends, took 0.3 s to convert), and the first admission of each preempted request not
    # finished yet
    _lists: tuple[array, array, array] | None = None

    def _records(self) -> dict:
        if self._lists is None:
            self._lists = (array("d"), array("d"), array("q"))
            self._first_admit: dict[int, float] = {}
        return dict(zip(("arrival", "admitted", "size"), self._lists))

    def on_preempt(self, req: RequestView, now: float) -> None:
        self._records()
        self._first_admit.setdefault(req.request_id, req.admitted_s)

    def on_finish(self, req: RequestView, now: float) -> None:
        # (once per request: the records read in one attribute, without a call)
        if self._lists is None:
            self._records()
        arrival, admitted, size = self._lists  # type: ignore[misc]
        arrival.append(req.arrival_s)
        admitted.append(self._first_admit.pop(req.request_id, req.admitted_s) if self._first_admit
                        else req.admitted_s)
        size.append(req.generated)  # the true length, known now that it has finished

    def native_books(self) -> tuple | None:
        """The records' storage (arrival, admitted, size, first admissions of preempted
        requests), for the engine to write as these hooks would (``sim.core.binding.FinishBooks``);
        None when a subclass has hooks of its own, which must be called."""
        cls = type(self)
        if cls.on_finish is not RankedPolicy.on_finish or cls.on_preempt is not RankedPolicy.on_preempt:
            return None
        self._records()
        return (*self._lists, self._first_admit)  # type: ignore[misc]

    def report(self) -> dict:
        rec = self._records()
        tau, pairs = srpt_order_tau(np.asarray(rec["arrival"], float), np.asarray(rec["admitted"], float),
                                    np.asarray(rec["size"], float))
        return {"srpt_order_tau": None if math.isnan(tau) else round(tau, 4), "srpt_order_pairs": pairs}


class StarvationClock:
    """Tracks when each live request last made progress and when it will next count as starved.

    A request is *starved* at ``now`` when ``now - last_seen >= limit_s``, where ``last_seen`` is the
    latest of its arrival, the end of its last scheduled step, and its last ``reset``. Deadlines sit
    in a heap and are re-validated lazily, so ``next_deadline`` costs O(log n) per change.
    """

    EPS = 1e-9

    def __init__(self, limit_s: float) -> None:
        self.limit = limit_s
        self.live: dict[int, RequestView] = {}
        self.since: dict[int, float] = {}
        self.heap: list[tuple[float, int]] = []

    def add(self, req: RequestView, now: float) -> None:
        self.live[req.request_id] = req
        self.since[req.request_id] = now
        heapq.heappush(self.heap, (now + self.limit, req.request_id))

    def remove(self, req: RequestView) -> None:
        self.live.pop(req.request_id, None)
        self.since.pop(req.request_id, None)

    def reset(self, req: RequestView, now: float) -> None:
        if req.request_id in self.live:
            self.since[req.request_id] = now

    def last_seen(self, req: RequestView) -> float:
        s = self.since.get(req.request_id, req.arrival_s)
        ls = req.last_scheduled_s
        return s if ls != ls else max(s, ls)  # NaN: never scheduled

    def starved(self, req: RequestView, now: float) -> bool:
        return req.request_id in self.live and now - self.last_seen(req) >= self.limit - self.EPS

    def next_deadline(self, now: float | None = None) -> float | None:
        """The earliest time after ``now`` (s) at which a live request will next count as
        starved; None when none will. A deadline already reached is skipped: a request ranked
        since then was reset (and its deadline moved on), and one the engine does not rank (a
        disaggregated decode replica's request waiting for room, or one whose copy is landing)
        changes no ranking by starving; declaring that past time again would stop every run a
        nanosecond later, over and over, while nothing can run."""
        heap = self.heap
        reached = []
        out = None
        while heap:
            d, rid = heap[0]
            req = self.live.get(rid)
            if req is None:
                heapq.heappop(heap)
                continue
            real = self.last_seen(req) + self.limit
            if real > d + self.EPS:
                heapq.heapreplace(heap, (real, rid))
                continue
            if now is not None and d <= now + self.EPS:
                reached.append(heapq.heappop(heap))  # (put back below: it moves on when the request does)
                continue
            out = d
            break
        for entry in reached:
            heapq.heappush(heap, entry)
        return out
