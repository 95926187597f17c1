"""Errors and small validation helpers shared by every workloads module.

A :class:`WorkloadError` message names where the problem is (a key path such as
``streams[0].arrival.rate`` or a file and 1-based line), the offending value and what was
expected, so a user can fix the scenario or trace without reading code.
"""
from __future__ import annotations

from typing import Any, Iterable

from plumbing.numbers import broken_bound, is_integer, is_number
from plumbing.suggest import did_you_mean


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
    require(key, value, is_number(value), "a finite number")
    v = float(value)
    broken = broken_bound(v, gt=gt, ge=ge, lt=lt, le=le)
    require(key, value, broken is None, str(broken))
    return v


def integer(key: str, value: Any, *, ge: int | None = None) -> int:
    """Check that ``value`` is an integer (an integral float is accepted) >= ``ge``."""
    require(key, value, is_integer(value, integral_floats=True), "an integer")
    v = int(value)
    if ge is not None:
        require(key, value, v >= ge, f"an integer >= {ge}")
    return v


def unknown_keys(path: str, given: Iterable[str], allowed: Iterable[str]) -> None:
    """Raise on the first key of ``given`` not in ``allowed``, with a "did you mean" hint."""
    allowed = sorted(allowed)
    for k in given:
        if k not in allowed:
            hint = did_you_mean(k, allowed)
            where = f"{path}.{k}" if path else k
            raise WorkloadError(f"{where}: unknown key (expected one of {', '.join(allowed)}){hint}")
