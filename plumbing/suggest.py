"""The "did you mean" hint every unknown-name message shares (a key, a class, a profile): the
closest known name by :func:`difflib.get_close_matches`, or nothing when none is close."""
from __future__ import annotations

import difflib
from typing import Iterable


def closest(name: object, known: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The known name closest to ``name`` (a similarity of at least ``cutoff``, difflib's
    ratio), else None."""
    close = difflib.get_close_matches(str(name), [str(k) for k in known], n=1, cutoff=cutoff)
    return close[0] if close else None


def did_you_mean(name: object, known: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the known name closest to ``name``, else ``""``."""
    close = closest(name, known)
    return f"; did you mean '{close}'?" if close else ""
