"""A step's plan (what the scheduler decided) and the orders the engine keeps requests in.

:func:`sim.core.planner.plan` fills a :class:`StepPlan`; the cost model prices it
(:meth:`sim.core.engine.Engine.compute_ns`); :func:`sim.core.apply.apply` carries it out.
"""
from __future__ import annotations

from operator import attrgetter
from typing import Final

from sim.core.request import Request


def age(r: Request) -> tuple:
    """Arrival order (earliest first)."""
    return (r.arrival_ns, r.request_id)


NO_PRIORITY: Final = -(1 << 62)  # below every class priority: "no class present"


def least_urgent(class_priority: list[int], counts: list[int], top: int = NO_PRIORITY) -> int:
    """The largest (least urgent) of ``top`` and the priorities of the classes whose count is
    not zero (``counts`` per class, e.g. running requests or cohort members)."""
    for p, n in zip(class_priority, counts):
        if n and p > top:
            top = p
    return top


#: Rank order of running requests: ``(key, admit_seq)``, the policy key, then admission order
#: (an attrgetter: sorts, bisections and maxima keyed by it read both fields in C).
rank: Final = attrgetter("key", "admit_seq")
#: Admission order alone: the order vLLM V1 walks its running list in (``engine.running_order``)
admitted: Final = attrgetter("admit_seq")


class StepShape:
    """What the cost model prices of one step (:meth:`sim.core.costs.CostModel.price`).

    ``prefill_tokens``: tokens prefilled (plus speculative verification tokens);
    ``decoders``: requests decoding; ``sum_l2``: sum over prefill chunks of l^2 (l: the
    chunk's tokens); ``sum_lc``: sum of l x c (c: the tokens before the chunk, its KV
    context); ``sum_ctx``: sum of the decoders' contexts; ``prefill_chunks``: prefill chunks;
    ``admitted``: requests whose prefill starts in the step (the last two: engine overhead).
    """

    # (this and the two classes below are plain classes with their own __init__, not a
    # NamedTuple or dataclasses: the compiled build makes them native, and builds one in C where
    # the generated __init__ or __new__ would be a Python call; made at every engine event)
    __slots__ = ("prefill_tokens", "decoders", "sum_l2", "sum_lc", "sum_ctx", "prefill_chunks", "admitted")

    def __init__(self, prefill_tokens: int, decoders: int, sum_l2: int, sum_lc: int, sum_ctx: int,
                 prefill_chunks: int = 0, admitted: int = 0) -> None:
        self.prefill_tokens = prefill_tokens
        self.decoders = decoders
        self.sum_l2 = sum_l2
        self.sum_lc = sum_lc
        self.sum_ctx = sum_ctx
        self.prefill_chunks = prefill_chunks
        self.admitted = admitted

    def __repr__(self) -> str:
        return "StepShape(" + ", ".join(f"{k}={getattr(self, k)}" for k in self.__slots__) + ")"


class Scheduled:
    """One request's share of a step."""

    __slots__ = ("req", "tokens", "computed_before", "decode", "admitted", "at", "chunk", "chunk_steps")

    def __init__(self, req: Request, tokens: int, computed_before: int, decode: bool, admitted: bool = False,
                 at: int = 0) -> None:
        self.req = req
        self.tokens = tokens
        self.computed_before = computed_before  # tokens computed before this chunk (its KV context)
        self.decode = decode
        self.admitted = admitted  # taken from the waiting set in this step
        self.at = at  # the run's step it joined at (> 0: admitted inside a held run, sim.cluster.replicas)
        # a prefill that goes on in a fast-forwarded run's next steps (sim.core.fastforward): the
        # tokens it takes in each (the last takes what is left), and how many steps after the first
        # it prefills in (its first token ends the last of them); 0 for every other item
        self.chunk = 0
        self.chunk_steps = 0

    def __repr__(self) -> str:
        return "Scheduled(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__) + ")"


class StepPlan:
    """Who runs in a step and what moves: items (explicitly scheduled requests), the lazily-advanced
    cohort's decoders, admissions, preemptions and swaps (blocks each way, and who)."""

    __slots__ = ("items", "admitted", "preempted", "swap_out_blocks", "swap_in_blocks", "swapped_out", "swapped_in",
                 "cohort", "kinds", "recompute_steps", "landed", "retracted")

    def __init__(self) -> None:
        self.items: list[Scheduled] = []
        self.admitted = 0
        self.preempted = 0
        self.swap_out_blocks = 0
        self.swap_in_blocks = 0
        self.swapped_out: list = []  # (request, blocks)
        self.swapped_in: list = []
        self.cohort = 0  # decoders of the lazily-advanced cohort in this step (beyond ``items``)
        self.kinds: list = []  # items' kinds, for the iteration trace
        # a fast-forwarded run's later steps in which a recompute's prompt is chunked: (step, its
        # tokens, the step's tokens, its class), for the share of their time lost to preemption
        # (None: none)
        self.recompute_steps: list | None = None
        # items that are decoders whose KV landed inside a held run (``at`` > 0, ``decode``; a
        # disaggregated decode replica's): not in the running set until the run ends
        self.landed = 0
        # preemptions by running requests short of blocks (SGLang's retractions; ``preempted``
        # counts those for waiters too)
        self.retracted = 0

    @property
    def empty(self) -> bool:
        return not self.items and not self.cohort and not self.swap_out_blocks
