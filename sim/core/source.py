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


def frontend_visible_ns(arr_ns: np.ndarray, delay_ns: int, busy_ns: int) -> np.ndarray:
    """When the engine sees each of the open requests arriving at ``arr_ns`` (int64 ns, in
    arrival order) behind an API server of latency ``delay_ns`` that serves one request at a
    time for ``busy_ns`` each (the overhead's ``frontend_s`` and ``frontend_busy_s``).

    Request i starts service at ``s_i = max(a_i, s_(i-1) + busy)`` (Lindley's recursion; with
    a constant service time its closed form is ``s_i = i*busy + max_(j<=i) (a_j - j*busy)``, a
    running maximum, exact in integer ns) and is seen at ``s_i + delay``; with ``busy_ns`` 0
    that is ``a_i + delay``."""
    a = np.asarray(arr_ns, dtype=np.int64)
    if busy_ns <= 0 or len(a) == 0:
        return a + delay_ns
    k = np.arange(len(a), dtype=np.int64) * busy_ns
    return np.maximum.accumulate(a - k) + k + delay_ns


class RequestSource:
    """``delay_ns``: front-end latency (ns) between a request's arrival and the engine seeing it
    (the overhead's ``frontend_s``); ``busy_ns``: the front end's serial work per request (its
    ``frontend_busy_s``: one server, first come first served, :func:`frontend_visible_ns`);
    requests keep their arrival time.

    Open arrivals and closed-loop sends queue at the front end separately (a scenario with both
    kinds of stream sees each limit alone). Closed-loop sends take it in the order they are
    made, first come first served: a user schedules its send when its last request ends, think
    time ahead, so sends are scheduled out of the order they are made in; each is put through
    the front end once the clock reaches it (:meth:`_serve_sends`), when every send made before
    it is known."""

    def __init__(self, workload, class_index: dict[str, int], class_priority: list[int],
                 delay_ns: int = 0, busy_ns: int = 0) -> None:
        self.delay = delay_ns
        self.busy = busy_ns
        self._free = -NEVER  # when the front end is free for the next closed-loop send (ns)
        # closed-loop sends scheduled but not made yet, with a busy front end: (made at ns, seq,
        # stream, user, row), taken through the front end in that order as the clock reaches them
        self._sends: list[tuple] = []
        df = workload.open
        self.n_open = len(df)
        # typed arrays: 8 bytes a request, and indexing yields plain Python numbers
        arr = np.rint(df["arrival_s"].to_numpy(np.float64) * NS).astype(np.int64)
        self.arr_ns = array("q", arr.tobytes())
        # when the engine sees each open request (after the front end)
        self.vis_ns = array("q", frontend_visible_ns(arr, delay_ns, busy_ns).tobytes())
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
        self._next_open = self.vis_ns[0] if self.n_open else NEVER
        self.next_id = self.n_open
        self._seq = 0
        self.closed = {c.stream: c for c in workload.closed}
        self.closed_heap: list[tuple] = []
        starts = [(int(round(t_s * NS)), cl.stream, user, row) for cl in workload.closed
                  for user, t_s, row in cl.start()]
        if busy_ns:  # (the front end serves the first sends in time order)
            starts.sort(key=lambda x: x[0])
        for t_ns, stream, user, row in starts:
            self._push_closed(t_ns, stream, user, row)

    def _push_closed(self, t_ns: int, stream: int, user: int, row: dict) -> None:
        """Schedule a closed-loop send made at ``t_ns`` (ns, not before now)."""
        self._seq += 1
        if self.busy:
            heapq.heappush(self._sends, (t_ns, self._seq, stream, user, row))
        else:
            heapq.heappush(self.closed_heap, (t_ns + self.delay, self._seq, stream, user, row, t_ns))

    def _serve_sends(self, now_ns: int) -> None:
        """(A busy front end) Take the closed-loop sends made by ``now_ns`` through the front end,
        in the order they were made: when each starts its service is final, since a send is
        scheduled no later than it is made (at the end of the user's last request), so every
        send made by now is known now."""
        sends = self._sends
        while sends and sends[0][0] <= now_ns:
            t_ns, seq, stream, user, row = heapq.heappop(sends)
            start = t_ns if t_ns > self._free else self._free
            self._free = start + self.busy
            heapq.heappush(self.closed_heap, (start + self.delay, seq, stream, user, row, t_ns))

    @property
    def closed_pending(self) -> bool:
        """Whether a closed-loop send is scheduled that the engine has not seen yet."""
        return bool(self.closed_heap or self._sends)

    def next_arrival_ns(self) -> int:
        """Time of the next arrival known now (NEVER when none); a send not yet through a busy
        front end counts at the earliest it could get through (a lower bound)."""
        a = self._next_open
        if self.closed_heap and self.closed_heap[0][0] < a:
            a = self.closed_heap[0][0]
        if self._sends:
            t_ns = self._sends[0][0]
            lb = (t_ns if t_ns > self._free else self._free) + self.delay
            if lb < a:
                a = lb
        return a

    def next_open_arrival_ns(self) -> int:
        """When the request the engine sees next arrived (ns), where that is an open request and
        no closed-loop user could send one before it; NEVER otherwise. (An overlap-scheduled
        replica takes a request in at the end of the first step that starts after the engine
        saw it, its arrival plus the front end's latency: ``replica_loop``.)"""
        if self.closed or self.i >= self.n_open:
            return NEVER
        return self.arr_ns[self.i]

    def pop_due(self, now_ns: int) -> list[Request]:
        """Every request that has arrived by ``now_ns``, in arrival order (open ones first on
        ties, then closed-loop sends)."""
        out = []
        if self._next_open <= now_ns:
            vis = self.vis_ns
            i, n = self.i, self.n_open
            while i < n and vis[i] <= now_ns:
                out.append(next(self._open))  # (request i)
                i += 1
            self.i = i
            self._next_open = vis[i] if i < n else NEVER
        if self._sends:
            self._serve_sends(now_ns)
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
