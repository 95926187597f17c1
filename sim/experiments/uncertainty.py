"""The cost model's own error, propagated: ``--uncertainty`` on run, sweep, capacity and tune.

Every cost model has a distribution of *time factors* by metric kind (TTFT, TPOT/ITL,
E2E/latency, throughput): the multiplier on every time it prices (``engine.cost_scale``) that
would have made its simulated metrics match measured ones (docs/uncertainty.md). Where it comes
from, first found first:

1. the profile declares it: ``meta.uncertainty = {by_kind = {TTFT = {lo, hi}, ...}, source}``;
2. the profile was fitted by ``priosim calibrate --from-runs`` with three runs or more: its
   leave-one-run-out errors (``meta.fitted_from_runs.leave_one_run_out``);
3. otherwise the fidelity table's leave-one-source-out rows (``sim/core/uncertainty.json``,
   written by ``python -m calibrate.fidelity.uncertainty``), pooled over the presets.

The design: the scenario as given (the central run, byte for byte what a run without
``--uncertainty`` gives) and the same scenario, same seed, at each kind's low and high factor
(the 10th and 90th percentiles). A metric's 80 % interval is the range of its values over its
kind's runs and the central one. The interval is the cost model's error, not seed noise.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

from sim.core.overhead import PRESETS_PATH

#: The distribution file (beside the overhead presets).
PATH = PRESETS_PATH.parent / "uncertainty.json"
KINDS = ("TTFT", "TPOT/ITL", "E2E/latency", "throughput")
#: The headline metrics given intervals, with the kind whose factors move them (``None``: every
#: kind's runs, for a figure that several kinds decide, e.g. SLO attainment).
METRIC_KINDS: dict[str, str | None] = {
    "ttft_p50_s": "TTFT", "ttft_p90_s": "TTFT", "ttft_p99_s": "TTFT", "ttft_mean_s": "TTFT",
    "queue_wait_p50_s": "TTFT", "queue_wait_p99_s": "TTFT",
    "tpot_p50_s": "TPOT/ITL", "tpot_p99_s": "TPOT/ITL", "tpot_mean_s": "TPOT/ITL",
    "itl_p50_s": "TPOT/ITL", "itl_p99_s": "TPOT/ITL",
    "e2e_p50_s": "E2E/latency", "e2e_p90_s": "E2E/latency", "e2e_p99_s": "E2E/latency",
    "e2e_mean_s": "E2E/latency",
    "output_tokens_per_s": "throughput", "throughput_rps": "throughput", "goodput_rps": None,
    "slo_attainment": None,
}
#: calibrate --from-runs metric names -> kind (calibrate/runs/fit.py METRICS)
_RUN_KINDS = {"ttft": "TTFT", "tpot": "TPOT/ITL", "itl": "TPOT/ITL", "e2e": "E2E/latency"}


class UncertaintyError(ValueError):
    """A declared distribution is malformed (the message names the profile and key)."""


@dataclass(frozen=True)
class Distribution:
    """Low and high time factors per metric kind, the interval's level and where they came from."""

    by_kind: dict[str, tuple[float, float]]
    source: str
    level: float = 0.8
    rows: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # every factor to 4 significant digits, as a run at it is named (``x{f:.4g}``): two
        # kinds whose factors print alike share one run (1.1685 and 1.169 were two runs of
        # one name); estimates from a few rows carry no more digits than that
        object.__setattr__(self, "by_kind", {k: (float(f"{lo:.4g}"), float(f"{hi:.4g}"))
                                             for k, (lo, hi) in self.by_kind.items()})

    def factors(self, kinds=KINDS) -> list[float]:
        """The distinct factors other than 1.0 the design runs for ``kinds``, ascending."""
        fs = {f for k in kinds if k in self.by_kind for f in self.by_kind[k]}
        return sorted(f for f in fs if f != 1.0)

    def span(self, kinds) -> tuple[float, float]:
        """The widest low and high factors over ``kinds`` (capacity: the kinds its SLOs constrain)."""
        ks = [k for k in kinds if k in self.by_kind] or list(self.by_kind)
        return min(self.by_kind[k][0] for k in ks), max(self.by_kind[k][1] for k in ks)

    def meta(self, spans: str) -> dict:
        """What summary.json's ``run.uncertainty`` records once: the level, what it spans, the factors."""
        return {"level": self.level, "spans": spans, "source": self.source,
                "factors": {k: list(v) for k, v in self.by_kind.items()}, "rows": dict(self.rows)}


def _pair(v, where: str) -> tuple[float, float]:
    try:
        lo, hi = float(v["lo"]), float(v["hi"])
    except (TypeError, KeyError, ValueError):
        raise UncertaintyError(f"{where}: expected a table {{lo = F, hi = F}} of time factors (got {v!r})") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo <= 1.0 <= hi):
        raise UncertaintyError(f"{where}: expected 0 < lo <= 1 <= hi (got lo={lo!r}, hi={hi!r})")
    return lo, hi


def shipped() -> Distribution:
    """The fidelity table's distribution (sim/core/uncertainty.json)."""
    doc = json.loads(PATH.read_text())
    by = {k: _pair(v, f"{PATH.name}.by_kind.{k}") for k, v in doc["by_kind"].items() if k in KINDS}
    return Distribution(by, "fidelity table, leave-one-source-out rows (sim/core/uncertainty.json)",
                        float(doc["level"]), {k: int(doc["by_kind"][k]["rows"]) for k in by})


def _run_kind(metric: str) -> str:
    return _RUN_KINDS.get(metric.split("_")[0], "throughput")


def from_runs(loro: dict, name: str) -> Distribution | None:
    """The distribution of a profile fitted to runs: its leave-one-run-out errors (``{run:
    {metric: simulated / measured - 1}}``) as time factors by kind (1 / (1 + e) for a latency,
    1 + e for a rate), each kind's 10th and 90th percentiles; None without such errors."""
    got: dict[str, list[float]] = {}
    for errs in (loro or {}).values():
        for m, e in (errs or {}).items():
            if e is None or not math.isfinite(e) or e <= -1:
                continue
            k = _run_kind(m)
            got.setdefault(k, []).append(1.0 + e if k == "throughput" else 1.0 / (1.0 + e))
    if not got:
        return None
    by = {}
    for k, fs in got.items():
        lo, hi = np.quantile(fs, [0.1, 0.9])
        by[k] = (min(float(lo), 1.0), max(float(hi), 1.0))  # (the central run is always inside)
    return Distribution(by, f"profile {name}: calibrate --from-runs leave-one-run-out errors",
                        0.8, {k: len(v) for k, v in got.items()})


def distribution_of(costs) -> Distribution:
    """The distribution of a cost model (see module docstring for the order)."""
    meta = costs.meta or {}
    dist = shipped()
    declared = meta.get("uncertainty")
    if declared is not None:
        where = f"profile {costs.name}: meta.uncertainty"
        if not isinstance(declared, dict) or not isinstance(declared.get("by_kind"), dict):
            raise UncertaintyError(f"{where}: expected {{by_kind = {{KIND = {{lo, hi}}}}, source}} "
                                   f"(kinds: {', '.join(KINDS)})")
        unknown = sorted(set(declared["by_kind"]) - set(KINDS))
        if unknown:
            raise UncertaintyError(f"{where}.by_kind: unknown kind {unknown[0]!r} (expected {', '.join(KINDS)})")
        by = {k: _pair(v, f"{where}.by_kind.{k}") for k, v in declared["by_kind"].items()}
        # kinds it does not declare keep the fidelity table's
        return Distribution({**dist.by_kind, **by}, f"profile {costs.name}: declared ({declared.get('source', '')})",
                            dist.level, {k: dist.rows.get(k, 0) for k in KINDS if k not in by})
    runs = from_runs((meta.get("fitted_from_runs") or {}).get("leave_one_run_out"), costs.name)
    if runs is not None:
        return Distribution({**dist.by_kind, **runs.by_kind}, runs.source, runs.level, runs.rows)
    return dist


def cost_model_of(sc):
    """The scenario's cost model (its [engine] profile and overhead, as a run prices it)."""
    from sim.assembly import engine_costs

    return engine_costs(sc)


def scale_doc(doc: dict, factor: float) -> dict:
    """A copy of the scenario dict ``doc`` with ``engine.cost_scale`` multiplied by ``factor``
    (every [cluster] group's too)."""
    import copy

    doc = copy.deepcopy(doc)
    doc.setdefault("engine", {})
    doc["engine"]["cost_scale"] = doc["engine"].get("cost_scale", 1.0) * factor
    for g in ((doc.get("cluster") or {}).get("groups") or []):
        if isinstance(g.get("engine"), dict) and "cost_scale" in g["engine"]:
            g["engine"]["cost_scale"] *= factor
    return doc


def at_scale(sc, factor: float):
    """``sc`` with ``engine.cost_scale`` multiplied by ``factor`` (every [cluster] group's too)."""
    from sim.config import scenario_from_dict

    return scenario_from_dict(scale_doc(sc.to_dict(), factor), source=f"{sc.source} [cost_scale x{factor:g}]",
                              base_dir=sc.base_dir)


# ---- intervals of a run's summary ---------------------------------------------------------------
def _groups(summary: dict) -> dict[str, dict]:
    return {**{f"classes.{c}": m for c, m in summary["classes"].items()}, "overall": summary["overall"]}


def intervals(central: dict, runs: dict[float, dict], dist: Distribution) -> dict[str, dict[str, list]]:
    """``{group: {metric: [lo, hi]}}``: each headline metric's range over the central summary
    and its kind's runs (``runs``: factor -> summary dict)."""
    out: dict[str, dict[str, list]] = {}
    cg = _groups(central)
    rg = {f: _groups(s) for f, s in runs.items()}
    for g, m in cg.items():
        for metric, kind in METRIC_KINDS.items():
            v = m.get(metric)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                continue
            fs = list(runs) if kind is None or kind not in dist.by_kind else list(dist.by_kind[kind])
            vals = [v] + [rg[f][g].get(metric) for f in fs if f in rg]
            vals = [x for x in vals if isinstance(x, (int, float)) and math.isfinite(x)]
            out.setdefault(g, {})[metric] = [min(vals), max(vals)]
    return out


def annotate(summary: dict, ivs: dict, meta: dict) -> None:
    """Write ``<metric>_lo`` and ``<metric>_hi`` beside each central value and
    ``run.uncertainty`` (level, what the interval spans, the factors) into ``summary``."""
    groups = _groups(summary)
    for g, ms in ivs.items():
        for metric, (lo, hi) in ms.items():
            groups[g][f"{metric}_lo"] = lo
            groups[g][f"{metric}_hi"] = hi
    summary["run"]["uncertainty"] = meta


SPANS = ("the cost model's error: the same scenario and seed at each metric kind's low and high time factor "
         "(engine.cost_scale), not seed noise")


def run_with_uncertainty(sc, *, progress=False, trace_iterations: bool = False, lenient: bool = False, log=None):
    """Simulate ``sc`` (the central run, unchanged) and at each factor of its cost model's
    distribution; returns the central Results with intervals written into its summary."""
    from sim.run import simulate

    dist = distribution_of(cost_model_of(sc))
    res = simulate(sc, trace_iterations=trace_iterations, progress=progress, lenient=lenient)
    runs = {}
    for f in dist.factors():
        if log is not None:
            log(f"uncertainty: cost_scale x{f:.3g}")
        runs[f] = simulate(at_scale(sc, f), lenient=lenient).summary_dict
    ivs = intervals(res.summary_dict, runs, dist)
    annotate(res.summary_dict, ivs, {**dist.meta(SPANS), "runs": len(runs)})
    return res, ivs


# ---- printing -----------------------------------------------------------------------------------
def fmt(v: float, lo: float, hi: float) -> str:
    """``0.48 (0.41-0.57)``."""
    return f"{v:.3g} ({lo:.3g}-{hi:.3g})"


TABLE_METRICS = ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "e2e_p99_s", "output_tokens_per_s", "slo_attainment")


def table(res, ivs: dict) -> str:
    """The run's table (:meth:`Results.table`'s columns) with each headline value as
    ``central (lo-hi)``."""
    import pandas as pd

    df = res.summary.reindex(columns=["class", "arrived", "finished", "rejected", "unfinished", *TABLE_METRICS,
                                      "preemptions"]).astype(object)
    for i, row in df.iterrows():
        g = "overall" if row["class"] == "overall" else f"classes.{row['class']}"
        for m in TABLE_METRICS:
            v = row[m]
            if v is None or (isinstance(v, float) and math.isnan(v)):
                df.at[i, m] = "-"
            elif m in ivs.get(g, {}):
                df.at[i, m] = fmt(v, *ivs[g][m])
            else:
                df.at[i, m] = f"{v:.4g}"
    level = res.summary_dict["run"]["uncertainty"]["level"]
    return (pd.DataFrame(df).to_string(index=False, na_rep="-")
            + f"\n(central value, then its {level:.0%} interval from the cost model's error: docs/uncertainty.md)")


# ---- capacity -----------------------------------------------------------------------------------
#: the kind of metric each capacity SLO key constrains
SLO_KINDS = {"ttft": "TTFT", "tpot": "TPOT/ITL", "done": "E2E/latency"}


def binding_kinds(rep, slos: dict, class_names: list[str] | None = None) -> list[str]:
    """The metric kinds that bind the answers: the metric with the worst ratio to its SLO at each
    design's answer (read from the answers where every design has one and ``class_names`` are
    given, else from ``rep.explain``), else every kind ``slos`` constrain."""
    from sim.experiments.capacity_explain import answer_kinds

    got = set()
    metrics = answer_kinds(rep, slos, class_names) if class_names is not None else None
    if metrics is None:
        metrics = {((info or {}).get("at_answer") or {}).get("metric")
                   for infos in ((rep.explain or {}).get("designs") or {}).values() for info in infos or []}
    for m in metrics:
        if m in SLO_KINDS:
            got.add(SLO_KINDS[m])
    if not got:
        got = {SLO_KINDS[k] for s in slos.values() for k, v in s.items() if v is not None and k in SLO_KINDS}
    return sorted(got)


def capacity_uncertainty(rep, sc, slos: dict, search, log=None) -> dict:
    """Search again at the low and high time factor of the kinds that bind the answers
    (:func:`binding_kinds`; the widest over them) and record each design's GPUs as
    ``uncertainty = {gpus_lo, gpus_hi, ...}`` in ``rep.designs``; ``search``: ``(scenario,
    known) -> CapacityReport`` (the same search on another scenario, started from ``known``:
    the verdicts of ``rep``'s search that hold at the other factor, as every step taking longer
    never helps a request meet its SLO, :meth:`sim.experiments.capacity.Known.carried`).
    Returns the factors' metadata. ``gpus_hi`` None: no count up to the search limit meets the
    SLOs at the high factor."""
    dist = distribution_of(cost_model_of(sc))
    kinds = binding_kinds(rep, slos, sc.class_names)
    lo, hi = dist.span(kinds)
    other = {}
    for f in (lo, hi):
        if f == 1.0:
            continue
        if log is not None:
            log(f"uncertainty: searching again at cost_scale x{f:.3g}")
        other[f] = search(at_scale(sc, f), {d: k.carried(slower=f > 1.0) for d, k in rep.known.items()})
    meta = {**dist.meta(SPANS.replace("each metric kind's", "the binding metric kinds' widest")),
            "kinds": kinds, "design_factors": [lo, hi]}
    for d, a in rep.designs.items():
        if a.get("gpus") is None:
            continue
        got = [o.designs.get(d, {}).get("gpus") for o in other.values()]
        found = [g for g in got if g is not None] + [a["gpus"]]
        a["uncertainty"] = {"gpus_lo": min(found), "gpus_hi": None if None in got else max(found),
                            "level": dist.level, "factors": [lo, hi], "kinds": kinds, "spans": meta["spans"]}
    return meta


def capacity_lines(rep, max_replicas: int) -> list[str]:
    """``shared: 8 GPUs (7-10; ...)`` per design with an interval (``(7 to more than
    --max-replicas=64 replicas; ...)`` where no count up to the limit meets the SLOs at the high
    factor)."""
    out = []
    for d, a in rep.designs.items():
        u = a.get("uncertainty")
        if u is None:
            continue
        if u["gpus_hi"] is None:
            span = f"{u['gpus_lo']} to more than --max-replicas={max_replicas} replicas"
        else:
            span = f"{u['gpus_lo']}-{u['gpus_hi']}"
        out.append(f"{d}: {a['gpus']} GPUs ({span}; {u['level']:.0%} interval from the cost "
                   f"model's error, time factors x{u['factors'][0]:.3g}..x{u['factors'][1]:.3g})")
    return out
