"""DistServe's disaggregated-against-co-located comparison, published against simulated:
docs/disaggregation-paper.md. Runnable once prefill/decode pools land: the
disaggregated scenarios use their ``[cluster]`` keys (``role``, ``link``, ``decode_router``).

Zhong et al., OSDI 2024 (arXiv:2401.09670). The metric is theirs, *per-GPU goodput*: the highest
Poisson arrival rate at which a design meets its SLOs, divided by its GPUs. Two comparisons
(the scenarios in ``workloads/papers/``; tolerance ``TOLERANCE``, stated before the first run):

* ``fig1`` (primary): Figure 1, a 13B model (OPT-13B) on A100-80GBs, 512-token prompts and
  64-token answers, P90 TTFT <= 0.4 s and P90 TPOT <= 0.04 s. The paper's disaggregated figure
  is composed from one-phase curves, ``min(2 x prefill only, decode only) / 3`` GPUs, against
  the co-located vLLM's 1.6 req/s: 2.1x. Simulated the same way, and the 2P1D cluster as a whole.
* ``t2`` (secondary): §6's chatbot on ShareGPT with OPT-13B, a request attaining when it meets
  TTFT 0.25 s and TPOT 0.1 s, goodput at 90 % attainment; Table 2's real-system curves give
  1.11 req/s per GPU for vLLM (TP 1) and 2.39 for DistServe (prefill TP 2 + decode TP 1): 2.15x.

The search (:func:`goodput`) has the shape of ``priosim capacity``'s (double until a probe
fails, then bisect), over the arrival rate instead of a replica count: capacity's own judge is
P99 with every request finished (:mod:`sim.experiments.slos`), not the paper's P90 / attainment,
and it holds the rate fixed. Every probe offers the same number of requests (``horizon_s =
requests / rate``, drained), as the paper's client sent a fixed count per rate; seeds are pooled
before judging. Assumes more load never helps (monotone).

Run: ``python -m scripts.pd_paper [--only fig1|t2] [--small]``; ``--small`` is a quick check
(fewer requests and seeds, a coarser bracket), not the comparison.
``python -m scripts.pd_paper --write-lengths`` writes the ShareGPT length table the ``t2``
scenarios' first runs read (``workloads/papers/data/sharegpt_under_2048.csv.gz``, a new file
only); they now read DistServe's own sample (``sharegpt_distserve_cl100k.csv.gz``, written by
``scripts/make_distserve_sharegpt.py`` in a scratch environment: it needs the data set).
"""
from __future__ import annotations

import argparse
import copy
import gzip
import io
import math
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from scripts.paper_ratios import Comparison

ROOT = Path(__file__).resolve().parents[1]
PAPERS = ROOT / "workloads" / "papers"
COMMAND = "python -m scripts.pd_paper"
#: simulated / published within 1 +- this counts as reproduced (docs/disaggregation-paper.md,
#: stated before any disaggregated run)
TOLERANCE = 0.25

#: Table 2's real-system attainment at per-GPU rates (req/s per GPU -> share), §6.4
TABLE2 = {"vllm": {1.0: 0.970, 1.5: 0.655, 2.0: 0.528, 2.5: 0.449, 3.0: 0.367, 3.5: 0.278, 4.0: 0.236},
          "distserve": {1.0: 1.0, 1.5: 1.0, 2.0: 0.993, 2.5: 0.873, 3.0: 0.830, 3.5: 0.773, 4.0: 0.700}}


def crossing(curve: dict[float, float], target: float = 0.9) -> float:
    """The rate at which an attainment curve (rate -> share, falling) first drops below
    ``target``, interpolated linearly between its points (as DistServe's plot script does)."""
    pts = sorted(curve.items())
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if (y0 < target) != (y1 < target):
            return x0 + (target - y0) * (x1 - x0) / (y1 - y0)
    raise ValueError(f"the curve never crosses {target}")


PUBLISHED = {
    "fig1": Comparison("Zhong et al. 2024 (DistServe)", "per-GPU goodput, 2P1D / co-located vLLM",
                       "§1, Figure 1: 3.3 (10 req/s on 3 GPUs, composed) against 1.6 req/s", 3.3 / 1.6,
                       "13B (OPT-13B) on A100-80GB, 512/64 tokens, Poisson, P90 TTFT 0.4 s, P90 TPOT 0.04 s"),
    "t2": Comparison("Zhong et al. 2024 (DistServe)", "per-GPU goodput at 90 % attainment, DistServe / vLLM",
                     "§6.4, Table 2 (real system), interpolated at 90 %: 2.39 against 1.11 req/s per GPU",
                     crossing(TABLE2["distserve"]) / crossing(TABLE2["vllm"]), "OPT-13B, ShareGPT < 2048 tokens, Poisson, TTFT 0.25 s and TPOT 0.1 s; "
                                  "P TP 2 + D TP 1 against vLLM TP 1"),
}
#: the published one-phase and co-located goodputs of Figure 1, req/s per GPU (no tolerance)
FIG1_PARTS = {"colocated": 1.6, "prefill_only": 5.6, "decode_only": 10.0}


# ---- judging a probe ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Criterion:
    """How a probe's requests are judged (seconds; None: no such SLO).

    ``how = "p90"``: the 90th percentile of TTFT and of TPOT each within its SLO (Figure 1);
    ``how = "attainment"``: at least ``target`` of the requests meet every SLO given (§6; a
    one-token answer has no TPOT and meets any TPOT SLO, as in priosim's own attainment). A
    request not finished fails both."""

    ttft_s: float | None
    tpot_s: float | None
    how: str = "p90"
    target: float = 0.9

    def met(self, req: pd.DataFrame) -> bool:
        done = (req["status"] == "finished").to_numpy()
        ttft = req["ttft_s"].to_numpy(dtype=float)
        tpot = req["tpot_s"].to_numpy(dtype=float)
        if self.how == "p90":
            if done.mean() < 1.0:
                return False
            ok = True
            for v, slo in ((ttft, self.ttft_s), (tpot, self.tpot_s)):
                v = v[~np.isnan(v)]
                if slo is not None and len(v):
                    ok = ok and float(np.quantile(v, self.target)) <= slo
            return ok
        good = done.copy()
        if self.ttft_s is not None:
            good &= ttft <= self.ttft_s
        if self.tpot_s is not None:
            good &= np.isnan(tpot) | (tpot <= self.tpot_s)
        return float(good.mean()) >= self.target


def criterion_of(doc: dict, how: str) -> Criterion:
    """The scenario's (single) class SLOs, judged ``how``."""
    (cls,) = doc["classes"]
    return Criterion(cls.get("ttft_slo_s"), cls.get("tpot_slo_s"), how)


# ---- one probe -----------------------------------------------------------------------------------
def read(name: str, cost_scale: float = 1.0) -> dict:
    """A scenario of ``workloads/papers/`` as a dict, every step priced ``cost_scale`` times
    (``engine.cost_scale``; 1.0 as written)."""
    doc = tomllib.loads((PAPERS / f"{name}.toml").read_text())
    if cost_scale != 1.0:
        doc["engine"]["cost_scale"] = float(cost_scale)
    return doc


def gpus(doc: dict, role: str | None = None) -> int:
    """GPUs of a design: replicas x tensor parallelism, over its groups (one replica without
    ``[cluster]``); with ``role``, over the groups of that role only (a group's default role is
    ``both``)."""
    tp = int(doc.get("engine", {}).get("tp", 1))
    cluster = doc.get("cluster")
    if not cluster:
        return tp
    groups = cluster.get("groups") or [{"replicas": cluster.get("replicas", 1)}]
    return sum(int(g.get("replicas", 1)) * int(g.get("gpus", g.get("engine", {}).get("tp", tp))) for g in groups
               if role is None or g.get("role", "both") == role)


def at_rate(doc: dict, rate: float, requests: int, seed: int) -> dict:
    """``doc`` offering ``requests`` Poisson arrivals at ``rate`` req/s in all (its single
    stream), drained, under ``seed``."""
    out = copy.deepcopy(doc)
    (stream,) = out["streams"]
    stream["arrival"] = {"process": "poisson", "rate": float(rate)}
    out.update(seed=int(seed), horizon_s=requests / rate, drain=True)
    # the time series is not read here: no more samples than a long, slow probe needs
    out["engine"]["timeseries_interval_s"] = max(1.0, out["horizon_s"] / 1e5)
    return out


class Watch:
    """Told of every request that ends in a probe's runs (all seeds, in turn); raises
    :class:`sim.experiments.slos.ProbeLost` once the pooled verdict is certain to be a miss, so
    that an overloaded probe stops early (as ``priosim capacity``'s ``SloWatch`` does for P99).

    Over ``total`` pooled requests, a miss is certain once more than ``total - floor((total -
    1) x target)`` of them exceed one SLO (``p90``: the linear quantile is then above it; fewer
    TPOT values, e.g. one-token answers, would need fewer, so this is conservative), or more
    than ``(1 - target) x total`` miss an SLO (``attainment``)."""

    def __init__(self, crit: Criterion, total: int) -> None:
        self.crit = crit
        self.over = {"ttft": 0, "tpot": 0, "any": 0}
        # (rounded before floor / ceil: 0.9 x 100 is 90.00000000000001 in floating point)
        self.need = (total - math.floor(round((total - 1) * crit.target, 9)) if crit.how == "p90"
                     else total - math.ceil(round(crit.target * total, 9)) + 1)

    def __call__(self, req, now_ns: int) -> None:
        from sim.core.costs import NS
        from sim.core.request import State
        from sim.experiments.slos import ProbeLost

        if req.state is State.REJECTED:
            bad = {"ttft", "tpot"}
        elif req.state is State.FINISHED:
            first, finish = req.first_token_ns / NS, req.finish_ns / NS
            bad = set()
            if self.crit.ttft_s is not None and first - req.arrival_ns / NS > self.crit.ttft_s:
                bad.add("ttft")
            if self.crit.tpot_s is not None and req.generated > 1 and \
                    (finish - first) / (req.generated - 1) > self.crit.tpot_s:
                bad.add("tpot")
        else:
            return
        for k in bad:
            self.over[k] += 1
        self.over["any"] += bool(bad)
        keys = ("ttft", "tpot") if self.crit.how == "p90" else ("any",)
        if any(self.over[k] >= self.need for k in keys):
            raise ProbeLost(req.cls)


def probe(doc: dict, rate: float, requests: int, seeds: list[int], crit: Criterion) -> bool:
    """Whether ``doc`` at ``rate`` meets ``crit`` over its runs under ``seeds``, pooled (each
    run a cluster, one replica where ``doc`` has no ``[cluster]``, so that :class:`Watch` can
    stop a lost probe)."""
    from sim import scenario_from_dict
    from sim.cluster import simulate_cluster
    from sim.experiments.slos import ProbeLost

    watch = Watch(crit, requests * len(seeds))
    tables = []
    for seed in seeds:
        d = at_rate(doc, rate, requests, seed)
        d.setdefault("cluster", {"replicas": 1})
        sc = scenario_from_dict(d, source=str(PAPERS / doc["name"]), base_dir=PAPERS)
        try:
            tables.append(simulate_cluster(sc, on_end=watch).requests)
        except ProbeLost:
            return False
    return crit.met(pd.concat(tables, ignore_index=True))


# ---- the search ----------------------------------------------------------------------------------
def goodput(doc: dict, crit: Criterion, *, requests: int, seeds: list[int], start: float,
            rel: float = 0.01, log=None) -> float:
    """The highest total arrival rate (req/s) at which ``doc`` meets ``crit``: double from
    ``start`` until a probe fails (halve while the first one fails), then bisect until the
    bracket is within ``rel`` of its top. 0.0 when even ``start / 1024`` fails."""
    def ok(rate: float) -> bool:
        verdict = probe(doc, rate, requests, seeds, crit)
        if log:
            log(f"  {doc['name']}: {rate:.4g} req/s {'meets' if verdict else 'misses'}")
        return verdict

    lo, hi = 0.0, start
    if ok(start):
        lo, hi = start, 2 * start
        while ok(hi):
            if hi > start * 1024:
                raise ValueError(f"{doc['name']}: meets its SLOs even at {hi:g} req/s (expected a limit)")
            lo, hi = hi, 2 * hi
    else:  # halve until a probe meets the SLOs
        while not ok(hi / 2):
            hi /= 2
            if hi < start / 1024:
                return 0.0
        lo = hi / 2
    while hi - lo > rel * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def per_gpu(name: str, how: str, *, requests: int, seeds: list[int], rel: float, log=None,
            per_gpu_requests: bool = False, role: str | None = None, cost_scale: float = 1.0) -> float:
    """Goodput per GPU of the scenario ``name`` (``requests`` per probe, or per GPU per probe
    with ``per_gpu_requests``), judged on its own SLOs ``how``; per GPU of the groups of
    ``role`` only when given (the decode-only design counts its decode GPU, not the prefill
    GPUs that feed it); steps priced ``cost_scale`` times; the search starts at the scenario's
    own rate."""
    doc = read(name, cost_scale)
    n = gpus(doc, role)
    start = float(doc["streams"][0]["arrival"]["rate"])
    total = goodput(doc, criterion_of(doc, how), requests=requests * (n if per_gpu_requests else 1), seeds=seeds,
                    start=start, rel=rel, log=log)
    return total / n


# ---- the two comparisons ---------------------------------------------------------------------------
def fig1_settings(small: bool) -> dict:
    """Requests, seeds and bracket of Figure 1's searches (docs/disaggregation-paper.md)."""
    return dict(requests=300, seeds=[0], rel=0.05) if small else dict(requests=2000, seeds=[0, 1, 2], rel=0.01)


def fit_cost_scale(small: bool = False, log=None, rel: float = 0.01) -> float:
    """The one engine constant of the calibrated reading: the ``engine.cost_scale`` at which
    Figure 1's co-located design reaches its published goodput (1.6 req/s), by bisection in
    [1, 4] (goodput falls as every step gets slower). Read off the co-located baseline only,
    never off a disaggregated design."""
    target = FIG1_PARTS["colocated"]
    lo, hi = 1.0, 4.0  # goodput(lo) >= target > goodput(hi), checked below

    def gp(scale: float) -> float:
        g = per_gpu("distserve_fig1_colocated", "p90", cost_scale=scale, **fig1_settings(small))
        if log:
            log(f"  cost_scale {scale:.4g}: co-located {g:.3g} req/s")
        return g

    if gp(lo) < target or gp(hi) >= target:
        raise ValueError(f"cost_scale: the co-located goodput {target} req/s is not bracketed by [{lo}, {hi}]")
    while hi - lo > rel * lo:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gp(mid) >= target else (lo, mid)
    return lo


def fig1(small: bool = False, log=None, cost_scale: float = 1.0) -> dict[str, float]:
    """Figure 1: the three published goodputs simulated, the ratio composed the paper's way, and
    the 2P1D cluster searched as a whole (req/s per GPU; ratios), steps priced ``cost_scale``
    times."""
    kw = dict(fig1_settings(small), cost_scale=cost_scale)
    parts = {k: per_gpu(f"distserve_fig1_{k}", "p90", log=log, role="decode" if k == "decode_only" else None, **kw)
             for k in FIG1_PARTS}
    whole = per_gpu("distserve_fig1_disaggregated", "p90", log=log, **kw)
    composed = min(2 * parts["prefill_only"], parts["decode_only"]) / 3
    return {**parts, "composed_2p1d": composed, "whole_2p1d": whole,
            "ratio": composed / parts["colocated"], "ratio_whole": whole / parts["colocated"]}


def t2(small: bool = False, log=None, cost_scale: float = 1.0) -> dict[str, float]:
    """§6 / Table 2: per-GPU goodput at 90 % attainment of both designs at the artifact's 100
    requests per GPU per rate (seeds pooled), and at a steady 2,000 requests; steps priced
    ``cost_scale`` times."""
    out = {}
    runs = {"artifact": dict(requests=100, per_gpu_requests=True, seeds=list(range(3 if small else 10))),
            "steady": dict(requests=300 if small else 2000, seeds=[0] if small else [0, 1, 2])}
    for label, kw in runs.items():
        g = {k: per_gpu(f"distserve_opt13b_sharegpt_{k}", "attainment", rel=0.05 if small else 0.01, log=log,
                        cost_scale=cost_scale, **kw)
             for k in ("colocated", "disaggregated")}
        out.update({f"{label}_colocated": g["colocated"], f"{label}_disaggregated": g["disaggregated"],
                    f"{label}_ratio": g["disaggregated"] / g["colocated"] if g["colocated"] else float("nan")})
    out["ratio"] = out["artifact_ratio"]
    return out


def verdict(simulated: float, published: float) -> str:
    """'reproduced' when simulated / published is within 1 +- TOLERANCE and disaggregation wins."""
    r = simulated / published
    return "reproduced" if simulated > 1 and abs(r - 1) <= TOLERANCE else "not reproduced"


def rows(sim: dict[tuple[str, str], dict[str, float]]) -> list[str]:
    """The page's table: one row per (comparison, reading)."""
    out = ["| comparison | reading | published | simulated | sim / published | verdict (±25 %) | source |",
           "|---|---|---:|---:|---:|---|---|"]
    for (key, reading), v in sim.items():
        c = PUBLISHED[key]
        s = v["ratio"]
        out.append(f"| {c.what} | {reading} | {c.published:.2f} | {s:.2f} | {s / c.published:.2f} | "
                   f"{verdict(s, c.published)} | {c.source} |")
    return out


# ---- the ShareGPT lengths of the t2 scenarios' first runs --------------------------------------------
def sharegpt_under_2048() -> pd.DataFrame:
    """The bundled ShareGPT length table's rows as DistServe filtered its dataset
    (evaluation/2-benchmark-serving/0-prepare-dataset.py): prompt + output < 2048 tokens, and
    not both under 4."""
    src = ROOT / "workloads" / "data" / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv.gz"
    d = pd.read_csv(src, usecols=["num_prefill_tokens", "num_decode_tokens"])
    p, o = d["num_prefill_tokens"], d["num_decode_tokens"]
    return d[(p + o < 2048) & ~((p < 4) & (o < 4))].reset_index(drop=True)


def write_lengths(path: Path) -> None:
    """:func:`sharegpt_under_2048` as a gzipped CSV at ``path`` (byte-identical on every run: no
    time in the gzip header); a new file only."""
    from sim.outdir import write_file

    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, filename="") as gz:
        gz.write(sharegpt_under_2048().to_csv(index=False).encode())
    write_file(path, buf.getvalue())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=sorted(PUBLISHED), action="append", help="one comparison (repeatable)")
    ap.add_argument("--small", action="store_true", help="a quick check: fewer requests and seeds")
    ap.add_argument("--uncalibrated-only", action="store_true",
                    help="only the reading as written (no engine.cost_scale fitted on the co-located baseline)")
    ap.add_argument("--write-lengths", action="store_true", help="write the t2 scenarios' first ShareGPT table and stop")
    args = ap.parse_args(argv)
    if args.write_lengths:
        path = PAPERS / "data" / "sharegpt_under_2048.csv.gz"
        if path.exists():
            print(f"error: {path}: exists (expected a new path; this command writes only its own file)",
                  file=sys.stderr)
            return 2
        write_lengths(path)
        print(f"wrote {path}")
        return 0
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731 - the search's progress
    from sim import ScenarioError

    readings = {"as written": 1.0}
    sim = {}
    try:
        if not args.uncalibrated_only:
            scale = fit_cost_scale(args.small, log)
            print(f"cost_scale fitted on Figure 1's co-located baseline: {scale:.4g}")
            readings[f"cost_scale {scale:.3g}"] = scale
        for reading, scale in readings.items():
            for key in args.only or list(PUBLISHED):
                sim[key, reading] = (fig1 if key == "fig1" else t2)(args.small, log, scale)
                print(f"{key}, {reading}: " + ", ".join(f"{k} {v:.3g}" for k, v in sim[key, reading].items()))
    except (ScenarioError, ValueError) as exc:  # e.g. a disaggregated scenario before the pools exist
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(rows(sim)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
