"""Eviction and prefix sharing on the Mooncake trace under memory pressure: the victim rule
(``engine.victim = rank`` vs ``prefix_aware``) side by side at a few pool sizes, with every
prefix eviction attributed to its cause (a preemption released the group, or cache pressure
evicted what a finished request left) and the re-prefill it pushed onto other requests.

Writes docs/figures/prefix_victim.png and prints a markdown table.
Run: python -m scripts.prefix_victim [--quick] [--set KEY=VALUE ...]
(--set is passed to the scenario, e.g. the trace's path when the data is kept elsewhere.)"""
from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from sim import load_scenario, simulate  # noqa: E402

VICTIMS = ("rank", "prefix_aware")


def measure(kv_list, horizon, sets):
    rows = []
    for kv in kv_list:
        for victim in VICTIMS:
            ov = [*sets, f"horizon_s={horizon}", f"engine.kv_blocks={kv}", f"engine.victim=\"{victim}\""]
            res = simulate(load_scenario("mooncake_prefix", overrides=ov))
            c = res.summary_dict["classes"]["chat"]
            by_pre = [r for r in res.summary_dict["run"]["prefix_attribution"] if r["cause"] == "preemption"]
            rows.append({"kv_blocks": kv, "victim": victim, "ttft_p50_s": c["ttft_p50_s"],
                         "ttft_p99_s": c["ttft_p99_s"], "hit_rate": c["prefix_hit_rate"],
                         "preemptions": c["preemptions"],
                         "ev_preempt": c["prefix_evictions_by_preemption"],
                         "ev_pressure": c["prefix_evictions_by_pressure"],
                         "own_tokens": c["refill_own_tokens"], "pushed_tokens": c["refill_pushed_tokens"],
                         "pushed_s": c["refill_pushed_s"], "recompute_s": c["recompute_s"],
                         "tokens_per_s": c["output_tokens_per_s"],
                         "pre_own": sum(r["own_refill_tokens"] for r in by_pre),
                         "pre_pushed": sum(r["pushed_refill_tokens"] for r in by_pre)})
    return rows


def main():
    ap = argparse.ArgumentParser(prog="python -m scripts.prefix_victim", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one pool size, a 120 s horizon")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a scenario override, e.g. the trace's path when the data is kept elsewhere")
    args = ap.parse_args()
    kv_list = [10000, 20000, 40000] if not args.quick else [20000]
    rows = measure(kv_list, 120.0 if args.quick else 300.0, args.set)
    print("| KV blocks | victim | hit rate | preemptions | prefix evictions: by preemption / by pressure "
          "| re-prefill from preemption evictions: victim's own / pushed onto others (tokens) "
          "| re-prefill pushed onto others, all evictions | TTFT p99 (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['kv_blocks']} | {r['victim']} | {r['hit_rate']:.1%} | {r['preemptions']} | "
              f"{r['ev_preempt']} / {r['ev_pressure']} | {r['pre_own']} / {r['pre_pushed']} | "
              f"{r['pushed_tokens'] / 1e6:.2f} M tokens ({r['pushed_s']:.1f} s) | {r['ttft_p99_s']:.1f} |")
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    x = np.arange(len(kv_list))
    w = 0.38
    for j, victim in enumerate(VICTIMS):
        rs = [r for r in rows if r["victim"] == victim]
        off = (j - 0.5) * w
        axes[0].bar(x + off, [r["ev_preempt"] for r in rs], w, label=f"{victim}: by preemption",
                    color=("tab:red", "tab:green")[j])
        axes[1].bar(x + off, [r["pre_own"] / 1e3 for r in rs], w, label=f"{victim}: the victim's own",
                    color=("tab:red", "tab:green")[j])
        axes[1].bar(x + off, [r["pre_pushed"] / 1e3 for r in rs], w, bottom=[r["pre_own"] / 1e3 for r in rs],
                    label=f"{victim}: pushed onto others", color=("salmon", "lightgreen")[j])
        axes[2].bar(x + off, [r["ttft_p99_s"] for r in rs], w, label=victim, color=("tab:red", "tab:green")[j])
    for ax, title in zip(axes, ("prefix evictions caused by preemptions",
                                "re-prefill charged to them (k tokens)", "TTFT p99 (s)")):
        ax.set_xticks(x, [f"{kv} blocks" for kv in kv_list])
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("mooncake_prefix under memory pressure: engine.victim = rank vs prefix_aware", fontsize=11)
    fig.tight_layout()
    out = Path(__file__).resolve().parents[1] / "docs" / "figures" / "prefix_victim.png"
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
