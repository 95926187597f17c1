"""A cluster's results: :class:`ClusterResults` is a :class:`~sim.results.Results` for the whole
cluster (the requests table gains ``replica`` and ``group`` columns; percentiles are computed over
all requests, inter-token gaps merged exactly) plus one Results per replica and per group, and a
``summary_dict["cluster"]`` section (:func:`cluster_results`). ``save`` writes the combined run as
an ordinary results folder (so ``priosim plot``/``compare`` work) with ``replicas/<i>/`` and
``groups/<name>/`` inside.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path

import numpy as np
import pandas as pd

from sim.assembly import engine_run_info
from sim.cluster.cost import cost_report
from sim.cluster.spec import ClusterSpec
from sim.config import Scenario
from sim.core.costs import NS
from sim.core.telemetry import Telemetry
from sim.results import Results, _strings


@dataclass
class ClusterResults(Results):
    """Results of the whole cluster plus ``replicas`` (one Results each, index order), ``groups``
    (name -> Results over the group's replicas) and ``cluster`` (the layout)."""

    replicas: list = field(default_factory=list)
    groups: dict = field(default_factory=dict)
    cluster: dict = field(default_factory=dict)

    def replica_table(self) -> pd.DataFrame:
        """One row per replica: group, requests, TTFT p99 per class, output tokens/s, busy time."""
        return pd.DataFrame(self.summary_dict["cluster"]["replicas"])

    def fleet_table(self) -> pd.DataFrame:
        """Replica counts over time: one row per group at each change (t_s, group, serving,
        provisioning, draining)."""
        return pd.DataFrame(self.summary_dict["cluster"].get("fleet", {}).get("replicas_over_time", []))

    def group_table(self) -> pd.DataFrame:
        rows = []
        for name, g in self.summary_dict["cluster"]["groups"].items():
            for cname, m in g["classes"].items():
                if m["arrived"]:
                    rows.append({"group": name, "replicas": g["replicas"], "class": cname, "arrived": m["arrived"],
                                 "finished": m["finished"], "ttft_p99_s": m["ttft_p99_s"],
                                 "tpot_p99_s": m["tpot_p99_s"], "output_tokens_per_s": m["output_tokens_per_s"],
                                 "slo_attainment": m.get("slo_attainment")})
        return pd.DataFrame(rows)

    def write_into(self, tmp: Path) -> None:
        """The cluster's files, and each replica's and group's in folders below them."""
        self.write_files(tmp)
        for sub, r in [(Path("replicas") / str(i), r) for i, r in enumerate(self.replicas)] + \
                [(Path("groups") / name, r) for name, r in self.groups.items()]:
            (tmp / sub).mkdir(parents=True)
            r.write_into(tmp / sub)


def _same_run(scg: Scenario, sc: Scenario) -> bool:
    """Whether a group's scenario builds the same Results as the cluster's from the same
    replicas (everything ``Results.build`` reads but the resolved scenario itself)."""
    return scg.engine == sc.engine and scg.policy == sc.policy


def _sum_info(infos: list[dict], end_ns: int) -> dict:
    out = {k: sum(i[k] for i in infos) for k in ("engine_events", "iterations", "busy_s", "thrash_s",
                                                 "idle_with_work_s", "kv_blocks", "swap_blocks",
                                                 "prefix_evictions")}
    modes: dict[str, int] = {}
    for i in infos:
        for k, v in i["preemptions_by_mode"].items():
            modes[k] = modes.get(k, 0) + v
    out.update(end_s=end_ns / NS, preemptions_by_mode=modes, speculative=None, policy={})
    return out


def cluster_json(res: ClusterResults) -> str:
    return json.dumps(res.cluster, indent=1, default=str)


# ---- building them ---------------------------------------------------------------------------------
@dataclass
class _Builder:
    """Builds one Results over some replicas of a finished run (their telemetry merged)."""

    sc: Scenario
    interval_ns: int
    facts: dict  # wall_s, cpu_s and workload: the same for every Results of the run

    def build(self, scx: Scenario, reps: list, info: dict, trace=None) -> Results:
        costs = reps[0].engine.costs
        tel = reps[0].engine.tel if len(reps) == 1 else Telemetry.merged(
            [r.engine.tel for r in reps], self.sc.class_names, self.interval_ns, costs, scx.engine.block_size)
        return Results.build(scx, costs, tel, {**info, **self.facts}, trace)


def cluster_results(sc: Scenario, spec: ClusterSpec, replicas: list, assign: dict[int, int],
                    group_sc: dict[str, Scenario], router, end_ns: int, interval_ns: int, facts: dict, *,
                    per_replica: bool = True, trace_iterations: bool = False, fleet=None) -> ClusterResults:
    """The results of a finished cluster run: ``replicas`` (index order, each with ``index``,
    ``group``, ``engine``, ``trace``, ``routed``), ``assign`` (request id -> replica index),
    ``group_sc`` (each group's scenario: its engine and policy). ``facts`` (wall and CPU time,
    workload) go into every Results' run facts. ``per_replica=False``: no per-replica or
    per-group Results (faster)."""
    # (a windowed run's replicas bring their run facts, computed where they ran)
    infos = [getattr(rep, "info", None) or engine_run_info(rep.engine, end_ns, reports=per_replica)
             for rep in replicas]
    b = _Builder(sc, interval_ns, facts)
    rep_res = [_replica_result(b, group_sc[rep.group], rep, info)
               for rep, info in zip(replicas, infos)] if per_replica else []
    grp_res = _group_results(b, spec, replicas, infos, group_sc, end_ns) if per_replica else {}
    comb = b.build(sc, replicas, _sum_info(infos, end_ns))
    if per_replica and len(grp_res) < len(spec.groups):
        g = spec.groups[0]  # the only group: a copy, before the cluster's columns are added
        grp_res[g.name] = Results(comb.requests.copy(), comb.summary.copy(), comb.timeseries.copy(),
                                  copy.deepcopy(comb.summary_dict), group_sc[g.name].to_dict(where=True), None,
                                  dict(comb.manifest))
    req = comb.requests
    replica = _replica_of(req["request_id"].to_numpy(), assign)
    req.insert(1, "replica", replica)
    names = [r.group for r in replicas]
    # (each replica's group name taken by Arrow, not a list of 815k names converted one by one)
    req.insert(2, "group", _strings(names, replica) if len(replica) else [])
    if per_replica and trace_iterations:
        its = [r.iterations for r in rep_res if r.iterations is not None and len(r.iterations)]
        comb.iterations = pd.concat(its, ignore_index=True) if its else None
    layout = _layout(spec, replicas, infos, rep_res, grp_res, end_ns, per_replica)
    layout["router_report"] = router.report()
    if fleet is not None:
        layout["fleet"] = fleet.report()
        if fleet.autoscaled and len(comb.timeseries):
            # (only when autoscaled: a fixed cluster's time series stays as it was)
            ts = comb.timeseries
            ts["replicas_serving"], ts["replicas_paid"] = fleet.counts_at(ts["t_s"].to_numpy())
    comb.summary_dict["cluster"] = layout
    comb.summary_dict["cost"] = cost_report(spec, fleet.lives if fleet is not None else _whole_run(replicas, end_ns),
                                            end_ns, req, sc.class_names)
    comb.manifest["cluster"] = {"router": spec.router, "replicas": spec.n_replicas}
    return ClusterResults(comb.requests, comb.summary, comb.timeseries, comb.summary_dict, comb.scenario,
                          comb.iterations, comb.manifest, comb.itl_gaps, replicas=rep_res, groups=grp_res,
                          cluster=layout)


def _whole_run(replicas: list, end_ns: int) -> list:
    from sim.cluster.autoscale import Life
    return [Life(r.index, r.group, 0, 0, end_ns) for r in replicas]


def _replica_of(request_ids: np.ndarray, assign: dict[int, int]) -> np.ndarray:
    """Each request's replica index (int64) from ``assign`` (request id -> replica), looked up in
    a table indexed by request id (ids are 0..n-1): Series.map with a dict first makes a Series
    of the whole dict (1 h ServeGen cluster, 815k requests: 0.18 -> 0.04 s). A request never
    routed is an error, as it was for map."""
    if not len(request_ids):
        return np.zeros(0, dtype=np.int64)
    ids = np.fromiter(assign, np.int64, len(assign))
    table = np.full(max(int(request_ids.max()), int(ids.max()) if len(ids) else 0) + 1, -1, dtype=np.int64)
    table[ids] = np.fromiter(assign.values(), np.int64, len(assign))
    out = table[request_ids]  # (a negative id wraps around: refused below)
    if request_ids.min() < 0 or (out < 0).any():
        raise ValueError("a request in the table was never routed to a replica")
    return out


def _replica_result(b: _Builder, scg: Scenario, rep, info: dict) -> Results:
    r = b.build(scg, [rep], info, rep.trace)
    r.requests.insert(1, "replica", rep.index)
    if r.iterations is not None:
        r.iterations.insert(0, "replica", rep.index)
    return r


def _group_results(b: _Builder, spec: ClusterSpec, replicas: list, infos: list[dict],
                   group_sc: dict[str, Scenario], end_ns: int) -> dict[str, Results]:
    out = {}
    for g in spec.groups:
        reps = [r for r in replicas if r.group == g.name]
        if len(reps) == len(replicas) and _same_run(group_sc[g.name], b.sc):
            continue  # one group of every replica: its Results are the cluster's (copied by the caller)
        out[g.name] = b.build(group_sc[g.name], reps, _sum_info([infos[r.index] for r in reps], end_ns))
    return out


def _layout(spec: ClusterSpec, replicas: list, infos: list[dict], rep_res: list, grp_res: dict,
            end_ns: int, per_replica: bool) -> dict:
    """``summary_dict["cluster"]``: the router, the groups (with their metrics) and one row per replica."""
    layout = {
        "router": spec.router, "router_params": spec.router_params, "replicas_total": spec.n_replicas,
        "gpus_total": spec.gpus,
        "groups": {}, "replicas": [],
    }
    for g in spec.groups:
        reps = [r for r in replicas if r.group == g.name]
        entry = {"replicas": g.replicas, "gpus_per_replica": g.gpus, "classes": list(g.classes) if g.classes else None,
                 "first_replica": reps[0].index, "busy_s": sum(infos[r.index]["busy_s"] for r in reps)}
        if g.name in grp_res:
            sd = grp_res[g.name].summary_dict
            entry["classes"] = {k: {kk: vv for kk, vv in v.items() if not isinstance(vv, dict)}
                                for k, v in sd["classes"].items()}
            entry["served_classes"] = list(g.classes) if g.classes else None
            entry["overall"] = {k: v for k, v in sd["overall"].items() if not isinstance(v, dict)}
        layout["groups"][g.name] = entry
    span = max(end_ns / NS, 1e-9)
    for rep, info in zip(replicas, infos):
        row = {"replica": rep.index, "group": rep.group, "routed": rep.routed, "busy_s": info["busy_s"],
               "utilisation": info["busy_s"] / span, "engine_events": info["engine_events"],
               "kv_blocks": info["kv_blocks"]}
        if per_replica:
            s = rep_res[rep.index].summary_dict
            row["finished"] = s["overall"]["finished"]
            row["output_tokens_per_s"] = s["overall"]["output_tokens_per_s"]
            for cname, m in s["classes"].items():
                row[f"ttft_p99_s[{cname}]"] = m["ttft_p99_s"]
        layout["replicas"].append(row)
    return layout


# ---- a disaggregated cluster ------------------------------------------------------------------------
#: the per-request phases of a disaggregated request's first token (seconds), after its TTFT (with
#: ``first_token = "prefill"`` the last three come after it, before its second token)
PD_COLUMNS = ("prefill_queue_s", "prefill_s", "decode_wait_s", "transfer_s", "decode_join_s")


def disagg_results(sc: Scenario, spec: ClusterSpec, cl, group_sc: dict[str, Scenario], end_ns: int,
                   interval_ns: int, facts: dict, *, per_replica: bool = True,
                   trace_iterations: bool = False) -> ClusterResults:
    """The results of a finished disaggregated run (:class:`sim.cluster.disagg.DisaggCluster`
    ``cl``): the request table holds every request once, as it ended (decode and co-located
    replicas, and the requests that ended elsewhere: refused at arrival, or still prefilling or
    on their way at the horizon), with its replica, group and the phases of its first token
    (:data:`PD_COLUMNS`, NaN for a co-located request; ``prefill_passes``: prefills it took,
    more than one after decode-side recompute); each prefill replica's own Results hold its
    prefill legs (one output token each). ``summary_dict["cluster"]["disaggregation"]``: GPUs
    per role, the link's totals and each class's phase statistics."""
    replicas = cl.replicas
    infos = [engine_run_info(rep.engine, end_ns, reports=per_replica) for rep in replicas]
    b = _Builder(sc, interval_ns, facts)
    rep_res = [_replica_result(b, group_sc[rep.group], rep, info)
               for rep, info in zip(replicas, infos)] if per_replica else []
    grp_res = _group_results(b, spec, replicas, infos, group_sc, end_ns) if per_replica else {}
    owners = [r for r in replicas if r.role != "prefill"]
    costs = owners[0].engine.costs
    tel = Telemetry.merged([r.engine.tel for r in owners] + [cl.front_tel], sc.class_names, interval_ns, costs,
                           sc.engine.block_size)
    comb = Results.build(sc, costs, tel, {**_sum_info(infos, end_ns), **facts}, None)
    req = comb.requests
    ids = req["request_id"].to_numpy()
    replica = _replica_of(ids, cl.assign)
    req.insert(1, "replica", replica)
    req.insert(2, "group", _strings([r.group for r in replicas], replica) if len(replica) else [])
    _add_phases(req, cl.phases)
    if per_replica and trace_iterations:
        its = [r.iterations for r in rep_res if r.iterations is not None and len(r.iterations)]
        comb.iterations = pd.concat(its, ignore_index=True) if its else None
    layout = _layout(spec, replicas, infos, rep_res, grp_res, end_ns, per_replica)
    for g in spec.groups:
        layout["groups"][g.name]["role"] = g.role
    for row, rep in zip(layout["replicas"], replicas):
        row["role"] = rep.role
    layout["router_report"] = cl.router.report()
    layout["disaggregation"] = _pd_report(sc, spec, cl, req)
    comb.summary_dict["cluster"] = layout
    comb.summary_dict["cost"] = cost_report(spec, _whole_run(replicas, end_ns), end_ns, req, sc.class_names,
                                            work=cl.prefill_work)
    comb.manifest["cluster"] = {"router": spec.router, "replicas": spec.n_replicas,
                                "decode_router": spec.decode_router, "link": spec.link.name if spec.link else None}
    return ClusterResults(comb.requests, comb.summary, comb.timeseries, comb.summary_dict, comb.scenario,
                          comb.iterations, comb.manifest, comb.itl_gaps, replicas=rep_res, groups=grp_res,
                          cluster=layout)


def _add_phases(req: pd.DataFrame, phases: dict[int, list[int]]) -> None:
    """Each request's first-token phases (s) from the cluster's clocks ``phases`` (request id ->
    [prefill start, prefill end, copy reserved, landed, prefill passes, taken in] ns; -1: did not
    happen)."""
    n = len(req)
    cols = {c: np.full(n, np.nan) for c in PD_COLUMNS}
    passes = np.zeros(n, dtype=np.int64)
    if n and phases:
        ids = np.fromiter(phases.keys(), np.int64, len(phases))
        ns = np.fromiter(chain.from_iterable(phases.values()), np.int64, 6 * len(ids)).reshape(len(ids), 6)
        at = pd.Index(req["request_id"].to_numpy()).get_indexer(ids)  # (-1: not in the table)
        ns, at = ns[at >= 0], at[at >= 0]
        passes[at] = ns[:, 4]
        ns = ns[:, [0, 1, 2, 3, 5]]  # (the clocks, in the order of the phases between them)
        clocks = np.column_stack([req["arrival_s"].to_numpy()[at], np.where(ns >= 0, ns / NS, np.nan)])
        for j, c in enumerate(PD_COLUMNS):
            cols[c][at] = clocks[:, j + 1] - clocks[:, j]
    for c in PD_COLUMNS:
        req[c] = cols[c]
    req["prefill_passes"] = passes


def _pd_report(sc: Scenario, spec: ClusterSpec, cl, req: pd.DataFrame) -> dict:
    """GPUs per role, the link, and per class the mean, p50 and p99 of each first-token phase
    over the requests that reached their first token through a prefill replica."""
    classes = {}
    # (masks over the columns read, not copies of the whole table per class)
    started = req["decode_join_s"].notna().to_numpy()
    phases = {c: req[c].to_numpy() for c in PD_COLUMNS}
    for cname in sc.class_names:
        of = (req["class"] == cname).to_numpy()
        part = of & started
        entry: dict = {"requests": int(part.sum()), "prefill_passes_mean": (
            float(req.loc[of, "prefill_passes"].mean()) if of.any() else None)}
        for c in PD_COLUMNS:
            v, base = phases[c][part], c.removesuffix("_s")
            entry[f"{base}_mean_s"] = float(v.mean()) if len(v) else None
            entry[f"{base}_p50_s"] = float(np.quantile(v, 0.5)) if len(v) else None
            entry[f"{base}_p99_s"] = float(np.quantile(v, 0.99)) if len(v) else None
        classes[cname] = entry
    return {"gpus_by_role": spec.gpus_by_role(), "decode_router": spec.decode_router,
            **cl.links.report(), "recompute_prefills": cl.recompute_legs,
            "refused_too_large_for_decode": cl.too_large, "classes": classes}
