"""Side-by-side comparison of two runs' per-class metrics, for quick what-if answers.

``compare_runs(a, b)`` reads two results folders (``summary.json``) and returns one row per
class and metric with the value in A, in B, the ratio B/A (NaN where A is zero or a metric is
missing) and which side is better: each metric's direction comes from
:data:`sim.metrics.METRIC_TABLE`, and a difference within noise is ``same``. A side may be
several runs, one per seed: its value is then their mean and the seeds' spread widens the noise.
``format_comparison`` renders the table ``priosim compare`` prints.

Noise (:func:`noise`): a difference is ``same`` when it is at most 1 % of the larger magnitude
(``REL_NOISE``; the simulator is deterministic, so a smaller difference is real but not worth a
verdict), or, when a side has several seeds, at most two standard errors of the difference of
the means (``sqrt(sd_a^2 / n_a + sd_b^2 / n_b)``, sample standard deviations over each side's
seeds), whichever is larger.

Intervals (runs made with ``--uncertainty``, whose summaries hold ``<metric>_lo`` and
``<metric>_hi``, docs/uncertainty.md): the columns ``a_lo, a_hi, b_lo, b_hi``; a difference
beyond noise whose two intervals overlap is ``same within the model's uncertainty``.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

import pandas as pd

from sim.core.columns import STATS
from sim.metrics import HIGHER, LOWER, METRIC_TABLE

# (metric, unit) printed by default, in print order: the request counts, the per-request
# statistics the column table (sim.core.columns.STATS) marks for comparison, then figures that
# are not of request columns. ``--metric`` may name any figure of METRIC_TABLE.
METRICS = [
    (k, METRIC_TABLE[k].unit) for k in (
        "arrived", "finished", "rejected", "unfinished",
        *[s.key for s in STATS if s.compare],
        "itl_p99_s", "throughput_rps", "goodput_rps", "slo_attainment", "swap_s", "recompute_s")
]
#: a difference at most this fraction of the larger magnitude is "same"
REL_NOISE = 0.01
#: standard errors of the difference of the means within which seeds' runs count as "same"
SPREAD_SE = 2.0
#: the verdict of a difference beyond noise whose intervals overlap
WITHIN_MODEL = "same within the model's uncertainty"


def _summary(run_dir: str | Path) -> dict:
    d = Path(run_dir)
    f = d / "summary.json"
    if not f.is_file():
        hint = " (a sweep folder: compare two of its runs/<run_id> folders)" if (d / "sweep.parquet").exists() else ""
        raise FileNotFoundError(f"{d}: not a run results folder: no summary.json{hint}")
    try:
        s = json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{f}: not JSON ({getattr(exc, 'msg', exc)}): expected a run's summary") from None
    for key in ("classes", "overall"):
        if not isinstance(s, dict) or not isinstance(s.get(key), dict):
            raise ValueError(f"{f}: no {key!r} table: expected a run's summary (priosim run writes it)")
    return s


def _runs(x: str | Path | Sequence[str | Path]) -> list[Path]:
    return [Path(x)] if isinstance(x, (str, Path)) else [Path(p) for p in x]


def _side(side: str, runs: list[Path]) -> list[dict]:
    """The summaries of one side's runs; a warning when two share a seed (the same run twice
    would shrink the seeds' spread)."""
    from plumbing.notices import warn

    out = [_summary(r) for r in runs]
    seen: dict = {}
    for r, s in zip(runs, out):
        if s.get("seed") in seen:
            warn(f"compare: {side}'s runs {seen[s.get('seed')]} and {r} have the same seed {s.get('seed')}: "
                 "the seeds' spread expects one run per seed")
        seen.setdefault(s.get("seed"), r)
    return out


def _mean_sd(vals: list[float]) -> tuple[float, float, int]:
    """Mean, sample standard deviation (NaN below two values) and count of ``vals`` (NaN, NaN, 0
    when empty)."""
    n = len(vals)
    if not n:
        return math.nan, math.nan, 0
    m = math.fsum(vals) / n
    sd = math.sqrt(math.fsum((v - m) ** 2 for v in vals) / (n - 1)) if n > 1 else math.nan
    return m, sd, n


def noise(a: float, b: float, sd_a: float = math.nan, n_a: int = 1, sd_b: float = math.nan, n_b: int = 1) -> float:
    """The largest difference ``b - a`` (in magnitude) called ``same``: ``REL_NOISE`` of the larger
    magnitude, or ``SPREAD_SE`` standard errors of the difference of two means of ``n_a`` and
    ``n_b`` seeds with sample standard deviations ``sd_a``, ``sd_b`` (a side of one run adds no
    spread), whichever is larger."""
    var = sum(sd * sd / n for sd, n in ((sd_a, n_a), (sd_b, n_b)) if n > 1 and not math.isnan(sd))
    return max(REL_NOISE * max(abs(a), abs(b)), SPREAD_SE * math.sqrt(var))


def verdict(metric: str, a: float, b: float, tol: float) -> str:
    """``same`` when ``|b - a| <= tol``; else ``a`` or ``b``, the side better by the metric's
    direction; ``''`` when a value is missing or the metric has no better side."""
    if math.isnan(a) or math.isnan(b):
        return ""
    if abs(b - a) <= tol:
        return "same"
    better = METRIC_TABLE[metric].better
    if better == HIGHER:
        return "b" if b > a else "a"
    if better == LOWER:
        return "b" if b < a else "a"
    return ""


def compare_runs(a: str | Path | Sequence[str | Path], b: str | Path | Sequence[str | Path],
                 metrics: list[str] | None = None) -> pd.DataFrame:
    """Per class (classes of A first, then any only in B, then ``overall``) and metric:
    ``a``, ``b`` (the mean over a side's runs when it has several), ``ratio`` = b / a,
    ``better`` ('a', 'b', 'same' within :func:`noise`, or '' when unknown or neither is better),
    ``noise`` (the tolerance used) and ``a_sd``, ``b_sd`` (the seeds' sample standard deviation,
    NaN for one run). ``a``, ``b``: a run folder or a list of them (one per seed).
    ``metrics``: names from :data:`sim.metrics.METRIC_TABLE` (default: ``METRICS``; ValueError
    naming the valid ones otherwise)."""
    known = list(METRIC_TABLE)
    for m in metrics or []:
        if m not in METRIC_TABLE:
            raise ValueError(f"--metric: unknown metric {m!r} (expected one of {', '.join(known)})")
    sa, sb = _side("A", _runs(a)), _side("B", _runs(b))
    wanted = METRICS if metrics is None else [(m, METRIC_TABLE[m].unit) for m in known if m in metrics]
    classes = list(dict.fromkeys(c for s in (*sa, *sb) for c in s["classes"]))
    rows = []
    for c in [*classes, "overall"]:
        for m, unit in wanted:
            sides = []
            for ss in (sa, sb):
                groups = [s["overall"] if c == "overall" else s["classes"].get(c, {}) for s in ss]
                sides.append(_mean_sd([float(g[m]) for g in groups if g.get(m) is not None]))
            (fa, sda, na), (fb, sdb, nb) = sides
            if not na and not nb:
                continue
            ratio = fb / fa if fa and not math.isnan(fa) and not math.isnan(fb) else math.nan
            tol = noise(fa, fb, sda, na, sdb, nb) if na and nb else math.nan
            ends = {}
            for side, ss in (("a", sa), ("b", sb)):
                groups = [s["overall"] if c == "overall" else s["classes"].get(c, {}) for s in ss]
                for end in ("lo", "hi"):  # (a side's interval: the mean of its runs' ends, as its value)
                    vals = [float(g[f"{m}_{end}"]) for g in groups if g.get(f"{m}_{end}") is not None]
                    ends[f"{side}_{end}"] = math.fsum(vals) / len(vals) if vals and len(vals) == len(groups) \
                        else math.nan
            better = verdict(m, fa, fb, tol)
            if better in ("a", "b") and _overlap(ends):
                better = WITHIN_MODEL
            rows.append({"class": c, "metric": m, "unit": unit, "a": fa, "b": fb, "ratio": ratio,
                         "better": better, "noise": tol, "a_sd": sda, "b_sd": sdb, **ends})
    return pd.DataFrame(rows, columns=["class", "metric", "unit", "a", "b", "ratio", "better", "noise",
                                       "a_sd", "b_sd", "a_lo", "a_hi", "b_lo", "b_hi"])


def _overlap(e: dict) -> bool:
    """Whether both sides have intervals and they overlap."""
    if any(math.isnan(v) for v in e.values()):
        return False
    return e["a_lo"] <= e["b_hi"] and e["b_lo"] <= e["a_hi"]


def format_comparison(df: pd.DataFrame, a: str | Path | Sequence[str | Path],
                      b: str | Path | Sequence[str | Path]) -> str:
    """The text table: a header naming A and B (policy, seed(s), scenario), then one block per
    class; a side of several seeds' runs shows its mean and standard deviation."""
    ra, rb = _runs(a), _runs(b)
    sa, sb = _summary(ra[0]), _summary(rb[0])
    seeded = len(ra) > 1 or len(rb) > 1

    def head(side: str, runs: list[Path], s: dict) -> str:
        seeds = ",".join(str(_summary(r).get("seed")) for r in runs) if len(runs) > 1 else s.get("seed")
        more = f" + {len(runs) - 1} more run(s)" if len(runs) > 1 else ""
        return f"{side}: {runs[0]}{more}  ({s.get('scenario')}, policy={s.get('policy')}, seed={seeds})"

    lines = [head("A", ra, sa), head("B", rb, sb),
             "ratio = B / A; 'better' marks the side with the lower latency or higher throughput,",
             "'same' a difference within noise (1 % of the larger value"
             + (", or 2 standard errors over the seeds)" if seeded else ")"), ""]

    def f(v: float) -> str:
        return "-" if v != v else f"{v:.4g}"

    def pm(v: float, sd: float) -> str:
        return f(v) if sd != sd else f"{f(v)}±{sd:.2g}"

    ranged = bool(len(df)) and bool(df[["a_lo", "b_lo"]].notna().any().any())

    def val(v: float, sd: float, lo: float, hi: float) -> str:
        return pm(v, sd) if lo != lo or hi != hi else f"{pm(v, sd)} ({lo:.3g}-{hi:.3g})"

    if ranged:
        lines.insert(-1, "A (lo-hi): the 80 % interval from the cost model's error (--uncertainty); overlapping "
                         "intervals are 'same within the model's uncertainty'")
    width = (17 if seeded else 11) + (16 if ranged else 0)
    for c, g in df.groupby("class", sort=False):
        lines.append(f"[{c}]")
        lines.append(f"  {'metric':22s} {'unit':6s} {'A':>{width}s} {'B':>{width}s} {'B/A':>8s}  better")
        for r in g.itertuples():
            lines.append(f"  {r.metric:22s} {r.unit:6s} {val(r.a, r.a_sd, r.a_lo, r.a_hi):>{width}s} "
                         f"{val(r.b, r.b_sd, r.b_lo, r.b_hi):>{width}s} {f(r.ratio):>8s}  {r.better}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
