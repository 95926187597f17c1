"""The cost model's error distribution, from the leave-one-source-out rows, and its coverage.

    python -m calibrate.fidelity.uncertainty     # writes sim/core/uncertainty.json and
                                                 # calibrate/fidelity/uncertainty.csv (about a minute)

Each evaluated row of ``calibrate/fidelity/loso.csv`` (a published measurement simulated with
presets fitted on the *other* publishers only) implies a **time factor**: the multiplier on every
time the cost model prices (``engine.cost_scale``: step times and overhead terms, front end
included) that would have made the simulated metric match the published one at light load.
For a latency (TTFT, TPOT/ITL, E2E) that is ``published / simulated``; for a rate (a throughput), which
falls as times grow, ``simulated / published`` (:func:`is_rate`). Per metric kind the 10th and 90th percentiles
of those factors are the low and high factors of an 80 % interval. Quantiles, not standard
deviations: the TTFT errors are dominated by a few rows 4 to 6 times off (a standard deviation
would be set by them alone).

Coverage (the check that the intervals are neither overconfident nor vacuous): every evaluated
row is simulated again with its shipped preset at its kind's low and high factors. How much the
factor moves the row's metric (``shipped at f / shipped at 1``: exactly f or 1/f at light load,
more under queueing) is applied to the row's leave-one-source-out value, giving the row's
interval; the published value lies inside it or not. The LOSO presets themselves are not kept
(refitting them takes long), so the response to the factor is measured on the shipped preset:
that approximation is the one made. ``uncertainty.csv`` keeps every row's values;
tests/test_uncertainty.py recomputes the coverage from it.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.fidelity.fit import LOSO_PATH
from calibrate.fidelity.suite import load_table, metric_value, scenario_for

#: Where the distribution goes (read by sim/experiments/uncertainty.py) and the per-row check.
OUT_JSON = Path(__file__).resolve().parents[2] / "sim" / "core" / "uncertainty.json"
OUT_CSV = Path(__file__).resolve().parent / "uncertainty.csv"
LEVEL = 0.8
QUANTILES = (0.1, 0.9)
KINDS = ("TTFT", "TPOT/ITL", "E2E/latency", "throughput")


def is_rate(metric: str) -> bool:
    """Whether ``metric`` is a rate (requests or tokens per second), which falls as times grow.
    By name, not kind: ``decode_tok_s_batch1`` is a rate of the E2E/latency kind (one request's
    tokens over its end-to-end time)."""
    return metric.startswith("throughput") or "tok_s" in metric or "req_s" in metric


def implied_factor(metric: str, published: float, simulated: float) -> float:
    """The time factor that makes ``simulated`` match ``published`` at light load (see module
    docstring): ``published / simulated`` for a latency, the inverse for a rate."""
    return simulated / published if is_rate(metric) else published / simulated


def factors_by_kind(rows: pd.DataFrame) -> dict[str, dict]:
    """Per metric kind (and ``all``): rows, the low and high factors (the 10th and 90th
    percentiles, linear interpolation) and the median factor."""
    out = {}
    for kind in ("all", *KINDS):
        sub = rows if kind == "all" else rows[rows.kind == kind]
        f = sub.factor.to_numpy(dtype=float)
        if not len(f):
            continue
        lo, med, hi = np.quantile(f, [QUANTILES[0], 0.5, QUANTILES[1]])
        out[kind] = {"rows": int(len(f)), "lo": round(float(lo), 4), "hi": round(float(hi), 4),
                     "median": round(float(med), 4)}
    return out


def simulate_rows(table: pd.DataFrame, scale_of) -> list[float]:
    """Each row of ``table`` simulated with its shipped preset and ``engine.cost_scale`` =
    ``scale_of(row)``; rows differing only in the metric share a run."""
    from sim.config import scenario_from_dict
    from sim.run import simulate

    cache: dict = {}
    out = []
    for row in table.to_dict("records"):
        f = float(scale_of(row))
        key = (row["profile"], row["scenario"], row["dataset"], row["n"], row["prompt_tokens"], row["output_tokens"],
               row["rate"], row["concurrency"], row["engine_settings"], row["prompt_mean"], row["output_mean"],
               row["overhead"], f)
        if key not in cache:
            with tempfile.TemporaryDirectory(prefix="priosim-uncertainty-") as d:
                doc = scenario_for(row, Path(d))
                doc["engine"]["cost_scale"] = f
                cache[key] = simulate(scenario_from_dict(doc, base_dir=d))
        out.append(metric_value(row, cache[key]))
    return out


def evaluate(loso: pd.DataFrame, table: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """The per-row check (see module docstring) and the factors by kind."""
    ev = loso[loso.evaluated.astype(bool)].copy()
    ev["factor"] = [implied_factor(m, p, s) for m, p, s in zip(ev.metric, ev.published, ev.simulated)]
    factors = factors_by_kind(ev)
    rows = table.set_index("id").loc[ev.id].reset_index()
    ev["factor_lo"] = [factors[k]["lo"] for k in ev.kind]
    ev["factor_hi"] = [factors[k]["hi"] for k in ev.kind]
    lo_of = dict(zip(ev.id, ev.factor_lo))
    hi_of = dict(zip(ev.id, ev.factor_hi))
    ev["shipped"] = simulate_rows(rows, lambda r: 1.0)
    ev["shipped_lo"] = simulate_rows(rows, lambda r: lo_of[r["id"]])
    ev["shipped_hi"] = simulate_rows(rows, lambda r: hi_of[r["id"]])
    a = ev.simulated * ev.shipped_lo / ev.shipped
    b = ev.simulated * ev.shipped_hi / ev.shipped
    ev["interval_lo"] = np.minimum(np.minimum(a, b), ev.simulated)
    ev["interval_hi"] = np.maximum(np.maximum(a, b), ev.simulated)
    ev["inside"] = (ev.interval_lo <= ev.published) & (ev.published <= ev.interval_hi)
    return ev, factors


def coverage(ev: pd.DataFrame) -> dict[str, dict]:
    """Share of rows whose published value lies inside their interval: ``all`` and per kind."""
    out = {}
    for kind in ("all", *KINDS):
        sub = ev if kind == "all" else ev[ev.kind == kind]
        if len(sub):
            out[kind] = {"rows": int(len(sub)), "inside": int(sub.inside.sum()),
                         "coverage": round(float(sub.inside.mean()), 4)}
    return out


def document(ev: pd.DataFrame, factors: dict, presets: list[str]) -> dict:
    """sim/core/uncertainty.json: the factors by kind, which presets they are assigned to, and
    how they were obtained."""
    own = {p: {k: int(((ev.overhead == p) & (ev.kind == k)).sum()) for k in KINDS} for p in presets}
    return {
        "_about": "the cost model's time factors by metric kind (docs/uncertainty.md); regenerated by "
                  "python -m calibrate.fidelity.uncertainty from calibrate/fidelity/loso.csv",
        "date": _dt.date.today().isoformat(),
        "level": LEVEL,
        "quantiles": list(QUANTILES),
        "factor": "multiplier on every time the cost model prices (engine.cost_scale: step times and overhead "
                  "terms, front end included) that would make a row's simulated metric match the published one "
                  "at light load: published / simulated for a latency, simulated / published for a rate",
        "basis": "the evaluated leave-one-source-out rows (presets fitted on other publishers), every preset's "
                 "pooled: no preset has enough rows of one kind for its own 10th and 90th percentiles",
        "by_kind": factors,
        "presets": {p: {"assigned": "pooled", "own_rows": own[p]} for p in presets},
        "coverage": coverage(ev),
        "coverage_method": "each row simulated with its shipped preset at its kind's low and high factors; that "
                           "response (shipped at f / shipped at 1) applied to its leave-one-source-out value "
                           "(calibrate/fidelity/uncertainty.csv)",
    }


COLUMNS = ["id", "source_kind", "overhead", "metric", "kind", "published", "simulated", "factor", "factor_lo",
           "factor_hi", "shipped", "shipped_lo", "shipped_hi", "interval_lo", "interval_hi", "inside"]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m calibrate.fidelity.uncertainty", description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="print the factors and coverage, write nothing")
    args = ap.parse_args(argv)
    from sim.core.overhead import preset_names

    ev, factors = evaluate(pd.read_csv(LOSO_PATH), load_table())
    doc = document(ev, factors, [p for p in preset_names() if p != "none"])
    for k, v in factors.items():
        print(f"{k:12s} rows {v['rows']:3d}  factors {v['lo']:.3g} .. {v['hi']:.3g} (median {v['median']:.3g})")
    for k, v in doc["coverage"].items():
        print(f"coverage {k:12s} {v['inside']:3d} of {v['rows']:3d} = {v['coverage']:.0%}")
    if args.dry_run:
        return
    from sim import jsonout

    OUT_JSON.write_text(jsonout.dumps(doc, indent=1) + "\n")
    ev[COLUMNS].to_csv(OUT_CSV, index=False, float_format="%.10g")
    print(f"wrote {OUT_JSON} and {OUT_CSV}")


if __name__ == "__main__":
    main()
