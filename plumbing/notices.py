"""Warnings about suspicious but valid input (an SLO that looks like milliseconds, trace rows
that all fall after the horizon): the run goes on exactly as asked, and the user is told once.

They are ordinary Python warnings of one category, :class:`InputWarning`, so a library user can
filter them (``warnings.simplefilter("ignore", InputWarning)``) or make them errors; the
``priosim`` command prints each one as a single line ``warning: <message>`` on stderr
(:func:`sim.cli.group.one_line_warnings`). A message names the file or key, the value and why
it looks wrong, like an error's.
"""
from __future__ import annotations

import warnings


class InputWarning(UserWarning):
    """Suspicious input that is still valid: the simulation is not changed by it."""


def warn(msg: str) -> None:
    """Issue ``msg`` as an :class:`InputWarning` (pointing at the caller's caller)."""
    warnings.warn(msg, InputWarning, stacklevel=3)
