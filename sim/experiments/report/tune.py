"""The report of a tune study (``priosim tune``): every trial's objectives, the Pareto front,
parameter importance, each knob against the first objective, and the chosen configuration next
to the scenario's defaults.

Reads ``tune.json`` (required: the search, the defaults' and the best trial's measures),
``trials.parquet`` (one row per trial), ``pareto.csv``, ``importance.json`` and the defaults'
``evals/runs/default-s<seed>/scenario.json`` (for the knobs' default values) where present.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from sim.experiments.report import read
from sim.experiments.report.page import PALETTE, Page, empty, fmt, layout
from sim.experiments.tune_report import default_value

MAX_KNOB_CHARTS = 6


def objectives(info: dict) -> list[tuple[str, bool]]:
    return [(o.get("metric"), bool(o.get("maximize"))) for o in info.get("objectives", []) if isinstance(o, dict)]


def knobs(info: dict, trials: pd.DataFrame) -> list[str]:
    keys = [str(s).split("=", 1)[0].strip() for s in info.get("space", [])]
    return [k for k in dict.fromkeys(keys) if k in trials.columns]


def slo_text(slo) -> str:
    """An SLO of tune.json as a reader writes it: ``interactive ttft <= 0.5 s``."""
    if isinstance(slo, dict) and {"class", "key", "limit_s"} <= set(slo):
        return f"{slo['class']} {slo['key']} <= {fmt(slo['limit_s'])} s"
    return str(slo)


def default_scenario(folder: Path, info: dict) -> dict:
    for seed in info.get("seeds", []):
        doc = read.json_file(folder / "evals" / "runs" / f"default-s{seed}" / "scenario.json", required=False)
        if doc:
            return doc
    return {}


def _marks(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    done = df[df["state"] == "COMPLETE"] if "state" in df else df
    feas = done["feasible"].astype(bool) if "feasible" in done else pd.Series(True, index=done.index)
    return done[feas], done[~feas]


def _hover(df: pd.DataFrame, keys: list[str]) -> list[str]:
    return ["<br>".join([f"trial {int(r['trial'])}"] + [f"{k} = {fmt(r[k])}" for k in keys]) for _, r in df.iterrows()]


def trials_chart(df: pd.DataFrame, name: str, maximize: bool, keys: list[str], best: int | None) -> dict:
    ok, bad = _marks(df)
    data = []
    for part, label, sym in ((ok, "meets the SLOs", "circle"), (bad, "misses an SLO", "circle-open")):
        if len(part) and name in part:
            data.append({"type": "scatter", "mode": "markers", "name": label, "x": part["trial"], "y": part[name],
                         "marker": {"symbol": sym, "size": 9, "color": "#1f77b4" if sym == "circle" else "#d62728"},
                         "customdata": _hover(part, keys), "hovertemplate": "%{customdata}<br>%{y:.4g}<extra></extra>"})
    if len(ok) and name in ok:
        s = ok.sort_values("trial")
        run = s[name].cummax() if maximize else s[name].cummin()
        data.append({"type": "scatter", "mode": "lines", "name": "best so far", "x": s["trial"], "y": run,
                     "line": {"shape": "hv", "color": "#2ca02c"}})
    if best is not None and best in set(df["trial"]) and name in df:
        row = df[df["trial"] == best].iloc[0]
        data.append({"type": "scatter", "mode": "markers", "name": f"chosen (trial {best})", "x": [best],
                     "y": [row[name]], "marker": {"symbol": "star", "size": 16, "color": "#ff7f0e",
                                                  "line": {"width": 1, "color": "#000"}}})
    if not data:
        return empty(f"{name} per trial", "no trial finished")
    return {"data": data, "layout": layout(f"{'maximise' if maximize else 'minimise'} {name}: every trial",
                                           "trial", name)}


def front_chart(df: pd.DataFrame, front: pd.DataFrame | None, x: str, y: str, info: dict, keys: list[str],
                labels: tuple[str, str]) -> dict:
    ok, bad = _marks(df)
    data = []
    for part, label, color in ((ok, "trial: meets the SLOs", "#9ecae1"), (bad, "trial: misses an SLO", "#fcbba1")):
        if len(part):
            data.append({"type": "scatter", "mode": "markers", "name": label, "x": part[x], "y": part[y],
                         "marker": {"size": 9, "color": color, "line": {"width": 1, "color": "#555"}},
                         "customdata": _hover(part, keys), "hovertemplate": "%{customdata}<br>%{x:.4g}, %{y:.4g}"
                                                                            "<extra></extra>"})
    if front is not None and len(front) and x in front and y in front:
        f = front.sort_values(x)
        data.append({"type": "scatter", "mode": "lines+markers", "name": "Pareto front", "x": f[x], "y": f[y],
                     "line": {"color": "#d62728", "shape": "hv"}, "marker": {"size": 10, "color": "#d62728"},
                     "customdata": _hover(f, keys), "hovertemplate": "%{customdata}<br>%{x:.4g}, %{y:.4g}"
                                                                     "<extra></extra>"})
    for what, sym, color in (("default", "diamond", "#000000"), ("best", "star", "#ff7f0e")):
        m = info.get(what) or {}
        m = m.get("measure", m) if what == "best" else m
        vx, vy = _measure(m, x), _measure(m, y)
        if vx is not None and vy is not None:
            data.append({"type": "scatter", "mode": "markers", "name": "the scenario's defaults" if what == "default"
                         else f"chosen (trial {info['best'].get('trial')})", "x": [vx], "y": [vy],
                         "marker": {"symbol": sym, "size": 16, "color": color, "line": {"width": 1, "color": "#000"}}})
    if not data:
        return empty("Pareto front", "no trial finished")
    return {"data": data, "layout": layout("Trials and the Pareto front", labels[0], labels[1])}


def _measure(m: dict, name: str):
    """An objective's mean in a measure of tune.json (None for the SLO ratio: trials only)."""
    o = (m.get("objectives") or {}).get(name)
    return o.get("mean") if isinstance(o, dict) else None


def importance_chart(imp: dict) -> dict:
    data = []
    names = [n for n, v in imp.items() if isinstance(v, dict) and "error" not in v]
    for i, n in enumerate(names):
        keys = sorted(imp[n], key=lambda k: imp[n][k])
        data.append({"type": "bar", "orientation": "h", "name": n, "y": keys, "x": [imp[n][k] for k in keys],
                     "marker": {"color": PALETTE[i % len(PALETTE)]},
                     "hovertemplate": f"{n}<br>%{{y}}: %{{x:.2f}}<extra></extra>"})
    if not data:
        return empty("Parameter importance", "not computed (too few finished trials)")
    return {"data": data, "layout": layout("Parameter importance (fANOVA: share of the objective's variance)",
                                           "importance", "", barmode="group", xaxis={"range": [0, 1]},
                                           margin={"l": 200, "r": 20, "t": 50, "b": 50})}


def knob_chart(df: pd.DataFrame, key: str, name: str, keys: list[str]) -> dict:
    ok, bad = _marks(df)
    data = [{"type": "scatter", "mode": "markers", "name": label, "x": part[key], "y": part[name],
             "marker": {"size": 9, "color": color, "symbol": sym}, "customdata": _hover(part, keys),
             "hovertemplate": "%{customdata}<br>%{y:.4g}<extra></extra>"}
            for part, label, color, sym in ((ok, "meets the SLOs", "#1f77b4", "circle"),
                                            (bad, "misses an SLO", "#d62728", "circle-open")) if len(part)]
    if not data:
        return empty(f"{name} against {key}", "no trial finished")
    return {"data": data, "layout": layout(f"{name} against {key}", key, name)}


def best_vs_defaults(info: dict, keys: list[str], default_sc: dict) -> list[dict]:
    best = info.get("best") or {}
    bm, dm = best.get("measure") or {}, info.get("default") or {}
    rows = [{"": k, "defaults": default_value(default_sc, k) if default_sc else None,
             f"chosen (trial {best.get('trial')})": (best.get("params") or {}).get(k), "change": None} for k in keys]
    names = [o for o, _ in objectives(info)]
    for n, mx in objectives(info):
        a, b = _measure(dm, n), _measure(bm, n)
        rows.append({"": f"{'max' if mx else 'min'} {n}", "defaults": a, f"chosen (trial {best.get('trial')})": b,
                     "change": None if a in (None, 0) or b is None else f"{(b - a) / abs(a):+.1%}"})
    for k in sorted(set(bm.get("metrics") or {}) | set(dm.get("metrics") or {})):
        if k in names:
            continue
        a, b = (dm.get("metrics") or {}).get(k), (bm.get("metrics") or {}).get(k)
        rows.append({"": k, "defaults": a, f"chosen (trial {best.get('trial')})": b,
                     "change": None if not isinstance(a, (int, float)) or not a or not isinstance(b, (int, float))
                     else f"{(b - a) / abs(a):+.1%}"})
    return rows


def build(folder: Path) -> Page:
    info = read.json_file(folder / "tune.json")
    df = read.parquet(folder / "trials.parquet", required=False, columns=["trial"])
    df = df if df is not None else pd.DataFrame({"trial": pd.Series(dtype=int)})
    front = read.csv(folder / "pareto.csv")
    imp = read.json_file(folder / "importance.json", required=False) or info.get("importance") or {}
    objs = objectives(info)
    keys = knobs(info, df)
    best = (info.get("best") or {}).get("trial")
    page = Page(f"Tune: {info.get('scenario', folder.name)}",
                f"{len(df)} trials · {len(keys)} knobs · {len(objs)} objective{'s' if len(objs) != 1 else ''} · "
                f"seeds {', '.join(map(str, info.get('seeds', [])))} · folder {folder.name}")
    page.section("Overview")
    page.cards([("trials", info.get("trials", len(df)), ""), ("meet the SLOs", info.get("feasible"), ""),
                ("chosen trial", best if best is not None else "none", "ok" if best is not None else "bad")])
    page.pairs({"scenario": info.get("scenario"), "source": info.get("source"),
                "searched": "; ".join(map(str, info.get("space", []))),
                "objectives": "; ".join(f"{'maximise' if mx else 'minimise'} {n}" for n, mx in objs),
                "SLOs": "; ".join(map(slo_text, info.get("slo", []))) or "none", "chosen how": info.get("chosen")})
    page.section("Best against the scenario's defaults")
    page.table(best_vs_defaults(info, keys, default_scenario(folder, info)))
    page.section("Trials")
    page.open_grid()
    for n, mx in objs[:3]:
        page.chart(trials_chart(df, n, mx, keys, best))
    page.close_grid()
    page.section("Pareto front")
    if len(objs) > 1 and all(n in df for n, _ in objs[:2]):
        page.note(f"x: {objs[0][0]} ({'higher' if objs[0][1] else 'lower'} is better), y: {objs[1][0]} "
                  f"({'higher' if objs[1][1] else 'lower'} is better); red: the trials no other trial beats on "
                  "both (pareto.csv).")
        page.chart(front_chart(df, front, objs[0][0], objs[1][0], info, keys, (objs[0][0], objs[1][0])), height=460)
    elif objs and "slo_ratio" in df and df["slo_ratio"].notna().any():
        df = df.assign(slo_ratio=pd.to_numeric(df["slo_ratio"], errors="coerce"))
        page.note(f"One objective with SLOs: {objs[0][0]} against the worst SLO ratio (value / limit, at most 1 "
                  "meets them); red: the trials no other trial beats on both.")
        page.chart(front_chart(df, front, objs[0][0], "slo_ratio", info, keys, (objs[0][0], "worst SLO ratio")),
                   height=460)
    else:
        page.note("One objective and no SLOs: there is no trade-off to draw; the chosen trial is the best one "
                  "(see Trials).")
    page.section("What matters")
    page.open_grid()
    page.chart(importance_chart(imp))
    if objs:
        for k in keys[:MAX_KNOB_CHARTS]:
            page.chart(knob_chart(df, k, objs[0][0], keys))
    page.close_grid()
    if len(keys) > MAX_KNOB_CHARTS:
        page.note(f"{len(keys) - MAX_KNOB_CHARTS} more knobs not drawn (see trials.parquet).")
    page.section("Every trial")
    cols = ["trial", "state", *keys, *[n for n, _ in objs if n in df], "feasible"]
    page.pre(f"trials.parquet ({len(df)} trials)",
             df[[c for c in cols if c in df]].to_string(index=False, float_format=lambda v: fmt(v)))
    page.pre("tune.json", json.dumps(info, indent=1))
    return page

