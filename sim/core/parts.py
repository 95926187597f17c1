"""What the engine's step modules may read of the engine: its parts, declared once.

The planner, preemption, apply, fast-forward and the checks are functions of a step's parts,
not of the :class:`~sim.core.engine.Engine` class: they are typed against
:class:`EngineParts`, which the engine satisfies, so none of them imports the engine (no import
cycle inside ``sim/core``) and this list is the whole of what they can reach. Each part owns
its state and changes it through its own calls: the queues (:class:`~sim.core.queues.Queues`),
the KV memory (:class:`~sim.core.kvpool.KVPool`: device blocks, prefix cache, host space), the
step limits (:class:`~sim.core.limits.StepLimits`) and the cohort
(:class:`~sim.core.cohort.DecodeCohort`).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sim.core.binding import BoundPolicy
from sim.core.cohort import DecodeCohort
from sim.core.costs import CostModel
from sim.core.kvpool import KVPool
from sim.core.limits import StepLimits
from sim.core.queues import Queues
from sim.core.request import Request
from sim.core.speculation import Speculation
from sim.core.telemetry import Telemetry

__all__ = ["EngineParts"]


class EngineParts:
    """A replica's parts, as its step modules see them; :class:`~sim.core.engine.Engine` is its
    one subclass. (A plain base class, not a ``typing.Protocol``: the compiled build reads the
    fields of a class it compiles directly, but those of a Protocol by Python attribute lookup,
    which cost the compiled engine about a seventh of its time.)

    ``queues``, ``pool``, ``limits``, ``cohort`` (None when every request is stepped),
    ``policy`` (bound), ``preemption`` (the mode: how a victim gives up its blocks),
    ``waiting_rule`` (which running requests a waiter may evict), ``victim_rule`` (whom a
    running request short of blocks preempts), ``reserve`` (SGLang's admission estimate:
    :class:`~sim.core.reserve.SglangReserve`, or None), ``costs``, ``tel``
    (telemetry), ``spec`` / ``spec_k`` (speculative decoding, None / 0 when off), ``cfg`` (the
    engine settings, read-only), ``bs`` (block size, tokens), ``grows_blocks`` (the mode's),
    ``trace`` (iteration rows or None), ``gate`` (admission gate or None), ``next_change_ns``,
    ``through_finishes``, the counters ``iterations`` / ``events`` / ``busy_ns`` /
    ``thrash_ns``, and ``on_request_end``.

    In a disaggregated cluster (:mod:`sim.cluster.disagg`) a replica's KV may be held outside
    its queues: ``held`` (request id -> request) are requests holding device blocks that are
    neither waiting nor running (a finished prefill whose KV is still being sent when
    ``keeps_kv``; a request whose KV is arriving from a prefill replica), and
    ``on_recompute`` takes a victim preempted by recompute away to be prefilled elsewhere.
    """

    queues: Queues
    pool: KVPool
    limits: StepLimits
    cohort: DecodeCohort | None
    policy: BoundPolicy
    preemption: Any
    waiting_rule: Any
    victim_rule: Any
    reserve: Any
    costs: CostModel
    tel: Telemetry
    spec: Speculation | None
    spec_k: int
    cfg: Any
    bs: int
    grows_blocks: bool
    trace: list | None
    gate: Any
    next_change_ns: int
    through_finishes: bool
    iterations: int
    events: int
    busy_ns: int
    thrash_ns: int
    held: dict[int, Request]
    #: set by the runner for closed-loop users: called with (request, end time in ns)
    on_request_end: Callable[[Request, int], None] | None = None
    #: a prefill replica whose finished requests keep their KV blocks (in ``held``) until sent
    keeps_kv: bool = False
    #: a decode replica whose landed requests' sampled token reached the client at their
    #: prefill's end (``cluster.first_token = "prefill"``), not when their KV lands here
    sampled_token_sent: bool = False
    #: set by a disaggregated cluster: takes a victim preempted by recompute (request, ns)
    #: instead of its waiting again here
    on_recompute: Callable[[Request, int], None] | None = None

    def push_waiting(self, req: Request, now_ns: int) -> None:
        """``req`` (new, or preempted) joins the waiting set under the policy's key now."""
        raise NotImplementedError

    def push_waiting_last(self, req: Request, now_ns: int) -> None:
        """``req`` (preempted) joins the waiting set as if it arrived at ``now_ns``."""
        raise NotImplementedError

    def size_refusal(self, prompt_tokens: int, max_tokens: int, priority: int) -> str:
        """Why a request of these lengths is refused at its arrival whatever the load, or ""."""
        raise NotImplementedError

    def admit_arrival(self, req: Request, now_ns: int) -> bool:
        """``req`` arrives at ``now_ns``: gated, then queued; False when the gate refused it."""
        raise NotImplementedError

    def trace_run(self, plan: Any, start_ns: int, durations: list[int]) -> None:
        """Iteration rows of a run of ``plan``'s steps (when tracing)."""
        raise NotImplementedError
