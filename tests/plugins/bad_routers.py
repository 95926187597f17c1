"""Routers that break the contract (``route`` returns one of its candidates), for the guard's
tests: a user's router that answers something else stops the run in one line."""
from sim.routers import BaseRouter


class Nowhere(BaseRouter):
    """Answers None."""

    name = "nowhere"

    def route(self, req, candidates, now_ns):
        return None


class ByIndex(BaseRouter):
    """Answers the replica's number, not the replica."""

    name = "by_index"

    def route(self, req, candidates, now_ns):
        return candidates[-1].index
