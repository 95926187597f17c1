"""The admission gate: per-tenant rate limits and caps, memory budget, deadline-aware shedding.

Every check runs at the request's arrival instant, before any queue; a request that fails one
is rejected at once with a reason (the engine records ``status = rejected`` and
``reject_reason``). Checks in order, first failure wins; nothing is debited unless all pass:

``too_large``      prompt + max_tokens above ``admission.max_request_tokens`` (the engine itself
                   rejects, with the same reason, what could never fit in the KV pool);
``rate_limit``     the tenant's token buckets: ``rate_rps``/``burst_requests`` (1 per request)
                   and ``rate_tps``/``burst_tokens`` (prompt + max_tokens per request). A bucket
                   starts full and refills continuously at its rate up to its burst;
``concurrency``    the tenant's ``max_concurrency`` or the class's
                   ``admission.class_concurrency[class]`` requests admitted and not finished;
``memory_budget``  KV blocks promised (blocks for prompt + max_tokens) to admitted, unfinished
                   requests of the same or a more urgent class, plus this one, above
                   ``admission.memory_budget`` x the pool's blocks. Less urgent classes see more
                   promised work, so they are refused first;
``deadline``       with ``admission.shed = "deadline"``: the estimated time to first token
                   (:meth:`Gate.estimate_ttft`) exceeds ``shed_slack`` x the class's
                   ``ttft_slo_s`` (or the request's own ``deadline_s``, whichever is smaller).
                   Only the work ranked ahead of the request counts, so the least urgent
                   classes are shed first. Requests without either target are never shed.

Configuration: the scenario's ``[admission]``, ``[[tenants]]`` and ``[fairness]`` tables, validated
with the rest of the scenario (:mod:`sim.tables`); see docs/admission.md.
"""
from __future__ import annotations

import math
from collections import defaultdict

from sim.core.errors import ScenarioError

# ---- the gate ---------------------------------------------------------------------------------

class TokenBucket:
    """Capacity ``burst``, refilled continuously at ``rate`` per second; starts full."""

    __slots__ = ("rate", "burst", "level", "t")

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = float(rate)
        self.burst = float(burst)
        self.level = float(burst)
        self.t = 0.0

    def peek(self, now: float) -> float:
        return min(self.burst, self.level + self.rate * (now - self.t))

    def can(self, cost: float, now: float) -> bool:
        return self.peek(now) + 1e-9 >= cost

    def take(self, cost: float, now: float) -> None:
        self.level = self.peek(now) - cost
        self.t = now


class Gate:
    """Admission gate (see module docstring), a :class:`policies.contracts.Gate`: ``check`` ->
    reason or ''; ``on_finish`` releases."""

    def __init__(self, sc, costs) -> None:
        adm = sc.admission
        self.costs = costs
        self.cfg = sc.engine
        self.shed = adm.shed
        self.slack = float(adm.shed_slack)
        self.max_request_tokens = int(adm.max_request_tokens)
        self.memory_budget = float(adm.memory_budget)
        self.class_cap = {c: int(v) for c, v in adm.class_concurrency.items()}
        self.slo = {c.name: c.ttft_slo_s for c in sc.classes}
        self.tenants = {t.name: t for t in sc.tenants}
        self.req_bucket: dict[str, TokenBucket] = {}
        self.tok_bucket: dict[str, TokenBucket] = {}
        for name, t in self.tenants.items():
            if t.rate_rps is not None:
                burst = t.burst_requests if t.burst_requests is not None else max(1.0, t.rate_rps)
                self.req_bucket[name] = TokenBucket(t.rate_rps, burst)
            if t.rate_tps is not None:
                self.tok_bucket[name] = TokenBucket(t.rate_tps, t.burst_tokens if t.burst_tokens is not None
                                                    else t.rate_tps)
        self.tenant_cap = {n: int(t.max_concurrency) for n, t in self.tenants.items() if t.max_concurrency is not None}
        self.in_tenant: dict[str, int] = defaultdict(int)
        self.in_class: dict[str, int] = defaultdict(int)
        self.promised: dict[int, int] = defaultdict(int)  # blocks promised per priority
        self._blocks: dict[int, int] = {}  # request_id -> promised blocks
        self.view = None  # the replica's GateView (bind)
        self.rejected: dict[str, int] = defaultdict(int)
        self.rejections: list[tuple[int, float, str]] = []  # (request_id, time decided, reason)
        self.admitted = 0
        # mean output length per class, from finished requests (prior: half of max_tokens)
        self.out_sum: dict[str, float] = defaultdict(float)
        self.out_n: dict[str, int] = defaultdict(int)
        self._est: dict[int, float] = {}
        self.est_ratio: list[float] = []  # actual / estimated TTFT of admitted requests
        self.shed_log: list[tuple[float, str, float, float]] = []  # (t, class, est, target)

    def bind(self, view) -> None:
        """The replica's :class:`sim.core.engine.GateView`, read when ``check`` is given none."""
        self.view = view

    # ---- checks ----------------------------------------------------------------------------
    def check(self, req, now_s: float, view=None) -> str:
        view = view if view is not None else self.view
        reason = self._check(req, now_s, view)
        if reason:
            self.rejected[reason] += 1
            self.rejections.append((req.request_id, now_s, reason))
            return reason
        self._commit(req, now_s, view)
        return ""

    def _cost_tokens(self, req) -> int:
        return req.prompt_tokens + req.max_tokens

    def _check(self, req, now: float, view) -> str:
        need = self._cost_tokens(req)
        if self.max_request_tokens and need > self.max_request_tokens:
            return "too_large"
        t = req.tenant
        b = self.req_bucket.get(t)
        if b is not None and not b.can(1.0, now):
            return "rate_limit"
        b = self.tok_bucket.get(t)
        if b is not None and not b.can(need, now):
            return "rate_limit"
        cap = self.tenant_cap.get(t)
        if cap is not None and self.in_tenant[t] >= cap:
            return "concurrency"
        cap = self.class_cap.get(req.cls)
        if cap is not None and self.in_class[req.cls] >= cap:
            return "concurrency"
        if self.memory_budget > 0 and view is not None:
            blocks = view.pool.blocks_for(need)
            ahead = sum(v for p, v in self.promised.items() if p <= req.priority)
            if ahead + blocks > self.memory_budget * view.pool.total:
                return "memory_budget"
        if self.shed == "deadline" and view is not None:
            target = self.target(req)
            if target is not None:
                est = self.estimate_ttft(req, now, view)
                if est > self.slack * target:
                    self.shed_log.append((now, req.cls, est, target))
                    return "deadline"
                self._est[req.request_id] = est
        return ""

    def _commit(self, req, now: float, view) -> None:
        t = req.tenant
        if t in self.req_bucket:
            self.req_bucket[t].take(1.0, now)
        if t in self.tok_bucket:
            self.tok_bucket[t].take(self._cost_tokens(req), now)
        self.in_tenant[t] += 1
        self.in_class[req.cls] += 1
        if self.memory_budget > 0 and view is not None:
            b = view.pool.blocks_for(self._cost_tokens(req))
            self.promised[req.priority] += b
            self._blocks[req.request_id] = b
        self.admitted += 1

    def on_finish(self, req, now_s: float) -> None:
        self.in_tenant[req.tenant] -= 1
        self.in_class[req.cls] -= 1
        b = self._blocks.pop(req.request_id, 0)
        if b:
            self.promised[req.priority] -= b
        self.out_sum[req.cls] += req.generated
        self.out_n[req.cls] += 1
        est = self._est.pop(req.request_id, None)
        if est is not None and req.first_token_ns >= 0 and est > 0:
            self.est_ratio.append((req.first_token_ns / 1e9 - req.arrival_s) / est)

    # ---- deadline estimate -----------------------------------------------------------------
    def target(self, req) -> float | None:
        slo = self.slo.get(req.cls)
        d = req.deadline_s
        cands = [x for x in (slo, d) if x is not None and not (isinstance(x, float) and math.isnan(x))]
        return min(cands) if cands else None

    def mean_output(self, cls: str, max_tokens: int) -> float:
        n = self.out_n.get(cls, 0)
        if n == 0:
            return max(1.0, max_tokens / 2.0)
        return max(1.0, self.out_sum[cls] / n)

    def estimate_ttft(self, req, now: float, view) -> float:
        """Estimated seconds from now to ``req``'s first token, from the work ranked ahead of it.

        Ahead: waiting requests whose rank key is below ``req``'s, and running requests it may
        not evict (same or more urgent class, or eviction disabled). With B the step token
        budget, S the slot limit, D = min(S, running ahead + waiting ahead) decoders:

        * prefill: Q = prompt tokens still to compute for the waiting ahead, the running ahead
          and ``req``; it takes ceil(Q / (B - D)) steps, each priced by the profile as a step
          of min(Q, B - D) prefill tokens and D decodes at the current mean context;
        * slots and memory: if the waiting ahead plus ``req`` need k more slots (or KV blocks,
          converted to requests at the running ones' mean blocks) than are free, k running
          requests must finish first; with R running ahead of mean output length L (tokens,
          from finished requests of their class), one finishes every L / R decode steps, so
          the wait is k * L / R decode steps priced at D decodes.

        The estimate is the sum of the two.
        """
        W, R, evictable_blocks = self._ahead(req, now, view)
        pool = view.pool
        Q = req.prompt_tokens
        need_blocks = pool.blocks_for(req.prompt_tokens + 1)
        ctx = 0
        for r in W:
            Q += max(0, r.tokens - r.computed)
            need_blocks += pool.blocks_for(r.tokens + 1)
            ctx += r.tokens
        for r in R:
            Q += max(0, r.tokens - r.computed - 1)
            ctx += r.tokens
        n_dec = min(view.max_num_seqs, len(R) + len(W))
        mean_ctx = ctx / max(1, len(R) + len(W))
        B = view.max_batched_tokens
        per = max(1, B - n_dec)
        chunk = min(Q, per)
        steps_p = -(-Q // per)
        mean_prompt = Q / (len(W) + 1)
        l2 = chunk * min(mean_prompt, chunk)
        t_prefill = steps_p * view.costs.step_s(P=chunk, D=n_dec, sum_l2=l2, sum_ctx=n_dec * mean_ctx)
        # slots and memory
        free_slots = view.max_num_seqs - len(R)
        k_slots = max(0, len(W) + 1 - free_slots)
        avail = pool.available_for(req.priority) - view.watermark_blocks + evictable_blocks
        k = max(k_slots, self._finishes_for_memory(need_blocks - avail, R, view))
        return t_prefill + self._wait_s(k, R, mean_ctx, view)

    def _ahead(self, req, now: float, view) -> tuple[list, list, int]:
        """The waiting requests ranked before ``req``, the running ones it may not evict, and the
        KV blocks of those it may."""
        try:
            k_new = view.key(req, now)
        except ScenarioError:  # a policy breaking its contract (a write, a NaN key) stops the run
            raise
        except Exception:  # a policy that needs on_arrival first: rank by class, then FIFO
            k_new = (req.priority, math.inf)
        evict = view.evicts_for_waiters
        W = [r for key, r in view.waiting() if _before(key, k_new, r, req)]
        R = []
        evictable_blocks = 0
        for r in view.running():
            if evict and r.priority > req.priority:
                evictable_blocks += r.blocks
            else:
                R.append(r)
        return W, R, evictable_blocks

    @staticmethod
    def _finishes_for_memory(deficit: int, R: list, view) -> int:
        """Running requests (of ``R``) that must finish to free ``deficit`` KV blocks."""
        if deficit <= 0:
            return 0
        pool = view.pool
        if not view.grows_blocks:
            per_req = sum(pool.blocks_for(r.prompt_tokens + r.max_tokens) for r in R) / max(1, len(R))
        else:
            per_req = sum(r.blocks for r in R) / max(1, len(R))
        return math.ceil(deficit / max(1.0, per_req))

    def _wait_s(self, k: int, R: list, mean_ctx: float, view) -> float:
        """Seconds until ``k`` of the running requests ``R`` finish (decode steps of all of them)."""
        if k <= 0 or not R:
            return 0.0
        L = sum(self.mean_output(r.cls, r.max_tokens) for r in R) / len(R)
        steps = k * L / len(R)
        return steps * view.costs.step_s(D=len(R), sum_ctx=len(R) * (mean_ctx + view.pool.block_size))

    def report(self) -> dict:
        r = sorted(self.est_ratio)
        return {
            "shed": self.shed,
            "admitted": self.admitted,
            "rejected": dict(sorted(self.rejected.items())),
            "shed_by_class": _count(c for _, c, _, _ in self.shed_log),
            "ttft_actual_over_estimate_p50": r[len(r) // 2] if r else None,
            "ttft_actual_over_estimate_p90": r[int(len(r) * 0.9)] if r else None,
        }


def _before(key: tuple, k_new: tuple, r, req) -> bool:
    try:
        return key < k_new
    except TypeError:
        return (r.priority, r.arrival_s) <= (req.priority, req.arrival_s)


def _count(it) -> dict:
    out: dict = defaultdict(int)
    for x in it:
        out[x] += 1
    return dict(sorted(out.items()))


def make_gate(sc, costs):
    """The gate for a scenario, or None when nothing gates arrivals."""
    adm = sc.admission
    gating = (adm.shed != "none" or adm.max_request_tokens or adm.memory_budget or adm.class_concurrency
              or any(t.gated for t in sc.tenants))
    return Gate(sc, costs) if gating else None


def make_fair_policy(sc, policy):
    """Wrap ``policy`` with the fairness accountant. With ``fairness.enabled`` it orders tenants
    within a class; otherwise it only keeps the per-tenant books (keys are the inner policy's)."""
    fair = sc.fairness
    from sim.core.fairness import FairShare
    return FairShare(policy, enabled=fair.enabled, shares={t.name: float(t.share) for t in sc.tenants},
                     measure=fair.measure, window_s=fair.window_s,
                     prompt_price=fair.prompt_price, output_price=fair.output_price,
                     max_num_seqs=sc.engine.max_num_seqs,
                     max_concurrency={t.name: int(t.max_concurrency) for t in sc.tenants
                                      if t.max_concurrency is not None})
