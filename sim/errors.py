"""priosim's exceptions: bad input found before a simulation starts (``ScenarioError``), and
broken invariants found while one runs."""
from __future__ import annotations


class ScenarioError(ValueError):
    """Bad input. ``str(err)`` is one line naming the file, the key, the value and what was
    expected; the CLI prints it and exits non-zero."""


class OracleAccessError(AttributeError):
    """A non-oracle policy read a request's true output length (policies never may: no real scheduler knows it)."""


class KVInvariantError(AssertionError):
    """KV-block accounting broke an invariant (blocks not conserved, over-release)."""
