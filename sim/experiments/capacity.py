"""Capacity planning: the fewest replicas each cluster design needs to meet the SLOs.

A *design* turns a replica-count vector into a ``[cluster]`` table:

* ``shared``: one pool of ``k`` replicas serving every class (priority scheduling inside each
  replica; the router spreads load, ``least_outstanding`` unless ``router`` says otherwise);
* ``partitioned``: static partitioning, one group per class (``k_c`` replicas serving only class
  ``c``, the ``class_aware`` router). The partitions do not interact, so each class's count is
  searched independently: a probe simulates one partition alone (its class's requests on ``k_c``
  replicas), which is exact when the replicas are interchangeable (open arrivals, no speculative
  decoding, a policy that draws no random numbers: nothing then depends on a replica's place in
  the cluster). Otherwise the partitions are probed in lockstep, all at once;
* ``disaggregated``: prefill and decode replicas (docs/disaggregation.md): ``P`` replicas of
  role ``prefill`` and ``D`` of role ``decode``, every class on both, with the shared design's
  router in front and the default decode router (the scenario's own ``[cluster] link`` and
  ``decode_router`` where it has them); the scenario's ``[engine]`` on both roles. The search is
  over the split too (:mod:`sim.experiments.capacity_pd`): the fewest ``P + D`` that meets the
  SLOs, and the answer reports GPUs per role (``gpus_prefill``, ``gpus_decode``).

A point *meets the SLOs* when, for every class: every request finished (none rejected or left
unfinished), ``ttft_p99_s <= ttft`` and ``tpot_p99_s <= tpot`` where the class has those SLOs, and
the class's last request finished by ``done`` (simulated seconds) where given. Classes with no
latency SLO (batch) get an implicit deadline by default: the day's batch work must be done by the
end of the day plus a grace, and no request sooner than it could be on an idle replica,
``done = horizon_s * (1 + grace) + the longest unloaded service time among the class's requests``
(:mod:`sim.experiments.slos`): a deadline no fleet can meet because of one request's own length
never decides the count. ``--slo CLASS:ttft=S,tpot=S,done=S`` overrides (``done`` literally).

Requests refused at any count for their length (over ``engine.max_model_len``, or more KV than a
replica has) are found before the search (:func:`sim.experiments.slos.refused_requests`, in
``refused``); their class can meet no SLO at any count, which the report says. A class with no
request in the stream gets no partition (0 replicas) in ``partitioned``.

The search, per dimension: double from 1 until a point meets the SLOs (or ``max_replicas``), then
bisect between the largest failing and the smallest passing count. It assumes more replicas never
hurt (monotone); ``disaggregated`` has its own search of the two counts, under the same assumption
for each role. Every probe is a full simulation; a round's probes (all designs, and several
probes per design when there are more workers than designs: a k-ary search) run in parallel on
local processes. The answer of each design is simulated once more as a whole (beside the next
round of the designs still searching, or after the last) and reported: GPUs needed, the batch
throughput achieved, utilisation and the classes' p99 latencies.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from sim.core.errors import ScenarioError
from sim.experiments.slos import ProbeLost, SloWatch, check_point
from sim.outdir import KINDS, locked, write_file, write_marker
from sim.progress import progress_bar
from sim import jsonout

DESIGNS = ("shared", "partitioned", "disaggregated")
#: the roles of the disaggregated design's groups, in the order of its counts
PD_ROLES = ("prefill", "decode")


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


def design_dims(design: str, class_names: list[str], limit: int, idle: frozenset | set = frozenset()) -> list[Dim]:
    """The searched counts of ``design``; ``idle``: classes with no request in the stream, whose
    partition (``partitioned``) has 0 replicas and is not searched."""
    if design == "shared":
        return [Dim("shared", list(class_names), limit=limit)]
    if design == "partitioned":
        return [Dim(c, [c], hi=0, limit=limit) if c in idle else Dim(c, [c], limit=limit) for c in class_names]
    if design == "disaggregated":  # (every class on both roles; searched together: capacity_pd)
        return [Dim(r, list(class_names), limit=limit) for r in PD_ROLES]
    raise ScenarioError(f"--designs: unknown design {design!r} (expected one of {', '.join(DESIGNS)})")


def design_cluster(design: str, dims: list[Dim], counts: list[int], router: str | dict | None,
                   pd: dict | None = None) -> dict:
    """The ``[cluster]`` of ``design`` at ``counts``. ``router``: the shared design's, a name or a
    table; a table's ``refresh_s`` (docs/distributed.md) applies to every design's router.
    ``pd``: the disaggregated design's other ``[cluster]`` keys (:func:`pd_settings`)."""
    if design == "shared":
        return {"replicas": counts[0], "router": router or "least_outstanding"}
    if design == "disaggregated":
        return {"groups": [{"name": d.name, "role": d.name, "replicas": k} for d, k in zip(dims, counts)],
                "router": router or "least_outstanding", **(pd or {})}
    groups = [{"name": d.name, "replicas": k, "classes": list(d.classes)} for d, k in zip(dims, counts) if k]
    idle = [c for d, k in zip(dims, counts) if not k for c in d.classes]
    if idle and groups:  # (a class with no traffic has no partition; a cluster names a group for every
        groups[0]["classes"] += idle  # class, so the first one lists it: it never gets a request)
    return {"groups": groups, "router": _refreshed("class_aware", router)}


def pd_settings(sc) -> dict:
    """The scenario's own ``[cluster] link``, ``decode_router`` and ``first_token`` (as written),
    which the disaggregated design keeps: the link is the hardware's and where the first token
    is streamed the engine's, not the design's. Absent: the defaults (docs/disaggregation.md)."""
    c = sc.cluster
    out: dict = {}
    if c is not None and c.link is not None:
        out["link"] = c.link if isinstance(c.link, str) else c.link.model_dump()
    if c is not None and c.decode_router is not None:
        out["decode_router"] = c.decode_router
    if c is not None and c.first_token is not None:
        out["first_token"] = c.first_token
    return out


def _refreshed(name: str, router: str | dict | None) -> str | dict:
    """Router ``name``, with the ``refresh_s`` of ``router`` when it is a table that has one."""
    refresh = router.get("refresh_s") if isinstance(router, dict) else None
    return name if refresh is None else {"name": name, "refresh_s": refresh}


# ---- one point -----------------------------------------------------------------------------------
_WORKLOADS: dict[str, object] = {}  # per process: the probes' shared request stream


def scenario_workload(sc, load_scale: float):
    """The scenario's request stream (``workloads.Workload``), generated once per process (the
    CLI builds it before claiming its folder, so that a bad trace fails first, and the probes of
    a pool forked after that find it built). Raises ScenarioError on bad input."""
    from sim.assembly import build_workload

    key = json.dumps([sc.streams, sc.horizon_s, sc.seed, sc.base_dir, load_scale], sort_keys=True, default=str)
    if key not in _WORKLOADS:
        wl = build_workload(sc, load_scale)
        _WORKLOADS.clear()
        _WORKLOADS[key] = wl
    return _WORKLOADS[key]


def _workload(sc, load_scale: float):
    """The request stream every probe shares (probes differ only in the cluster; the stream is
    not modified by a run). None with closed-loop users, whose state a run advances."""
    wl = scenario_workload(sc, load_scale)
    return None if wl.closed else wl


def idle_classes(sc, load_scale: float) -> set[str]:
    """The classes with no request in the stream (none known with closed-loop users, whose
    requests are made during a run)."""
    wl = _workload(sc, load_scale)
    if wl is None:
        return set()
    return set(sc.class_names) - set(wl.open["cls"].unique())


def _only(wl, classes: list[str]):
    """The open requests of ``classes`` alone (what one partition of a partitioned cluster
    serves), in the same order."""
    from dataclasses import replace

    df = wl.open
    return replace(wl, open=df[df["cls"].isin(classes)].reset_index(drop=True))


def evaluate(base, cluster: dict, load_scale: float, slos: dict,
             dims: list[list[str]] | None = None, part: list[str] | None = None,
             distributed: dict | None = None) -> dict:
    """Simulate the validated scenario ``base`` (a :class:`sim.config.Scenario`) with the
    ``[cluster]`` table ``cluster``; the SLO verdict and headline numbers.

    With ``dims`` (the classes of each searched dimension) the simulation stops as soon as the
    verdict of every dimension is certain to be a miss (:class:`SloWatch`); the point then has
    ``stopped_at_s`` and, for the classes that lost, ``slo_ratio`` is a lower bound. With
    ``part`` (classes) only those classes' requests are served (one partition, alone).
    ``distributed``: ``backend``, ``workers``, ``address`` of a windowed run (the router has
    ``refresh_s``; docs/distributed.md), each probe spread over those workers."""
    from sim.cluster import simulate_cluster
    from sim.config import with_cluster

    t0 = time.perf_counter()
    # probes differ only in [cluster]: the rest was validated once (streams, profile, policy)
    sc = with_cluster(base, cluster)
    wl = _workload(sc, load_scale)
    if part is not None:
        assert wl is not None, "a partition is simulated alone only with open arrivals"
        wl = _only(wl, part)
    watch = None
    if dims is not None and wl is not None:
        totals = {str(k): int(v) for k, v in wl.open["cls"].value_counts().items()}
        watch = SloWatch(slos, totals, dims)
    try:
        res = simulate_cluster(sc, load_scale=load_scale, per_replica=False, workload=wl, on_end=watch,
                               **(distributed or {}))
    except ProbeLost:
        assert watch is not None
        classes = {c: {"ok": False if c in watch.lost else None, "arrived": None, "finished": None,
                       "ttft_p99_s": None, "tpot_p99_s": None, "last_finish_s": None, "last_arrival_s": None,
                       "output_tokens_per_s": None, "slo_ratio": watch.lost.get(c)} for c in slos}
        from sim.cluster.spec import parse_cluster

        lay = parse_cluster(sc)  # (GPUs: a replica may have several, tensor parallel)
        return {"ok": False, "classes": classes, "replicas": lay.n_replicas, "gpus": lay.gpus, "end_s": None,
                "utilisation": None, "wall_s": time.perf_counter() - t0, "engine_events": None,
                "stopped_at_s": watch.at_ns / 1e9}
    s = res.summary_dict
    classes = check_point(s, res.requests, slos)
    lay = s["cluster"]
    span = s["run"]["end_s"]
    busy = sum(r["busy_s"] for r in lay["replicas"])
    out = {"ok": all(c["ok"] for c in classes.values()), "classes": classes,
           "replicas": lay["replicas_total"], "gpus": lay["gpus_total"], "end_s": span,
           "utilisation": busy / (lay["replicas_total"] * span) if span > 0 else 0.0,
           "wall_s": time.perf_counter() - t0, "engine_events": s["run"]["engine_events"]}
    if "disaggregation" in lay:  # GPUs per role (a replica may have several: tensor parallel)
        by_role = lay["disaggregation"]["gpus_by_role"]
        out.update({f"gpus_{r}": by_role.get(r, 0) for r in PD_ROLES})
    return out


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
    points: list = field(default_factory=list)  # every probe (with its wall_s: perf.json, not capacity.json)
    wall_s: float = 0.0
    #: requests refused at any count for their length, per class (:func:`sim.experiments.slos.refused_requests`)
    refused: dict = field(default_factory=dict)
    #: classes with no request in the stream (no partition)
    idle: list = field(default_factory=list)
    #: why each answer is what it is (:func:`sim.experiments.capacity_explain.explain_capacity`)
    explain: dict | None = None
    #: what the search established, per design (:class:`Known`; not written to capacity.json)
    known: dict = field(default_factory=dict, repr=False)

    def table(self) -> pd.DataFrame:
        rows = []
        roles = "disaggregated" in self.designs  # (GPUs per role: the disaggregated design's answer)
        for name, d in self.designs.items():
            row = {"design": name, "replicas": d.get("replicas"), "gpus": d.get("gpus")}
            if roles:
                row.update({f"gpus_{r}": d.get(f"gpus_{r}") for r in PD_ROLES})
            row.update({"split": d.get("split"), "meets_slo": d.get("ok"), "gpu_hours": d.get("gpu_hours")})
            if any(x.get("cost_usd") is not None for x in self.designs.values()):
                row["cost_usd"] = d.get("cost_usd")
            for cname, m in (d.get("classes") or {}).items():
                row[f"{cname}_ttft_p99_s"] = m["ttft_p99_s"]
                row[f"{cname}_tokens_per_s"] = m["output_tokens_per_s"]
            row["utilisation"] = d.get("utilisation")
            rows.append(row)
        return pd.DataFrame(rows)

    def to_dict(self) -> dict:
        """capacity.json: the same bytes for the same inputs (wall-clock times: :meth:`perf`)."""
        doc = {"scenario": self.scenario, "slos": self.slos, "designs": self.designs,
               "points": [{k: v for k, v in p.items() if k != "wall_s"} for p in self.points]}
        if self.refused:
            doc["refused"] = {c: {k: v for k, v in r.items() if k != "rows"} for c, r in self.refused.items()}
        if self.idle:
            doc["idle_classes"] = list(self.idle)
        if self.explain is not None:
            doc["explain"] = self.explain
        return doc

    def perf(self) -> dict:
        """perf.json: the search's wall-clock seconds, and each probe's (in capacity.json's order)."""
        return {"wall_s": self.wall_s,
                "points": [{"design": p["design"], "counts": p["counts"], "wall_s": p.get("wall_s")}
                           for p in self.points]}


def gpu_hour_price(sc) -> float | None:
    """Dollars per GPU-hour for a capacity answer: the scenario's ``[cluster] gpu_hour_usd`` when
    one number, or its entry for the scenario's ``engine.gpu``; None without one (the answer's
    ``cost_usd`` is then null). Every design runs the scenario's engine, so one price serves all."""
    p = sc.cluster.gpu_hour_usd if sc.cluster else None
    if isinstance(p, dict):
        p = p.get(sc.engine.gpu) if sc.engine.gpu else None
    return float(p) if p is not None else None


def _worst(point: dict) -> float:
    """The point's worst class ratio to its SLO (classes a stopped probe did not judge left out)."""
    return max((m["slo_ratio"] for m in point["classes"].values() if m["slo_ratio"] is not None), default=0.0)


@dataclass(frozen=True)
class Known:
    """What one design's search established: each dimension's largest count known to miss the
    SLOs (0: none) and smallest known to meet them (None: none), and the disaggregated design's
    splits with their verdicts."""

    fails: tuple[int, ...] = ()
    passes: tuple[int | None, ...] = ()
    splits: tuple[tuple[tuple[int, int], bool], ...] = ()

    def carried(self, slower: bool) -> "Known":
        """The verdicts that hold for the same search with every step ``slower`` (or faster):
        a count that missed the SLOs misses them when steps take longer, and one that met them
        meets them when steps take less time (steps that take longer never help a request)."""
        if slower:
            return Known(fails=self.fails, passes=tuple(None for _ in self.passes),
                         splits=tuple((s, ok) for s, ok in self.splits if not ok))
        return Known(fails=tuple(0 for _ in self.fails), passes=self.passes,
                     splits=tuple((s, ok) for s, ok in self.splits if ok))


def capacity_search(sc, designs: list[str], slos: dict, *, router: str | dict | None = None, max_replicas: int = 64,
                    load_scale: float = 1.0, workers: int | None = None, log=None,
                    early_stop: bool = True, progress: bool | None = False,
                    apart: bool | None = None, out_dir: str | Path | None = None,
                    finish=None, distributed: dict | None = None, known: dict[str, Known] | None = None,
                    whole: bool = True) -> CapacityReport:
    """Search each design's fewest replicas meeting ``slos`` (see module docstring).
    ``early_stop=False`` runs every failing probe to its end (same answers, slower). ``progress``
    counts the simulations done on stderr (see :func:`sim.progress.progress_bar`). ``apart``:
    probe the partitions of ``partitioned`` one at a time (default: where that is exact, see
    :func:`partitions_apart`); ``False`` probes them in lockstep (same answers, slower).
    ``out_dir``: the search's folder, held by its lock for the search: each probe's outcome is
    kept in ``out_dir/probes`` as it finishes, and a probe found there is not simulated again, so
    a search that was killed resumes where it stopped. ``finish``: called with the report while
    that lock is still held (the CLI writes ``capacity.json`` and the figure there, so that a
    second search waiting on the lock writes its own after them, never before). ``distributed``:
    each probe a windowed run over these workers (:func:`evaluate`); the probes then run one
    at a time. ``known``: verdicts established before (by design, :meth:`Known.carried`), which
    the search takes as given instead of probing them. ``whole=False``: each design's answer
    is not simulated once more as a whole; the report then has its counts and GPUs only (what
    a search at another time factor needs, :func:`sim.experiments.uncertainty.capacity_uncertainty`)."""
    opts = dict(router=router, max_replicas=max_replicas, load_scale=load_scale, workers=workers, log=log,
                early_stop=early_stop, progress=progress, apart=apart, distributed=distributed, known=known,
                whole=whole)
    if out_dir is None:
        return _search(sc, designs, slos, None, **opts)
    scenario_workload(sc, load_scale)  # (a bad trace fails here, before the folder is made)
    with locked(Path(out_dir), "capacity") as out:
        rep = _search(sc, designs, slos, out / "probes", **opts)
        if finish is not None:
            finish(rep)
        return rep


def _search(sc, designs: list[str], slos: dict, probes: Path | None, *, router, max_replicas: int,
            load_scale: float, workers: int | None, log, early_stop: bool, progress, apart,
            distributed: dict | None = None, known: dict[str, Known] | None = None,
            whole: bool = True) -> CapacityReport:
    if distributed:
        workers = 1  # (each probe uses the workers itself)
    search = _Search(sc, designs, slos, router=router, max_replicas=max_replicas, load_scale=load_scale,
                     workers=max(1, workers or os.cpu_count() or 1), log=log, early_stop=early_stop, apart=apart,
                     probes=probes)
    search.distributed = distributed
    search.whole = whole
    if known:
        search.take_known(known)
    t0 = time.perf_counter()
    with search.running(progress):
        while search.probe_round():
            pass
        finals = search.answers()
        if whole:  # (those not simulated yet in a round beside other designs' probes)
            search.run_all([(d, c) for d, c in finals.items() if c is not None])
    search.record_answers(finals)
    search.rep.wall_s = time.perf_counter() - t0
    return search.rep


#: in a search's ``probes/``: the files the last search read, path -> sha256 (so that the next
#: one can say which changed)
INPUTS_FILE = "inputs.json"


class _Search:
    """One capacity search: each design's per-dimension bisection (``state``), every simulated
    point by (design, counts) (``cache``; a partition probed alone has None for the others'
    counts), and the workers that simulate them."""

    def __init__(self, sc, designs: list[str], slos: dict, *, router, max_replicas: int, load_scale: float,
                 workers: int, log, early_stop: bool, apart: bool | None, probes: Path | None = None) -> None:
        self.base = sc  # validated once; each probe only sets its [cluster] (it pickles to the workers)
        self.name = sc.name
        self.designs, self.slos, self.router, self.max_replicas = designs, slos, router, max_replicas
        self.load_scale, self.workers, self.log, self.early_stop = load_scale, workers, log, early_stop
        from sim.experiments.slos import refused_requests

        self.idle = idle_classes(sc, load_scale)
        self.state = {d: design_dims(d, sc.class_names, max_replicas, self.idle) for d in designs}  # (checks names)
        from sim.experiments.capacity_pd import SplitSearch

        self.splits = {d: SplitSearch(max_replicas) for d in designs if d == "disaggregated"}  # (its own search)
        self.pd = pd_settings(sc)
        if apart is None:
            apart = "partitioned" in designs and partitions_apart(sc, load_scale)
        self.alone = {d for d in designs if d == "partitioned" and apart}  # probed a partition at a time
        self.cache: dict[tuple, dict] = {}
        self.rep = CapacityReport(sc.name, slos, idle=sorted(self.idle))
        self.rep.refused = refused_requests(sc, scenario_workload(sc, load_scale))
        for dims in self.state.values():  # (no count serves a refused request: nothing to search)
            for x in dims:
                if any(c in self.rep.refused for c in x.classes):
                    x.lo, x.exhausted = x.limit, True
        self.pool = None
        self.bar = None
        self.probes = probes
        self.distributed: dict | None = None  # (set by _search: evaluate's)
        self.whole = True  # (set by _search: each answer simulated once more as a whole)
        # what every probe's outcome depends on besides its own cluster (its file name's key): the
        # scenario, and what the files it reads hold (a policy file, a trace: edited, they are
        # other probes)
        self.base_key = ""
        if probes is not None:
            from sim.inputs import input_files

            doc = sc.to_dict()
            inputs = input_files(doc, sc.base_dir)
            self.base_key = json.dumps(doc, sort_keys=True, default=str) + \
                (json.dumps(inputs, sort_keys=True) if inputs else "")  # (none: the keys as they always were)
            self.note_inputs(inputs)

    @contextmanager
    def running(self, progress: bool | None):
        """The worker pool and the progress bar, for the length of the search."""
        self.pool = ProcessPoolExecutor(max_workers=self.workers) if self.workers > 1 else None
        self.bar = progress_bar(progress, total=None, desc=f"capacity {self.name}", unit="simulations")
        try:
            yield self
        finally:
            if self.bar is not None:
                self.bar.close()
            if self.pool is not None:
                self.pool.shutdown()

    def task(self, d: str, c: tuple) -> tuple:
        """The arguments of :func:`_eval_task` for design ``d`` at counts ``c``."""
        if None in c:  # one partition alone (the other counts None): its classes' requests only
            j = next(i for i, k in enumerate(c) if k is not None)
            x = self.state[d][j]
            return (self.base, {"replicas": c[j], "router": _refreshed("least_outstanding", self.router)},
                    self.load_scale, self.slos, [x.classes] if self.early_stop else None, x.classes,
                    self.distributed)
        return (self.base, design_cluster(d, self.state[d], list(c), self.router, self.pd),
                self.load_scale, self.slos, [x.classes for x in self.state[d]] if self.early_stop else None, None,
                self.distributed)

    def run_all(self, jobs: list[tuple[str, tuple]]) -> None:
        """Simulate the points not simulated yet (in parallel when there are workers)."""
        todo = []
        for d, c in dict.fromkeys(jobs):
            if (d, c) in self.cache:
                continue
            r = self.kept(d, c)
            if r is None:
                todo.append((d, c))
            else:
                self.record_point(d, c, r)
        args = [self.task(d, c) for d, c in todo]
        outs = self.pool.map(_eval_task, args) if self.pool is not None else map(_eval_task, args)
        for (d, c), out in zip(todo, outs):
            if out[0] != "ok":
                raise RuntimeError(f"capacity point {d} {list(c)} failed: {out[1]}\n{out[2]}")
            self.keep(d, c, out[1])
            self.record_point(d, c, out[1])

    def probe_file(self, d: str, c: tuple) -> Path:
        """Where the outcome of design ``d`` at counts ``c`` is kept: named by everything that
        decides it (the scenario, the cluster, the load, the SLOs, early stopping)."""
        _, cluster, load, slos, watch, part, _ = self.task(d, c)
        only = [] if part is None else [part]  # (where the probe runs decides nothing)
        key = self.base_key + json.dumps([cluster, load, slos, watch, only], sort_keys=True, default=str)
        return self.probes / f"{hashlib.sha1(key.encode()).hexdigest()[:20]}.json"

    def note_inputs(self, inputs: dict[str, str]) -> None:
        """Say (one line per file) which files changed since the kept probes read them, so that
        their points are simulated again, and record what this search reads
        (``probes/inputs.json``)."""
        from sim.inputs import changed_files

        f = self.probes / INPUTS_FILE
        try:
            old = json.loads(f.read_text())
        except (OSError, ValueError):
            old = None
        if self.log is not None:
            for p in changed_files(old if isinstance(old, dict) else None, inputs):
                self.log(f"rerun: {p} changed since the kept probes read it: its points are simulated again")
        if inputs and inputs != old:
            self.probes.mkdir(parents=True, exist_ok=True)
            write_file(f, json.dumps(inputs, indent=1, sort_keys=True))

    def kept(self, d: str, c: tuple) -> dict | None:
        """The outcome of an earlier search's probe of ``d`` at ``c``, if one was kept."""
        if self.probes is None:
            return None
        try:
            return json.loads(self.probe_file(d, c).read_text(), parse_constant=float)
        except (OSError, ValueError):
            return None

    def keep(self, d: str, c: tuple, r: dict) -> None:
        if self.probes is not None:
            self.probes.mkdir(parents=True, exist_ok=True)
            write_file(self.probe_file(d, c), json.dumps(r, default=str))  # (in its order: the report keeps it)

    def record_point(self, d: str, c: tuple, r: dict) -> None:
        if None in c:  # one partition alone: only its classes were served
            part = self.state[d][next(i for i, k in enumerate(c) if k is not None)].classes
            r["classes"] = {k: v for k, v in r["classes"].items() if k in part}
        self.cache[(d, c)] = r
        if self.bar is not None:
            self.bar.update(1)
        self.rep.points.append({"design": d, "counts": list(c), **{k: v for k, v in r.items() if k != "classes"},
                                "classes": r["classes"]})
        if self.log is not None:
            worst = _worst(r)
            stop = f", stopped at {r['stopped_at_s']:.0f} s" if r.get("stopped_at_s") is not None else ""
            shown = "[" + ", ".join("-" if k is None else str(k) for k in c) + "]"
            self.log(f"  {d:12s} {shown:14s} {'meets' if r['ok'] else 'misses'} SLOs "
                     f"(worst p99/SLO {'>= ' if stop else ''}{worst:.2f}, wall {r['wall_s']:.1f}s{stop})")

    def probe_round(self) -> bool:
        """One round of probes for every design still searching, spread over the workers, then
        each probed dimension's bisection told the verdict. False when every design is done."""
        active = [d for d in self.designs if not self.done(d)]
        if not active:
            return False
        # a design found already has its answer simulated as a whole in this round, on a
        # worker that the searching designs' probes leave (or share) rather than after them
        found = [(d, c) for d, c in self.answers().items()
                 if self.whole and d not in active and c is not None and (d, c) not in self.cache]
        m = max(1, (self.workers - len(found)) // len(active))
        plan = [step for d in active for step in self.round_plan(d, m)]
        self.run_all([(d, counts) for d, counts, _ in plan] + found)
        for d, search in self.splits.items():
            if d in active:
                search.told({c: (self.cache[(d, c)]["ok"], _worst(self.cache[(d, c)]))
                             for dd, c, _ in plan if dd == d})
        for d, counts, probed in plan:
            if d in self.splits:
                continue
            r = self.cache[(d, counts)]
            for x, k, pr in zip(self.state[d], counts, probed):
                if pr:
                    x.update(k, all(r["classes"][c]["ok"] for c in x.classes))
        return True

    def done(self, d: str) -> bool:
        return self.splits[d].done if d in self.splits else all(x.done for x in self.state[d])

    def round_plan(self, d: str, m: int) -> list[tuple[str, tuple, list[bool]]]:
        """Design ``d``'s points this round (up to ``m`` probes per dimension), each with which
        dimensions it probes; a dimension already done sits at its answer (or its limit)."""
        if d in self.splits:  # (the split search says which points)
            return [(d, c, [True, True]) for c in self.splits[d].probes(m)]
        dims = self.state[d]
        per_dim = [x.probes(m) for x in dims]
        plan = []
        if d in self.alone:  # each partition's probes on their own
            for j, p in enumerate(per_dim):
                for k in p:
                    counts = tuple(k if i == j else None for i in range(len(dims)))
                    plan.append((d, counts, [i == j for i in range(len(dims))]))
            return plan
        for j in range(max(len(p) for p in per_dim)):
            counts = tuple(p[min(j, len(p) - 1)] if p else (x.limit if x.hi is None else x.hi)
                           for p, x in zip(per_dim, dims))
            plan.append((d, counts, [bool(p) for p in per_dim]))
        return plan

    def answers(self) -> dict[str, tuple | None]:
        """Each design's answer (None: some dimension found no count)."""
        return {d: self.splits[d].answer if d in self.splits else
                None if any(x.exhausted for x in self.state[d]) else tuple(x.hi for x in self.state[d])
                for d in self.designs}

    def take_known(self, known: dict[str, Known]) -> None:
        """Start each design's search from verdicts established before (:class:`Known`)."""
        for d, k in known.items():
            if d in self.splits:
                self.splits[d].take_known(k.splits)
            elif d in self.state:
                for x, lo, hi in zip(self.state[d], k.fails, k.passes):
                    if lo:
                        x.update(lo, False)
                    if hi is not None:
                        x.update(hi, True)

    def record_known(self) -> None:
        for d in self.designs:
            if d in self.splits:
                self.rep.known[d] = Known(splits=tuple((s, v.ok) for s, v in self.splits[d].seen.items()))
            else:
                self.rep.known[d] = Known(fails=tuple(x.lo for x in self.state[d]),
                                          passes=tuple(x.hi for x in self.state[d]))

    def refused_only(self, d: str) -> bool:
        """Whether every dimension of design ``d`` that found no count serves a class with
        requests refused at any count."""
        return all(any(c in self.rep.refused for c in x.classes) for x in self.state[d] if x.exhausted)

    def failing(self, d: str) -> list[str]:
        """Per dimension of design ``d`` that found no count: the classes that miss their SLOs at
        its limit, each with why when the count cannot fix it (requests refused for their length)."""
        out = []
        for j, x in enumerate(self.state[d]):
            if not x.exhausted:
                continue
            at = [p for (dd, c), p in self.cache.items() if dd == d and c[j] == x.limit]
            bad = ([c for c in x.classes if c in self.rep.refused]
                   or [c for c in x.classes if any(p["classes"].get(c, {}).get("ok") is False for p in at)]
                   or x.classes)
            names = [c + (f": {refused_text(self.rep.refused[c])}" if c in self.rep.refused else "") for c in bad]
            out.append(", ".join(names))
        return out

    def record_answers(self, finals: dict[str, tuple | None]) -> None:
        self.record_known()
        for d in self.designs:
            c = finals[d]
            # the disaggregated design's answer has its GPUs per role beside its GPUs
            roles = [f"gpus_{role}" for role in PD_ROLES] if d in self.splits else []
            if c is None:
                # (refused requests: no count at all, not only none up to the limit)
                limit = "" if self.refused_only(d) else f" up to --max-replicas={self.max_replicas}"
                what = (f"no split up to --max-replicas={self.max_replicas} of each role meets the SLOs"
                        if d in self.splits else
                        f"no count{limit} meets the SLOs ({'; '.join(self.failing(d))})")
                self.rep.designs[d] = {"ok": False, "replicas": None, "gpus": None, **dict.fromkeys(roles),
                                       "note": what}
                if d not in self.splits:  # (each dimension's own answer: a partition may meet its SLOs)
                    self.rep.designs[d]["found"] = {x.name: x.hi for x in self.state[d]}
                continue
            if not self.whole:  # (the counts, and the GPUs their layout has)
                from sim.cluster.spec import parse_cluster
                from sim.config import with_cluster

                lay = parse_cluster(with_cluster(self.base, design_cluster(d, self.state[d], list(c), self.router,
                                                                           self.pd)))
                by_role = lay.gpus_by_role()
                self.rep.designs[d] = {"ok": True, "replicas": lay.n_replicas, "gpus": lay.gpus,
                                       **{f"gpus_{r}": by_role.get(r, 0) for r in PD_ROLES if roles},
                                       "split": {x.name: k for x, k in zip(self.state[d], c)}}
                continue
            r = self.cache[(d, c)]
            gpu_h = r["gpus"] * r["end_s"] / 3600 if r.get("end_s") is not None else None
            price = gpu_hour_price(self.base)
            self.rep.designs[d] = {"ok": r["ok"], "replicas": r["replicas"], "gpus": r["gpus"],
                                   **{k: r[k] for k in roles},
                                   "gpu_hours": gpu_h, "cost_usd": gpu_h * price if gpu_h is not None and
                                   price is not None else None,
                                   "split": {x.name: k for x, k in zip(self.state[d], c)}, "classes": r["classes"],
                                   "utilisation": r["utilisation"], "end_s": r["end_s"],
                                   "cluster": design_cluster(d, self.state[d], list(c), self.router, self.pd)}


def refused_text(r: dict) -> str:
    """``3 of 31 requests refused at any count (too long: prompt + max_tokens over
    engine.max_model_len)`` for one class's :func:`sim.experiments.slos.refused_requests`."""
    mml = f" = {r['max_model_len']:,}" if r.get("max_model_len") else ""
    why = [w for w, n in ((f"prompt + max_tokens over engine.max_model_len{mml}", r["too_long"]),
                          ("more KV than a replica could ever give one request", r["too_large"]),
                          ("more than one step's token budget without chunked prefill", r["too_long_for_step"]))
           if n]
    n = r["too_long"] + r["too_large"] + r["too_long_for_step"]
    return f"{n:,} of {r['arrived']:,} requests refused at any count ({'; '.join(why)})"


# ---- output --------------------------------------------------------------------------------------
def save_report(rep: CapacityReport, out_dir: str | Path) -> Path:
    """Write ``capacity.json``, ``points.csv`` (the same bytes for the same inputs) and
    ``perf.json`` (wall-clock seconds) into ``out_dir``, each whole or not at all."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_marker(out, "capacity", sorted(KINDS["capacity"][1]))
    write_file(out / "capacity.json", jsonout.dumps(rep.to_dict(), indent=1, default=str))
    write_file(out / "perf.json", jsonout.dumps(rep.perf(), indent=1))
    rows = []
    for p in rep.points:  # (wall-clock seconds: perf.json, so that the same inputs give the same bytes)
        row = {k: v for k, v in p.items() if k not in ("classes", "counts", "wall_s")}
        row["counts"] = ",".join("-" if k is None else str(k) for k in p["counts"])  # -: not in this probe
        for cname, m in p["classes"].items():
            for k in ("ok", "ttft_p99_s", "tpot_p99_s", "last_finish_s", "output_tokens_per_s", "slo_ratio"):
                row[f"{cname}.{k}"] = m[k]
        rows.append(row)
    write_file(out / "points.csv", pd.DataFrame(rows).to_csv(index=False))
    return out


#: the disaggregated design's bars, by role
ROLE_COLORS = {"prefill": "#8c564b", "decode": "#17becf"}


def plot_capacity(rep: CapacityReport, path: str | Path) -> Path:
    """Left: GPUs each design needs (partitioned stacked by partition, disaggregated by role),
    annotated with the batch throughput achieved. Right: every probe, worst p99/SLO ratio against replicas."""
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
        if d in ("partitioned", "disaggregated"):  # stacked: a partition per class, or a role's replicas
            bottom = 0
            for part, k in split.items():
                role = d == "disaggregated"
                ax.bar(i, k, bottom=bottom, color=ROLE_COLORS[part] if role else cc.get(part, "grey"),
                       edgecolor="white", label=f"{part} {'replicas' if role else 'partition'}")
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
    write_file(p, lambda t: fig.savefig(t, format=Path(p).suffix.lstrip('.') or 'png', dpi=120,
                                          bbox_inches="tight"))  # (grows the canvas to the legends)
    return p
