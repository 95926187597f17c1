"""Sensitivity: which knobs move a scenario's answer, and by how much.

A *knob* is a dotted scenario key (anything ``--set`` accepts) or ``load`` (the arrival-rate
multiplier), with a *range*: ``[OFF/]LOW..HIGH[:log]`` (``OFF``: one more value outside the
range, e.g. ``0`` = no cap) or choices ``a,b,c``. :data:`DEFAULT_RANGES` covers the common knobs;
any other needs one given. The *metric* is read from each run's summary: by default the worst
latency SLO ratio over the classes that have one (p99 TTFT or TPOT over its SLO; a class whose
requests gave no sample of it, e.g. none finished so no TPOT, misses it: 1e6, as ``priosim tune``
counts it; the most urgent class's TTFT p99 in seconds when no class has an SLO), else
``METRIC[:CLASS]``.

* ``oat`` (one at a time): the scenario as it is, then each knob alone at ``levels`` values
  over its range (the ends and evenly spaced between, on a log scale where the range says so,
  plus its OFF value), the others at the scenario's values. A knob's *swing* is the largest
  minus the smallest metric among its values (the scenario's own run included): the width of
  its bar in the tornado chart. Cheap (``1 + levels x knobs`` runs) and easy to read, blind to
  interactions.
* ``sobol`` (variance-based): ``samples x (knobs + 2)`` runs at Saltelli/Sobol' quasi-random
  points of the whole box (SALib), every knob moving at once; ``S1`` is the share of the
  metric's variance a knob explains alone, ``ST`` with its interactions. OFF values and choices
  are not sampled (ranges only).

Every run is a full simulation with the scenario's seed; runs go to local processes. The
results (``sensitivity.csv``, ``sensitivity.json``, ``tornado.png``) hold no wall times: the
same scenario and seed give the same bytes.
"""
from __future__ import annotations

import copy
import math
import os
import re
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from plumbing.numbers import in_range, is_number
from sim.config import apply_override, parse_value, scenario_from_dict
from sim.core.errors import ScenarioError
from sim.experiments.slos import MISSED, slo_ratio

METHODS = ("oat", "sobol")
#: ranges of the common knobs (``classes.*`` stands for any class)
DEFAULT_RANGES = {
    "engine.max_batched_tokens": "512..16384:log",
    "engine.max_num_seqs": "16..1024:log",
    "engine.max_prefill_chunk": "0/256..8192:log",
    "classes.*.max_prefill_tokens_per_step": "0/256..4096:log",
    "load": "0.5..1.5",
}


class SensitivityError(ScenarioError):
    """Bad sensitivity input (one line naming the option, the value and what was expected)."""


# ---- knobs ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Knob:
    """A knob and its range: ``low..high`` (``log`` scale, ``integer`` values), an ``off`` value
    tried besides (OAT only), or ``choices`` (OAT only)."""

    key: str
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    integer: bool = False
    off: float | None = None
    choices: tuple = ()

    def text(self) -> str:
        if self.choices:
            return ",".join(str(c) for c in self.choices)
        off = f"{self.off:g}/" if self.off is not None else ""
        return f"{off}{self.low:g}..{self.high:g}{':log' if self.log else ''}"

    def at(self, u: float):
        """The value at ``u`` in [0, 1] of the range."""
        v = self.low * (self.high / self.low) ** u if self.log else self.low + u * (self.high - self.low)
        return int(round(v)) if self.integer else float(v)

    def levels(self, n: int) -> list:
        """OAT values: the OFF value, then ``n`` values from low to high (choices: each)."""
        if self.choices:
            return list(self.choices)
        vals = ([self.off] if self.off is not None else []) + [self.at(i / (n - 1)) for i in range(n)]
        vals = [int(v) if self.integer else v for v in vals]
        return list(dict.fromkeys(vals))


def parse_range(key: str, text: str) -> Knob:
    """``[OFF/]LOW..HIGH[:log]`` or ``a,b,c`` for ``key`` (ints when every end is one)."""
    spec = text.strip()
    where = f"--ranges {key}={text}"
    if ".." not in spec:
        choices = tuple(parse_value(c.strip()) for c in spec.split(",") if c.strip())
        if len(choices) < 2:
            raise SensitivityError(f"{where}: expected [OFF/]LOW..HIGH[:log] or at least two choices a,b")
        return Knob(key, choices=choices)
    body, log = (spec[:-4], True) if spec.endswith(":log") else (spec, False)
    off_t, _, rng = body.rpartition("/")
    lo_t, _, hi_t = rng.partition("..")
    try:
        lo, hi = parse_value(lo_t.strip()), parse_value(hi_t.strip())
        off = parse_value(off_t.strip()) if off_t.strip() else None
    except ScenarioError:
        lo = hi = off = None
    if not (is_number(lo) and is_number(hi)) or (off_t.strip() and not is_number(off)):
        raise SensitivityError(f"{where}: expected numbers in [OFF/]LOW..HIGH[:log] (got {text!r})")
    if not lo < hi:
        raise SensitivityError(f"{where}: empty range (expected LOW < HIGH)")
    if log and lo <= 0:
        raise SensitivityError(f"{where}: a log range needs LOW > 0")
    integer = all(isinstance(v, int) for v in (lo, hi) + ((off,) if off is not None else ()))
    return Knob(key, float(lo), float(hi), log, integer, off)


def default_range(key: str) -> str | None:
    return DEFAULT_RANGES.get(re.sub(r"^classes\.[^.]+\.", "classes.*.", key))


def split_ranges(text: str | None) -> dict[str, str]:
    """``k1=lo..hi,k2=a,b`` -> ``{k1: 'lo..hi', k2: 'a,b'}`` (a comma starts a new knob only
    where ``KEY=`` follows it)."""
    if not text:
        return {}
    out = {}
    for part in re.split(r",(?=\s*[A-Za-z_][\w.*-]*\s*=)", text):
        key, sep, spec = part.partition("=")
        if not sep or not key.strip() or not spec.strip():
            raise SensitivityError(f"--ranges {part.strip()!r}: expected KEY=[OFF/]LOW..HIGH[:log] or KEY=a,b,c")
        out[key.strip()] = spec.strip()
    return out


def make_knobs(keys: list[str], ranges: dict[str, str]) -> list[Knob]:
    """The knobs of ``keys``, each with its ``--ranges`` range or its default one."""
    if not keys:
        raise SensitivityError("--knobs: empty list (expected KEY[,KEY...])")
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup:
        raise SensitivityError(f"--knobs {dup[0]}: given twice")
    extra = sorted(set(ranges) - set(keys))
    if extra:
        raise SensitivityError(f"--ranges {extra[0]}: not one of --knobs ({', '.join(keys)})")
    knobs = []
    for k in keys:
        text = ranges.get(k) or default_range(k)
        if text is None:
            raise SensitivityError(f"--knobs {k}: no default range (expected --ranges {k}=LOW..HIGH; defaults "
                                   f"exist for {', '.join(DEFAULT_RANGES)})")
        knobs.append(parse_range(k, text))
    return knobs


# ---- the metric ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Metric:
    """``slo_ratio`` (the worst latency SLO ratio; of one class with ``cls``) or a summary
    metric of a class, of all requests (``overall``) or of the run."""

    name: str = "slo_ratio"
    cls: str | None = None

    @property
    def label(self) -> str:
        base = "worst p99/SLO" if self.name == "slo_ratio" else self.name
        return f"{base}:{self.cls}" if self.cls else base

    def read(self, summary: dict, slos: dict[str, tuple]) -> float | None:
        if self.name == "slo_ratio":
            worst = None
            for c, (ttft, tpot) in slos.items():
                if self.cls is not None and c != self.cls:
                    continue
                m = summary["classes"][c]
                for lim, col in ((ttft, "ttft_p99_s"), (tpot, "tpot_p99_s")):
                    if lim is not None:  # (no measure: the SLO is missed, as tune judges it)
                        worst = max(worst or 0.0, slo_ratio(m.get(col), lim))
            return worst
        if self.cls is not None:
            v = summary["classes"][self.cls].get(self.name)
        else:
            v = summary["overall"].get(self.name, summary["run"].get(self.name))
        return None if v is None or not is_number(v) else float(v)


def parse_metric(text: str | None, sc) -> Metric:
    """``METRIC[:CLASS]``; None: the worst SLO ratio, or the most urgent class's TTFT p99 when
    no class has a latency SLO."""
    from sim.experiments.tune import RUN_METRICS, known_metrics

    names = sc.class_names
    if text is None:
        if any(c.ttft_slo_s is not None or c.tpot_slo_s is not None for c in sc.classes):
            return Metric()
        return Metric("ttft_p99_s", min(sc.classes, key=lambda c: c.priority).name)
    metric, _, cls = text.strip().partition(":")
    cls = cls.strip() or None
    ok = known_metrics() | {"slo_ratio"}
    if metric not in ok and not (cls is None and metric in RUN_METRICS):
        raise SensitivityError(f"--metric {text!r}: unknown metric {metric!r} (expected slo_ratio or one of "
                               f"{', '.join(sorted(ok | set(RUN_METRICS)))})")
    if cls is not None and cls not in names:
        raise SensitivityError(f"--metric {text!r}: no class {cls!r} (expected one of {', '.join(names)})")
    if metric == "slo_ratio" and not any(c.ttft_slo_s is not None or c.tpot_slo_s is not None
                                         for c in sc.classes if cls is None or c.name == cls):
        raise SensitivityError(f"--metric {text!r}: no {'class' if cls is None else 'SLO of ' + cls} with a "
                               f"ttft_slo_s or tpot_slo_s (expected another metric, e.g. ttft_p99_s:{names[0]})")
    return Metric(metric, cls)


# ---- the study -----------------------------------------------------------------------------------
@dataclass
class Study:
    """What to run: the base scenario (a resolved dict), its knobs, the metric, the method."""

    base: dict
    base_dir: str
    source: str
    knobs: list[Knob]
    metric: Metric
    method: str = "oat"
    levels: int = 3
    samples: int = 8
    slos: dict = field(default_factory=dict)  # class -> (ttft, tpot)

    def point(self, values: dict) -> tuple:
        """The arguments of :func:`_run_point` with the knobs at ``values`` (key -> value)."""
        data = copy.deepcopy(self.base)
        load = 1.0
        for k, v in values.items():
            if k == "load":
                load = float(v)
            else:
                apply_override(data, k, copy.deepcopy(v), "sensitivity")
        return (data, self.base_dir, self.source, load, self.metric, self.slos)

    def base_value(self, key: str):
        """The scenario's own value of ``key`` (None when it does not set it)."""
        if key == "load":
            return 1.0
        node = self.base
        for part in key.split("."):
            if isinstance(node, list):
                node = next((x for x in node if isinstance(x, dict) and x.get("name") == part), None) \
                    if not part.isdigit() else (node[int(part)] if int(part) < len(node) else None)
            elif isinstance(node, dict):
                node = node.get(part)
            else:
                return None
            if node is None:
                return None
        return node

    def plan(self) -> list[dict]:
        """Every run's knob values: OAT the base then each knob's levels; Sobol the samples."""
        if self.method == "oat":
            return [{}] + [{k.key: v} for k in self.knobs for v in k.levels(self.levels)]
        x = self.sobol_sample()
        return [{k.key: k.at(float(u)) for k, u in zip(self.knobs, row)} for row in x]

    def problem(self) -> dict:
        return {"num_vars": len(self.knobs), "names": [k.key for k in self.knobs],
                "bounds": [[0.0, 1.0]] * len(self.knobs)}

    def sobol_sample(self):
        from SALib.sample import sobol

        return sobol.sample(self.problem(), self.samples, calc_second_order=False, seed=0)


def make_study(sc, keys: list[str], ranges_text: str | None, metric_text: str | None, method: str,
               levels: int, samples: int) -> Study:
    """The study, every knob value validated against the scenario before any run (raises
    :class:`SensitivityError` or :class:`ScenarioError` with one line)."""
    if method not in METHODS:
        raise SensitivityError(f"--method {method!r}: expected one of {', '.join(METHODS)}")
    if levels < 2:
        raise SensitivityError(f"--levels: expected >= 2 (got {levels})")
    if samples < 1:
        raise SensitivityError(f"--samples: expected >= 1 (got {samples})")
    if method == "sobol" and samples & (samples - 1):  # (SALib's Sobol' points are balanced only then)
        raise SensitivityError(f"--samples: expected a power of 2 (got {samples})")
    knobs = make_knobs(keys, split_ranges(ranges_text))
    if method == "sobol":
        bad = [k.key for k in knobs if k.choices]
        if bad:
            raise SensitivityError(f"--ranges {bad[0]}: --method sobol samples ranges LOW..HIGH (got choices)")
    slos = {c.name: (c.ttft_slo_s, c.tpot_slo_s) for c in sc.classes}
    st = Study(sc.to_dict(), sc.base_dir, sc.source, knobs, parse_metric(metric_text, sc), method, levels,
               samples, slos)
    for k in knobs:
        if k.key == "load":  # (not a scenario key: the multiplier is checked here)
            for v in k.levels(2):
                if not in_range(v, gt=0):
                    raise SensitivityError(f"--ranges load: expected arrival-rate multipliers > 0 (got {v!r})")
            continue
        for v in (k.levels(2) if not k.choices else list(k.choices)):
            data = st.point({k.key: v})[0]
            try:
                scenario_from_dict(data, source=sc.source, base_dir=sc.base_dir)
            except ScenarioError as exc:
                raise SensitivityError(f"--knobs {k.key}={v!r}: {exc}") from None
    return st


def _run_point(args: tuple) -> tuple:
    """One simulation: ``("ok", metric value)`` or ``("failed", error)``."""
    import warnings

    data, base_dir, source, load, metric, slos = args
    try:
        from sim.run import simulate

        with warnings.catch_warnings():  # (the parent checked the values and warned once)
            warnings.simplefilter("ignore")
            sc = scenario_from_dict(data, source=source, base_dir=base_dir)
            res = simulate(sc, load_scale=load)
        return ("ok", metric.read(res.summary_dict, slos))
    except Exception as exc:  # noqa: BLE001 - reported by the driver
        return ("failed", f"{type(exc).__name__}: {exc}")


def run_study(st: Study, workers: int | None = None, progress=None) -> dict:
    """Run every point of ``st`` (in parallel on ``workers`` local processes) and analyse:
    the report (see :func:`oat_report` / :func:`sobol_report`)."""
    plan = st.plan()
    args = [st.point(v) for v in plan]
    n = max(1, min(workers or os.cpu_count() or 1, len(args)))
    if n == 1:
        outs = [_run_point(a) for a in args]
    else:
        with ProcessPoolExecutor(max_workers=n) as pool:
            outs = list(pool.map(_run_point, args))
    values = []
    for v, out in zip(plan, outs):
        if out[0] != "ok":
            where = ", ".join(f"{k}={x!r}" for k, x in v.items()) or "the scenario as it is"
            raise RuntimeError(f"sensitivity run at {where} failed: {out[1]}")
        values.append(out[1])
    return oat_report(st, plan, values) if st.method == "oat" else sobol_report(st, plan, values)


def _mark(key: str) -> str | None:
    from sim.engines import priosim_only

    return priosim_only(key)


def oat_report(st: Study, plan: list[dict], values: list) -> dict:
    """The OAT report: the base metric, then per knob every level's metric, its low and high
    ends, swing (largest minus smallest metric, the base run included), ranked by swing."""
    base = values[0]
    rows = []
    for k in st.knobs:
        pts = [(p[k.key], m) for p, m in zip(plan, values) if k.key in p]
        own = st.base_value(k.key)
        seen = [m for _, m in pts if m is not None] + ([base] if base is not None else [])
        swing = max(seen) - min(seen) if seen else None
        rows.append({"knob": k.key, "range": k.text(), "scenario_value": own,
                     "low_value": pts[0][0], "low_metric": pts[0][1],
                     "high_value": pts[-1][0], "high_metric": pts[-1][1],
                     "min_metric": min(seen) if seen else None, "max_metric": max(seen) if seen else None,
                     "swing": swing, "priosim_only": _mark(k.key),
                     "points": [{"value": v, "metric": m} for v, m in pts]})
    rows.sort(key=lambda r: (-(r["swing"] if r["swing"] is not None and not math.isnan(r["swing"]) else -1),
                             r["knob"]))
    for i, r in enumerate(rows):
        r["rank"] = i + 1
    return {"method": "oat", "metric": st.metric.label, "base_metric": base, "levels": st.levels,
            "simulations": len(plan), "knobs": rows}


def sobol_report(st: Study, plan: list[dict], values: list) -> dict:
    """The Sobol' report: per knob S1 and ST with their 95 % confidence half-widths (SALib's
    bootstrap, seeded), ranked by ST."""
    import numpy as np
    from SALib.analyze import sobol

    y = np.array([np.nan if v is None else v for v in values], dtype=float)
    if np.isnan(y).any():
        raise RuntimeError(f"sensitivity: {int(np.isnan(y).sum())} of {len(y)} runs have no {st.metric.label} "
                           f"(no request of the class finished); expected another --metric or narrower --ranges")
    si = sobol.analyze(st.problem(), y, calc_second_order=False, num_resamples=100, conf_level=0.95,
                       print_to_console=False, seed=0)
    rows = []
    for i, k in enumerate(st.knobs):
        col = [p[k.key] for p in plan]
        rows.append({"knob": k.key, "range": f"{k.low:g}..{k.high:g}{':log' if k.log else ''}",
                     "scenario_value": st.base_value(k.key), "S1": float(si["S1"][i]), "S1_conf": float(si["S1_conf"][i]),
                     "ST": float(si["ST"][i]), "ST_conf": float(si["ST_conf"][i]),
                     "low_value": min(col), "high_value": max(col), "priosim_only": _mark(k.key)})
    rows.sort(key=lambda r: (-r["ST"], r["knob"]))
    for i, r in enumerate(rows):
        r["rank"] = i + 1
    return {"method": "sobol", "metric": st.metric.label, "samples": st.samples, "simulations": len(plan),
            "metric_min": float(y.min()), "metric_max": float(y.max()), "metric_mean": float(y.mean()),
            "knobs": rows}


# ---- output --------------------------------------------------------------------------------------
def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def is_slo_ratio(rep: dict) -> bool:
    """Whether the report's metric is the SLO ratio (where :data:`MISSED` means missed)."""
    return str(rep.get("metric", "")).startswith("worst p99/SLO")


def fmt_metric(v, rep: dict) -> str:
    """A metric value as the table shows it: ``missed`` for an SLO ratio with no measure."""
    return "missed" if is_slo_ratio(rep) and v is not None and v >= MISSED else fmt(v)


def table_text(rep: dict) -> str:
    """The ranked table ``priosim sensitivity`` prints."""
    import pandas as pd

    rows = []
    for r in rep["knobs"]:
        row = {"rank": r["rank"], "knob": r["knob"]}
        if rep["method"] == "oat":
            row["low -> metric"] = f"{fmt(r['low_value'])} -> {fmt_metric(r['low_metric'], rep)}"
            row["high -> metric"] = f"{fmt(r['high_value'])} -> {fmt_metric(r['high_metric'], rep)}"
            row["swing"] = fmt(r["swing"])
        else:
            row["range"] = r["range"]
            row["S1"] = f"{r['S1']:.2f} +- {r['S1_conf']:.2f}"
            row["ST"] = f"{r['ST']:.2f} +- {r['ST_conf']:.2f}"
        row["priosim-only"] = "priosim-only" if r["priosim_only"] else ""
        rows.append(row)
    return pd.DataFrame(rows).to_string(index=False)


def save(rep: dict, scenario: str, out: Path, plots: bool = True) -> list[str]:
    """Write ``sensitivity.json``, ``sensitivity.csv`` and (``plots``) ``tornado.png`` into the
    folder ``out`` (filled by the caller's staging); the names written."""
    import pandas as pd

    from sim import jsonout
    from sim.outdir import write_file

    doc = {"scenario": scenario, **rep}
    write_file(out / "sensitivity.json", jsonout.dumps(doc, indent=1, default=str) + "\n")
    flat = []
    for r in rep["knobs"]:
        row = {k: v for k, v in r.items() if k != "points"}
        if "points" in r:
            row["points"] = ";".join(f"{p['value']}={fmt(p['metric'])}" for p in r["points"])
        flat.append(row)
    write_file(out / "sensitivity.csv", pd.DataFrame(flat).to_csv(index=False))
    names = ["sensitivity.json", "sensitivity.csv"]
    if plots:
        tornado(doc, out / "tornado.png")
        names.append("tornado.png")
    return names


def tornado(doc: dict, path: Path) -> Path:
    """OAT: one bar per knob from its smallest to its largest metric, the largest swing on top,
    around the scenario's own metric (the line), each end labelled with the knob value that
    gave it; priosim-only knobs hatched. Sobol: ST and S1 per knob with their confidence."""
    from matplotlib.figure import Figure

    from sim.outdir import write_file

    rows = doc["knobs"][::-1]  # (the largest on top)
    fig = Figure(figsize=(8.5, 1.2 + 0.55 * len(rows)), layout="constrained")
    ax = fig.subplots()
    labels = [r["knob"] + ("\n(priosim-only)" if r["priosim_only"] else "") for r in rows]
    if doc["method"] == "oat":
        drawn = _drawn_at(doc)
        base = drawn(doc["base_metric"])
        for i, r in enumerate(rows):
            if r["min_metric"] is None:
                continue
            lo, hi = drawn(r["min_metric"]), drawn(r["max_metric"])
            ax.barh(i, hi - lo, left=lo, color="#d62728" if r["priosim_only"] else "#1f77b4",
                    hatch="//" if r["priosim_only"] else None, edgecolor="white", height=0.6)
            at = {m: v for v, m in ((p["value"], p["metric"]) for p in r["points"]) if m is not None}
            for m, x, ha in ((r["min_metric"], lo, "right"), (r["max_metric"], hi, "left")):
                v = at.get(m, r["scenario_value"])
                missed = " (missed)" if fmt_metric(m, doc) == "missed" else ""
                ax.text(x, i, f" {fmt(v)}{missed} ", ha=ha, va="center", fontsize=8)
        ends = [drawn(m) for r in rows for m in (r["min_metric"], r["max_metric"]) if m is not None]
        if ends:  # (room for the end labels on both sides)
            pad = 0.18 * ((max(ends) - min(ends)) or abs(max(ends)) or 1.0)
            ax.set_xlim(min(ends) - pad, max(ends) + pad)
        ax.set_ylim(-0.6, len(rows) - 0.4 + 0.5)
        if base is not None:
            ax.axvline(base, color="k", lw=0.8, ls="--",
                       label=f"scenario as it is: {fmt_metric(doc['base_metric'], doc)}")
            ax.legend(fontsize=8, loc="upper right", ncols=1, frameon=False)
        ax.set_xlabel(doc["metric"])
        ax.set_title(f"{doc['scenario']}: one knob at a time over its range ({doc['simulations']} runs)")
    else:
        y = list(range(len(rows)))
        ax.barh([i + 0.18 for i in y], [r["ST"] for r in rows], 0.36, xerr=[r["ST_conf"] for r in rows],
                color="#1f77b4", label="ST (with interactions)")
        ax.barh([i - 0.18 for i in y], [r["S1"] for r in rows], 0.36, xerr=[r["S1_conf"] for r in rows],
                color="#ff7f0e", label="S1 (alone)")
        ax.set_xlabel(f"share of the variance of {doc['metric']}")
        ax.legend(fontsize=8, loc="lower right")
        ax.set_title(f"{doc['scenario']}: Sobol' indices ({doc['simulations']} runs)")
    ax.set_yticks(range(len(rows)), labels)
    write_file(path, lambda t: fig.savefig(t, format="png", dpi=110, metadata={"Software": None},
                                             bbox_inches="tight"))  # (long knob labels: nothing cut off)
    return path


def _drawn_at(doc: dict):
    """Where a metric is drawn: itself, or for a missed SLO (:data:`MISSED`) a little past the
    largest measured ratio (at 1e6 it would squash every other bar to a point)."""
    metrics = [p["metric"] for r in doc["knobs"] for p in r.get("points", [])] + [doc.get("base_metric")]
    if not is_slo_ratio(doc):
        return lambda m: m
    seen = [m for m in metrics if m is not None and m < MISSED]
    edge = 1.3 * max([1.0, *seen])
    return lambda m: m if m is None or m < MISSED else edge
