"""A step's limits: slots, the token budget, prefill chunk caps, the KV watermark.

One owner (:class:`StepLimits`) for the settings every plan reads (from ``[engine]`` and the
classes' ``max_prefill_tokens_per_step``) and for the one piece of step state they bound: the
prefill tokens each class has taken in the step being planned.
"""
from __future__ import annotations

import math

from sim.core.costs import NEVER
from sim.core.request import Request

__all__ = ["StepLimits"]


class StepLimits:
    """What one step may hold.

    Args:
        cfg: the scenario's EngineConfig (``max_batched_tokens``, ``max_num_seqs``,
            ``chunked_prefill``, ``batching``, ``max_prefill_chunk``, ``watermark``).
        class_prefill_cap: each class's prefill tokens per step (0: no cap).
        pool_blocks: the KV pool's blocks (the watermark is a share of them).
        draft_slots: KV slots a speculative decode step's drafts take beyond its token.

    Attributes (read by the planner and fast-forward): ``max_batched_tokens`` (tokens per
    step), ``max_num_seqs`` (running requests), ``chunked_prefill``, ``prefill_first`` (the
    batching mode: prefill steps apart from decode steps), ``chunk_cap`` (tokens of
    one prefill chunk; NEVER for none), ``class_prefill_cap`` and ``class_prefill`` (per class:
    the cap and what the step being planned took), ``counting_prefill`` (any cap set),
    ``watermark_blocks`` (blocks admission leaves free), ``draft_slots``.
    """

    def __init__(self, cfg, class_prefill_cap: list[int], pool_blocks: int, draft_slots: int = 0) -> None:
        self.max_batched_tokens: int = cfg.max_batched_tokens
        self.max_num_seqs: int = cfg.max_num_seqs
        self.chunked_prefill: bool = cfg.chunked_prefill
        # a step that can take prefill work holds only that (engine.batching; sim.core.planner)
        self.prefill_first: bool = cfg.batching == "prefill_first"
        self.chunk_cap: int = cfg.max_prefill_chunk or NEVER
        self.class_prefill_cap = class_prefill_cap
        self.class_prefill = [0] * len(class_prefill_cap)
        self.counting_prefill = any(class_prefill_cap)
        self.watermark_blocks = int(math.ceil(cfg.watermark * pool_blocks))
        self.draft_slots = draft_slots
        # the longest request (prompt + max_tokens) the engine accepts (vLLM's max_model_len,
        # SGLang's context length): NEVER for no such limit
        self.max_model_len: int = cfg.max_model_len or NEVER
        self._need_limits: dict[int, int] = {}  # per priority: the largest request the KV cache holds (kv_limit)

    def new_step(self) -> None:
        """A plan starts: no class has taken prefill tokens yet."""
        if self.counting_prefill:
            self.class_prefill = [0] * len(self.class_prefill_cap)

    def chunk(self, req: Request, budget: int, class_prefill: list[int] | None = None) -> int:
        """Tokens ``req`` may take this step: 1 for a decode; for a prefill, what is left of the
        budget, the per-request chunk cap and its class's per-step prefill cap allow (prefill
        tokens already taken per class: ``class_prefill``, default this step's)."""
        need = req.tokens - req.computed
        if need <= 1:
            return 1 if budget >= 1 else 0
        cap = self.class_prefill_cap[req.cls_idx]
        if cap:
            used = (self.class_prefill if class_prefill is None else class_prefill)[req.cls_idx]
            if self.chunked_prefill or used:
                budget = min(budget, cap - used)
            # unchunked prompts longer than the cap go one per step (else they never could)
        if self.chunked_prefill:
            # max(0, min(need, budget, chunk_cap)), compared (about a sixth of the builtins' cost)
            n = need if need < budget else budget
            if n > self.chunk_cap:
                n = self.chunk_cap
            return n if n > 0 else 0
        return need if need <= budget else 0

    def chunk_size(self, r: Request) -> int:
        """Prefill tokens a request takes in a step where nothing but its caps limit it: the chunk
        cap and its class's per-step prefill cap (NEVER when neither is set)."""
        c = self.chunk_cap
        cap = self.class_prefill_cap[r.cls_idx]
        return cap if cap and cap < c else c

    def class_capped(self, w: Request) -> bool:
        """Is ``w`` (a prefill) held back only by its class's per-step prefill cap?"""
        cap = self.class_prefill_cap[w.cls_idx]
        used = self.class_prefill[w.cls_idx]
        if not cap or w.tokens - w.computed <= 1 or not used:
            return False
        return used >= cap or (not self.chunked_prefill and used + w.tokens - w.computed > cap)

    def took_prefill(self, cls_idx: int, tokens: int) -> None:
        """A prefill of class ``cls_idx`` took ``tokens`` in the step being planned."""
        self.class_prefill[cls_idx] += tokens

    def kv_limit(self, priority: int, pool) -> int:
        """The most tokens (prompt + output + drafts) the KV cache could ever hold for a request of
        ``priority``, kept per priority (one lookup an arrival): its blocks within what it could
        ever hold of ``pool`` above the watermark (``blocks_for(need) <= C`` exactly when ``need
        <= C * block_size``); more is rejected at its arrival as ``too_large``."""
        limit = self._need_limits.get(priority)
        if limit is None:
            limit = self._need_limits[priority] = (pool.capacity_for(priority) - self.watermark_blocks) * pool.block_size
        return limit

    def step_need(self, prompt_tokens: int, need: int, grows_blocks: bool) -> int:
        """The tokens a request must prefill in one step without chunked prefill (0 with it, when
        a prompt may be split): its prompt, or, when a preemption may make it prefill again all it
        holds (``grows_blocks``: a mode that preempts), ``need`` (prompt + max_tokens + drafts).
        More than the step's budget is rejected at its arrival as ``too_long_for_step``."""
        if self.chunked_prefill:
            return 0
        return need if grows_blocks else prompt_tokens
