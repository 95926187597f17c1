"""A waiting rule in one file: a waiter may evict any running request of a less urgent class
that the policy ranks below it, however close their priorities (``threshold`` with no gap).

Named in a scenario as ``engine.preempt_for_waiting = "tests.plugins.any_lower:AnyLower"``.
"""
from sim.core.preemption import WaitingRule


class AnyLower(WaitingRule):
    """A running request of any less urgent class, ranked below the waiter."""

    name = "any_lower"

    def none_below(self, top: int, w) -> bool:
        return top <= w.priority

    def victims(self, w, running, queues) -> list:
        return [r for r in running if r.priority > w.priority and r.key > w.key]
