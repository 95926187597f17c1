"""The engine's request sets: who waits, who runs, and the counts and orders kept on them.

One owner (:class:`Queues`) for the waiting set (a heap of ``(key, seq, request)``, or the
policy's own structure with the same reads), the running set, the per-class counts the time
series reads, the least urgent running requests (the first victims of a preemption) and the
running set's rank order. The planner, preemption and apply change them only through its
methods, so each count moves with the set it counts.
"""
from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from typing import Any, Final

from sim.core.cohort import NOT_MEMBER
from sim.core.plan import NO_PRIORITY, admitted, least_urgent, rank
from sim.core.request import Request

__all__ = ["Queues", "LEAST_KEPT"]

#: how many of the least urgent running requests :meth:`Queues.lowest_running` finds at once
#: (preemptions take them one by one; a few more cost little in the same walk)
LEAST_KEPT: Final = 8


class Queues:
    """The waiting and running sets of one replica.

    Args:
        class_priority: each class's priority, in declaration order (every running request has
            its class's, as the request source makes them, until one is seen that has not).
        own_queues: the policy's own waiting structure (``push``, ``pop``, ``rekey``, ``len``,
            ``[0]``, iteration over ``(key, seq, request)`` entries: the fairness accountant's
            per-tenant queues), or None for the heap.

    Read by the engine's parts: ``waiting`` (``waiting[0]`` is the first-ranked entry),
    ``running`` (by request id, in admission order), ``waiting_count`` / ``running_count`` (per
    class), ``waiting_prefills`` (waiting requests due a prefill, per class), ``rank_order``
    (running requests outside the cohort in rank order, None when stale: see
    :meth:`ranked_running`) and ``admissions`` (requests admitted so far).
    """

    def __init__(self, class_priority: list[int], own_queues: Any = None) -> None:
        n = len(class_priority)
        self.class_priority = class_priority
        self.own_queues = own_queues
        self.waiting: Any = own_queues if own_queues is not None else []
        # the running set by request id, in the order its requests were admitted (a dict: a
        # request leaves it in O(1) where a list is searched, and it iterates as the list did)
        self.running: dict[int, Request] = {}
        # requests per class in the waiting and the running set, counted as they enter and leave
        # (the time series reads them every interval: a count, not a walk of the queue)
        self.waiting_count = [0] * n
        self.running_count = [0] * n
        self.waiting_prefills = [0] * n
        # the least urgent running requests (the last-ranked is the first victim), ascending by
        # rank, and every other running request ranks below all of them: kept as requests start
        # and leave (at most 2 x LEAST_KEPT: the most urgent of them are let go), found again
        # (the LEAST_KEPT last-ranked) once all have left. Under KV pressure the last-ranked
        # leaves at every preemption; a walk of the running set each time was a large share of
        # a preempting run.
        self.last_ranked: list[Request] = []
        # the running requests outside the cohort in the order a step walks them (ranked_running):
        # by rank, or by admission alone (``engine.running_order = "admission"``: vLLM V1's list)
        self.by_admission = False
        self.rank_order: list[Request] | None = None
        self.seq = 0  # entries pushed so far (ties in the heap go to the earlier push)
        self.admissions = 0
        # True while every running request has its class's priority: the least urgent priority
        # running (``top``) is then read from the class counts
        self.priority_by_class = True
        self.top = NO_PRIORITY

    # ---- waiting -------------------------------------------------------------------------------
    def push(self, req: Request, key: tuple) -> None:
        """``req`` joins the waiting set under ``key`` (after every entry of an equal key)."""
        req.key = key
        self.seq += 1
        self.push_entry((key, self.seq, req))
        if req.tokens - req.computed > 1:
            self.waiting_prefills[req.cls_idx] += 1

    def push_entry(self, entry: tuple) -> None:
        """Put a ``(key, seq, request)`` entry back (the policy's own queues when it keeps them)."""
        if self.own_queues is not None:
            self.own_queues.push(entry)
        else:
            heapq.heappush(self.waiting, entry)
        self.waiting_count[entry[2].cls_idx] += 1

    def pop_entry(self) -> tuple:
        """Take the first-ranked ``(key, seq, request)`` entry out of the waiting set."""
        entry = self.own_queues.pop() if self.own_queues is not None else heapq.heappop(self.waiting)
        self.waiting_count[entry[2].cls_idx] -= 1
        return entry

    def take(self, w: Request) -> None:
        """Waiting request ``w`` (popped) is admitted: it gets the next admission number."""
        if w.tokens - w.computed > 1:
            self.waiting_prefills[w.cls_idx] -= 1
        self.admissions += 1
        w.admit_seq = self.admissions

    # ---- running -------------------------------------------------------------------------------
    def add_running(self, r: Request) -> None:
        """``r`` (admitted, its ``admit_seq`` the newest) joins the running set."""
        self.running[r.request_id] = r
        self.running_count[r.cls_idx] += 1
        if r.priority != self.class_priority[r.cls_idx]:
            self.priority_by_class = False
        if r.priority > self.top:
            self.top = r.priority
        least = self.last_ranked
        if least and rank(r) > rank(least[0]):
            insort(least, r, key=rank)
            if len(least) > 2 * LEAST_KEPT:  # (the first ones rank above the rest still)
                del least[:LEAST_KEPT]

    def remove_running(self, r: Request) -> None:
        """``r`` leaves the running set (finished or preempted)."""
        del self.running[r.request_id]
        ci = r.cls_idx
        n = self.running_count[ci] - 1
        self.running_count[ci] = n
        if not n and r.priority == self.top:  # its class was the least urgent running
            self.top = least_urgent(self.class_priority, self.running_count)
        least = self.last_ranked
        if least:
            k = rank(r)
            if k >= rank(least[0]):
                i = bisect_left(least, k, key=rank)
                if i < len(least) and least[i] is r:
                    del least[i]

    def lowest_running(self) -> Request:
        """The running request ranked last (largest key; ties: the most recently admitted).
        The running set must not be empty."""
        least = self.last_ranked
        if not least:
            least = self.last_ranked = heapq.nlargest(LEAST_KEPT, self.running.values(), key=rank)
            least.reverse()
        return least[-1]

    def top_running_priority(self) -> int:
        """The least urgent (largest) priority of a running request; the set must not be empty."""
        if not self.priority_by_class:
            return max(r.priority for r in self.running.values())
        return self.top

    def ranked_running(self) -> list[Request]:
        """Running requests outside the cohort (:mod:`sim.core.cohort`) in the order a step walks
        them: most urgent first, or the earliest admitted first (``by_admission``); cached until
        the set or the keys change."""
        if self.rank_order is None:
            self.rank_order = sorted((r for r in self.running.values() if r.cohort_base_step == NOT_MEMBER),
                                     key=admitted if self.by_admission else rank)
        return self.rank_order

    def walk_key(self, r: Request) -> tuple:
        """``r``'s place in :meth:`ranked_running`'s order (smaller: walked earlier)."""
        return (r.admit_seq,) if self.by_admission else rank(r)

    def ordered_in(self, r: Request) -> None:
        """``r`` became an explicit running request: it goes into the kept walk order."""
        if self.rank_order is not None:
            insort(self.rank_order, r, key=admitted if self.by_admission else rank)

    def ordered_out(self, r: Request) -> None:
        """``r`` is no longer an explicit running request: it leaves the kept rank order."""
        if self.rank_order is not None:
            self.rank_order.remove(r)

    # ---- ranking -------------------------------------------------------------------------------
    def rekey(self, key, now_s: float) -> None:
        """Recompute every key, waiting (the heap rebuilt, or the policy's queues re-keyed by
        themselves) and running, with ``key(request, now_s)``; the orders kept are dropped."""
        if self.own_queues is not None:
            self.own_queues.rekey()
        else:
            seq = self.seq
            items = []
            for _, _, r in self.waiting:
                r.key = k = key(r, now_s)
                seq += 1
                items.append((k, seq, r))
            self.seq = seq
            heapq.heapify(items)
            self.waiting = items
        for r in self.running.values():
            r.key = key(r, now_s)
        self.rank_order = None
        self.last_ranked = []

    def waiting_requests(self) -> list[Request]:
        """The waiting requests (in the waiting set's order, not its rank order)."""
        return [w for _, _, w in self.waiting]
