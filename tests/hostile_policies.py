"""Users' policies that break the contract of ``policies.base``, for tests/test_policy_guard.py
(loaded as ``tests.hostile_policies:Class``, the way a user's module is)."""
from __future__ import annotations

import heapq
import math

from policies import BasePolicy


class Fifo(BasePolicy):
    """A well-behaved user policy: class priority, then arrival (the shipped ``priority``'s order)."""

    name = "user_fifo"

    def key(self, req, now: float) -> tuple:
        return (req.priority, req.arrival_s, req.request_id)


class WritesCls(Fifo):
    """Moves every request into the most urgent class."""

    def key(self, req, now: float) -> tuple:
        req.cls = "hi"
        return super().key(req, now)


class WritesPrompt(Fifo):
    """Rewrites every prompt to one token."""

    def key(self, req, now: float) -> tuple:
        req.prompt_tokens = 1
        return super().key(req, now)


class WritesOnFinish(Fifo):
    """Writes into a request from a hook, not from key()."""

    def on_finish(self, req, now: float) -> None:
        req.generated = 0


class WritesFeature(Fifo):
    def key(self, req, now: float) -> tuple:
        req.features["x"] = 1.0
        return super().key(req, now)


class Value(Fifo):
    """key() returns ``(VALUE, arrival_s, request_id)`` for every third request (the others
    ``(0, ...)``), VALUE set per subclass or by ``make``."""

    VALUE: object = 0

    def key(self, req, now: float) -> tuple:
        head = self.VALUE if req.request_id % 3 == 1 else 0
        return (head, req.arrival_s, req.request_id)


class Drawn(Value):
    """Value whose VALUE a test sets."""


class NanKey(Value):
    VALUE = math.nan


class StrKey(Value):
    VALUE = "urgent"


class NoneKey(Value):
    VALUE = None


class ListKey(Value):
    VALUE = [1, 2]


class InfKey(Value):
    """inf and -inf are numbers that order: last and first."""

    def key(self, req, now: float) -> tuple:
        head = (math.inf, -math.inf, 0)[req.request_id % 3]
        return (head, req.arrival_s, req.request_id)


class BareKey(Fifo):
    """key() returns a number, not a tuple."""

    def key(self, req, now: float):
        return req.arrival_s


class Changes(Fifo):
    """Fifo whose next_change() answers CHANGE (Fifo's keys never change: any answer that is a
    time leaves the schedule alone)."""

    CHANGE: object = None

    def next_change(self, now: float):
        return self.CHANGE


class NanChange(Changes):
    CHANGE = math.nan


class HugeChange(Changes):
    CHANGE = 1e300


class InfChange(Changes):
    CHANGE = math.inf


class HugeIntChange(Changes):
    CHANGE = 10 ** 400


class NegativeChange(Changes):
    CHANGE = -1.0


class StrChange(Changes):
    CHANGE = "soon"


class WritesContext(Fifo):
    needs_prefix_info = True
    dynamic = True  # (told before every plan)

    def before_ranking(self, ctx) -> None:
        ctx.queue_len = 0


class OwnHeap:
    """A waiting set kept by the policy itself (``policies.base.WaitingQueues``): one heap."""

    def __init__(self) -> None:
        self.h: list = []

    def push(self, entry: tuple) -> None:
        heapq.heappush(self.h, entry)

    def pop(self) -> tuple:
        return heapq.heappop(self.h)

    def rekey(self) -> None:
        pass

    def __getitem__(self, i: int) -> tuple:
        return self.h[i]

    def __len__(self) -> int:
        return len(self.h)

    def __iter__(self):
        return iter(list(self.h))


class OwnQueues(Fifo):
    """Fifo keeping the waiting set itself: the same schedule as Fifo's."""

    def waiting_queues(self) -> OwnHeap:
        return OwnHeap()
