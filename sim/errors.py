"""Errors raised before any simulation starts: bad scenario, profile or policy input."""
from __future__ import annotations


class ScenarioError(ValueError):
    """Bad input. ``str(err)`` is one line naming the file, the key, the value and what was
    expected; the CLI prints it and exits non-zero."""
