"""The report of a tune (``sim.experiments.tune``): the trials table, the chosen trial and the front,
``best.toml``, parameter importance, ``pareto.png`` and the side-by-side table the CLI prints.

Files written into the tune's folder by :func:`write_report`: ``trials.parquet``,
``pareto.csv``, ``pareto.png``, ``best.toml``, ``importance.json``, ``tune.json``.
Optuna, tomli-w and matplotlib are imported inside the functions that use them.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.outdir import write_file
from sim.experiments.slos import slo_ratio
from sim.experiments.tune import STUDY, VIOLATION, TuneSpec, fmt_value, evaluated, measure
from sim import jsonout


def trials_frame(spec: TuneSpec, study) -> pd.DataFrame:
    """One row per evaluated trial: knobs, objectives (mean, std), SLO values, feasible."""
    rows = []
    for t in evaluated(study):
        m = t.user_attrs.get("measure") or {}
        row: dict = {"trial": t.number, "state": t.state.name, "config": t.user_attrs.get("config")}
        for k in spec.knobs:
            row[k.key] = t.params.get(k.key)
        for o in spec.objectives:
            om = (m.get("objectives") or {}).get(o.name, {})
            row[o.name] = om.get("mean")
            row[f"{o.name}_std"] = om.get("std")
        for s in spec.slos:
            row[f"slo:{s.name}"] = (m.get("slo") or {}).get(s.name)
            row[f"slo:{s.name}_limit"] = s.limit
        row["slo_ratio"] = _slo_ratio(spec, m.get("slo") or {}) if spec.slos else None
        for k, v in (m.get("metrics") or {}).items():
            row[f"m:{k}"] = v
        row["feasible"] = bool(m.get("feasible")) and t.state.name == "COMPLETE"
        row["error"] = t.user_attrs.get("error")
        rows.append(row)
    df = pd.DataFrame(rows)
    for k in spec.knobs:  # mixed choice labels and numbers would not write
        if k.key in df and k.kind == "choice":
            df[k.key] = df[k.key].astype(str)
    return df


def _slo_ratio(spec: TuneSpec, slo: dict) -> float:
    """The tightest SLO's measured / limit (<= 1: all met)."""
    return max([0.0, *(slo_ratio(slo.get(s.name), s.limit) for s in spec.slos)])


def pareto_front(df: pd.DataFrame, cols: list[str], maximize: list[bool]) -> pd.DataFrame:
    """Rows of ``df`` no other row dominates on ``cols`` (ties kept), in the first column's order."""
    if df.empty:
        return df
    x = np.column_stack([df[c].to_numpy(float) * (-1 if mx else 1) for c, mx in zip(cols, maximize)])
    keep = []
    for i in range(len(x)):
        dominated = np.any(np.all(x <= x[i], axis=1) & np.any(x < x[i], axis=1))
        keep.append(not dominated)
    return df[keep].sort_values(cols[0], ascending=not maximize[0])


def best_trial(spec: TuneSpec, df: pd.DataFrame) -> tuple[pd.Series | None, pd.DataFrame, str]:
    """The chosen trial, the front, and how it was chosen.

    One objective: the best feasible mean (no feasible trial: the smallest SLO ratio); the
    front trades the objective against the SLO ratio. Several: the feasible Pareto front, and
    the front's best on the first objective."""
    ok = df[df["state"] == "COMPLETE"] if len(df) else df
    if ok.empty:
        return None, ok, "no trial finished"
    o0 = spec.objectives[0]
    feas = ok[ok["feasible"]]
    if len(spec.objectives) > 1:
        base = feas if len(feas) else ok
        front = pareto_front(base, [o.name for o in spec.objectives], [o.maximize for o in spec.objectives])
        best = front.sort_values(o0.name, ascending=not o0.maximize).iloc[0]
        how = "Pareto front (feasible trials), best on the first objective" if len(feas) else \
            "no trial meets the SLOs: Pareto front of all trials"
        return best, front, how
    front = pareto_front(ok, [o0.name, "slo_ratio"], [o0.maximize, False]) if spec.slos else \
        ok.sort_values(o0.name, ascending=not o0.maximize).head(1)
    if len(feas):
        return feas.sort_values([o0.name, "trial"], ascending=[not o0.maximize, True]).iloc[0], front, \
            "best feasible trial"
    return ok.sort_values(["slo_ratio", "trial"]).iloc[0], front, "no trial meets the SLOs: the least violating"


def _strip_none(v):
    if isinstance(v, dict):
        return {k: _strip_none(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [_strip_none(x) for x in v if x is not None]
    return v


def _absolute_paths(data: dict, base_dir: Path) -> dict:
    """Stream, profile, model (config.json) and draft-profile paths relative to the scenario's folder, made absolute
    so that ``best.toml`` runs from wherever it is written."""
    def fix(p):
        if isinstance(p, str) and not Path(p).is_absolute() and (base_dir / p).is_file():
            return str((base_dir / p).resolve())
        return p

    def walk(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k in ("path", "file") and isinstance(v, str):
                    node[k] = fix(v)
                else:
                    walk(v)
        elif isinstance(node, list):
            for x in node:
                walk(x)
    walk(data.get("streams", []))
    eng = data.get("engine", {})
    for key in ("profile", "model"):
        if isinstance(eng.get(key), str):
            eng[key] = fix(eng[key])
    spec = eng.get("speculative")
    if isinstance(spec, dict) and isinstance(spec.get("draft_profile"), str):
        spec["draft_profile"] = fix(spec["draft_profile"])
    return data


def best_scenario(spec: TuneSpec, params: dict) -> dict:
    """The base scenario with ``params`` applied: a complete scenario dict (seed unchanged)."""
    sc = spec.scenario_for(params, spec.base.get("seed", 0))
    sc.pop("tune", None)
    sc["name"] = f"{sc.get('name', 'scenario')}_tuned"
    return _absolute_paths(_strip_none(sc), Path(spec.base_dir))


def default_value(base: dict, key: str) -> Any:
    node: Any = base
    for part in key.split("."):
        if isinstance(node, list):
            try:
                node = node[int(part)]
            except (ValueError, IndexError):
                return None
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return None
    return node


def write_report(spec: TuneSpec, out_dir: str | Path, *, plots: bool = True, uncertainty: dict | None = None) -> dict:
    """Write the tune's files into ``out_dir`` (see module docstring); returns tune.json's dict.
    ``uncertainty``: first re-evaluate the best configuration and the defaults at the cost
    model's time factors (``--uncertainty``; the keyword arguments of
    :func:`sim.experiments.tune_uncertainty.evaluate`: backend, workers, address, log) and
    record their intervals as tune.json's ``uncertainty``."""
    import optuna
    import tomli_w

    out = Path(out_dir)
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{(out / 'study.db').resolve()}")
    df = trials_frame(spec, study)
    write_file(out / "trials.parquet", lambda p: df.to_parquet(p, index=False))
    base_runs = [out / "evals" / "runs" / f"default-s{s}" for s in spec.seeds]
    default = measure(spec, base_runs) if all((d / "summary.json").exists() for d in base_runs) else None
    best, front, how = best_trial(spec, df)
    if "config" in front:  # a configuration asked twice is one point
        front = front.drop_duplicates("config")
    write_file(out / "pareto.csv", front.to_csv(index=False))
    info: dict = {"scenario": spec.base.get("name"), "source": spec.source, "seeds": spec.seeds,
                  "space": [k.text() for k in spec.knobs],
                  "objectives": [{"metric": o.name, "maximize": o.maximize} for o in spec.objectives],
                  "slo": [{"class": s.cls, "key": s.key, "limit_s": s.limit} for s in spec.slos],
                  "trials": int(len(df)), "feasible": int(df["feasible"].sum()) if len(df) else 0,
                  "chosen": how, "default": default}
    if best is not None:
        t = study.trials[int(best["trial"])]
        info["best"] = {"trial": int(best["trial"]), "params": {k.key: k.value(t.params[k.key]) for k in spec.knobs},
                        "measure": t.user_attrs.get("measure")}
        write_file(out / "best.toml",
            f"# tuned by priosim tune from {Path(spec.source).name}: {how}, trial {int(best['trial'])}\n"
            + tomli_w.dumps(best_scenario(spec, dict(t.params))))
    if uncertainty is not None:
        from sim.experiments.tune_uncertainty import evaluate

        params = dict(study.trials[int(best["trial"])].params) if best is not None else None
        info["uncertainty"] = evaluate(spec, out, params, **uncertainty)
    noise = {}
    for o in spec.objectives:
        col = f"{o.name}_std"
        if len(df) and col in df:
            std = df[col].dropna()
            mean = df[o.name].abs().replace(0, np.nan)
            rel = (df[col] / mean).dropna()
            noise[o.name] = {"median_std": float(std.median()) if len(std) else None,
                             "median_rel_std": float(rel.median()) if len(rel) else None,
                             "best_std": (info.get("best") or {}).get("measure", {}).get("objectives", {})
                             .get(o.name, {}).get("std")}
    info["noise"] = noise
    info["importance"] = importance(spec, study)
    write_file(out / "importance.json", jsonout.dumps(info["importance"], indent=1))
    write_file(out / "tune.json", jsonout.dumps(info, indent=1, default=str))
    if plots and len(df):
        plot_front(spec, df, front, default, out / "pareto.png")
    return info


def importance(spec: TuneSpec, study) -> dict:
    """Which knobs mattered, per objective (``optuna.importance``, its default evaluator, which
    ranks knobs by how they separate the best trials: a maximised metric is negated); {} with
    fewer than 3 finished trials."""
    import warnings

    import optuna

    out: dict[str, dict] = {}
    complete = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    if len(complete) < 3 or len(spec.knobs) < 1:
        return out
    for i, o in enumerate(spec.objectives):
        try:
            sign = -1.0 if o.maximize else 1.0
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                imp = optuna.importance.get_param_importances(study, target=lambda t, i=i, s=sign: s * t.values[i])
            out[o.name] = {k: float(v) for k, v in imp.items()}
        except (RuntimeError, ValueError, ZeroDivisionError) as exc:  # e.g. a knob never varied
            out[o.name] = {"error": str(exc)}
    return out


def plot_front(spec: TuneSpec, df: pd.DataFrame, front: pd.DataFrame, default: dict | None, path: Path) -> Path:
    """Every trial (feasible filled, infeasible hollow), the front joined by a line, the scenario's
    defaults as a star: objective 1 vs 2, or the objective vs the tightest SLO ratio."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = df[df["state"] == "COMPLETE"]
    o0 = spec.objectives[0]
    if len(spec.objectives) > 1:
        xcol, ycol = spec.objectives[1].name, o0.name
        dx = default and default["objectives"][xcol]["mean"]
    elif spec.slos:
        xcol, ycol = "slo_ratio", o0.name
        dx = default and _slo_ratio(spec, default["slo"])
    else:
        xcol, ycol = "trial", o0.name
        dx = None
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    feas = ok[ok["feasible"]]
    inf = ok[~ok["feasible"]]
    ax.scatter(feas[xcol], feas[ycol], s=22, color="tab:blue", label="trial (meets SLOs)" if spec.slos else "trial")
    if len(inf):
        ax.scatter(inf[xcol], inf[ycol], s=22, facecolors="none", edgecolors="tab:gray",
                   label="trial (violates SLOs)")
    if len(front) > 1 and xcol != "trial":
        f = front.sort_values(xcol)
        ax.plot(f[xcol], f[ycol], "-", color="tab:orange", lw=1.2, label="front")
    if default is not None and dx is None:  # an optimisation history: the defaults as a line
        ax.axhline(default["objectives"][ycol]["mean"], color="tab:red", ls="--", lw=1.2, label="scenario defaults")
    if default is not None and dx is not None:
        ax.scatter([dx], [default["objectives"][ycol]["mean"]], marker="*", s=160, color="tab:red",
                   label="scenario defaults", zorder=5)
    if xcol == "slo_ratio":
        ax.axvline(1.0, color="k", ls=":", lw=1)
        ax.set_xscale("log")
        ax.set_xlabel("tightest SLO: measured p99 / limit (<= 1 meets)")
    else:
        ax.set_xlabel(xcol)
    ax.set_ylabel(ycol + (" (maximise)" if o0.maximize else " (minimise)"))
    ax.set_title(f"priosim tune: {spec.base.get('name')} ({len(ok)} trials x {len(spec.seeds)} seeds)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    write_file(path, lambda t: fig.savefig(t, format="png", dpi=120, bbox_inches="tight"))  # (a long title: nothing cut off)
    plt.close(fig)
    return path


def side_by_side(spec: TuneSpec, info: dict) -> str:
    """The best configuration next to the scenario's defaults: knobs, then objectives and SLOs."""
    best = info.get("best")
    if best is None:
        return "(no trial finished)"
    rows = []
    for k in spec.knobs:
        d = default_value(spec.base, k.key)
        rows.append((k.key, "(unset)" if d is None else fmt_value(d), fmt_value(best["params"][k.key])))
    dm = info.get("default") or {}
    bm = best.get("measure") or {}
    u = info.get("uncertainty") or {}

    def iv(which: str, part: str, name: str) -> str:  # " (lo-hi)" with --uncertainty
        r = ((u.get(which) or {}).get(part) or {}).get(name)
        return "" if not r else f" ({r[0]:.3g}-{r[1]:.3g})"

    for o in spec.objectives:
        def cell(m, which):
            om = (m.get("objectives") or {}).get(o.name) if m else None
            return "-" if not om or om["mean"] is None else \
                f"{om['mean']:.4g}{iv(which, 'objectives', o.name)} ± {om['std']:.2g}"
        rows.append((f"{'max' if o.maximize else 'min'} {o.name}", cell(dm, "default"), cell(bm, "best")))
    for s in spec.slos:
        def sv(m, which):
            v = (m.get("slo") or {}).get(s.name) if m else None
            return "-" if v is None else f"{v:.4g}{iv(which, 'slo', s.name)}{' ok' if v <= s.limit else ' VIOLATED'}"
        rows.append((f"slo {s.name} <= {s.limit:g}", sv(dm, "default"), sv(bm, "best")))
    w = max(len(r[0]) for r in rows)
    w2 = max(12, max(len(r[1]) for r in rows))
    lines = [f"{'':{w}}  {'defaults':>{w2}}  best (trial {best['trial']})"]
    lines += [f"{a:{w}}  {b:>{w2}}  {c}" for a, b, c in rows]
    if u.get("level"):
        lines.append(f"(lo-hi): the {u['level']:.0%} interval from the cost model's error, the defaults and the "
                     f"best configuration re-evaluated at its time factors, not every trial (docs/uncertainty.md)")
    return "\n".join(lines)
