"""Figures for one run and for a sweep (matplotlib; each saved as PNG and SVG).

``plot_run(run_dir)`` writes into ``run_dir/figures/``:
    latency_cdf    TTFT, time per output token and end-to-end latency CDFs per class, SLO lines
    token_share    output tokens/s over time, stacked by class and by tenant
    kv_queues      KV blocks in use (and swap), waiting and running requests per class over time
    timeline       request Gantt chart (only when the run wrote ``iterations.parquet``): prefill,
                   decode, recompute and swap stretches coloured by class, waits and stalls grey
``plot_sweep(sweep_dir)`` writes into ``sweep_dir/figures/``:
    latency_vs_load      TTFT and end-to-end p50/p99 per class (columns) per policy (lines), SLO lines
                         (every figure: a filled band for the spread over seeds, a hatched one for
                         the cost model's interval of a sweep run with --uncertainty)
    throughput_vs_load   output tokens/s, finished requests/s and goodput (within SLO) vs load
    preemptions_vs_load  preemptions per class and overall vs load

Figures are built on ``matplotlib.figure.Figure`` directly (no pyplot state, no GUI backend), so
plotting works in worker processes, in tests and in notebooks alike. Only ``sim.cli`` and the
notebooks import this module.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.lines import Line2D
from matplotlib.ticker import NullFormatter

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
DPI = 110


def _save(fig: Figure, out_dir: Path, name: str) -> list[Path]:
    """Save ``fig`` as PNG and SVG. The constrained layout already fits titles and legends, so
    no ``bbox_inches="tight"`` (it draws every figure twice); PNGs use light zlib compression
    (encoding was a third of the time at the default level, the files are ~10% larger)."""
    from sim.outdir import write_file

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext in ("png", "svg"):
        opts = {"pil_kwargs": {"compress_level": 1}} if ext == "png" else {}
        paths.append(write_file(out_dir / f"{name}.{ext}",
                                lambda t, ext=ext, opts=opts: fig.savefig(t, format=ext, dpi=DPI, **opts)))
    return paths


def _suptitle(fig: Figure, text: str, fontsize: float = 12.0) -> None:
    """A figure title wrapped to the canvas: the constrained layout makes room for its height
    but not its width, so a long line (a long scenario name, the load note) would be cut off at
    both edges. Each line is wrapped at the characters that fit the figure's width, estimated at
    0.62 em per character (sans-serif average, with slack)."""
    import textwrap

    width = int(fig.get_figwidth() * 72 / (fontsize * 0.62))
    lines = [w for line in text.split("\n") for w in (textwrap.wrap(line, width) or [""])]
    fig.suptitle("\n".join(lines), fontsize=fontsize)


def _class_colors(classes: list[str]) -> dict[str, str]:
    return {c: PALETTE[i % len(PALETTE)] for i, c in enumerate(classes)}


# ---- one run --------------------------------------------------------------------------------
def _load_run(run_dir: Path) -> dict:
    scen = json.loads((run_dir / "scenario.json").read_text())
    summ = json.loads((run_dir / "summary.json").read_text())
    data = {"scenario": scen, "summary": summ,
            "requests": pd.read_parquet(run_dir / "requests.parquet"),
            "timeseries": pd.read_parquet(run_dir / "timeseries.parquet"),
            "classes": [c["name"] for c in scen["classes"]],
            "slo": {c["name"]: (c.get("ttft_slo_s"), c.get("tpot_slo_s")) for c in scen["classes"]}}
    it = run_dir / "iterations.parquet"
    data["iterations"] = pd.read_parquet(it) if it.exists() else None
    return data


def _title(d: dict) -> str:
    s = d["summary"]
    return f"{s.get('scenario')} · policy {s.get('policy')} · seed {s.get('seed')}"


def fig_latency_cdf(d: dict) -> Figure:
    req, colors = d["requests"], _class_colors(d["classes"])
    fig = Figure(figsize=(13, 4.2), layout="constrained")
    axes = fig.subplots(1, 3)
    panels = [("ttft_s", "time to first token (s)", 0), ("tpot_s", "time per output token (s)", 1),
              ("e2e_s", "end-to-end latency (s)", None)]
    for ax, (col, label, slo_i) in zip(axes, panels):
        any_line = False
        for c in d["classes"]:
            v = req.loc[req["class"] == c, col].dropna().to_numpy()
            v = np.sort(v[v > 0])
            if v.size == 0:
                continue
            y = np.arange(1, v.size + 1) / v.size
            ax.step(v, y, where="post", color=colors[c], lw=1.8, label=f"{c} (n={v.size})")
            any_line = True
            slo = d["slo"][c][slo_i] if slo_i is not None else None
            if slo:
                ax.axvline(slo, color=colors[c], ls="--", lw=1, alpha=0.8)
                ax.text(slo, 0.02, f" {c} SLO {slo:g}s", color=colors[c], rotation=90, va="bottom",
                        ha="right", fontsize=8)
        if any_line:
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())  # crowded minor labels on short ranges
            ax.legend(loc="lower right", fontsize=8, title="class")
        else:
            ax.text(0.5, 0.5, "no requests", transform=ax.transAxes, ha="center")
        ax.set_xlabel(label + ", log scale")
        ax.set_ylabel("fraction of requests ≤ x")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3, which="both")
    axes[0].set_title("Time to first token (started requests)")
    axes[1].set_title("Time per output token (finished)")
    axes[2].set_title("End-to-end latency (finished)")
    _suptitle(fig, f"Latency CDFs per class — {_title(d)}  (dashed: SLO)")
    return fig


def _stack(ax, t, series: dict[str, np.ndarray], colors: dict[str, str], title: str) -> None:
    names = [n for n in series if np.nansum(series[n]) > 0] or list(series)
    if not names:
        ax.text(0.5, 0.5, "no tokens", transform=ax.transAxes, ha="center")
        return
    ax.stackplot(t, *[series[n] for n in names], labels=names, colors=[colors[n] for n in names],
                 alpha=0.85, step="post")
    ax.set_ylabel("output tokens / s")
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)


def fig_token_share(d: dict) -> Figure:
    ts = d["timeseries"]
    fig = Figure(figsize=(12, 6.5), layout="constrained")
    a1, a2 = fig.subplots(2, 1, sharex=True)
    piv = ts.pivot_table(index="t_s", columns="class", values="tokens_per_s", aggfunc="first").fillna(0.0)
    # tokens of a fast-forwarded stretch land in the interval where it ends: smooth over ~1% of
    # the run so the shares, not the binning, are what the eye sees
    win = max(1, len(piv) // 100)
    piv = piv.rolling(win, min_periods=1, center=True).mean()
    t = piv.index.to_numpy()
    cls = [c for c in d["classes"] if c in piv.columns]
    _stack(a1, t, {c: piv[c].to_numpy() for c in cls}, _class_colors(d["classes"]),
           "By class (band height = that class's share of the throughput)")
    tcols = [c for c in ts.columns if c.startswith("tenant_tokens_per_s[")]
    first = ts.groupby("t_s", sort=True).first()[tcols].rolling(win, min_periods=1, center=True).mean()
    tenants = {c[len("tenant_tokens_per_s["):-1]: first[c].to_numpy() for c in tcols}
    tcolors = {n: PALETTE[(i + 3) % len(PALETTE)] for i, n in enumerate(tenants)}
    _stack(a2, first.index.to_numpy(), tenants, tcolors, "By tenant")
    a2.set_xlabel("simulated time (s)")
    shares = d["summary"].get("tenants", {})
    txt = ", ".join(f"{k} {v.get('token_share', 0):.0%}" for k, v in shares.items())
    iv = float(np.median(np.diff(t))) if len(t) > 1 else 0.0
    _suptitle(fig, f"Output token share over time — {_title(d)}\nwhole-run tenant shares: {txt}"
                 f"  (rolling mean over {win * iv:g} s)")
    return fig


def fig_kv_queues(d: dict) -> Figure:
    ts, colors = d["timeseries"], _class_colors(d["classes"])
    run = d["summary"].get("run", {})
    fig = Figure(figsize=(12, 8), layout="constrained")
    a1, a2, a3 = fig.subplots(3, 1, sharex=True)
    first = ts.groupby("t_s", sort=True).first()
    t = first.index.to_numpy()
    a1.plot(t, first["kv_blocks_used"], color="#333333", lw=1.5, label="device KV blocks in use")
    if run.get("kv_blocks"):
        a1.axhline(run["kv_blocks"], color="#d62728", ls="--", lw=1, label=f"device capacity ({run['kv_blocks']:,})")
    if first["swap_blocks_used"].max() > 0 or run.get("swap_blocks"):
        a1.plot(t, first["swap_blocks_used"], color="#9467bd", lw=1.2, label="host swap blocks in use")
    a1.set_ylabel("KV blocks")
    a1.set_title("KV-cache memory (blocks of block_size tokens)")
    a1.legend(loc="upper right", fontsize=8)
    for ax, col, title in ((a2, "waiting", "Waiting requests (queued, preempted or swapped out)"),
                           (a3, "running", "Running requests (in the batch)")):
        for c in d["classes"]:
            g = ts[ts["class"] == c]
            ax.step(g["t_s"], g[col], where="post", color=colors[c], lw=1.4, label=c)
        ax.set_ylabel("requests")
        ax.set_title(title)
        ax.legend(loc="upper right", fontsize=8, title="class")
    for ax in (a1, a2, a3):
        ax.grid(alpha=0.3)
    a3.set_xlabel("simulated time (s)")
    _suptitle(fig, f"Memory and queues over time — {_title(d)}")
    return fig


def _segments(it: pd.DataFrame) -> pd.DataFrame:
    """Merge consecutive iterations of the same kind of one request into stretches."""
    it = it.sort_values(["request_id", "start_s", "kind"], kind="stable").reset_index(drop=True)
    rid, kind = it["request_id"].to_numpy(), it["kind"].to_numpy()
    start, end = it["start_s"].to_numpy(), it["end_s"].to_numpy()
    new = np.ones(len(it), dtype=bool)
    if len(it) > 1:
        new[1:] = (rid[1:] != rid[:-1]) | (kind[1:] != kind[:-1]) | (start[1:] - end[:-1] > 1e-9)
    it["seg"] = np.cumsum(new)
    return it.groupby("seg", sort=True).agg(request_id=("request_id", "first"), kind=("kind", "first"),
                                            start_s=("start_s", "min"), end_s=("end_s", "max"))


def fig_timeline(d: dict, max_requests: int = 40) -> Figure | None:
    """Gantt chart of up to ``max_requests`` requests: the preempted ones first, then the
    earliest arrivals of each class, sorted by arrival."""
    it = d["iterations"]
    if it is None or it.empty:
        return None
    req, colors = d["requests"], _class_colors(d["classes"])
    seen = set(it["request_id"].unique())
    req = req[req["request_id"].isin(seen)]
    pick = list(req.loc[req["preemptions"] > 0, "request_id"][: max_requests // 2])
    per_class = max(1, (max_requests - len(pick)) // max(1, len(d["classes"])))
    for c in d["classes"]:
        pick += [r for r in req.loc[req["class"] == c, "request_id"][: per_class * 2] if r not in pick][:per_class]
    sel = req[req["request_id"].isin(pick[:max_requests])].sort_values("arrival_s")
    segs = _segments(it[it["request_id"].isin(sel["request_id"])])
    ypos = {rid: i for i, rid in enumerate(sel["request_id"])}
    fig = Figure(figsize=(13, max(4.0, 0.22 * len(sel) + 1.8)), layout="constrained")
    ax = fig.subplots()
    styles = {"prefill": {"hatch": "////", "alpha": 0.55}, "decode": {"alpha": 0.95},
              "recompute": {"hatch": "xxxx", "alpha": 0.55}}
    for r in sel.to_dict("records"):
        y = ypos[r["request_id"]]
        s = segs[segs["request_id"] == r["request_id"]].sort_values("start_s")
        end = r["finish_s"] if r["finish_s"] == r["finish_s"] else s["end_s"].max()
        ax.plot([r["arrival_s"], end], [y, y], color="#bbbbbb", lw=1, zorder=1)
        for kind, g in s.groupby("kind"):
            spans = list(zip(g["start_s"], g["end_s"] - g["start_s"]))
            if kind in ("swap_out", "swap_in"):
                ax.broken_barh(spans, (y - 0.4, 0.8), facecolors="black", zorder=3)
                continue
            st = styles.get(kind, {})
            ax.broken_barh(spans, (y - 0.35, 0.7), facecolors=colors[r["class"]],
                           edgecolor="black" if "hatch" in st else "none", linewidth=0.3,
                           hatch=st.get("hatch"), alpha=st.get("alpha", 1.0), zorder=2)
        # stalls: gaps between stretches once the request has started (it was preempted)
        if len(s) > 1:
            e0, s1 = s["end_s"].to_numpy()[:-1], s["start_s"].to_numpy()[1:]
            for g0, g1 in zip(e0[s1 - e0 > 1e-6], s1[s1 - e0 > 1e-6]):
                ax.plot([g0, g1], [y, y], color="#d62728", lw=2.2, zorder=2.5)
    ax.set_yticks(range(len(sel)))
    ax.set_yticklabels([f"#{r} {t}" for r, t in zip(sel["request_id"], sel["tenant"])], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("request (id, tenant), by arrival")
    ax.grid(alpha=0.3, axis="x")
    handles = [Patch(facecolor=colors[c], label=f"class {c}") for c in d["classes"]]
    handles += [Patch(facecolor="white", edgecolor="black", hatch="////", label="prefill"),
                Patch(facecolor="#888888", label="decode"),
                Patch(facecolor="white", edgecolor="black", hatch="xxxx", label="recompute (after preemption)"),
                Patch(facecolor="black", label="swap out / in"),
                Line2D([], [], color="#bbbbbb", lw=1, label="waiting (queued)"),
                Line2D([], [], color="#d62728", lw=2.2, label="stall after start (preempted)")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    _suptitle(fig, f"Request timeline ({len(sel)} of {len(seen)} traced requests) — {_title(d)}")
    return fig


def _save_all(figs: dict[str, Figure], out: Path) -> list[Path]:
    """Save every figure of ``figs`` (name -> figure) into ``out``; the files written."""
    from sim.outdir import write_marker

    paths: list[Path] = []
    for name, fig in figs.items():
        paths += _save(fig, out, name)
    if paths:
        write_marker(out, "figures", [p.name for p in paths])  # (once: it reads and rewrites the marker)
    return paths


def run_figures(run_dir: str | Path) -> dict[str, Figure]:
    """The run's figures by name, not saved (for notebooks)."""
    d = _load_run(Path(run_dir))
    figs = {"latency_cdf": fig_latency_cdf(d), "token_share": fig_token_share(d),
            "kv_queues": fig_kv_queues(d)}
    tl = fig_timeline(d)
    if tl is not None:
        figs["timeline"] = tl
    return figs


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Draw a run's figures into ``out_dir`` (default ``run_dir/figures``); returns the files."""
    run_dir = Path(run_dir)
    return _save_all(run_figures(run_dir), Path(out_dir) if out_dir else run_dir / "figures")


# ---- a sweep --------------------------------------------------------------------------------
def _series(df: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Label each row with its line: the policy plus any grid axis other than load and seed."""
    extra = [c for c in _axis_columns(df) if c not in ("policy", "load", "seed")]
    df = df.copy()
    df["series"] = df["policy"].astype(str)
    for c in extra:
        df["series"] = df["series"] + f" {c.split('.')[-1]}=" + df[c].astype(str)
    return df, list(dict.fromkeys(df["series"]))


def _axis_columns(df: pd.DataFrame) -> list[str]:
    cols = list(df.columns)
    end = cols.index("class") if "class" in cols else 0
    return [c for c in cols[1:end]]  # between run_id and class


def _curve(ax, df: pd.DataFrame, col: str, series: list[str], styles: dict, logy: bool = False) -> bool:
    drew = False
    for s in series:
        g = df[df["series"] == s]
        if col not in g or g[col].isna().all():
            continue
        stat = g.groupby("load")[col].agg(["mean", "min", "max"]).sort_index()
        x = stat.index.to_numpy(float)
        ax.plot(x, stat["mean"], label=s, **styles[s])
        if g["seed"].nunique() > 1:
            ax.fill_between(x, stat["min"], stat["max"], color=styles[s]["color"], alpha=0.12, lw=0)
        if f"{col}_lo" in g and g[f"{col}_lo"].notna().any():
            # sweep --uncertainty: the cost model's 80 % interval (mean of its ends over seeds),
            # hatched and unfilled so that it reads apart from the seed band's fill
            iv = g.groupby("load")[[f"{col}_lo", f"{col}_hi"]].mean().reindex(stat.index)
            ax.fill_between(x, iv[f"{col}_lo"], iv[f"{col}_hi"], facecolor="none", edgecolor=styles[s]["color"],
                            hatch="///", alpha=0.45, lw=0.6, ls=":")
        drew = True
    if drew and logy:
        vals = df[col].dropna()
        if (vals > 0).all():
            ax.set_yscale("log")
    ax.grid(alpha=0.3, which="both")
    return drew


def _load_note(df: pd.DataFrame) -> str:
    seeds = df["seed"].nunique() if "seed" in df else 1
    unc = any(c.endswith("_lo") for c in df.columns)
    return (f"x: load = arrival-rate multiplier (traces: time compression); lines: mean over {seeds} "
            f"seed{'s' if seeds != 1 else ''}" + ("; band: min–max over seeds" if seeds > 1 else "")
            + ("; hatched: the cost model's 80 % interval (--uncertainty)" if unc else ""))


def fig_latency_vs_load(df: pd.DataFrame, title: str = "") -> Figure:
    df, series = _series(df)
    styles = {s: {"color": PALETTE[i % 10], "marker": MARKERS[i % 8], "lw": 1.6, "ms": 5}
              for i, s in enumerate(series)}
    classes = [c for c in dict.fromkeys(df["class"]) if c != "overall"]
    metrics = [("ttft_p50_s", "TTFT p50 (s)", "ttft_slo_s"), ("ttft_p99_s", "TTFT p99 (s)", "ttft_slo_s"),
               ("e2e_p50_s", "end-to-end p50 (s)", None), ("e2e_p99_s", "end-to-end p99 (s)", None)]
    fig = Figure(figsize=(4.2 * len(classes) + 1.5, 11), layout="constrained")
    axes = np.atleast_2d(fig.subplots(len(metrics), len(classes), squeeze=False))
    for j, c in enumerate(classes):
        g = df[df["class"] == c]
        for i, (col, label, slo_col) in enumerate(metrics):
            ax = axes[i, j]
            if not _curve(ax, g, col, series, styles, logy=True):
                ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center")
            if slo_col and g[slo_col].notna().any():
                slo = float(g[slo_col].dropna().iloc[0])
                ax.axhline(slo, color="#d62728", ls="--", lw=1)
                ax.annotate(f"SLO {slo:g}s", (0.01, slo), xycoords=("axes fraction", "data"), color="#d62728",
                            fontsize=8, va="bottom")
            if i == 0:
                ax.set_title(f"class {c}")
            if j == 0:
                ax.set_ylabel(label + ", log")
            if i == len(metrics) - 1:
                ax.set_xlabel("load (× scenario arrival rate)")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    if handles:
        # one column at the right: any number of series fits the figure's height, where a row at
        # the bottom ran past both edges with long series names
        fig.legend(handles, labels, loc="outside right upper", title="policy", fontsize=9)
    _suptitle(fig, f"Latency vs load per class {title}\n{_load_note(df)}; dashed red: the class's SLO")
    return fig


def fig_throughput_vs_load(df: pd.DataFrame, title: str = "") -> Figure:
    df, series = _series(df)
    styles = {s: {"color": PALETTE[i % 10], "marker": MARKERS[i % 8], "lw": 1.6, "ms": 5}
              for i, s in enumerate(series)}
    ov = df[df["class"] == "overall"]
    fig = Figure(figsize=(15, 4.6), layout="constrained")
    axes = fig.subplots(1, 3)
    for ax, (col, label, t) in zip(axes, [
            ("output_tokens_per_s", "output tokens / s", "Token throughput (all classes)"),
            ("throughput_rps", "finished requests / s", "Request throughput (all classes)"),
            ("goodput_rps", "requests / s within SLO", "Goodput: finished within every SLO")]):
        if not _curve(ax, ov, col, series, styles):
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center")
        ax.set_title(t)
        ax.set_ylabel(label)
        ax.set_xlabel("load (× scenario arrival rate)")
        ax.set_ylim(bottom=0)
    axes[0].legend(fontsize=8, title="policy")
    _suptitle(fig, f"Throughput and goodput vs load {title}\n{_load_note(df)}")
    return fig


def fig_preemptions_vs_load(df: pd.DataFrame, title: str = "") -> Figure:
    df, series = _series(df)
    styles = {s: {"color": PALETTE[i % 10], "marker": MARKERS[i % 8], "lw": 1.6, "ms": 5}
              for i, s in enumerate(series)}
    classes = list(dict.fromkeys(df["class"]))
    fig = Figure(figsize=(4.2 * len(classes), 4.2), layout="constrained")
    axes = fig.subplots(1, len(classes), squeeze=False)[0]
    for ax, c in zip(axes, classes):
        _curve(ax, df[df["class"] == c], "preemptions", series, styles)
        ax.set_title("all classes" if c == "overall" else f"class {c}")
        ax.set_xlabel("load (× scenario arrival rate)")
        ax.set_ylim(bottom=0)
    axes[0].set_ylabel("preemptions per run (count)")
    axes[0].legend(fontsize=8, title="policy")
    _suptitle(fig, f"Preemptions vs load (a request preempted twice counts twice) {title}\n{_load_note(df)}")
    return fig


def sweep_figures(sweep_dir: str | Path) -> dict[str, Figure]:
    """The sweep's figures by name, not saved (for notebooks)."""
    d = Path(sweep_dir)
    df = pd.read_parquet(d / "sweep.parquet")
    if df.empty:
        return {}
    title = ""
    info = d / "sweep.json"
    if info.exists():
        meta = json.loads(info.read_text())
        title = f"— {meta.get('scenario_name') or Path(str(meta.get('source', ''))).stem}"
    return {"latency_vs_load": fig_latency_vs_load(df, title),
            "throughput_vs_load": fig_throughput_vs_load(df, title),
            "preemptions_vs_load": fig_preemptions_vs_load(df, title)}


def plot_sweep(sweep_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Draw a sweep's figures from ``sweep.parquet`` into ``out_dir`` (default ``sweep_dir/figures``)."""
    sweep_dir = Path(sweep_dir)
    return _save_all(sweep_figures(sweep_dir), Path(out_dir) if out_dir else sweep_dir / "figures")


def plot_any(path: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """A sweep folder (has sweep.parquet) or a run folder (has summary.json)."""
    p = Path(path)
    if (p / "sweep.parquet").exists():
        return plot_sweep(p, out_dir)
    if (p / "summary.json").exists():
        return plot_run(p, out_dir)
    raise FileNotFoundError(f"{p}: neither a sweep folder (sweep.parquet) nor a run folder (summary.json)")
