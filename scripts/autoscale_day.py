"""The autoscale_day question in dollars: one shared pool with priority scheduling vs static
partitions, each autoscaled, vs fixed fleets sized at the peak the autoscaled designs reached.

    python -m scripts.autoscale_day [--set KEY=VALUE ...]

Runs ``workloads/scenarios/autoscale_day.toml`` four ways and prints, per design, GPU-hours,
dollars, dollars per million output tokens per class, interactive TTFT / TPOT p99 against the
class's SLOs, and when the last batch request finished (the day's batch work is due by the end
of the day, 600 s, +10 % grace), as a markdown table; draws docs/figures/autoscale_day.png (the
replicas paid for over the day, per design, and each design's dollars; ``--figure`` elsewhere).
Each run takes some seconds.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from sim import load_scenario
from sim.cluster import simulate_cluster

SLO_CHAT = {"autoscale": {"policy": {"name": "slo", "metric": "ttft", "target_s": 0.3, "low": 0.6, "window_s": 20.0,
                                     "classes": ["interactive"]},
                          "min": 1, "max": 8, "interval_s": 10.0, "provision_s": 5.0}}
QUEUE_BULK = {"autoscale": {"policy": {"name": "queue_length", "target": 24}, "min": 1, "max": 4,
                            "interval_s": 10.0, "provision_s": 5.0}}


def _toml(v) -> str:
    """A value as an inline TOML value (for --set)."""
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}={_toml(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    if isinstance(v, str):
        return f'"{v}"'
    return repr(v)


def designs(peak_shared: int | None = None, peak_chat: int | None = None, peak_bulk: int | None = None) -> dict:
    """Each design's [cluster] table (the fixed ones once the autoscaled peaks are known)."""
    out = {
        "shared + autoscaled": None,  # as shipped
        "partitioned + autoscaled": {"gpu_hour_usd": 3.5, "groups": [
            {"name": "chat", "replicas": 2, "classes": ["interactive"], **SLO_CHAT},
            {"name": "bulk", "replicas": 1, "classes": ["batch"], **QUEUE_BULK}]},
    }
    if peak_shared:
        out["shared, fixed at its peak"] = {"gpu_hour_usd": 3.5, "replicas": peak_shared}
    if peak_chat and peak_bulk:
        out["partitioned, fixed at their peaks"] = {"gpu_hour_usd": 3.5, "groups": [
            {"name": "chat", "replicas": peak_chat, "classes": ["interactive"]},
            {"name": "bulk", "replicas": peak_bulk, "classes": ["batch"]}]}
    return out


def run(cluster: dict | None, sets: list[str]):
    over = list(sets) + ([f"cluster={_toml(cluster)}"] if cluster is not None else [])
    return simulate_cluster(load_scenario("autoscale_day", overrides=over), per_replica=False)


def row(name: str, res) -> dict:
    s = res.summary.set_index("class")
    c = res.summary_dict["cost"]
    req = res.requests
    batch_end = req.loc[req["class"] == "batch", "finish_s"].max()
    ttft, tpot = s.loc["interactive", "ttft_p99_s"], s.loc["interactive", "tpot_p99_s"]
    return {"design": name, "gpu_hours": c["gpu_hours"], "cost_usd": c["cost_usd"],
            "usd_per_Mtok_interactive": c["classes"]["interactive"]["usd_per_million_output_tokens"],
            "usd_per_Mtok_batch": c["classes"]["batch"]["usd_per_million_output_tokens"],
            "ttft_p99_s": ttft, "tpot_p99_s": tpot, "interactive_slo_met": bool(ttft <= 0.5 and tpot <= 0.1),
            "batch_done_s": batch_end, "batch_on_time": bool(batch_end <= 660.0)}


def peak(res, group: str) -> int:
    ft = res.fleet_table()
    return int(ft.loc[ft.group == group, "serving"].max())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE override for every run")
    ap.add_argument("--figure", type=Path, default=Path(__file__).resolve().parents[1] / "docs" / "figures"
                    / "autoscale_day.png", help="where to draw the figure")
    args = ap.parse_args(argv)
    rows = []
    runs = {}
    first = designs()
    shared = run(first["shared + autoscaled"], args.set)
    parts = run(first["partitioned + autoscaled"], args.set)
    rows += [row("shared + autoscaled", shared), row("partitioned + autoscaled", parts)]
    runs.update({"shared + autoscaled": shared, "partitioned + autoscaled": parts})
    fixed = designs(peak(shared, "default"), peak(parts, "chat"), peak(parts, "bulk"))
    for name in ("shared, fixed at its peak", "partitioned, fixed at their peaks"):
        label = name + f" ({_sizes(fixed[name])})"
        runs[label] = run(fixed[name], args.set)
        rows.append(row(label, runs[label]))
    cols = list(rows[0])
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in r.values()) + " |")
    figure(runs, rows, args.figure)


def paid(res) -> tuple[list[float], list[int]]:
    """The replicas paid for (serving + provisioning + draining, all groups) as a step function:
    (times s, counts)."""
    end = res.summary_dict["run"]["end_s"]
    ft = res.fleet_table()
    now: dict[str, int] = {}
    ts, ns = [], []
    for r in ft.itertuples():
        now[r.group] = r.serving + r.provisioning + r.draining
        if ts and ts[-1] == r.t_s:
            ns[-1] = sum(now.values())
        else:
            ts.append(r.t_s)
            ns.append(sum(now.values()))
    return ts + [end], ns + [ns[-1]]


def figure(runs: dict, rows: list[dict], out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [2, 1]})
    for (name, res), style in zip(runs.items(), ["-", "-", "--", "--"]):
        ts, ns = paid(res)
        a.step(ts, ns, where="post", ls=style, label=name)
    a.set(xlabel="simulated time (s; 600 s = one day)", ylabel="replicas paid for (H200)",
          title="autoscale_day: the fleet over the day")
    a.legend(fontsize=8)
    a.grid(alpha=0.3)
    names = [r["design"].split(" (")[0] for r in rows]
    b.barh(range(len(rows)), [r["cost_usd"] for r in rows], color=["C0", "C1", "C2", "C3"])
    b.set_yticks(range(len(rows)), [n.replace(", ", ",\n").replace(" + ", " +\n") for n in names], fontsize=8)
    b.invert_yaxis()
    b.set(xlabel="dollars for the day ($3.50 per GPU-hour)", title="cost, every design meeting its SLOs")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def _sizes(cluster: dict) -> str:
    if "replicas" in cluster:
        return f"{cluster['replicas']} replicas"
    return " + ".join(f"{g['replicas']} {g['name']}" for g in cluster["groups"])


if __name__ == "__main__":
    main()
