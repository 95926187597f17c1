"""``priosim sweep --uncertainty``: each cell's headline metrics with their 80 % interval.

The design of ``run --uncertainty`` (:mod:`sim.experiments.uncertainty`, docs/uncertainty.md)
per cell of the grid: the cell's own run, unchanged (the same run id, scenario and folder as
without ``--uncertainty``, so a sweep made without it is reused), plus one run per distinct time
factor of the cell's cost model, with ``engine.cost_scale`` multiplied by it. Those are ordinary
runs of the sweep: their own run ids (``<cell>__cost_scale=x<factor>``), the same worker pool,
the same crash-safe folders under ``DIR/runs/``, so a killed sweep resumes them too. They are
not rows of ``sweep.parquet``: their cell's rows get ``<metric>_lo`` / ``<metric>_hi`` columns,
once every one of the cell's runs is complete (a partial interval would look narrower than it is).
"""
from __future__ import annotations

import json
from pathlib import Path

from sim.experiments import uncertainty as unc

#: the axis name the extra runs carry in their ``sweep_run.json`` (a multiplier of the cell's own)
AXIS = "cost_scale"


def _key(sc) -> tuple:
    e = sc.engine
    return (str(e.profile), str(e.overhead), str(e.host_cpu), str(sc.base_dir))


def bracket_specs(specs: list, scenarios: list) -> tuple[list, dict]:
    """``specs`` (sweep run specs) and, after each, its runs at its cost model's time factors;
    ``scenarios``: each spec's validated scenario. Returns the specs and what ``sweep.json``
    records (the first cell's distribution, the runs added). Raises
    :class:`~sim.experiments.uncertainty.UncertaintyError` for a malformed declared distribution."""
    from sim.experiments.sweep import RunSpec, _fmt

    cache: dict[tuple, unc.Distribution] = {}  # (loading a profile per cell would be slow)
    out, first = [], None
    for spec, sc in zip(specs, scenarios):
        k = _key(sc)
        if k not in cache:
            cache[k] = unc.distribution_of(unc.cost_model_of(sc))
        dist = cache[k]
        first = first or dist
        by = tuple((kind, lo, hi) for kind, (lo, hi) in dist.by_kind.items())
        out.append(spec)
        for f in dist.factors():
            out.append(RunSpec(f"{spec.run_id}__{AXIS}=x{f:.4g}", {**spec.axes, AXIS: f},
                               unc.scale_doc(spec.scenario, f), spec.load_scale, (spec.run_id, f, by)))
    meta = {**(first.meta(unc.SPANS) if first else {}), "runs_added": len(out) - len(specs)}
    return out, meta


def _summary(d: Path) -> dict:
    return json.loads((d / "summary.json").read_text())


def with_intervals(rows: list[dict], central, brackets: list, runs_dir: Path) -> list[dict]:
    """The cell's ``rows`` (:func:`sim.experiments.sweep.run_rows`) with ``<metric>_lo`` and
    ``<metric>_hi`` beside each headline metric, from the cell's run and its ``brackets`` (the
    runs at other cost scales); unchanged while one of them is not complete."""
    from sim.experiments.sweep import is_complete

    if not all(is_complete(b, runs_dir) for b in brackets):
        return rows
    dist = unc.Distribution({k: (lo, hi) for k, lo, hi in brackets[0].bracket[2]}, "")
    ivs = unc.intervals(_summary(runs_dir / central.run_id),
                        {b.bracket[1]: _summary(runs_dir / b.run_id) for b in brackets}, dist)
    out = []
    for r in rows:
        g = "overall" if r["class"] == "overall" else f"classes.{r['class']}"
        r = dict(r)
        for metric, (lo, hi) in ivs.get(g, {}).items():
            r[f"{metric}_lo"], r[f"{metric}_hi"] = lo, hi
        out.append(r)
    return out


def cell_table(df, axes: list[str]) -> str:
    """The sweep's terminal table (mean over seeds) with each headline value as ``central (lo-hi)``."""
    keys = [a for a in axes if a != "seed" and a in df.columns] + ["class"]
    cols = [c for c in ("ttft_p50_s", "ttft_p99_s", "e2e_p99_s", "output_tokens_per_s", "goodput_rps",
                        "slo_attainment") if c in df.columns]
    have = [c for c in cols for x in ("_lo", "_hi") if c + x in df.columns]
    t = df.groupby(keys, sort=False)[cols + [c + x for c in dict.fromkeys(have) for x in ("_lo", "_hi")]] \
        .mean().reset_index()
    for c in cols:
        def cell(r, c=c):
            v = r[c]
            if v != v:  # NaN
                return "-"
            lo, hi = r.get(c + "_lo"), r.get(c + "_hi")
            return unc.fmt(v, lo, hi) if lo is not None and lo == lo and hi == hi else f"{v:.4g}"
        t[c] = t.apply(cell, axis=1)
    t = t[keys + cols]
    return (t.to_string(index=False)
            + "\n(central value, then its 80% interval from the cost model's error, mean over seeds: "
              "docs/uncertainty.md)")
