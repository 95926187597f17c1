"""Errors and small validation helpers shared by every workloads module.

A :class:`WorkloadError` message names where the problem is (a key path such as
``streams[0].arrival.rate`` or a file and 1-based line), the offending value and what was
expected, so a user can fix the scenario or trace without reading code.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Iterable

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


def made_with(factory: Callable, params: dict, what: str, also: str = "") -> Any:
    """``factory(**params)``, or a WorkloadError naming the parameters ``what`` (e.g. "process
    'batch'") does not take or misses, with what it expects (``also``: optional ones handled
    before the call, e.g. a length's min and max), in place of Python's TypeError."""
    try:
        return factory(**params)
    except TypeError as exc:
        try:
            sig = inspect.signature(factory).parameters
        except (TypeError, ValueError):
            sig = {}
        names = [n for n, q in sig.items() if q.kind not in (q.VAR_POSITIONAL, q.VAR_KEYWORD)]
        expected = ", ".join(names) + (f", plus optional {also}" if also else "") if names else "?"
        open_kw = any(q.kind == q.VAR_KEYWORD for q in sig.values())
        unknown = [k for k in params if k not in names] if not open_kw else []
        missing = [n for n, q in sig.items() if q.default is q.empty and q.kind in (
            q.POSITIONAL_OR_KEYWORD, q.KEYWORD_ONLY) and n not in params]
        hint = ""
        if unknown:
            hint = did_you_mean(unknown[0], names)
            verb = "is not one" if len(unknown) == 1 else "are not"
            why = f"{', '.join(map(repr, unknown))} {verb} of its parameters"
        elif missing:
            why = f"missing {', '.join(map(repr, missing))}"
        else:
            why = str(exc)  # (raised inside the factory: its own words)
        raise WorkloadError(f": bad parameters {sorted(params)} for {what}: {why} (expected {expected})"
                            f"{hint}") from None
