"""The report of a sweep folder (``priosim sweep``): every headline metric against load, one
line per policy (and per value of any other grid axis), the mean over seeds with a band from
the lowest to the highest seed; a menu above each chart picks the class.

Reads ``sweep.parquet`` (required: one row per run and class, ``overall`` included) and
``sweep.json`` (the axes, overrides and failed runs, when present).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from sim.experiments.report import intervals as iv
from sim.experiments.report import read
from sim.experiments.report.page import Page, PALETTE, empty, fmt, layout

#: (column, label, log y, the SLO column drawn as a dashed line)
METRICS = [
    ("ttft_p50_s", "TTFT p50 (s)", True, "ttft_slo_s"),
    ("ttft_p99_s", "TTFT p99 (s)", True, "ttft_slo_s"),
    ("tpot_p50_s", "TPOT p50 (s)", True, "tpot_slo_s"),
    ("tpot_p99_s", "TPOT p99 (s)", True, "tpot_slo_s"),
    ("itl_p99_s", "inter-token latency p99 (s)", True, "tpot_slo_s"),
    ("e2e_p50_s", "end-to-end p50 (s)", True, None),
    ("e2e_p99_s", "end-to-end p99 (s)", True, None),
    ("queue_wait_p99_s", "queue wait p99 (s)", True, None),
    ("slo_attainment", "SLO attainment (share within SLO)", False, None),
    ("goodput_rps", "goodput (finished within SLO / s)", False, None),
    ("throughput_rps", "finished requests / s", False, None),
    ("output_tokens_per_s", "output tokens / s", False, None),
    ("preemptions", "preemptions per run", False, None),
    ("rejected", "rejected requests", False, None),
    ("unfinished", "unfinished requests", False, None),
    ("thrash_ratio", "thrash ratio (busy time redoing work)", False, None),
]
#: metrics shown for "overall" first (the others for the first class)
OVERALL_FIRST = {"goodput_rps", "throughput_rps", "output_tokens_per_s", "preemptions", "thrash_ratio"}


def axis_columns(df: pd.DataFrame) -> list[str]:
    """The grid's axes: the columns between ``run_id`` and ``class``."""
    cols = list(df.columns)
    end = cols.index("class") if "class" in cols else 1
    return cols[1:end]


def series(df: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Each row labelled with its line: the policy plus any grid axis other than load and seed."""
    extra = [c for c in axis_columns(df) if c not in ("policy", "load", "seed")]
    df = df.copy()
    df["series"] = df["policy"].astype(str) if "policy" in df else "runs"
    for c in extra:
        df["series"] = df["series"] + f" {c.split('.')[-1]}=" + df[c].astype(str)
    return df, list(dict.fromkeys(df["series"]))


def metric_chart(df: pd.DataFrame, column: str, label: str, logy: bool, slo_col: str | None,
                 classes: list[str], lines: list[str], first: str) -> dict:
    """One metric against load: per class (a menu picks one) and line, the mean over seeds and a
    min-max band; the class's SLO as a dashed line."""
    data, owner = [], []
    seeds = df["seed"].nunique() if "seed" in df else 1
    for c in classes:
        g = df[df["class"] == c]
        for i, s in enumerate(lines):
            h = g[g["series"] == s]
            if column not in h or h[column].isna().all():
                continue
            st = h.groupby("load")[column].agg(["mean", "min", "max", "count"]).sort_index()
            x = st.index.to_numpy(float)
            color = PALETTE[i % len(PALETTE)]
            if seeds > 1:
                data.append({"type": "scatter", "mode": "lines", "x": np.concatenate([x, x[::-1]]),
                             "y": np.concatenate([st["max"].to_numpy(), st["min"].to_numpy()[::-1]]),
                             "fill": "toself", "fillcolor": _alpha(color, 0.15), "line": {"width": 0},
                             "name": f"{s}: seed range", "legendgroup": s, "showlegend": False, "hoverinfo": "skip"})
                owner.append(c)
            if f"{column}_lo" in h and h[f"{column}_lo"].notna().any():
                # --uncertainty: the cost model's interval (mean of its ends over seeds), hatched
                # with a dotted edge so that it reads apart from the seed band's plain fill
                ends = h.groupby("load")[[f"{column}_lo", f"{column}_hi"]].mean().reindex(st.index)
                data.append({"type": "scatter", "mode": "lines", "x": np.concatenate([x, x[::-1]]),
                             "y": np.concatenate([ends[f"{column}_hi"].to_numpy(),
                                                  ends[f"{column}_lo"].to_numpy()[::-1]]),
                             "fill": "toself", "fillcolor": _alpha(color, 0.05),
                             "fillpattern": {"shape": "/", "fgcolor": _alpha(color, 0.5), "size": 8},
                             "line": {"width": 1, "dash": "dot", "color": _alpha(color, 0.6)},
                             "name": f"{s}: 80 % interval", "legendgroup": s, "showlegend": False,
                             "hoverinfo": "skip"})
                owner.append(c)
            data.append({"type": "scatter", "mode": "lines+markers", "x": x, "y": st["mean"].to_numpy(), "name": s,
                         "legendgroup": s, "line": {"color": color, "width": 2}, "marker": {"size": 7},
                         "customdata": np.stack([st["min"].to_numpy(), st["max"].to_numpy(),
                                                 st["count"].to_numpy()], axis=1),
                         "hovertemplate": f"{s}<br>load %{{x:g}}<br>mean %{{y:.4g}}<br>"
                                          "min %{customdata[0]:.4g}, max %{customdata[1]:.4g} over "
                                          "%{customdata[2]} runs<extra></extra>"})
            owner.append(c)
        if slo_col and slo_col in g and g[slo_col].notna().any() and len(g):
            slo = float(g[slo_col].dropna().iloc[0])
            lo, hi = float(df["load"].min()), float(df["load"].max())
            data.append({"type": "scatter", "mode": "lines", "x": [lo, hi], "y": [slo, slo],
                         "name": f"{c} SLO {slo:g} s", "line": {"color": "#d62728", "dash": "dash", "width": 1.2},
                         "hovertemplate": f"{c} SLO {slo:g} s<extra></extra>"})
            owner.append(c)
    if not data:
        return empty(label, "no run has this metric")
    shown = first if first in owner else owner[0]
    for tr, c in zip(data, owner):
        tr["visible"] = c == shown
    menu = [c for c in classes if c in owner]
    buttons = [{"label": "all classes" if c == "overall" else f"class {c}", "method": "update",
                "args": [{"visible": [o == c for o in owner]}]} for c in menu]
    lay = layout(f"{label} vs load", "load (× the scenario's arrival rates)", label,
                 yaxis={"type": "log"} if logy and (df[column].dropna() > 0).all() else {"rangemode": "tozero"},
                 updatemenus=[{"buttons": buttons, "active": menu.index(shown), "x": 0, "xanchor": "left", "y": 1.18, "yanchor": "top",
                     "direction": "down", "showactive": True}],
                 margin={"l": 60, "r": 20, "t": 80, "b": 50})
    return {"data": data, "layout": lay}


def _alpha(hex_color: str, a: float) -> str:
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{a})"


def build(folder: Path) -> Page:
    df = read.parquet(folder / "sweep.parquet", columns=["run_id", "class", "load"])
    meta = read.json_file(folder / "sweep.json", required=False) or {}
    name = meta.get("scenario_name") or Path(str(meta.get("source", folder.name))).stem
    df, lines = series(df)
    if "seed" not in df:
        df["seed"] = 0
    classes = [c for c in dict.fromkeys(df["class"]) if c != "overall"]
    classes += ["overall"] if (df["class"] == "overall").any() else []
    page = Page(f"Sweep: {name}", f"{df['run_id'].nunique()} runs · {len(lines)} lines · "
                                  f"{df['seed'].nunique()} seeds per point · folder {folder.name}")
    page.section("Overview")
    axes = meta.get("axes") or {c: sorted(map(str, df[c].unique())) for c in axis_columns(df)}
    failed = meta.get("failed") or {}
    page.cards([("runs in sweep.parquet", df["run_id"].nunique(), ""), ("failed runs", len(failed),
                "bad" if failed else "ok"), ("policies", df["policy"].nunique() if "policy" in df else 1, ""),
                ("loads", df["load"].nunique(), ""), ("seeds", df["seed"].nunique(), "")])
    page.pairs({"scenario": name, "source": meta.get("source"), "backend": meta.get("backend"),
                **{f"axis {k}": ", ".join(map(str, v)) for k, v in axes.items()},
                "overrides (--set)": ", ".join(meta.get("overrides") or []) or None,
                "seed repeats not run": meta.get("seed_repeats_not_run"), "wall time (s)": meta.get("wall_s")})
    if failed:
        page.heading("Failed runs")
        page.table([{"run": k, "error": str(v)[:200]} for k, v in failed.items()])
    page.section("Headline metrics vs load")
    if df.empty:
        page.note("No run has finished yet (sweep.parquet is empty).")
        return page
    seeds = df["seed"].nunique()
    page.note("x: load = arrival-rate multiplier (traces: time compression). Lines: the mean over "
              f"{seeds} seed{'s' if seeds != 1 else ''}" + ("; band: the lowest to the highest seed" if seeds > 1
                                                            else "") +
              ". The menu above each chart picks the class; dashed red: the class's SLO. Click a legend entry "
              "to hide a policy." + (" Hatched band with a dotted edge: the cost model's 80 % interval "
                                     "(--uncertainty; the mean of its ends over seeds)."
                                     if any(c.endswith("_lo") for c in df.columns) else ""))
    page.open_grid()
    for column, label, logy, slo in METRICS:
        if column not in df:
            continue
        first = "overall" if column in OVERALL_FIRST and "overall" in classes else classes[0]
        page.chart(metric_chart(df, column, label, logy, slo, classes, lines, first), height=400)
    page.close_grid()
    page.section("Every run")
    keep = ["run_id", "class", "ttft_p99_s", "tpot_p99_s", "e2e_p99_s", "slo_attainment", "goodput_rps",
            "output_tokens_per_s", "preemptions", "rejected"]
    shown = df[[c for c in keep if c in df]].copy()
    if any(c.endswith("_lo") for c in df.columns):  # central (lo-hi)
        for c in shown.columns:
            if f"{c}_lo" in df:
                shown[c] = [iv.cell(r, c) for r in df[[c, f"{c}_lo", f"{c}_hi"]].to_dict("records")]
        page.note(iv.NOTE)
    page.pre(f"sweep.parquet ({len(df)} rows): run, class and headline metrics",
             shown.to_string(index=False, float_format=lambda v: fmt(v)))
    if meta:
        page.pre("sweep.json", json.dumps(meta, indent=1))
    return page
