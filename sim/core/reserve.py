"""SGLang's conservative admission: a waiting request's whole output is reserved, scaled down by
a ratio that decays while nothing is retracted (``engine.admission_estimate = "sglang"``).

As read in sgl-project/sglang 0.5.x (``python/sglang/srt/managers/schedule_policy.py``,
``PrefillAdder``; ``scheduler.py``, ``get_new_batch_prefill`` and ``update_running_batch``;
``schedule_batch.py``, ``retract_decode``; the constants in ``environ.py``):

* **the check** (``add_one_req``): a waiting request is taken in only if its prompt's new tokens
  plus ``min(max_new_tokens - output so far, 4096)`` are fewer than the free and evictable KV
  tokens less an offset: ``min(max_new_tokens - output so far, 4096) x new_token_ratio`` for
  every running request, plus what each request admitted earlier in the same step reserved (its
  prompt tokens and ``min(max_new_tokens, 4096)``; a prompt cut into chunks reserves only its
  chunk, and its output with its last chunk). The first waiter that does not fit stops
  admission, and so does a reserve used up by the one just taken in (``budget_state``).
* **a full batch** (``batch_is_full``): once admission stopped for want of KV, SGLang tries
  none again until a running request leaves (finished or retracted).
* **the ratio** (``new_token_ratio``): 0.7 at start (``SGLANG_INIT_NEW_TOKEN_RATIO`` x
  ``--schedule-conservativeness`` 1.0); each decode step without retraction takes
  ``(init - min) / 600`` off, down to ``min = init x 0.14``; a retraction sets it to
  ``min(1, (outputs so far + 20 x requests) / (their max_new_tokens + 1))`` over the requests
  that stay; an idle scheduler resets it to ``init``.

priosim counts in KV blocks (SGLang's page is priosim's block; its default page of 1 token makes
them one): a request's tokens become ``blocks_for(tokens)`` blocks, the ratio's share of the
running requests' outputs is divided by the block size. One :class:`SglangReserve` per replica
holds the ratio and the full-batch flag; the planner asks it (:mod:`sim.core.planner`), apply
and the replica loop tell it of decode steps, departures and idle time.
"""
from __future__ import annotations

from typing import Final

from sim.core.cohort import NOT_MEMBER
from sim.core.parts import EngineParts as Engine
from sim.core.plan import Scheduled, StepPlan
from sim.core.request import Request, State

__all__ = ["SglangReserve", "INIT_RATIO", "MIN_RATIO_FACTOR", "DECAY_STEPS", "RETRACT_DECODE_STEPS",
           "CLIP_MAX_NEW_TOKENS"]

#: ``SGLANG_INIT_NEW_TOKEN_RATIO``: the share of each running request's remaining output reserved
INIT_RATIO: Final = 0.7
#: ``SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR``: the ratio's floor, a share of its start
MIN_RATIO_FACTOR: Final = 0.14
#: ``SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS``: decode steps from the start to the floor
DECAY_STEPS: Final = 600
#: ``SGLANG_RETRACT_DECODE_STEPS``: decode steps per request a retraction's estimate allows for
RETRACT_DECODE_STEPS: Final = 20
#: ``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION``: the most output tokens of one request counted, tokens
CLIP_MAX_NEW_TOKENS: Final = 4096


class SglangReserve:
    """One replica's SGLang admission state: the new-token ratio and the full-batch flag.

    Args:
        block_size: tokens per KV block.
        conservativeness: SGLang's ``--schedule-conservativeness`` (1.0 by default): scales the
            ratio's start, at most 1.

    ``ratio`` (a share, 0..1), ``paused`` (True: admission stopped for want of KV and waits for
    a running request to leave), ``offset`` (KV blocks reserved in the step being planned:
    None until the step's first admission check).
    """

    def __init__(self, block_size: int, conservativeness: float = 1.0) -> None:
        self.bs = block_size
        self.init = min(INIT_RATIO * conservativeness, 1.0)
        self.floor = min(self.init * MIN_RATIO_FACTOR, 1.0)
        self.decay = (self.init - self.floor) / DECAY_STEPS
        self.ratio = self.init
        self.paused = False
        self.offset: float | None = None

    # ---- the ratio ---------------------------------------------------------------------------
    def decode_steps(self, n: int) -> None:
        """``n`` decode steps ran without a retraction: the ratio decays by one step each (the
        same float subtraction each step, as SGLang's loop does it; at the floor it stays)."""
        r, d, floor = self.ratio, self.decay, self.floor
        while n > 0 and r > floor:
            r = r - d
            if r < floor:
                r = floor
            n -= 1
        self.ratio = r

    def retracted(self, eng: Engine) -> None:
        """A retraction left the running set as it is now: the ratio becomes its estimate of the
        share of the remaining output the requests that stay will use (``retract_decode``)."""
        decoded = max_new = 0
        for r in eng.queues.running.values():
            decoded += generated(eng, r)
            max_new += r.max_tokens
        est = (decoded + RETRACT_DECODE_STEPS * len(eng.queues.running)) / (max_new + 1)
        self.ratio = est if est < 1.0 else 1.0

    def idle(self) -> None:
        """Nothing runs and nothing can be taken in: SGLang's idle check resets the ratio. (A
        full flag is cleared too: with nothing running, no departure would ever clear it.)"""
        self.ratio = self.init
        self.paused = False

    def left(self) -> None:
        """A running request left (finished or retracted): SGLang tries admission again."""
        self.paused = False

    # ---- a step's plan -----------------------------------------------------------------------
    def after_plan(self, eng: Engine, plan: StepPlan) -> None:
        """The step is planned: a retraction (``plan.retracted``) sets the ratio, a decode step
        (no prompt tokens in it) decays it; the step's reserve is forgotten."""
        self.offset = None
        if plan.preempted:
            self.paused = False  # (the batch shrank: SGLang's batch_is_full is cleared)
        if plan.retracted:
            self.retracted(eng)
        elif decode_only(plan):
            self.decode_steps(1)

    def room(self, eng: Engine, w: Request, need: int, hit: int, avail: int, scheduled: dict) -> bool:
        """Does waiting ``w`` pass SGLang's check? ``need``: the new device blocks its
        admission takes now (a swapped-out request's: those it swaps in); ``hit``: cached
        prefix groups it reuses; ``avail``: the blocks it may take (free and evictable, less
        the watermark and the cached groups it would hold). Its prompt's new tokens and its
        clipped remaining output must be fewer blocks than ``avail`` less the step's offset."""
        out = clipped(w.max_tokens - w.generated)
        if out < 0:
            out = 0
        pool = eng.pool
        if w.state is State.SWAPPED:  # (its blocks come back from host space: no prefill)
            total = need + pool.blocks_for(out)
        else:  # (its prompt, and after a recompute its output so far, past the cached groups)
            cache = pool.cache
            cached = hit * cache.group_tokens if hit and cache is not None else 0
            total = pool.blocks_for(w.tokens - cached + out)
        return total < avail - self.step_offset(eng, scheduled)

    def never_fits(self, prompt_tokens: int, max_tokens: int, limit: int) -> bool:
        """Would a request of ``prompt_tokens`` and ``max_tokens`` fail the check even alone in
        the engine (``limit``: the most tokens its class's blocks above the watermark hold)? The
        check is strict: its prompt and clipped output must leave a block free."""
        return -(-(prompt_tokens + clipped(max_tokens)) // self.bs) * self.bs >= limit

    def admitted(self, s: Scheduled) -> None:
        """``s``'s request was taken in: it reserves its output when its whole prompt is in this
        step (its prompt's blocks are already taken from the pool)."""
        assert self.offset is not None
        self.offset += _last_chunk_reserve(self.bs, s)

    def used_up(self, avail: int) -> bool:
        """After an admission, is the step's reserve used up (``avail``: the blocks still free
        and evictable, less the watermark)? SGLang then stops admission (``budget_state``)."""
        assert self.offset is not None
        return avail - self.offset <= 0

    def step_offset(self, eng: Engine, scheduled: dict) -> float:
        """The KV blocks reserved in the step being planned (worked out at its first check):
        the ratio's share of every running request's clipped remaining output, and the output
        of a running prompt whose last chunk is in this step (SGLang's chunked request, outside
        its running batch, reserves it whole)."""
        if self.offset is None:
            left = 0
            chunks = 0.0
            for r in eng.queues.running.values():
                s = scheduled.get(r.request_id)
                if s is not None and not s.decode:
                    chunks += _last_chunk_reserve(self.bs, s)
                    continue
                left += clipped(r.max_tokens - generated(eng, r))
            self.offset = self.ratio * left / self.bs + chunks
        return self.offset


def clipped(out: int) -> int:
    """Output tokens counted of a request's ``out``: at most CLIP_MAX_NEW_TOKENS."""
    return out if out < CLIP_MAX_NEW_TOKENS else CLIP_MAX_NEW_TOKENS


def generated(eng: Engine, r: Request) -> int:
    """Output tokens running ``r`` has generated (a cohort member's, without syncing it)."""
    if r.cohort_base_step != NOT_MEMBER and eng.cohort is not None:
        return r.generated + eng.cohort.steps - r.cohort_base_step
    return r.generated


def _last_chunk_reserve(bs: int, s: Scheduled) -> int:
    """Blocks a prefill in a step reserves for its output: ``min(max_tokens, 4096)`` when the
    step ends its prompt, else none (SGLang's ``_update_prefill_budget`` for a chunk)."""
    r = s.req
    if s.computed_before + s.tokens < r.tokens:
        return 0
    return -(-clipped(r.max_tokens) // bs)


def decode_only(plan: StepPlan) -> bool:
    """Does the step hold decoders and no prompt tokens (a decode step, whose ratio decays)?"""
    if plan.admitted:
        return False
    for s in plan.items:
        if not s.decode:
            return False
    return bool(plan.items) or plan.cohort > 0
