"""A scheduling policy of your own: last come, first served, optionally within class priority.

Load it by file path or, from this folder, by module path (no install, no ``PYTHONPATH``):

    priosim run chat_vs_batch --policy docs/examples/lifo_policy.py:LIFO
    cd docs/examples && priosim run chat_vs_batch --policy lifo_policy:LIFO

or from a scenario file: ``[policy] name = "lifo_policy:LIFO"`` plus ``per_class = false``.
Check it against the engine's contract with
``python -c "from policies import check_policy; print(check_policy('docs/examples/lifo_policy.py:LIFO'))"``.
A walk-through is in docs/own-policy.md.
"""
from __future__ import annotations

from policies import BasePolicy


class LIFO(BasePolicy):
    """Newest request first. Keys are compared as tuples, smaller = more urgent, and must end in
    ``(arrival_s, request_id)`` so that the order is total and every run repeats exactly."""

    name = "lifo"
    description = "last come, first served; with per_class = true, within class priority"

    def __init__(self, per_class: bool = True) -> None:
        super().__init__()
        if not isinstance(per_class, bool):  # bad parameters: one line naming policy, parameter, value
            raise ValueError(f"lifo: per_class must be true or false (got {per_class!r})")
        self.per_class = per_class

    def key(self, req, now: float) -> tuple:
        head = (req.priority,) if self.per_class else ()
        return (*head, -req.arrival_s, req.arrival_s, req.request_id)
