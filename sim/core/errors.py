"""priosim's exceptions: bad input found before a simulation starts (``ScenarioError``), and
broken invariants found while one runs."""
from __future__ import annotations


def error_message(exc: BaseException) -> str:
    """An exception's message as raised (``str`` of a KeyError would quote it)."""
    return str(exc.args[0]) if exc.args else str(exc)


class ScenarioError(ValueError):
    """Bad input. ``str(err)`` is one line naming the file, the key, the value and what was
    expected; the CLI prints it and exits non-zero."""


class OracleAccessError(AttributeError):
    """A non-oracle policy read a request's true output length (policies never may: no real scheduler knows it)."""


class KVInvariantError(AssertionError):
    """KV-block accounting broke an invariant (blocks not conserved, over-release)."""


class StallError(ScenarioError):
    """The run cannot go on: no token emitted and no request ended over a long stretch of
    engine steps while work exists (a livelock), nothing runnable and nothing to wait for, or
    the ``engine.max_events`` safety stop. One line naming the requests and the cause."""
