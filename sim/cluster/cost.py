"""What a cluster run cost: GPU-hours and dollars, per group and in all, and dollars per million
output tokens per class (docs/autoscaling.md, "Cost").

A replica is paid for from its provisioning start to its removal (a fixed replica: the whole
run), on every one of its GPUs::

    gpu_hours[g] = sum over g's replica lifetimes of (end - start) x gpus_per_replica / 3600
    cost_usd[g]  = gpu_hours[g] x gpu_hour_usd[g]

Each group's dollars are shared among the classes in proportion to the output tokens the group
generated for each (a shared pool charges every class the same rate; a partition charges its own
classes), and a class's rate is what it was charged per million of its output tokens::

    usd_per_million_output_tokens[c] = sum_g cost_usd[g] x tokens[g, c] / tokens[g]  /  (tokens[c] / 1e6)

A group that generated no token leaves its dollars ``unallocated_usd``.
"""
from __future__ import annotations

import pandas as pd

from sim.core.costs import NS


def cost_report(spec, lives, end_ns: int, requests: pd.DataFrame, class_names: list[str]) -> dict:
    """``summary.json``'s ``cost``: ``spec`` the cluster's layout, ``lives`` the fleet's
    (:class:`~sim.cluster.autoscale.Life`: replica, group, start_ns, end_ns), ``requests`` the
    cluster's request table (its ``group``, ``class`` and ``generated_tokens`` columns)."""
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
    per_class: dict[str, float | None] = {c: None for c in class_names}
    unallocated = 0.0
    if total_usd is not None:
        charged = {c: 0.0 for c in class_names}
        made = {c: 0 for c in class_names}
        for name, v in groups.items():
            total = sum(tok[name].values())
            if total == 0:
                unallocated += v["cost_usd"]
                continue
            for c, n in tok[name].items():
                charged[c] += v["cost_usd"] * n / total
                made[c] += n
        per_class = {c: (charged[c] / (made[c] / 1e6) if made[c] else None) for c in class_names}
    out_tokens = int(requests["generated_tokens"].sum()) if len(requests) else 0
    return {
        "gpu_hours": total_h,
        "cost_usd": total_usd,
        "usd_per_million_output_tokens": (total_usd / (out_tokens / 1e6)
                                          if total_usd is not None and out_tokens else None),
        "classes": {c: {"usd_per_million_output_tokens": per_class[c]} for c in class_names},
        "unallocated_usd": unallocated if total_usd is not None else None,
        "groups": groups,
    }
