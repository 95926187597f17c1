"""Where requests come from: the workload's pre-generated arrivals plus closed-loop users.

A :class:`RequestSource` turns the columnar open stream into :class:`Request` objects when the
clock passes their arrival (no process per request), and keeps closed-loop users' next sends on
a heap, pushed when their previous request ends. Request ids: open requests 0..n-1 in arrival
order, then closed-loop requests in the order they are created.

:class:`RequestStream` is what the replica loop (:func:`sim.core.loop.replica_loop`) reads: a
:class:`RequestSource` for one replica, a cluster replica's inbox behind a router.
"""
from __future__ import annotations

import heapq
import math
from array import array
from itertools import repeat
from typing import Protocol

import numpy as np

from sim.core.costs import NEVER, NS
from sim.core.request import Request


class RequestStream(Protocol):
    """Where one replica's requests come from.

    A cluster replica's inbox also has the hooks the loop looks up when present: ``wakeup(t)``
    and ``finished()`` (sleep on an event until a request is routed here, or stop when none
    will be), ``hold(now, plan, dur0, run)`` and ``held()`` (a run of steps priced
    a stretch at a time, that a routed request may cut short), ``on_run(now, durations)`` (told
    of each run).
    """

    def next_arrival_ns(self) -> int:
        """When the next request may arrive (ns; NEVER when none will). A lower bound is
        enough: it only stops a fast-forwarded run early."""
        ...

    def pop_due(self, now_ns: int) -> list[Request]:
        """Every request that has arrived by ``now_ns``, in arrival order."""
        ...


class RequestSource:
    """``delay_ns``: front-end latency (ns) between a request's arrival and the engine seeing it
    (the overhead's ``frontend_s``); requests keep their arrival time."""

    def __init__(self, workload, class_index: dict[str, int], class_priority: list[int],
                 delay_ns: int = 0) -> None:
        self.delay = delay_ns
        df = workload.open
        self.n_open = len(df)
        # typed arrays: 8 bytes a request, and indexing yields plain Python numbers
        self.arr_ns = array("q", np.rint(df["arrival_s"].to_numpy(np.float64) * NS).astype(np.int64).tobytes())
        self.tenants = df["tenant"].tolist()
        self.clss = df["cls"].tolist()
        self.prompts = array("q", df["prompt_tokens"].to_numpy(np.int64).tobytes())
        self.outputs = array("q", df["output_tokens"].to_numpy(np.int64).tobytes())
        self.maxtoks = array("q", df["max_tokens"].to_numpy(np.int64).tobytes())
        self.deadlines = array("d", df["deadline_s"].to_numpy(np.float64).tobytes())
        self.streams = array("q", df["stream"].to_numpy(np.int64).tobytes())
        self.hashes = df["hash_ids"].tolist() if "hash_ids" in df.columns else None
        self.feats = {c: df[c].tolist() for c in df.columns if c.startswith("f_")}
        self.cls_idx = class_index
        self.cls_prio = class_priority
        # the open requests, made one at a time as they become due (``next``): one map over
        # the columns, each request's class index and priority looked up as it is made, instead
        # of a method call indexing every column per request
        prio_of = {c: class_priority[ci] for c, ci in class_index.items()}
        feats = ((dict(zip(self.feats, vals)) for vals in zip(*self.feats.values())) if self.feats
                 else repeat(None))
        self._open = map(Request, range(self.n_open), self.arr_ns, self.tenants, self.clss,
                         map(class_index.__getitem__, self.clss), map(prio_of.__getitem__, self.clss),
                         self.prompts, self.outputs, self.maxtoks, self.deadlines, self.streams, repeat(-1),
                         feats, repeat(None) if self.hashes is None else self.hashes)
        self.i = 0  # open requests made so far
        # when the next open request becomes visible (ns; NEVER after the last): read at every
        # arrival instant, kept as the requests are made
        self._next_open = self.arr_ns[0] + delay_ns if self.n_open else NEVER
        self.next_id = self.n_open
        self._seq = 0
        self.closed = {c.stream: c for c in workload.closed}
        self.closed_heap: list[tuple] = []
        for cl in workload.closed:
            for user, t_s, row in cl.start():
                self._push_closed(int(round(t_s * NS)), cl.stream, user, row)

    def _push_closed(self, t_ns: int, stream: int, user: int, row: dict) -> None:
        self._seq += 1
        heapq.heappush(self.closed_heap, (t_ns + self.delay, self._seq, stream, user, row, t_ns))

    def next_arrival_ns(self) -> int:
        """Time of the next arrival known now (NEVER when none)."""
        a = self._next_open
        if self.closed_heap and self.closed_heap[0][0] < a:
            return self.closed_heap[0][0]
        return a

    def pop_due(self, now_ns: int) -> list[Request]:
        """Every request that has arrived by ``now_ns``, in arrival order (open ones first on
        ties, then closed-loop sends)."""
        out = []
        if self._next_open <= now_ns:
            arr = self.arr_ns
            seen = now_ns - self.delay  # requests that arrived by then are visible now
            i, n = self.i, self.n_open
            while i < n and arr[i] <= seen:
                out.append(next(self._open))  # (request i)
                i += 1
            self.i = i
            self._next_open = arr[i] + self.delay if i < n else NEVER
        while self.closed_heap and self.closed_heap[0][0] <= now_ns:
            _, _, stream, user, row, t = heapq.heappop(self.closed_heap)
            out.append(self._make_closed(t, stream, user, row))
        return out

    def on_request_end(self, req: Request, now_ns: int) -> None:
        """A closed-loop user whose request ended thinks, then sends its next request."""
        cl = self.closed.get(req.stream)
        if cl is None or req.user < 0:
            return
        nxt = cl.next(req.user, now_ns / NS)
        if nxt is not None:
            t_s, row = nxt
            self._push_closed(max(int(round(t_s * NS)), now_ns), req.stream, req.user, row)

    def _make_closed(self, t_ns: int, stream: int, user: int, row: dict) -> Request:
        cl = self.closed[stream]
        rid = self.next_id
        self.next_id += 1
        ci = self.cls_idx[cl.cls]
        return Request(rid, t_ns, cl.tenant, cl.cls, ci, self.cls_prio[ci], int(row["prompt_tokens"]),
                       int(row["output_tokens"]), int(row["max_tokens"]),
                       float(row.get("deadline_s", math.nan)), stream, user)
