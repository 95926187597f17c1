"""Side-by-side comparison of two runs' per-class metrics, for quick what-if answers.

``compare_runs(a, b)`` reads two results folders (``summary.json``) and returns one row per
class and metric with the value in A, in B, and the ratio B/A (NaN where A is zero or a metric
is missing). ``format_comparison`` renders it as the text table ``priosim compare`` prints.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from sim.core.columns import STATS

# (metric, unit) in print order: the request counts, the per-request statistics the column table
# (sim.core.columns.STATS) marks for comparison, then figures that are not of request columns.
# Lower is better except where noted in HIGHER_IS_BETTER.
METRICS = [
    ("arrived", "req"), ("finished", "req"), ("rejected", "req"), ("unfinished", "req"),
    *[(s.key, s.unit) for s in STATS if s.compare],
    ("itl_p99_s", "s"), ("throughput_rps", "req/s"), ("goodput_rps", "req/s"),
    ("slo_attainment", "frac"), ("swap_s", "s"), ("recompute_s", "s"),
]
HIGHER_IS_BETTER = {"finished", "throughput_rps", "goodput_rps", "slo_attainment",
                    *[s.key for s in STATS if s.compare and s.higher_is_better]}


def _summary(run_dir: str | Path) -> dict:
    d = Path(run_dir)
    f = d / "summary.json"
    if not f.is_file():
        hint = " (a sweep folder: compare two of its runs/<run_id> folders)" if (d / "sweep.parquet").exists() else ""
        raise FileNotFoundError(f"{d}: not a run results folder: no summary.json{hint}")
    return json.loads(f.read_text())


def compare_runs(a: str | Path, b: str | Path, metrics: list[str] | None = None) -> pd.DataFrame:
    """Per class (classes of A first, then any only in B, then ``overall``) and metric:
    ``a``, ``b``, ``ratio`` = b / a, and ``better`` ('a', 'b' or '' when equal or unknown).
    ``metrics``: names from ``METRICS`` (ValueError naming the valid ones otherwise)."""
    known = [m for m, _ in METRICS]
    for m in metrics or []:
        if m not in known:
            raise ValueError(f"--metric: unknown metric {m!r} (expected one of {', '.join(known)})")
    sa, sb = _summary(a), _summary(b)
    wanted = [(m, u) for m, u in METRICS if metrics is None or m in metrics]
    classes = list(sa["classes"]) + [c for c in sb["classes"] if c not in sa["classes"]]
    rows = []
    for c in [*classes, "overall"]:
        ma = sa["overall"] if c == "overall" else sa["classes"].get(c, {})
        mb = sb["overall"] if c == "overall" else sb["classes"].get(c, {})
        for m, unit in wanted:
            va, vb = ma.get(m), mb.get(m)
            if va is None and vb is None:
                continue
            fa = math.nan if va is None else float(va)
            fb = math.nan if vb is None else float(vb)
            ratio = fb / fa if fa and not math.isnan(fa) and not math.isnan(fb) else math.nan
            better = ""
            if not (math.isnan(fa) or math.isnan(fb)) and fa != fb and m not in ("arrived",):
                b_wins = (fb > fa) if m in HIGHER_IS_BETTER else (fb < fa)
                better = "b" if b_wins else "a"
            rows.append({"class": c, "metric": m, "unit": unit, "a": fa, "b": fb, "ratio": ratio,
                         "better": better})
    return pd.DataFrame(rows, columns=["class", "metric", "unit", "a", "b", "ratio", "better"])


def format_comparison(df: pd.DataFrame, a: str | Path, b: str | Path) -> str:
    """The text table: a header naming A and B (policy, seed, scenario), then one block per class."""
    sa, sb = _summary(a), _summary(b)
    lines = [f"A: {a}  ({sa.get('scenario')}, policy={sa.get('policy')}, seed={sa.get('seed')})",
             f"B: {b}  ({sb.get('scenario')}, policy={sb.get('policy')}, seed={sb.get('seed')})",
             "ratio = B / A; 'better' marks the side with the lower latency or higher throughput", ""]

    def f(v: float) -> str:
        return "-" if v != v else f"{v:.4g}"

    for c, g in df.groupby("class", sort=False):
        lines.append(f"[{c}]")
        lines.append(f"  {'metric':22s} {'unit':6s} {'A':>11s} {'B':>11s} {'B/A':>8s}  better")
        for r in g.itertuples():
            lines.append(f"  {r.metric:22s} {r.unit:6s} {f(r.a):>11s} {f(r.b):>11s} {f(r.ratio):>8s}  {r.better}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
