"""The ranking vocabulary shared by the engine and every scheduling policy.

A policy decides *order* and nothing else: given a request it returns a rank key,
smaller meaning more urgent. The engine admits waiting requests in ascending key order and takes
preemption victims from the running requests with the largest keys. A policy never allocates
memory and never advances time.

Every key must be a tuple that ends in ``(arrival_s, request_id)`` so that ordering is total and
deterministic (heaps never compare incomparable things, runs repeat exactly). Its elements are
real numbers (int, float, bool, numpy numbers): inf and -inf order, NaN does not and is refused,
as are strings, None and nested containers (a user policy's keys are checked:
``sim.core.guard``).

Keys are cached by the engine: a request's key is computed when it enters the waiting set and
again whenever the policy's ranking may have changed, which the policy announces in one of two
ways:

* ``dynamic = True``: keys may change after any scheduling step (e.g. a fairness accountant's
  counters move with every token); the engine re-keys before each plan.
* ``next_change(now)``: the simulated time (seconds) at which keys change next without any event
  (e.g. aging promotes a class, a quantum expires). The engine never fast-forwards past it.
  None: no change declared; inf or a time past the engine's integer-ns range (2^61 ns): never;
  NaN is refused (and so is a negative time from a user's policy).

Hooks (all optional, defaults in :class:`BasePolicy`) let stateful policies keep their books:
``bind`` once before the run (the scenario's classes and a policy-owned seed), ``on_arrival``
when a request enters the system, ``before_ranking`` before the engine re-keys requests (with a
:class:`RankingContext`: what the scheduler knows then, such as the queue length and, for a
policy that declares ``needs_prefix_info``, each waiting request's cached prefix),
``on_scheduled`` after each step (or each fast-forwarded run of steps, with the total tokens and
service seconds; such a policy's requests are stepped one by one, never in the engine's
lazily-advanced decode cohort; a policy whose books need each step of a run, as the fairness
accountant's per-window service does, may also define ``on_scheduled_run(items, start_ns,
durations_ns)``, called instead for runs of two or more steps: ``items`` are ``(request, tokens
of the first step, steps it takes part in)``, each emitting one token a step after the first,
and the times are integer nanoseconds), ``on_preempt``, ``on_finish``, and ``report`` at the end (figures
for the run's summary). The engine writes nothing into a policy and nothing of its own into the
requests a policy sees: what it tells a policy goes through these calls.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable


@runtime_checkable
class RequestView(Protocol):
    """What a real scheduler can see of a request at the current moment.

    A user's policy is handed a read-only view (``sim.core.guard.ReadOnlyRequest``): a write
    raises at once, naming the policy and the attribute; ``predicted`` is the one dict it may
    write into. Shipped policies are handed the request itself and write nothing but
    ``predicted``.

    Attributes (read-only for policies):
        request_id: int, unique per simulation, in arrival order.
        arrival_s: arrival time in seconds.
        tenant: tenant name.
        cls: class name (``[[classes]] name``).
        priority: the class's priority, 0 is most urgent.
        prompt_tokens: prompt length in tokens.
        max_tokens: the output limit the client declared.
        generated: output tokens emitted so far.
        attained_s: engine seconds of service this request has received (sum of the durations of
            the steps it took part in).
        admitted_s: time it was last admitted to the running batch (NaN if never).
        last_scheduled_s: end time of the last step it took part in (NaN if never).
        preemptions: times it has been preempted.
        features: dict of extra per-request columns from the workload (e.g. trace fields).
        predicted: dict a predictor may fill (e.g. ``{"rank": 0.3}``); policies may read it.
        true_output_tokens: the real output length. Raises unless the policy is an oracle
            (``oracle = True``), because no real scheduler knows it.
    """

    request_id: int
    arrival_s: float
    tenant: str
    cls: str
    priority: int
    prompt_tokens: int
    max_tokens: int
    generated: int
    attained_s: float
    admitted_s: float
    last_scheduled_s: float
    preemptions: int
    features: dict
    predicted: dict

    @property
    def true_output_tokens(self) -> int: ...


@dataclass(frozen=True, slots=True)
class RankingContext:
    """What the scheduler tells a policy before it re-keys requests (:meth:`Policy.before_ranking`).

    Attributes:
        now: the time of the re-key, seconds.
        queue_len: requests waiting.
        cached_prefix_tokens: request id -> prompt tokens the engine's prefix cache holds for it
            now, for every waiting request (0 when nothing is cached or the request has already
            computed tokens). Filled only for policies that declare ``needs_prefix_info = True``
            (looking it up costs a pass over the waiting set); empty otherwise.
    """

    now: float
    queue_len: int
    cached_prefix_tokens: Mapping[int, int] = field(default_factory=dict)


@runtime_checkable
class Policy(Protocol):
    """A scheduling policy: ranks requests; may declare when its ranking changes next.

    Everything the engine reads or calls on a policy. Class attributes: ``name``; ``oracle``
    (may read ``true_output_tokens``); ``dynamic`` (keys may change after any step: re-key before
    every plan); ``needs_prefix_info`` (wants each waiting request's cached prefix in the
    :class:`RankingContext`). :class:`BasePolicy` gives every hook a default, so a policy that
    inherits it writes only ``key``; one that does not may omit any hook (the engine treats a
    missing one as the default).

    A policy may also keep the waiting set itself (optional, see :class:`OwnsWaitingSet`).
    """

    name: ClassVar[str]
    oracle: ClassVar[bool]
    dynamic: ClassVar[bool]
    needs_prefix_info: ClassVar[bool]

    def bind(self, classes: dict[str, dict], seed: int) -> None: ...

    def key(self, req: RequestView, now: float) -> tuple: ...

    def next_change(self, now: float) -> float | None: ...

    def before_ranking(self, ctx: RankingContext) -> None: ...

    def on_arrival(self, req: RequestView, now: float) -> None: ...

    def on_scheduled(self, req: RequestView, tokens: int, service_s: float, now: float) -> None: ...

    def on_preempt(self, req: RequestView, now: float) -> None: ...

    def on_finish(self, req: RequestView, now: float) -> None: ...

    def report(self) -> dict: ...


class WaitingQueues(Protocol):
    """A waiting set a policy keeps itself, read as the engine reads its heap of ``(key, seq,
    request)`` entries: ``push``, ``pop`` (the head), ``[0]`` (the head, its key current),
    ``len``, iteration (every entry, keys current); ``rekey`` replaces re-keying every entry."""

    def push(self, entry: tuple) -> None: ...

    def pop(self) -> tuple: ...

    def rekey(self) -> None: ...

    def __getitem__(self, i: int) -> tuple: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[tuple]: ...


@runtime_checkable
class OwnsWaitingSet(Protocol):
    """Optional: a policy that keeps the engine's waiting set in its own structure (the fairness
    accountant's per-tenant queues) returns it, or None to let the engine keep its heap. Not
    used with ``needs_prefix_info``."""

    def waiting_queues(self) -> WaitingQueues | None: ...


class BasePolicy:
    """Optional base class with do-nothing hooks. Subclasses set ``name`` and implement ``key``.

    ``describe`` and ``params`` are used by ``priosim policies``. Constructor keyword arguments
    are the policy's parameters (from the scenario's ``[policy]`` table); validate them in
    ``__init__`` and raise ``ValueError`` with a message naming the parameter, the value and what
    was expected.
    """

    name: ClassVar[str] = "base"
    description: ClassVar[str] = ""
    oracle: ClassVar[bool] = False
    dynamic: ClassVar[bool] = False
    needs_prefix_info: ClassVar[bool] = False

    def __init__(self, **params: Any) -> None:
        if params:
            raise ValueError(
                f"policy '{self.name}' takes no parameters (got {', '.join(sorted(params))})"
            )

    def bind(self, classes: dict[str, dict], seed: int) -> None:
        """Called once by the engine before the run with the scenario's classes
        (name -> {priority, ttft_slo_s, ...}) and a policy-owned seed."""
        self.classes = classes
        self.seed = seed

    def key(self, req: RequestView, now: float) -> tuple:  # pragma: no cover - abstract
        raise NotImplementedError

    def next_change(self, now: float) -> float | None:
        return None

    def before_ranking(self, ctx: RankingContext) -> None:
        """Before the engine re-keys requests. The default keeps what older policies that
        declare ``needs_prefix_info`` read: ``self.queue_len`` (deprecated: read
        ``ctx.queue_len``)."""
        if self.needs_prefix_info:
            self.queue_len = ctx.queue_len

    def on_arrival(self, req: RequestView, now: float) -> None:
        pass

    def on_scheduled(self, req: RequestView, tokens: int, service_s: float, now: float) -> None:
        pass

    def on_preempt(self, req: RequestView, now: float) -> None:
        pass

    def on_finish(self, req: RequestView, now: float) -> None:
        pass

    def report(self) -> dict:
        """Per-run figures the policy wants in summary.json (e.g. predictor tau)."""
        return {}


def listens_before_ranking(policy: object) -> bool:
    """Whether ``policy`` has a ``before_ranking`` of its own rather than BasePolicy's default.
    Read from the bound hook, not the type: a wrapper (the fairness accountant) may hand on its
    inner policy's hook as an instance attribute."""
    hook = getattr(policy, "before_ranking", None)
    return hook is not None and getattr(hook, "__func__", hook) is not BasePolicy.before_ranking
