"""Strict JSON for every file priosim writes: ``NaN`` and infinities, which Python's ``json``
writes as bare ``NaN`` / ``Infinity`` (not JSON: JavaScript's ``JSON.parse`` and most other
parsers reject them), become ``null``, with the reason beside the value as ``<key>_note``
("infinite", "-infinite" or "not a number") so a reader can tell a missing value from a
mean rate of a batch that arrived all at once."""
from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

NOTE = "_note"


def _why(x: float) -> str:
    return "not a number" if math.isnan(x) else ("infinite" if x > 0 else "-infinite")


def strict(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by None (and its ``<key>_note`` in a dict)."""
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if isinstance(v, np.generic):
                v = v.item()
            if isinstance(v, float) and not math.isfinite(v):
                out[k] = None
                out[f"{k}{NOTE}"] = _why(v)
            else:
                out[k] = strict(v)
        return out
    if isinstance(obj, (list, tuple)):
        return [strict(v) for v in obj]
    return obj


def dumps(obj: Any, **kw) -> str:
    """``json.dumps`` of :func:`strict` ``(obj)``; raises ValueError on any non-finite left."""
    return json.dumps(strict(obj), allow_nan=False, **kw)
