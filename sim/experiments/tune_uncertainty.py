"""``priosim tune --uncertainty``: the chosen configuration and the scenario's defaults, each
with the 80 % interval of its objectives and SLO values from the cost model's error.

Only those two configurations are re-evaluated, not every trial (the search itself ranks trials
by their central values: a trial's interval would multiply the tune's simulations by up to
nine): each seed of each at every distinct time factor of its cost model (``engine.cost_scale``,
:mod:`sim.experiments.uncertainty`, docs/uncertainty.md), as runs of the tune's evaluation sweep
(``evals/runs/<config>-s<seed>__cost_scale=x<factor>``), so a resumed tune reuses them. A value's
interval is its range over the central measure and its kind's factors' measures (an objective
whose metric several kinds decide, e.g. goodput: every factor's).
"""
from __future__ import annotations

from pathlib import Path

from sim.experiments import uncertainty as unc

#: the metric kind of each SLO key
SLO_KINDS = {"ttft": "TTFT", "tpot": "TPOT/ITL", "done_by": "E2E/latency"}


def _dist(spec, params: dict):
    from sim.config import scenario_from_dict

    sc = scenario_from_dict(spec.scenario_for(params, spec.seeds[0]), source=spec.source, base_dir=spec.base_dir)
    return unc.distribution_of(unc.cost_model_of(sc))


def _range(central, by_factor: dict, factors) -> list | None:
    vals = [central] + [by_factor.get(f) for f in factors]
    vals = [v for v in vals if v is not None]
    return [min(vals), max(vals)] if vals and central is not None else None


def _interval(m0: dict, at: dict[float, dict], spec, dist) -> dict:
    """``{objectives: {name: [lo, hi]}, slo: {name: [lo, hi]}}`` from the central measure
    ``m0`` and the measures ``at`` each factor (:func:`sim.experiments.tune.measure`)."""
    def fs(kind):
        return list(at) if kind is None or kind not in dist.by_kind else list(dist.by_kind[kind])

    out: dict = {"objectives": {}, "slo": {}}
    for o in spec.objectives:
        f = fs(unc.METRIC_KINDS.get(o.metric))
        out["objectives"][o.name] = _range(m0["objectives"][o.name]["mean"],
                                           {x: at[x]["objectives"][o.name]["mean"] for x in at}, f)
    for s in spec.slos:
        f = fs(SLO_KINDS.get(s.key))
        out["slo"][s.name] = _range(m0["slo"].get(s.name), {x: at[x]["slo"].get(s.name) for x in at}, f)
    return out


def evaluate(spec, out: Path, best_params: dict | None, *, backend: str = "local", workers: int = 1,
             address: str | None = None, log=None) -> dict:
    """Run the defaults and ``best_params`` (None: no best yet, the defaults alone) at their
    time factors and return what tune.json records as ``uncertainty``: ``{default: {...},
    best: {...}, level, spans, source, factors, evaluated}``."""
    from sim.experiments.sweep import RunSpec, run_sweep
    from sim.experiments.tune import config_id, measure

    runs_dir = out / "evals" / "runs"
    configs = {"default": {}}
    if best_params is not None:
        configs["best"] = best_params
    todo, plan = [], {}
    for name, params in configs.items():
        tag = "default" if name == "default" else config_id(params)
        dist = _dist(spec, params)
        plan[name] = (tag, dist)
        for f in dist.factors():
            for s in spec.seeds:
                todo.append(RunSpec(f"{tag}-s{s}__cost_scale=x{f:.4g}", {"config": tag, "seed": s, "cost_scale": f},
                                    unc.scale_doc(spec.scenario_for(params, s), f)))
    todo = list({s.run_id: s for s in todo}.values())  # (the best may be the defaults)
    if log is not None:
        log(f"uncertainty: {len(todo)} runs of the defaults and the best configuration at the cost model's "
            f"time factors (not every trial)")
    sw = run_sweep(todo, out / "evals", base_dir=spec.base_dir, source=spec.source, backend=backend,
                   workers=workers, address=address, progress=False)
    if sw.interrupted:
        raise KeyboardInterrupt
    res: dict = {}
    for name, (tag, dist) in plan.items():
        central = [runs_dir / f"{tag}-s{s}" for s in spec.seeds]
        if not all((d / "summary.json").exists() for d in central):
            continue
        at = {}
        for f in dist.factors():
            dirs = [runs_dir / f"{tag}-s{s}__cost_scale=x{f:.4g}" for s in spec.seeds]
            if all((d / "summary.json").exists() for d in dirs):
                at[f] = measure(spec, dirs)
        if len(at) < len(dist.factors()):  # a run failed: no interval rather than a narrow one
            continue
        res[name] = _interval(measure(spec, central), at, spec, dist)
        res.setdefault("meta", dist.meta(unc.SPANS))
    meta = res.pop("meta", {})
    return {**res, **meta, "evaluated": "the defaults and the best configuration only, not every trial"}
