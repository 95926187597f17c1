"""Policies used by the sweep tests: ``Broken`` fails at run time (not at validation), so a sweep
that includes it has one deliberately broken run per cell."""
from __future__ import annotations

from policies.base import BasePolicy


class Broken(BasePolicy):
    name = "broken"
    description = "raises on the first ranking (tests only)"

    def key(self, req, now):
        raise RuntimeError("boom: deliberately broken policy")
