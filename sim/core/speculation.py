"""Speculative decoding: a decoder verifies ``k`` draft tokens plus its own in one step.

A drafting decoder takes ``1 + k`` tokens of the step's budget (when the budget allows and its
class drafts); the step also pays the draft model's ``k`` sequential decode steps (its own
profile, or ``draft_cost_fraction`` of a target decode step). At the step's end it emits
``1 + a`` tokens, ``a`` the leading successes of ``k`` Bernoulli(acceptance) trials, drawn from
the engine's own random stream (never from the policy-visible request fields).
"""
from __future__ import annotations

import numpy as np

from sim.core.costs import CostModel
from sim.core.plan import Scheduled
from sim.core.request import Request


class Speculation:
    """One replica's speculative decoding: the draft length, who drafts, the draws, the counts.

    Args:
        spec: the scenario's ``engine.speculative`` table.
        classes: scenario classes, in declaration order (``speculate = false`` opts one out).
        seed: the seed of the acceptance draws.
        overhead: the engine-overhead preset a draft profile is priced with.
        scale: the scenario's ``engine.cost_scale`` (a draft profile's times are scaled alike).
    """

    def __init__(self, spec, classes, seed: int, overhead, scale: float = 1.0) -> None:
        self.k: int = spec.k
        self.acceptance = spec.acceptance
        self.draft_cost_fraction: float = spec.draft_cost_fraction
        self.drafts = [bool(getattr(c, "speculate", True)) for c in classes]  # per class
        self.rng = np.random.default_rng(seed)
        self.draft_costs: CostModel | None = None
        if spec.draft_profile:
            from sim.core.costs import load_profile
            self.draft_costs = load_profile(spec.draft_profile, where="engine.speculative.draft_profile",
                                            overhead=overhead, scale=scale)
        self.stats = {"steps": 0, "sequence_steps": 0, "drafted": 0, "accepted": 0, "emitted": 0}

    def tokens(self, cls_idx: int, budget: int) -> int:
        """Tokens a decoder of class ``cls_idx`` takes with ``budget`` left: k drafts + 1, or 1."""
        return 1 + self.k if budget > self.k and self.drafts[cls_idx] else 1

    def draft_ns(self, costs: CostModel, items: list[Scheduled]) -> int:
        """The draft model's k sequential steps over this step's drafting decoders, ns."""
        drafting = [s for s in items if s.decode and s.tokens > 1]
        if not drafting:
            return 0
        dctx = sum(s.computed_before + 1 for s in drafting)
        if self.draft_costs is not None:  # the draft model's own profile, k decode steps
            return self.k * self.draft_costs.step_ns(0, len(drafting), 0, 0, dctx)
        one = costs.step_ns(0, len(drafting), 0, 0, dctx)
        return int(round(self.k * self.draft_cost_fraction * one))

    def acceptance_of(self, r: Request) -> float:
        """This request's per-token draft acceptance probability."""
        acc = self.acceptance
        if isinstance(acc, dict):
            if "dist" in acc:  # each request draws its own rate once (Beta(a, b))
                if r.spec_acceptance < 0:
                    r.spec_acceptance = float(self.rng.beta(acc["a"], acc["b"]))
                return r.spec_acceptance
            for name in (r.cls, r.tenant):  # a table by class or tenant name
                if name in acc:
                    return float(acc[name])
            return 0.0
        return acc

    def accepted(self, r: Request, k: int) -> int:
        """Draft tokens accepted: leading successes of k Bernoulli(acceptance) trials."""
        acc = self.acceptance_of(r)
        if acc >= 1.0:
            return k
        if acc <= 0.0:
            return 0
        return min(k, int(self.rng.geometric(1.0 - acc)) - 1)

    def verify(self, r: Request, drafted: int) -> int:
        """A speculative step of ``r`` with ``drafted`` drafts ended: tokens it emits (1 +
        accepted, at most what is left of its output), counted; a draft accepted past the
        output's end is counted as wasted, not accepted (its verification bought nothing)."""
        a = self.accepted(r, drafted)
        emitted = min(1 + a, r.hidden_output_tokens - r.generated)
        st = self.stats
        st["sequence_steps"] += 1
        st["drafted"] += drafted
        st["accepted"] += emitted - 1
        st["emitted"] += emitted
        return emitted

