"""Speculative decoding vs load: mean time per output token and goodput, with and without
speculation, on workloads/scenarios/speculation_load.toml. Writes docs/figures/speculation_crossover.png
and prints the table (markdown). The question is verification compute in compute-bound steps,
so the figure is drawn priced without engine overhead (``--overhead none``, as
tests/test_speculation.py runs it). At the profile's declared overhead (``vllm-v1``: a small
host cost per step, next to nothing per sequence) the curves cross between the same loads.
Run: python -m scripts.speculation_crossover [--quick] [--overhead NAME]"""
from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from sim import load_scenario, simulate  # noqa: E402

SPEC = "engine.speculative={k=4,acceptance=0.7,draft_cost_fraction=0.1}"


def measure(rates, horizon, pricing=()):
    rows = []
    for rate in rates:
        for spec in (False, True):
            ov = [*pricing, f"streams.0.arrival.rate={rate}", f"horizon_s={horizon}"] + ([SPEC] if spec else [])
            res = simulate(load_scenario("speculation_load", overrides=ov))
            c = res.summary_dict["classes"]["chat"]
            rows.append({"rate": rate, "speculative": spec, "tpot_p50_s": c["tpot_p50_s"],
                         "overhead": res.summary_dict["profile"].get("overhead"),
                         "e2e_p50_s": c["e2e_p50_s"], "goodput_rps": c["goodput_rps"],
                         "throughput_rps": c["throughput_rps"], "tokens_per_s": c["output_tokens_per_s"]})
    return rows


def main():
    ap = argparse.ArgumentParser(prog="python -m scripts.speculation_crossover", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="two loads, a 30 s horizon")
    ap.add_argument("--overhead", default=None,
                    help="engine overhead preset (default: the profile's declared preset; the figure: none)")
    args = ap.parse_args()
    rates = [2, 8, 16, 24, 32, 40] if not args.quick else [2, 32]
    pricing = [f'engine.overhead="{args.overhead}"'] if args.overhead else []
    rows = measure(rates, 30.0 if args.quick else 120.0, pricing)
    print(f"engine overhead: {rows[0]['overhead']}\n")
    print("| rate (req/s) | speculative | TPOT p50 (ms) | e2e p50 (s) | goodput (req/s) | output tok/s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['rate']} | {'yes' if r['speculative'] else 'no'} | {r['tpot_p50_s'] * 1e3:.1f} | "
              f"{r['e2e_p50_s']:.2f} | {r['goodput_rps']:.2f} | {r['tokens_per_s']:.0f} |")
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for spec, style in ((False, "o-"), (True, "s--")):
        sel = [r for r in rows if r["speculative"] == spec]
        label = "speculative (k=4, α=0.7)" if spec else "no speculation"
        a.plot([r["rate"] for r in sel], [r["tpot_p50_s"] * 1e3 for r in sel], style, label=label)
        b.plot([r["rate"] for r in sel], [r["goodput_rps"] for r in sel], style, label=label)
    a.set(xlabel="offered load (requests/s)", ylabel="time per output token, p50 (ms)",
          title="Latency vs load")
    b.set(xlabel="offered load (requests/s)", ylabel="goodput (requests/s within TTFT 2 s, TPOT 50 ms)",
          title="Goodput vs load")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"speculation_load, engine overhead: {rows[0]['overhead']}")
    fig.tight_layout()
    out = Path(__file__).resolve().parents[1] / "docs" / "figures" / "speculation_crossover.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
