"""Scheduling policies: they rank requests; the engine in ``sim`` does everything else.

``make_policy(name, **params)`` builds a registered policy or a user's ``pkg.mod:Class``;
``list_policies()`` lists the registered ones.
"""
from __future__ import annotations

from typing import Any

from policies.base import BasePolicy, Policy, RequestView
from policies.registry import Registry, load_dotted

POLICIES = Registry("policy")
POLICIES.register("fcfs", "policies.fcfs:FCFS", "first come, first served (arrival, then id)")
POLICIES.register("priority", "policies.priority:Priority",
                  "strict priority by class (0 most urgent), FCFS within a class")


def make_policy(name: str, **params: Any) -> Policy:
    """Build policy ``name`` with its parameters; ``ValueError``/``KeyError`` on bad input."""
    factory = POLICIES.resolve(name)
    policy = factory(**params)
    missing = [m for m in ("key",) if not callable(getattr(policy, m, None))]
    if missing:
        raise KeyError(f"'{name}' is not a policy: it has no {', '.join(missing)}() method")
    return policy


def list_policies() -> list[tuple[str, str]]:
    return [(e.name, e.description) for e in POLICIES.entries()]


__all__ = ["BasePolicy", "Policy", "RequestView", "POLICIES", "make_policy", "list_policies",
           "Registry", "load_dotted"]
