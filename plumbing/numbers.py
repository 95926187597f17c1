"""Number checks every package shares: is a value a real number (or an integer), and which bound
does it break. Each caller words its own message and raises its own error (a scenario key, a
policy parameter, a trace row), so these return facts and the text of what was expected, never
raise. ``True``/``False`` are not numbers here, although Python counts them as ints.
"""
from __future__ import annotations

import math
from typing import Any


def is_number(value: Any) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_integer(value: Any, *, integral_floats: bool = False) -> bool:
    """An int (not a bool); with ``integral_floats``, also a finite float with no fraction (3.0)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return True
    return integral_floats and isinstance(value, float) and math.isfinite(value) and value.is_integer()


def _bounds(gt: float | None, ge: float | None, lt: float | None, le: float | None) -> list[tuple[str, Any]]:
    return [(op, b) for op, b in ((">", gt), (">=", ge), ("<", lt), ("<=", le)) if b is not None]


def _holds(value: float, op: str, bound: float) -> bool:
    return {">": value > bound, ">=": value >= bound, "<": value < bound, "<=": value <= bound}[op]


def bounds_text(*, gt: float | None = None, ge: float | None = None, lt: float | None = None,
                le: float | None = None) -> str:
    """The bounds as text, ``"> 0 and <= 1"`` (``""`` when there are none)."""
    return " and ".join(f"{op} {b:g}" for op, b in _bounds(gt, ge, lt, le))


def broken_bound(value: float, *, gt: float | None = None, ge: float | None = None,
                 lt: float | None = None, le: float | None = None) -> str | None:
    """The first bound (in the order gt, ge, lt, le) a number breaks, as text (``"> 0"``), or None."""
    for op, b in _bounds(gt, ge, lt, le):
        if not _holds(value, op, b):
            return f"{op} {b:g}"
    return None


def in_range(value: Any, *, gt: float | None = None, ge: float | None = None, lt: float | None = None,
             le: float | None = None, integer: bool = False) -> bool:
    """A finite number (an int when ``integer``) within every bound given."""
    ok = is_integer(value) if integer else is_number(value)
    return ok and broken_bound(value, gt=gt, ge=ge, lt=lt, le=le) is None
