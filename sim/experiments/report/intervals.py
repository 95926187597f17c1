"""The cost model's 80 % intervals in the report (results made with ``--uncertainty``,
docs/uncertainty.md): ``central (lo-hi)`` table cells and the charts' error bars and bands.
A result without intervals shows exactly as before."""
from __future__ import annotations

import math
from typing import Any

from sim.experiments.report.page import fmt

#: the note under a table or chart that shows intervals
NOTE = ("(lo-hi): the 80 % interval from the cost model's error (--uncertainty: the same scenario and seed "
        "at its metric kinds' low and high time factors), not seed noise; docs/uncertainty.md")


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def cell(m: dict, key: str) -> Any:
    """``m[key]`` as ``central (lo-hi)`` where ``m`` holds ``key_lo`` and ``key_hi``, else the value."""
    v, lo, hi = m.get(key), m.get(f"{key}_lo"), m.get(f"{key}_hi")
    if _num(v) and _num(lo) and _num(hi):
        return f"{fmt(v)} ({fmt(lo, 3)}-{fmt(hi, 3)})"
    return v


def has(m: dict) -> bool:
    """Whether a summary group (or row) carries any interval."""
    return any(k.endswith("_lo") for k in m)


def error_chart(title: str, label: str, groups: dict[str, dict], key: str) -> dict | None:
    """Per group (a class, 'overall'), ``key``'s central value with its interval as an error bar;
    None without intervals."""
    xs, ys, up, down = [], [], [], []
    for g, m in groups.items():
        v, lo, hi = m.get(key), m.get(f"{key}_lo"), m.get(f"{key}_hi")
        if _num(v) and _num(lo) and _num(hi):
            xs.append(g)
            ys.append(v)
            up.append(hi - v)
            down.append(v - lo)
    if not xs:
        return None
    from sim.experiments.report.page import layout

    return {"data": [{"type": "scatter", "mode": "markers", "x": xs, "y": ys, "name": label,
                      "marker": {"size": 10, "color": "#1f77b4"},
                      "error_y": {"type": "data", "symmetric": False, "array": up, "arrayminus": down,
                                  "thickness": 1.5, "width": 8},
                      "hovertemplate": "%{x}: %{y:.4g}<extra>80 % interval in the bar</extra>"}],
            "layout": layout(title, "class", label, yaxis={"rangemode": "tozero"})}
