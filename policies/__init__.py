"""Scheduling policies: they rank requests; the engine in ``sim`` does everything else.

``make_policy(name, **params)`` builds a registered policy or a user's ``pkg.mod:Class``;
``list_policies()`` lists the registered ones.
"""
from __future__ import annotations

from typing import Any

from policies.base import BasePolicy, Policy, RankingContext, RequestView
from plumbing.registry import Registry, check_param_names, load_dotted

POLICIES = Registry("policy")
POLICIES.register("fcfs", "policies.fcfs:FCFS", "first come, first served (arrival, then id)")
POLICIES.register("priority", "policies.priority:Priority",
                  "strict priority by class (0 most urgent), FCFS within a class")
POLICIES.register("wfq", "policies.wfq:WFQ",
                  "weighted fair queuing across classes: smallest virtual finish S + cost/w first")
POLICIES.register("aging", "policies.aging:Aging",
                  "priority aging: p_base - alpha x time in system (smaller first), FCFS among equals")
POLICIES.register("mlfq", "policies.mlfq:MLFQ",
                  "FastServe skip-join multi-level feedback queue with starvation promotion")
POLICIES.register("srpt_oracle", "policies.srpt:SRPTOracle",
                  "shortest remaining output first using the true length (simulation-only bound)")
POLICIES.register("sjf_rank", "policies.sjf_rank:SJFRank",
                  "shortest predicted output first (oracle / noisy / learned predictor), starvation guard")
POLICIES.register("lpm", "policies.lpm:LongestPrefixMatch",
                  "longest cached prefix first (SGLang), FCFS when the queue is long")


def make_policy(name: str, **params: Any) -> Policy:
    """Build policy ``name`` with its parameters; ``ValueError``/``KeyError`` on bad input."""
    factory = POLICIES.resolve(name)
    check_param_names(name, factory, params)
    policy = factory(**params)
    missing = [m for m in ("key",) if not callable(getattr(policy, m, None))]
    if missing:
        raise KeyError(f"'{name}' is not a policy: it has no {', '.join(missing)}() method")
    if getattr(type(policy), "key", None) is BasePolicy.key:  # (the base's raises NotImplementedError mid-run)
        raise KeyError(f"'{name}' is not a policy: it defines no key(req, now) (BasePolicy's is abstract; "
                       f"expected one returning a tuple ending in (arrival_s, request_id))")
    return policy


def check_policy(policy: Any, **params: Any) -> dict:
    """Run the policy conformance suite on a registered name, a class, or an instance
    (see :mod:`policies.check`); raises ``PolicyCheckError`` naming the first failure."""
    from policies.check import check_policy as _check
    return _check(policy, **params)


def list_policies() -> list[tuple[str, str]]:
    return [(e.name, e.description) for e in POLICIES.entries()]


from policies.predictors import PREDICTORS, make_predictor  # noqa: E402

__all__ = ["BasePolicy", "Policy", "RankingContext", "RequestView", "POLICIES", "make_policy", "list_policies",
           "check_policy", "PREDICTORS", "make_predictor", "Registry", "load_dotted"]
