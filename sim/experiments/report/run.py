"""The report of one run folder (``priosim run``): latency CDFs with SLO lines, queues, batch size,
KV use and preemptions over time, a request timeline, tenant shares, SLO attainment and goodput,
and the settings and provenance the run was made with.

Reads ``summary.json``, ``scenario.json``, ``manifest.json``, ``requests.parquet`` and
``timeseries.parquet`` (all required) and ``iterations.parquet`` and ``perf.json`` (when the run
wrote them). Times are simulated seconds throughout.
"""
from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from sim.experiments.report import intervals as iv
from sim.experiments.report import read
from sim.experiments.report.page import Page, colors, empty, fmt, layout, vline

#: Most points drawn per CDF curve and per time series (evenly spaced quantiles / time bins):
#: enough for the eye, and a day-long run's report stays a few MB.
MAX_POINTS = 1000
#: Most requests on the timeline (the preempted ones first, then spread over the arrivals).
MAX_TIMELINE = 80

REQUEST_COLUMNS = ["request_id", "tenant", "class", "arrival_s", "first_token_s", "finish_s", "status",
                   "preemptions", "ttft_s", "tpot_s", "e2e_s"]


def load(folder: Path) -> dict:
    """Everything the run's report reads, each file checked (one-line errors)."""
    scen = read.json_file(folder / "scenario.json")
    classes = [c.get("name") for c in scen.get("classes", []) if isinstance(c, dict)]
    return {
        "folder": folder,
        "summary": read.json_file(folder / "summary.json"),
        "scenario": scen,
        "manifest": read.json_file(folder / "manifest.json"),
        "perf": read.json_file(folder / "perf.json", required=False) or {},
        "requests": read.parquet(folder / "requests.parquet", columns=REQUEST_COLUMNS),
        "timeseries": read.parquet(folder / "timeseries.parquet",
                                   columns=["t_s", "class", "waiting", "running", "kv_blocks_used"]),
        "iterations": read.parquet(folder / "iterations.parquet", required=False,
                                   columns=["start_s", "end_s", "request_id", "kind"]),
        "classes": [c for c in classes if isinstance(c, str)],
        "slo": {c.get("name"): {"ttft_s": c.get("ttft_slo_s"), "tpot_s": c.get("tpot_slo_s")}
                for c in scen.get("classes", []) if isinstance(c, dict)},
    }


def title(d: dict) -> str:
    s = d["summary"]
    return f"Run: {s.get('scenario', '?')} · policy {s.get('policy', '?')} · seed {s.get('seed', '?')}"


def build(folder: Path) -> Page:
    d = load(folder)
    m = d["manifest"]
    page = Page(title(d), f"priosim {m.get('priosim_version', '?')} · profile {m.get('profile', '?')} · "
                          f"overhead preset {m.get('overhead') or 'none'} · folder {folder.name}")
    overview(page, d)
    page.section("Latency distributions")
    page.note("Cumulative distributions per class (log x); dashed lines: the class's SLO. TTFT counts the "
              "requests that started, TPOT and end-to-end the finished ones.")
    page.open_grid()
    for fig in latency_cdfs(d):
        page.chart(fig)
    page.close_grid()
    page.section("Over time")
    page.note(f"Sampled every {fmt(d['summary'].get('run', {}).get('timeseries_interval_s'))} s of simulated time "
              "(timeseries.parquet); long runs are binned (peaks kept for counts).")
    page.open_grid()
    for fig in over_time(d):
        page.chart(fig, height=340)
    page.close_grid()
    page.section("Request timeline")
    fig, note = timeline(d)
    page.note(note)
    page.chart(fig, height=max(380, 60 + 15 * len(fig["layout"]["yaxis"].get("categoryarray", []))))
    tenants(page, d)
    slo_goodput(page, d)
    settings(page, d)
    return page


# ---- overview ----------------------------------------------------------------------------------
def overview(page: Page, d: dict) -> None:
    s = d["summary"]
    ov, run = s.get("overall", {}), s.get("run", {})
    page.section("Overview")
    lost = (ov.get("rejected") or 0) + (ov.get("unfinished") or 0)
    page.cards([("requests arrived", ov.get("arrived"), ""),
                ("finished", ov.get("finished"), ""),
                ("rejected or unfinished", lost, "bad" if lost else "ok"),
                ("output tokens / s", ov.get("output_tokens_per_s"), ""),
                ("goodput (finished within SLO) / s", ov.get("goodput_rps"), ""),
                ("preemptions", ov.get("preemptions"), ""),
                ("thrash ratio (busy time redoing work)", run.get("thrash_ratio"),
                 "bad" if run.get("thrashing") else ""),
                ("simulated end (s)", run.get("end_s"), "")])
    rows = []
    for c in d["classes"] + ["overall"]:
        m = s.get("classes", {}).get(c) if c != "overall" else ov
        if not m:
            continue
        slo = d["slo"].get(c, {})
        v = partial(iv.cell, m)  # (central (lo-hi) in a run made with --uncertainty)
        rows.append({"class": c, "arrived": m.get("arrived"), "finished": m.get("finished"),
                     "rejected": m.get("rejected"), "unfinished": m.get("unfinished"),
                     "TTFT p50 (s)": v("ttft_p50_s"), "TTFT p99 (s)": v("ttft_p99_s"),
                     "TTFT SLO (s)": slo.get("ttft_s"), "TPOT p99 (s)": v("tpot_p99_s"),
                     "TPOT SLO (s)": slo.get("tpot_s"), "ITL p99 (s)": v("itl_p99_s"),
                     "e2e p99 (s)": v("e2e_p99_s"), "output tok/s": v("output_tokens_per_s"),
                     "SLO attainment": v("slo_attainment"), "goodput (req/s)": v("goodput_rps"),
                     "preemptions": m.get("preemptions")})
    page.table(rows)
    groups = {**{c: s.get("classes", {}).get(c) or {} for c in d["classes"]}, "overall": ov}
    if any(iv.has(m) for m in groups.values()):
        page.note(iv.NOTE)
        page.open_grid()
        for key, label in (("ttft_p99_s", "TTFT p99 (s)"), ("tpot_p99_s", "TPOT p99 (s)"),
                           ("e2e_p99_s", "end-to-end p99 (s)"), ("output_tokens_per_s", "output tokens / s")):
            fig = iv.error_chart(f"{label}: central value and 80 % interval", label, groups, key)
            if fig is not None:
                page.chart(fig, height=320)
        page.close_grid()


# ---- latency CDFs ------------------------------------------------------------------------------
def cdf_points(values: np.ndarray, n: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """The empirical CDF of ``values`` (sorted x, fraction <= x), at most ``n`` points: evenly
    spaced ranks, always the first and the last."""
    v = np.sort(values[np.isfinite(values)])
    if v.size == 0:
        return v, v
    idx = np.arange(v.size) if v.size <= n else np.unique(np.linspace(0, v.size - 1, n).round().astype(int))
    return v[idx], (idx + 1) / v.size


def token_gaps(d: dict) -> dict[str, np.ndarray] | None:
    """Per class, every gap between two tokens of one request (s), from iterations.parquet:
    the first token, then each decode step's end; None without the iterations table."""
    it, req = d["iterations"], d["requests"]
    if it is None or it.empty:
        return None
    dec = it.loc[it["kind"] == "decode", ["request_id", "end_s"]]
    first = req.loc[req["first_token_s"].notna(), ["request_id", "first_token_s"]].rename(
        columns={"first_token_s": "end_s"})
    t = pd.concat([first, dec], ignore_index=True).sort_values(["request_id", "end_s"], kind="stable")
    rid, te = t["request_id"].to_numpy(), t["end_s"].to_numpy(float)
    same = rid[1:] == rid[:-1]
    gaps, owner = np.diff(te)[same], rid[1:][same]
    cls = req.set_index("request_id")["class"]
    gap_cls = cls.reindex(owner).to_numpy()
    return {c: gaps[gap_cls == c] for c in d["classes"]}


def latency_cdfs(d: dict) -> list[dict]:
    req, col = d["requests"], colors(d["classes"])
    gaps = token_gaps(d)
    done = req["status"] == "finished"
    panels = [("Time to first token", "TTFT (s)", "ttft_s", req["first_token_s"].notna(), "ttft_s"),
              ("Time per output token", "TPOT (s)", "tpot_s", done, "tpot_s"),
              ("Inter-token latency" if gaps is not None else "Worst inter-token gap per request",
               "ITL (s)" if gaps is not None else "max ITL of a request (s)", "max_itl_s", done, "tpot_s"),
              ("End-to-end latency", "end-to-end (s)", "e2e_s", done, None)]
    figs = []
    for name, xlabel, column, rows, slo_key in panels:
        data = []
        for c in d["classes"]:
            if column == "max_itl_s" and gaps is not None:
                v = gaps.get(c, np.array([]))
            elif column in req:
                v = req.loc[rows & (req["class"] == c), column].to_numpy(float)
            else:
                v = np.array([])
            v = v[v > 0]
            x, y = cdf_points(v)
            if x.size == 0:
                continue
            data.append({"type": "scatter", "mode": "lines", "x": x, "y": y, "name": f"{c} (n={v.size})",
                         "line": {"color": col[c], "shape": "hv", "width": 2},
                         "hovertemplate": f"{c}<br>%{{x:.4g}} s<br>%{{y:.1%}} at or below<extra></extra>"})
            slo = d["slo"].get(c, {}).get(slo_key) if slo_key else None
            if slo:
                data.append(vline(slo, col[c], f"{c} SLO {slo:g} s"))
        if not data:
            figs.append(empty(name, "no requests to show"))
            continue
        sub = "every gap between two tokens (iterations.parquet)" if column == "max_itl_s" and gaps is not None \
            else ("per finished request (run with --trace-iterations for every gap)" if column == "max_itl_s" else "")
        figs.append({"data": data, "layout": layout(
            f"{name}<br><sup>{sub}</sup>" if sub else name, xlabel + ", log scale", "fraction of requests ≤ x"
            if column != "max_itl_s" or gaps is None else "fraction of gaps ≤ x",
            xaxis={"type": "log"}, yaxis={"range": [0, 1.02]})})
    return figs


# ---- over time ---------------------------------------------------------------------------------
def binned(frame: pd.DataFrame, how: dict[str, str], n: int = MAX_POINTS) -> pd.DataFrame:
    """``frame`` (indexed by time) in at most ``n`` equal time bins, each column aggregated as
    ``how`` says ("max", "mean", "sum"); unchanged when it is short enough."""
    if len(frame) <= n:
        return frame
    t = frame.index.to_numpy(float)
    edges = np.linspace(t[0], t[-1], n + 1)
    b = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, n - 1)
    out = frame.groupby(b).agg(how)
    out.index = edges[out.index.to_numpy()]
    return out


def over_time(d: dict) -> list[dict]:
    ts, run = d["timeseries"], d["summary"].get("run", {})
    col = colors(d["classes"])
    figs = []
    for column, name, ytitle in (("waiting", "Queue length: waiting requests per class", "requests waiting"),
                                 ("running", "Batch size: running requests per class", "requests in the batch")):
        piv = ts.pivot_table(index="t_s", columns="class", values=column, aggfunc="first").fillna(0)
        piv = binned(piv, {c: "max" for c in piv.columns})
        data = [{"type": "scatter", "mode": "lines", "x": piv.index.to_numpy(), "y": piv[c].to_numpy(),
                 "name": c, "line": {"color": col.get(c), "shape": "hv"}}
                for c in d["classes"] if c in piv.columns]
        figs.append({"data": data, "layout": layout(name, "simulated time (s)", ytitle)})
    first = ts.groupby("t_s", sort=True).first()
    kv_cols = {"kv_blocks_used": "max"}
    if "swap_blocks_used" in first:
        kv_cols["swap_blocks_used"] = "max"
    if "preemptions" in first:
        kv_cols["preemptions"] = "sum"
    eng = binned(first[list(kv_cols)], kv_cols)
    t = eng.index.to_numpy()
    data = [{"type": "scatter", "mode": "lines", "x": t, "y": eng["kv_blocks_used"].to_numpy(),
             "name": "device KV blocks in use", "line": {"color": "#333333", "shape": "hv"}}]
    if "swap_blocks_used" in eng and (eng["swap_blocks_used"].max() > 0 or run.get("swap_blocks")):
        data.append({"type": "scatter", "mode": "lines", "x": t, "y": eng["swap_blocks_used"].to_numpy(),
                     "name": "host swap blocks in use", "line": {"color": "#9467bd", "shape": "hv"}})
    if run.get("kv_blocks"):
        data.append({"type": "scatter", "mode": "lines", "x": [t[0] if len(t) else 0, t[-1] if len(t) else 1],
                     "y": [run["kv_blocks"]] * 2, "name": f"device capacity ({run['kv_blocks']:,} blocks)",
                     "line": {"color": "#d62728", "dash": "dash", "width": 1}})
    figs.append({"data": data, "layout": layout("KV-cache use (blocks of block_size tokens)", "simulated time (s)",
                                                "KV blocks")})
    if "preemptions" in eng:
        figs.append({"data": [{"type": "bar", "x": t, "y": eng["preemptions"].to_numpy(), "name": "preemptions",
                               "marker": {"color": "#d62728"}}],
                     "layout": layout(f"Preemptions per interval (all classes; {int(first['preemptions'].sum())} "
                                      f"in all)", "simulated time (s)", "preemptions")})
    if "tokens_per_s" in ts:
        piv = ts.pivot_table(index="t_s", columns="class", values="tokens_per_s", aggfunc="first").fillna(0.0)
        piv = binned(piv, {c: "mean" for c in piv.columns})
        figs.append({"data": [{"type": "scatter", "mode": "lines", "stackgroup": "cls", "x": piv.index.to_numpy(),
                               "y": piv[c].to_numpy(), "name": c, "line": {"color": col.get(c), "shape": "hv"}}
                              for c in d["classes"] if c in piv.columns],
                     "layout": layout("Output tokens / s by class (stacked)", "simulated time (s)", "tokens / s")})
    tcols = [c for c in ts.columns if c.startswith("tenant_tokens_per_s[")]
    if tcols:
        tt = binned(first[tcols], {c: "mean" for c in tcols})
        names = [c[len("tenant_tokens_per_s["):-1] for c in tcols]
        tcol = colors(names, 3)
        figs.append({"data": [{"type": "scatter", "mode": "lines", "stackgroup": "ten", "x": tt.index.to_numpy(),
                               "y": tt[c].to_numpy(), "name": n, "line": {"color": tcol[n], "shape": "hv"}}
                              for c, n in zip(tcols, names)],
                     "layout": layout("Output tokens / s by tenant (stacked)", "simulated time (s)", "tokens / s")})
    return figs


# ---- request timeline --------------------------------------------------------------------------
def pick_requests(req: pd.DataFrame, classes: list[str], n: int = MAX_TIMELINE) -> pd.DataFrame:
    """Up to ``n`` requests: the preempted ones first (up to half), then, per class, requests
    spread evenly over its arrivals; sorted by arrival."""
    req = req.sort_values(["arrival_s", "request_id"], kind="stable")
    pick = list(req.loc[req["preemptions"] > 0, "request_id"][: n // 2])
    per_class = max(1, (n - len(pick)) // max(1, len(classes)))
    for c in classes:
        ids = [r for r in req.loc[req["class"] == c, "request_id"] if r not in set(pick)]
        if len(ids) > per_class:
            ids = [ids[i] for i in np.unique(np.linspace(0, len(ids) - 1, per_class).round().astype(int))]
        pick += ids
    return req[req["request_id"].isin(pick[:n])]


def segments(it: pd.DataFrame) -> pd.DataFrame:
    """Consecutive iterations of one kind of one request merged into stretches (start_s, end_s)."""
    it = it.sort_values(["request_id", "start_s", "kind"], kind="stable").reset_index(drop=True)
    rid, kind = it["request_id"].to_numpy(), it["kind"].to_numpy()
    start, end = it["start_s"].to_numpy(float), it["end_s"].to_numpy(float)
    new = np.ones(len(it), dtype=bool)
    new[1:] = (rid[1:] != rid[:-1]) | (kind[1:] != kind[:-1]) | (start[1:] - end[:-1] > 1e-9)
    it["seg"] = np.cumsum(new)
    return it.groupby("seg", sort=True).agg(request_id=("request_id", "first"), kind=("kind", "first"),
                                            start_s=("start_s", "min"), end_s=("end_s", "max"))


def _bars(name: str, group: str, ys: list, starts: list, ends: list, color, width: float, *, pattern: str = "",
          show: bool = True, hover: list | None = None) -> dict:
    tr = {"type": "bar", "orientation": "h", "name": name, "legendgroup": group, "showlegend": show,
          "y": ys, "base": starts, "x": [e - s for s, e in zip(starts, ends)], "width": width,
          "marker": {"color": color, "line": {"width": 0}}}
    if pattern:
        tr["marker"]["pattern"] = {"shape": pattern, "fgcolor": "#222222", "solidity": 0.3}
    tr["customdata"] = hover or [f"{s:.4g} s to {e:.4g} s" for s, e in zip(starts, ends)]
    tr["hovertemplate"] = f"%{{y}}<br>{name}: %{{customdata}}<extra></extra>"
    return tr


def timeline(d: dict) -> tuple[dict, str]:
    """A Gantt-like chart of some requests: waiting, prefill, decode, recompute and swap
    stretches (from iterations.parquet) or arrival, first token and finish (requests table),
    preemption stalls in red."""
    req, col, it = d["requests"], colors(d["classes"]), d["iterations"]
    if req.empty:
        return empty("Request timeline", "no requests"), "The run had no requests."
    sel = pick_requests(req, d["classes"])
    label = {r: f"#{r} {t}" for r, t in zip(sel["request_id"], sel["tenant"])}
    order = [label[r] for r in sel["request_id"]]
    data: list[dict] = []
    traced = it is not None and not it.empty
    end_of = sel["finish_s"].where(sel["finish_s"].notna(), sel.get("end_s", sel["finish_s"]))
    waits = {"y": [], "s": [], "e": []}
    for r, a, e in zip(sel["request_id"], sel["arrival_s"], end_of):
        if np.isfinite(a) and np.isfinite(e if e is not None else np.nan):
            waits["y"].append(label[r]), waits["s"].append(float(a)), waits["e"].append(float(e))
    data.append(_bars("in the system (arrival to finish)", "wait", waits["y"], waits["s"], waits["e"], "#cccccc", 0.2))
    if traced:
        segs = segments(it[it["request_id"].isin(sel["request_id"])])
        cls = sel.set_index("request_id")["class"]
        segs["class"] = cls.reindex(segs["request_id"]).to_numpy()
        styles = {"prefill": ("prefill", "/"), "decode": ("decode", ""), "recompute": ("recompute (after preemption)", "x")}
        for kind, (name, pattern) in styles.items():
            for i, c in enumerate(d["classes"]):
                g = segs[(segs["kind"] == kind) & (segs["class"] == c)]
                if len(g):
                    data.append(_bars(f"{name} · {c}", f"{kind}-{c}", [label[r] for r in g["request_id"]],
                                      list(g["start_s"]), list(g["end_s"]), col[c], 0.7, pattern=pattern))
        sw = segs[~segs["kind"].isin(list(styles))]
        if len(sw):
            data.append(_bars("swap out / in", "swap", [label[r] for r in sw["request_id"]], list(sw["start_s"]),
                              list(sw["end_s"]), "#000000", 0.8))
        stall = {"y": [], "s": [], "e": []}
        for r, g in segs.groupby("request_id", sort=True):
            e0, s1 = g["end_s"].to_numpy()[:-1], g["start_s"].to_numpy()[1:]
            for a, b in zip(e0[s1 - e0 > 1e-6], s1[s1 - e0 > 1e-6]):
                stall["y"].append(label[r]), stall["s"].append(float(a)), stall["e"].append(float(b))
        if stall["y"]:
            data.append(_bars("stalled after starting (preempted)", "stall", stall["y"], stall["s"], stall["e"],
                              "#d62728", 0.35))
        note = (f"{len(sel)} of {len(req)} requests (the preempted ones first, then spread over the arrivals); "
                "bars from iterations.parquet: prefill hatched, decode solid, recompute cross-hatched, red: a "
                "stall after the request had started (it was preempted).")
    else:
        for c in d["classes"]:
            g = sel[(sel["class"] == c) & sel["first_token_s"].notna()]
            if len(g):
                data.append(_bars(f"waiting and prefill · {c}", f"pre-{c}", [label[r] for r in g["request_id"]],
                                  list(g["arrival_s"]), list(g["first_token_s"]), col[c], 0.5, pattern="/"))
            g = g[g["finish_s"].notna()]
            if len(g):
                hover = [f"{f:.4g} s to {e:.4g} s; preempted {p} times" for f, e, p in
                         zip(g["first_token_s"], g["finish_s"], g["preemptions"])]
                data.append(_bars(f"first token to finish · {c}", f"dec-{c}", [label[r] for r in g["request_id"]],
                                  list(g["first_token_s"]), list(g["finish_s"]), col[c], 0.7, hover=hover))
        pre = sel[(sel["preemptions"] > 0) & sel["first_token_s"].notna()]
        if len(pre):
            data.append({"type": "scatter", "mode": "markers", "name": "preempted (times in hover)",
                         "x": list(pre["first_token_s"]), "y": [label[r] for r in pre["request_id"]],
                         "marker": {"symbol": "x", "color": "#d62728", "size": 9},
                         "customdata": list(pre["preemptions"]),
                         "hovertemplate": "%{y}: preempted %{customdata} times<extra></extra>"})
        note = (f"{len(sel)} of {len(req)} requests (the preempted ones first, then spread over the arrivals): "
                "arrival to first token hatched, first token to finish solid; a red x marks a preempted request. "
                "Run with --trace-iterations for every prefill, decode and stall.")
    lay = layout("Request timeline (by arrival)", "simulated time (s)", "", barmode="overlay",
                 yaxis={"type": "category", "categoryorder": "array", "categoryarray": order, "autorange": "reversed",
                        "tickfont": {"size": 9}},
                 legend={"orientation": "h", "y": -0.08 if len(order) > 30 else -0.2, "font": {"size": 10}})
    return {"data": data, "layout": lay}, note


# ---- tenants, SLOs, settings -------------------------------------------------------------------
def tenants(page: Page, d: dict) -> None:
    ten = d["summary"].get("tenants") or {}
    page.section("Tenants")
    if not ten:
        page.note("The run had no tenants.")
        return
    names = list(ten)
    data = [{"type": "bar", "x": names, "y": [ten[n].get("token_share") for n in names], "name": "output token share",
             "marker": {"color": "#1f77b4"}, "hovertemplate": "%{x}: %{y:.1%} of the output tokens<extra></extra>"}]
    if any(ten[n].get("gpu_s_share") is not None for n in names):
        data.append({"type": "bar", "x": names, "y": [ten[n].get("gpu_s_share") for n in names],
                     "name": "GPU-time share", "marker": {"color": "#ff7f0e"},
                     "hovertemplate": "%{x}: %{y:.1%} of the GPU time<extra></extra>"})
    page.chart({"data": data, "layout": layout("Per-tenant shares of the whole run", "tenant", "share",
                                               yaxis={"tickformat": ".0%", "rangemode": "tozero"})}, height=320)
    page.table([{"tenant": n, "arrived": t.get("arrived"), "finished": t.get("finished"), "rejected": t.get("rejected"),
                 "unfinished": t.get("unfinished"), "output tok/s": t.get("output_tokens_per_s"),
                 "token share": t.get("token_share"), "GPU-time share": t.get("gpu_s_share"),
                 "TTFT p50 (s)": t.get("ttft_p50_s"), "TTFT p99 (s)": t.get("ttft_p99_s")} for n, t in ten.items()])


def slo_goodput(page: Page, d: dict) -> None:
    cl = d["summary"].get("classes") or {}
    names = [c for c in d["classes"] if c in cl]
    page.section("SLO attainment and goodput")
    page.note("SLO attainment: the share of a class's requests that finished within its TTFT and TPOT SLOs; "
              "goodput: those requests per second. Classes without SLOs have neither.")
    with_slo = [c for c in names if cl[c].get("slo_attainment") is not None]
    col = colors(d["classes"])
    page.open_grid()
    if with_slo:
        page.chart({"data": [{"type": "bar", "x": with_slo, "y": [cl[c]["slo_attainment"] for c in with_slo],
                              "marker": {"color": [col[c] for c in with_slo]}, "name": "SLO attainment",
                              "text": [f"{cl[c]['slo_attainment']:.1%}" for c in with_slo], "textposition": "auto"}],
                    "layout": layout("SLO attainment per class", "class", "share within SLO",
                                     yaxis={"range": [0, 1.05], "tickformat": ".0%"})}, height=320)
    else:
        page.chart(empty("SLO attainment per class", "no class has an SLO"), height=320)
    page.chart({"data": [{"type": "bar", "x": names, "y": [cl[c].get("throughput_rps") for c in names],
                          "name": "finished / s", "marker": {"color": "#aaaaaa"}},
                         {"type": "bar", "x": names, "y": [cl[c].get("goodput_rps") for c in names],
                          "name": "finished within SLO / s", "marker": {"color": "#2ca02c"}}],
                "layout": layout("Throughput and goodput per class", "class", "requests / s", barmode="group")},
               height=320)
    page.close_grid()


def settings(page: Page, d: dict) -> None:
    page.section("Settings and provenance")
    m, run, sc = d["manifest"], d["summary"].get("run", {}), d["scenario"]
    eng = sc.get("engine", {}) if isinstance(sc.get("engine"), dict) else {}
    items = {"scenario": m.get("scenario"), "policy": m.get("policy"), "seed": m.get("seed"),
             "cost profile": m.get("profile"), "profile sha256": m.get("profile_sha256"),
             "engine overhead preset": m.get("overhead"), "priosim version": m.get("priosim_version"),
             "engine build": run.get("engine_build"), "horizon (s)": sc.get("horizon_s"),
             "max_num_seqs": eng.get("max_num_seqs"), "max_batched_tokens": eng.get("max_batched_tokens"),
             "KV blocks": run.get("kv_blocks"), "preemption": eng.get("preemption"),
             "preempt_for_waiting": eng.get("preempt_for_waiting"), "engine events": run.get("engine_events"),
             "iterations": run.get("iterations"), "busy (s)": run.get("busy_s"),
             "wall time (s)": d["perf"].get("wall_s")}
    for k in sorted(set(m) - {"scenario", "policy", "seed", "profile", "profile_sha256", "overhead",
                              "priosim_version"}):
        items[k] = m[k] if not isinstance(m[k], (dict, list)) else json.dumps(m[k])
    page.pairs(items)
    page.pre("scenario.json (the scenario as run, every default filled in)", json.dumps(sc, indent=1))
    page.pre("manifest.json", json.dumps(m, indent=1))
