"""Errors and small validation helpers shared by every workloads module.

A :class:`WorkloadError` message names where the problem is (a key path such as
``streams[0].arrival.rate`` or a file and 1-based line), the offending value and what was
expected, so a user can fix the scenario or trace without reading code.
"""
from __future__ import annotations

import difflib
import math
from typing import Any, Iterable


class WorkloadError(ValueError):
    """Bad workload input: a stream table, a distribution's parameters or a trace file."""


def prefixed(path: str, err: WorkloadError) -> WorkloadError:
    """Return ``err`` with ``path.`` put in front of its message (for nested key paths)."""
    msg = str(err)
    sep = "" if msg.startswith(("[", ":")) else "."
    return WorkloadError(f"{path}{sep}{msg}" if path else msg)


def require(key: str, value: Any, ok: bool, expected: str) -> None:
    """Raise ``WorkloadError("key: must be <expected> (got value)")`` unless ``ok``."""
    if not ok:
        raise WorkloadError(f"{key}: must be {expected} (got {value!r})")


def number(key: str, value: Any, *, gt: float | None = None, ge: float | None = None,
           le: float | None = None, lt: float | None = None) -> float:
    """Check that ``value`` is a finite real number within the given bounds; return it as float."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    require(key, value, ok, "a finite number")
    v = float(value)
    if gt is not None:
        require(key, value, v > gt, f"> {gt:g}")
    if ge is not None:
        require(key, value, v >= ge, f">= {ge:g}")
    if lt is not None:
        require(key, value, v < lt, f"< {lt:g}")
    if le is not None:
        require(key, value, v <= le, f"<= {le:g}")
    return v


def integer(key: str, value: Any, *, ge: int | None = None) -> int:
    """Check that ``value`` is an integer (an integral float is accepted) >= ``ge``."""
    ok = (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, float) and math.isfinite(value) and value.is_integer())
    require(key, value, ok, "an integer")
    v = int(value)
    if ge is not None:
        require(key, value, v >= ge, f"an integer >= {ge}")
    return v


def unknown_keys(path: str, given: Iterable[str], allowed: Iterable[str]) -> None:
    """Raise on the first key of ``given`` not in ``allowed``, with a "did you mean" hint."""
    allowed = sorted(allowed)
    for k in given:
        if k not in allowed:
            close = difflib.get_close_matches(k, allowed, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            where = f"{path}.{k}" if path else k
            raise WorkloadError(f"{where}: unknown key (expected one of {', '.join(allowed)}){hint}")
