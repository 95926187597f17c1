"""Capacity planning: the fewest replicas each cluster design needs to meet the SLOs.

A *design* turns a replica-count vector into a ``[cluster]`` table:

* ``shared``: one pool of ``k`` replicas serving every class (priority scheduling inside each
  replica; the router spreads load, ``least_outstanding`` unless ``router`` says otherwise);
* ``partitioned``: static partitioning, one group per class (``k_c`` replicas serving only class
  ``c``, the ``class_aware`` router). The partitions do not interact, so each class's count is
  searched independently: a probe simulates one partition alone (its class's requests on ``k_c``
  replicas), which is exact when the replicas are interchangeable (open arrivals, no speculative
  decoding, a policy that draws no random numbers: nothing then depends on a replica's place in
  the cluster). Otherwise the partitions are probed in lockstep, all at once.

A point *meets the SLOs* when, for every class: every request finished (none rejected or left
unfinished), ``ttft_p99_s <= ttft`` and ``tpot_p99_s <= tpot`` where the class has those SLOs, and
the class's last request finished by ``done`` (simulated seconds) where given. Classes with no
latency SLO (batch) get ``done = horizon_s * (1 + grace)`` by default: the day's batch work must be
done by the end of the day (plus a grace). ``--slo CLASS:ttft=S,tpot=S,done=S`` overrides.

The search, per dimension: double from 1 until a point meets the SLOs (or ``max_replicas``), then
bisect between the largest failing and the smallest passing count. It assumes more replicas never
hurt (monotone). Every probe is a full simulation; a round's probes (all designs, and several
probes per design when there are more workers than designs: a k-ary search) run in parallel on
local processes. The answer of each design is simulated once more as a whole and reported: GPUs
needed, the batch throughput achieved, utilisation and the classes' p99 latencies.
"""
from __future__ import annotations

import heapq
import json
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from sim.core.errors import ScenarioError
from sim.progress import progress_bar

DESIGNS = ("shared", "partitioned")
SLO_KEYS = ("ttft", "tpot", "done")


# ---- SLOs ----------------------------------------------------------------------------------------
def parse_slo_text(text: str, classes, keys, off_words: tuple[str, ...] = ()) -> tuple[str, list]:
    """``CLASS:key=SECONDS[,key=SECONDS]`` -> ``(CLASS, [(key, seconds or None), ...])``; a value
    in ``off_words`` gives None (no such SLO). Raises ValueError with one line naming the text,
    the part and what was expected (callers re-raise it as their own error)."""
    cname, sep, rest = text.partition(":")
    cname = cname.strip()
    if not sep or cname not in classes:
        raise ValueError(f"--slo {text!r}: expected CLASS:key=SECONDS[,key=SECONDS] with CLASS one of "
                         f"{', '.join(classes)}")
    out = []
    for part in rest.split(","):
        k, sep, v = part.partition("=")
        k, v = k.strip(), v.strip()
        if not sep or k not in keys:
            raise ValueError(f"--slo {text!r}: '{part.strip()}': expected key=SECONDS with key one of "
                             f"{', '.join(keys)}")
        if v.lower() in off_words:
            out.append((k, None))
            continue
        try:
            val = float(v)
        except ValueError:
            raise ValueError(f"--slo {text!r}: {k}: expected a number of seconds (got {v!r})") from None
        if not val > 0:
            raise ValueError(f"--slo {text!r}: {k}: expected > 0 (got {v})")
        out.append((k, val))
    return cname, out


def parse_slos(sc, items: list[str] | None = None, grace: float = 0.1) -> dict[str, dict]:
    """Per class: {'ttft': s|None, 'tpot': s|None, 'done': s|None} (see module docstring)."""
    slos = {c.name: {"ttft": c.ttft_slo_s, "tpot": c.tpot_slo_s, "done": None} for c in sc.classes}
    for item in items or []:
        try:
            cname, pairs = parse_slo_text(item, list(slos), SLO_KEYS, off_words=("none", "off", "-"))
        except ValueError as exc:
            raise ScenarioError(str(exc)) from None
        slos[cname].update(pairs)
    for s in slos.values():
        if s["ttft"] is None and s["tpot"] is None and s["done"] is None:
            s["done"] = sc.horizon_s * (1 + grace)
    return slos


def check_point(summary: dict, requests: pd.DataFrame, slos: dict[str, dict]) -> dict[str, dict]:
    """Per class: ok plus the measured values the SLOs are judged on."""
    out = {}
    for cname, s in slos.items():
        m = summary["classes"][cname]
        g = requests[requests["class"] == cname]
        last = float(g["finish_s"].max()) if len(g) and g["finish_s"].notna().any() else 0.0
        ok = m["finished"] == m["arrived"]
        ratio = 0.0
        for key, col in (("ttft", "ttft_p99_s"), ("tpot", "tpot_p99_s")):
            if s[key] is not None and m[col] is not None:
                ratio = max(ratio, m[col] / s[key])
                ok = ok and m[col] <= s[key]
        if s["done"] is not None:
            ratio = max(ratio, last / s["done"])
            ok = ok and last <= s["done"]
        out[cname] = {"ok": bool(ok), "arrived": m["arrived"], "finished": m["finished"],
                      "ttft_p99_s": m["ttft_p99_s"], "tpot_p99_s": m["tpot_p99_s"], "last_finish_s": last,
                      "output_tokens_per_s": m["output_tokens_per_s"], "slo_ratio": ratio}
    return out


# ---- designs -------------------------------------------------------------------------------------
@dataclass
class Dim:
    """One searched count: the classes it serves, and what is known so far."""

    name: str
    classes: list[str]
    lo: int = 0  # largest count known to fail
    hi: int | None = None  # smallest count known to pass
    limit: int = 64
    exhausted: bool = False

    @property
    def done(self) -> bool:
        return self.exhausted or (self.hi is not None and self.hi - self.lo <= 1)

    def probes(self, m: int) -> list[int]:
        if self.done:
            return []
        if self.hi is None:  # doubling (the limit itself once doubling would pass it)
            out, k = [], 2 * self.lo if self.lo else 1
            while len(out) < m and k < self.limit:
                out.append(k)
                k *= 2
            if len(out) < m:
                out.append(self.limit)
            return sorted({x for x in out if x > self.lo})
        span = self.hi - self.lo
        m = min(m, span - 1)
        return sorted({self.lo + max(1, round(span * (j + 1) / (m + 1))) for j in range(m)} - {self.hi})

    def update(self, k: int, ok: bool) -> None:
        if ok:
            if self.hi is None or k < self.hi:
                self.hi = k
        elif k > self.lo:
            self.lo = k
            if self.hi is None and k >= self.limit:
                self.exhausted = True


def design_dims(design: str, class_names: list[str], limit: int) -> list[Dim]:
    if design == "shared":
        return [Dim("shared", list(class_names), limit=limit)]
    if design == "partitioned":
        return [Dim(c, [c], limit=limit) for c in class_names]
    raise ScenarioError(f"--designs: unknown design {design!r} (expected one of {', '.join(DESIGNS)})")


def design_cluster(design: str, dims: list[Dim], counts: list[int], router: str | None) -> dict:
    if design == "shared":
        return {"replicas": counts[0], "router": router or "least_outstanding"}
    return {"groups": [{"name": d.name, "replicas": k, "classes": list(d.classes)} for d, k in zip(dims, counts)],
            "router": "class_aware"}


# ---- stopping a probe that has lost ---------------------------------------------------------------
class ProbeLost(Exception):
    """Raised inside a probe's simulation once it can no longer meet its SLOs."""


class SloWatch:
    """Told of every request that ends in a probe; raises :class:`ProbeLost` as soon as every
    searched dimension has a class that can no longer meet its SLOs, so that a failing probe
    stops early with the same verdict it would reach at the end.

    A class is lost, for certain, when one of its requests is rejected (not every request would
    finish), finishes after its ``done`` deadline (its last finish can only be later), or when
    enough of its requests exceed the TTFT or TPOT SLO that the p99 must exceed it: with ``n``
    requests in the class, pandas' linear p99 is at least the sorted value at index
    ``floor((n - 1) * 0.99)``, so ``n - floor((n - 1) * 0.99)`` values above the SLO decide it
    (``n`` is the class's number of requests; fewer values, e.g. TPOT of one-token answers, need no
    more). Values are computed exactly as the requests table computes them.

    Args:
        slos: per class ``{'ttft', 'tpot', 'done'}`` (seconds or None).
        totals: requests per class in the stream (open arrivals only).
        dims: the classes of each searched dimension of the probe.
    """

    def __init__(self, slos: dict, totals: dict[str, int], dims: list[list[str]]) -> None:
        self.slos = slos
        self.dims = dims
        self.need = {c: n - math.floor((n - 1) * 0.99) for c, n in totals.items() if n}
        self.over: dict[tuple[str, str], list[float]] = {}  # (class, key) -> heap of the largest values
        self.lost: dict[str, float] = {}  # class -> a lower bound of its slo_ratio
        self.at_ns = -1

    def _over(self, c: str, key: str, v: float, limit: float) -> None:
        h = self.over.setdefault((c, key), [])
        m = self.need.get(c, 1)
        if len(h) < m:
            heapq.heappush(h, v)
        elif v > h[0]:
            heapq.heapreplace(h, v)
        if len(h) >= m:
            self._lose(c, h[0] / limit)  # the p99 is at least the m-th largest value

    def _lose(self, c: str, ratio: float) -> None:
        self.lost[c] = max(self.lost.get(c, 0.0), ratio)

    def __call__(self, req, now_ns: int) -> None:
        from sim.core.costs import NS
        from sim.core.request import State

        c = req.cls
        s = self.slos.get(c)
        if s is None:
            return
        if req.state is State.REJECTED:
            self._lose(c, 0.0)
        elif req.state is State.FINISHED:
            finish = req.finish_ns / NS
            if s["done"] is not None and finish > s["done"]:
                self._lose(c, finish / s["done"])
            first = req.first_token_ns / NS
            if s["ttft"] is not None:
                v = first - req.arrival_ns / NS
                if v > s["ttft"]:
                    self._over(c, "ttft", v, s["ttft"])
            if s["tpot"] is not None and req.generated > 1:
                v = (finish - first) / (req.generated - 1)
                if v > s["tpot"]:
                    self._over(c, "tpot", v, s["tpot"])
        if self.lost and all(any(x in self.lost for x in d) for d in self.dims):
            self.at_ns = now_ns
            raise ProbeLost(c)


# ---- one point -----------------------------------------------------------------------------------
_WORKLOADS: dict[str, object] = {}  # per process: the probes' shared request stream


def _workload(sc, load_scale: float):
    """The scenario's request stream, generated once per process and shared by every probe
    (probes differ only in the cluster; the stream is not modified by a run). None with
    closed-loop users, whose state a run advances."""
    from sim.run import build_workload

    key = json.dumps([sc.streams, sc.horizon_s, sc.seed, sc.base_dir, load_scale], sort_keys=True, default=str)
    wl = _WORKLOADS.get(key)
    if wl is None:
        wl = build_workload(sc, load_scale)
        if wl.closed:
            return None
        _WORKLOADS.clear()
        _WORKLOADS[key] = wl
    return wl


def _only(wl, classes: list[str]):
    """The open requests of ``classes`` alone (what one partition of a partitioned cluster
    serves), in the same order."""
    from dataclasses import replace

    df = wl.open
    return replace(wl, open=df[df["cls"].isin(classes)].reset_index(drop=True))


def evaluate(base: dict, source: str, base_dir: str, cluster: dict, load_scale: float, slos: dict,
             dims: list[list[str]] | None = None, part: list[str] | None = None) -> dict:
    """Simulate the scenario dict ``base`` with ``cluster``; the SLO verdict and headline numbers.

    With ``dims`` (the classes of each searched dimension) the simulation stops as soon as the
    verdict of every dimension is certain to be a miss (:class:`SloWatch`); the point then has
    ``stopped_at_s`` and, for the classes that lost, ``slo_ratio`` is a lower bound. With
    ``part`` (classes) only those classes' requests are served (one partition, alone)."""
    from sim.cluster import simulate_cluster
    from sim.config import scenario_from_dict

    t0 = time.perf_counter()
    d = dict(base)
    d["cluster"] = cluster
    sc = scenario_from_dict(d, source=source, base_dir=base_dir)
    wl = _workload(sc, load_scale)
    if part is not None:
        assert wl is not None, "a partition is simulated alone only with open arrivals"
        wl = _only(wl, part)
    watch = None
    if dims is not None and wl is not None:
        totals = {str(k): int(v) for k, v in wl.open["cls"].value_counts().items()}
        watch = SloWatch(slos, totals, dims)
    try:
        res = simulate_cluster(sc, load_scale=load_scale, per_replica=False, workload=wl, on_end=watch)
    except ProbeLost:
        assert watch is not None
        classes = {c: {"ok": False if c in watch.lost else None, "arrived": None, "finished": None,
                       "ttft_p99_s": None, "tpot_p99_s": None, "last_finish_s": None,
                       "output_tokens_per_s": None, "slo_ratio": watch.lost.get(c)} for c in slos}
        spec_groups = cluster.get("groups") or [{"replicas": cluster["replicas"]}]
        n = sum(g["replicas"] for g in spec_groups)
        return {"ok": False, "classes": classes, "replicas": n, "gpus": n, "end_s": None,
                "utilisation": None, "wall_s": time.perf_counter() - t0, "engine_events": None,
                "stopped_at_s": watch.at_ns / 1e9}
    s = res.summary_dict
    classes = check_point(s, res.requests, slos)
    lay = s["cluster"]
    span = s["run"]["end_s"]
    busy = sum(r["busy_s"] for r in lay["replicas"])
    return {"ok": all(c["ok"] for c in classes.values()), "classes": classes,
            "replicas": lay["replicas_total"], "gpus": lay["gpus_total"], "end_s": span,
            "utilisation": busy / (lay["replicas_total"] * span) if span > 0 else 0.0,
            "wall_s": time.perf_counter() - t0, "engine_events": s["run"]["engine_events"]}


def _draws_random(obj) -> bool:
    """Whether ``obj`` or one of its attributes (one level down) holds a random generator."""
    import random

    import numpy as np

    kinds = (np.random.Generator, np.random.RandomState, random.Random)
    for o in [obj, *vars(obj).values()] if hasattr(obj, "__dict__") else [obj]:
        if isinstance(o, kinds) or (hasattr(o, "__dict__") and any(isinstance(v, kinds) for v in vars(o).values())):
            return True
    return False


def partitions_apart(sc, load_scale: float) -> bool:
    """Whether a partition simulated alone behaves exactly as inside the whole cluster: its
    replicas are then numbered from 0, so nothing may depend on a replica's number (the seeds of
    speculative decoding and of the policy are), and closed-loop users are not split."""
    from policies import make_policy

    if sc.engine.speculative is not None or _workload(sc, load_scale) is None:
        return False
    policy = make_policy(sc.policy.name, **sc.policy.params())
    policy.bind({c.name: c.model_dump() for c in sc.classes}, 0)
    return not _draws_random(policy)


def _eval_task(args):
    try:
        return ("ok", evaluate(*args))
    except Exception as exc:  # noqa: BLE001 - reported by the driver
        import traceback
        return ("failed", f"{type(exc).__name__}: {exc}", traceback.format_exc())


# ---- the search ----------------------------------------------------------------------------------
@dataclass
class CapacityReport:
    scenario: str
    slos: dict
    designs: dict = field(default_factory=dict)  # design -> answer
    points: list = field(default_factory=list)  # every probe
    wall_s: float = 0.0

    def table(self) -> pd.DataFrame:
        rows = []
        for name, d in self.designs.items():
            row = {"design": name, "replicas": d.get("replicas"), "gpus": d.get("gpus"),
                   "split": d.get("split"), "meets_slo": d.get("ok")}
            for cname, m in (d.get("classes") or {}).items():
                row[f"{cname}_ttft_p99_s"] = m["ttft_p99_s"]
                row[f"{cname}_tokens_per_s"] = m["output_tokens_per_s"]
            row["utilisation"] = d.get("utilisation")
            rows.append(row)
        return pd.DataFrame(rows)

    def to_dict(self) -> dict:
        return {"scenario": self.scenario, "slos": self.slos, "designs": self.designs, "points": self.points,
                "wall_s": self.wall_s}


def _worst(point: dict) -> float:
    """The point's worst class ratio to its SLO (classes a stopped probe did not judge left out)."""
    return max((m["slo_ratio"] for m in point["classes"].values() if m["slo_ratio"] is not None), default=0.0)


def capacity_search(sc, designs: list[str], slos: dict, *, router: str | None = None, max_replicas: int = 64,
                    load_scale: float = 1.0, workers: int | None = None, log=None,
                    early_stop: bool = True, progress: bool | None = False,
                    apart: bool | None = None) -> CapacityReport:
    """Search each design's fewest replicas meeting ``slos`` (see module docstring).
    ``early_stop=False`` runs every failing probe to its end (same answers, slower). ``progress``
    counts the simulations done on stderr (see :func:`sim.progress.progress_bar`). ``apart``:
    probe the partitions of ``partitioned`` one at a time (default: where that is exact, see
    :func:`partitions_apart`); ``False`` probes them in lockstep (same answers, slower)."""
    base = sc.to_dict()
    base.pop("cluster", None)
    source, base_dir = sc.source, sc.base_dir
    workers = max(1, workers or os.cpu_count() or 1)
    for d in designs:
        design_dims(d, sc.class_names, max_replicas)  # validates the names
    state = {d: design_dims(d, sc.class_names, max_replicas) for d in designs}
    if apart is None:
        apart = "partitioned" in designs and partitions_apart(sc, load_scale)
    alone = {d for d in designs if d == "partitioned" and apart}  # designs probed a partition at a time
    cache: dict[tuple, dict] = {}
    rep = CapacityReport(sc.name, slos)
    t0 = time.perf_counter()
    pool = ProcessPoolExecutor(max_workers=workers) if workers > 1 else None
    bar = progress_bar(progress, total=None, desc=f"capacity {sc.name}", unit="simulations")

    def task(d: str, c: tuple) -> tuple:
        if None in c:  # one partition alone (the other counts None): its classes' requests only
            j = next(i for i, k in enumerate(c) if k is not None)
            x = state[d][j]
            return (base, source, base_dir, {"replicas": c[j], "router": "least_outstanding"}, load_scale, slos,
                    [x.classes] if early_stop else None, x.classes)
        return (base, source, base_dir, design_cluster(d, state[d], list(c), router), load_scale, slos,
                [x.classes for x in state[d]] if early_stop else None)

    def run_all(jobs: list[tuple[str, tuple]]) -> None:
        todo = [(d, c) for d, c in dict.fromkeys(jobs) if (d, c) not in cache]
        args = [task(d, c) for d, c in todo]
        outs = pool.map(_eval_task, args) if pool is not None else map(_eval_task, args)
        for (d, c), out in zip(todo, outs):
            if out[0] != "ok":
                raise RuntimeError(f"capacity point {d} {list(c)} failed: {out[1]}\n{out[2]}")
            r = out[1]
            if None in c:  # one partition alone: only its classes were served
                part = state[d][next(i for i, k in enumerate(c) if k is not None)].classes
                r["classes"] = {k: v for k, v in r["classes"].items() if k in part}
            cache[(d, c)] = r
            if bar is not None:
                bar.update(1)
            rep.points.append({"design": d, "counts": list(c), **{k: v for k, v in r.items() if k != "classes"},
                               "classes": r["classes"]})
            if log is not None:
                worst = _worst(r)
                stop = f", stopped at {r['stopped_at_s']:.0f} s" if r.get("stopped_at_s") is not None else ""
                shown = "[" + ", ".join("-" if k is None else str(k) for k in c) + "]"
                log(f"  {d:12s} {shown:14s} {'meets' if r['ok'] else 'misses'} SLOs "
                    f"(worst p99/SLO {'>= ' if stop else ''}{worst:.2f}, wall {r['wall_s']:.1f}s{stop})")

    try:
        while True:
            active = [d for d in designs if not all(x.done for x in state[d])]
            if not active:
                break
            m = max(1, workers // len(active))
            jobs = []
            plan = []
            for d in active:
                dims = state[d]
                per_dim = [x.probes(m) for x in dims]
                if d in alone:  # each partition's probes on their own
                    for j, p in enumerate(per_dim):
                        for k in p:
                            counts = tuple(k if i == j else None for i in range(len(dims)))
                            jobs.append((d, counts))
                            plan.append((d, counts, [i == j for i in range(len(dims))]))
                    continue
                n = max(len(p) for p in per_dim)
                for j in range(n):
                    counts = tuple(p[min(j, len(p) - 1)] if p else (x.hi or x.limit)
                                   for p, x in zip(per_dim, dims))
                    jobs.append((d, counts))
                    plan.append((d, counts, [bool(p) for p in per_dim]))
            run_all(jobs)
            for d, counts, probed in plan:
                r = cache[(d, counts)]
                for x, k, pr in zip(state[d], counts, probed):
                    if pr:
                        x.update(k, all(r["classes"][c]["ok"] for c in x.classes))
        # the answers, simulated as a whole
        finals = {}
        for d in designs:
            dims = state[d]
            if any(x.exhausted for x in dims):
                finals[d] = None
                continue
            finals[d] = tuple(x.hi for x in dims)
        run_all([(d, c) for d, c in finals.items() if c is not None])
    finally:
        if bar is not None:
            bar.close()
        if pool is not None:
            pool.shutdown()
    for d in designs:
        c = finals[d]
        if c is None:
            bad = [x.name for x in state[d] if x.exhausted]
            rep.designs[d] = {"ok": False, "replicas": None, "gpus": None,
                              "note": f"no count up to --max-replicas={max_replicas} meets the SLOs ({', '.join(bad)})"}
            continue
        r = cache[(d, c)]
        rep.designs[d] = {"ok": r["ok"], "replicas": r["replicas"], "gpus": r["gpus"],
                          "split": {x.name: k for x, k in zip(state[d], c)}, "classes": r["classes"],
                          "utilisation": r["utilisation"], "end_s": r["end_s"],
                          "cluster": design_cluster(d, state[d], list(c), router)}
    rep.wall_s = time.perf_counter() - t0
    return rep


# ---- output --------------------------------------------------------------------------------------
def save_report(rep: CapacityReport, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "capacity.json").write_text(json.dumps(rep.to_dict(), indent=1, default=str))
    rows = []
    for p in rep.points:
        row = {k: v for k, v in p.items() if k not in ("classes", "counts")}
        row["counts"] = ",".join("-" if k is None else str(k) for k in p["counts"])  # -: not in this probe
        for cname, m in p["classes"].items():
            for k in ("ok", "ttft_p99_s", "tpot_p99_s", "last_finish_s", "output_tokens_per_s", "slo_ratio"):
                row[f"{cname}.{k}"] = m[k]
        rows.append(row)
    pd.DataFrame(rows).to_csv(out / "points.csv", index=False)
    return out


def plot_capacity(rep: CapacityReport, path: str | Path) -> Path:
    """Left: GPUs each design needs (partitioned stacked by partition), annotated with the batch
    throughput achieved. Right: every probe, worst p99/SLO ratio against replicas."""
    from matplotlib.figure import Figure

    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax, ax2 = fig.subplots(1, 2, width_ratios=[1, 1.4])
    names = list(rep.designs)
    classes = list(rep.slos)
    cc = {c: colors[i % len(colors)] for i, c in enumerate(classes)}
    for i, d in enumerate(names):
        a = rep.designs[d]
        if not a.get("replicas"):
            ax.text(i, 0.5, "not found", ha="center")
            continue
        split = a["split"]
        if d == "partitioned":
            bottom = 0
            for part, k in split.items():
                ax.bar(i, k, bottom=bottom, color=cc.get(part, "grey"), edgecolor="white",
                       label=f"{part} partition" if i == names.index(d) else None)
                ax.text(i, bottom + k / 2, f"{part}\n{k}", ha="center", va="center", fontsize=8, color="white")
                bottom += k
        else:
            ax.bar(i, a["replicas"], color="#555555", edgecolor="white")
        tp = [f"{c}: {m['output_tokens_per_s']:.0f} tok/s" for c, m in a["classes"].items()
              if rep.slos[c]["ttft"] is None and rep.slos[c]["tpot"] is None]
        per_gpu = sum(m["output_tokens_per_s"] for m in a["classes"].values()) / a["gpus"]
        ax.text(i, a["gpus"] * 1.02, f"{a['gpus']} GPUs\n" + "\n".join(tp) + f"\n{per_gpu:.0f} tok/s per GPU",
                ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("GPUs (replicas) to meet the SLOs")
    top = max([a.get("gpus") or 1 for a in rep.designs.values()])
    ax.set_ylim(0, top * 1.45)
    ax.set_title(f"{rep.scenario}: capacity per design")
    for j, d in enumerate(names):
        pts = [p for p in rep.points if p["design"] == d]
        x = [p["replicas"] for p in pts]
        y = [_worst(p) for p in pts]
        ok = [p["ok"] for p in pts]
        col = colors[j % len(colors)]
        ax2.scatter([a for a, o in zip(x, ok) if o], [b for b, o in zip(y, ok) if o], color=col, marker="o",
                    label=f"{d}: meets")
        ax2.scatter([a for a, o in zip(x, ok) if not o], [b for b, o in zip(y, ok) if not o], facecolors="none",
                    edgecolors=col, marker="o", label=f"{d}: misses")
    ax2.axhline(1.0, color="k", lw=0.8, ls="--")
    ax2.set_yscale("log")
    ax2.set_xlabel("replicas in the probe (total)")
    ax2.set_ylabel("worst class: p99 / SLO (or last finish / deadline)")
    ax2.set_title("binary-search probes (each a full simulation)")
    ax2.legend(fontsize=8)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=120)
    return p
