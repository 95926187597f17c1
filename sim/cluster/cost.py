"""What a cluster run cost: GPU-hours and dollars, per group and in all, and dollars per million
output tokens per class (docs/autoscaling.md, "Cost").

A replica is paid for from its provisioning start to its removal (a fixed replica: the whole
run), on every one of its GPUs::

    gpu_hours[g] = sum over g's replica lifetimes of (end - start) x gpus_per_replica / 3600
    cost_usd[g]  = gpu_hours[g] x gpu_hour_usd[g]

Each group's dollars are shared among the classes in proportion to its work for each: the output
tokens it generated for them (a shared pool charges every class the same rate; a partition
charges its own classes), or, for a disaggregated cluster's prefill group, the prompt tokens it
computed for them (re-prefills of requests evicted on the decode side included). A class's
dollars are its shares, and its rate is what it was charged per million of its output tokens::

    cost_usd[c]                      = sum_g cost_usd[g] x work[g, c] / work[g]
    usd_per_million_output_tokens[c] = cost_usd[c] / (tokens[c] / 1e6)

A group that did no work leaves its dollars ``unallocated_usd``; the classes' dollars and it add
up to the total.
"""
from __future__ import annotations

import pandas as pd

from sim.core.costs import NS


def cost_report(spec, lives, end_ns: int, requests: pd.DataFrame, class_names: list[str],
                work: dict[str, list[int]] | None = None) -> dict:
    """``summary.json``'s ``cost``: ``spec`` the cluster's layout, ``lives`` the fleet's
    (:class:`~sim.cluster.autoscale.Life`: replica, group, start_ns, end_ns), ``requests`` the
    cluster's request table (its ``group``, ``class`` and ``generated_tokens`` columns);
    ``work``: per prefill group, per class (in ``class_names``' order), the prompt tokens it
    computed, which share its dollars instead of output tokens (a group absent: none)."""
    groups: dict[str, dict] = {}
    for g in spec.groups:
        secs = sum((lf.end_ns - lf.start_ns) for lf in lives if lf.group == g.name) / NS
        gpu_h = secs * g.gpus / 3600.0
        groups[g.name] = {"replica_hours": secs / 3600.0, "mean_replicas": secs / max(end_ns / NS, 1e-9),
                          "gpus_per_replica": g.gpus, "gpu_hours": gpu_h, "gpu_hour_usd": g.gpu_hour_usd,
                          "cost_usd": gpu_h * g.gpu_hour_usd if g.gpu_hour_usd is not None else None}
    priced = all(v["cost_usd"] is not None for v in groups.values())
    total_h = sum(v["gpu_hours"] for v in groups.values())
    total_usd: float | None = sum(v["cost_usd"] for v in groups.values()) if priced else None
    # output tokens per (group, class)
    tok: dict[str, dict[str, int]] = {g.name: {} for g in spec.groups}
    if len(requests):
        for (g, c), n in requests.groupby(["group", "class"], observed=True)["generated_tokens"].sum().items():
            tok[str(g)][str(c)] = int(n)
    made = {c: 0 for c in class_names}  # output tokens per class
    for by_class in tok.values():
        for c, n in by_class.items():
            made[c] += n
    # what shares each group's dollars: its output tokens, a prefill group's prompt tokens computed
    shares = {g.name: ({c: n for c, n in zip(class_names, work.get(g.name, ())) if n}
                       if g.role == "prefill" and work is not None else tok[g.name]) for g in spec.groups}
    per_class: dict[str, float | None] = {c: None for c in class_names}
    class_usd: dict[str, float | None] = {c: None for c in class_names}
    unallocated = 0.0
    if total_usd is not None:
        charged = {c: 0.0 for c in class_names}
        for name, v in groups.items():
            total = sum(shares[name].values())
            if total == 0:
                unallocated += v["cost_usd"]
                continue
            for c, n in shares[name].items():
                charged[c] += v["cost_usd"] * n / total
        per_class = {c: (charged[c] / (made[c] / 1e6) if made[c] else None) for c in class_names}
        class_usd = dict(charged)
    out_tokens = int(requests["generated_tokens"].sum()) if len(requests) else 0
    return {
        "gpu_hours": total_h,
        "cost_usd": total_usd,
        "usd_per_million_output_tokens": (total_usd / (out_tokens / 1e6)
                                          if total_usd is not None and out_tokens else None),
        "classes": {c: {"cost_usd": class_usd[c], "usd_per_million_output_tokens": per_class[c]}
                    for c in class_names},
        "unallocated_usd": unallocated if total_usd is not None else None,
        "groups": groups,
    }
