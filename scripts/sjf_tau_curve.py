"""Mean end-to-end latency vs predictor quality on workloads/scenarios/sharegpt_poisson.toml.

Runs fcfs, srpt_oracle, sjf_rank(oracle) and sjf_rank(noisy, tau) for tau in 0.3/0.5/0.7/0.9
over several seeds at a high load, prints a table (also as Markdown to docs/sjf_tau_curve.md)
and draws docs/sjf_tau_curve.png, priced at the profile's declared engine overhead unless
``--overhead`` names another preset (``none``: the profile alone). Usage:
``python -m scripts.sjf_tau_curve [--seeds 3] [--horizon-s 300] [--overhead NAME] [--out docs]``.
"""
from __future__ import annotations

import argparse
import sys
import datetime
from pathlib import Path

import numpy as np

from sim import simulate
from sim.config import load_scenario

ROOT = Path(__file__).resolve().parent.parent

SCENARIO = ROOT / "workloads" / "scenarios" / "sharegpt_poisson.toml"
TAUS = (0.3, 0.5, 0.7, 0.9)
# High load on one replica: 32 sequences, 6 standard requests/s (+ premium), 300 s. Waiting
# requests do not evict running ones (preempt_for_waiting = "never"), so the policies differ
# only in the order they admit: the quantity being studied.
HIGH_LOAD = ["horizon_s=300", "streams.0.arrival.rate=6", "engine.max_num_seqs=32",
             "engine.preempt_for_waiting=never"]


def policies() -> list[tuple[str, list[str]]]:
    out = [("fcfs", ["policy.name=fcfs"]), ("srpt_oracle", ["policy.name=srpt_oracle"]),
           ("sjf_rank(oracle)", ["policy.name=sjf_rank", "policy.predictor=oracle"])]
    out += [(f"sjf_rank(noisy, tau={t})", ["policy.name=sjf_rank", "policy.predictor=noisy", f"policy.tau={t}"])
            for t in TAUS]
    return out


#: the engine overhead preset the last run() was priced with (the summary's profile.overhead)
PRICED_WITH: list[str] = []


def run(overrides: list[str], seed: int, horizon_s: float = 300.0) -> tuple[float, float, float | None]:
    sc = load_scenario(SCENARIO, overrides=HIGH_LOAD + overrides + [f"seed={seed}", f"horizon_s={horizon_s}"])
    res = simulate(sc)
    PRICED_WITH[:] = [str(res.summary_dict["profile"].get("overhead"))]
    d = res.requests
    d = d[d["status"] == "finished"]
    return float(d["e2e_s"].mean()), float(d["e2e_s"].quantile(0.99)), res.summary_dict["run"]["policy"].get("srpt_order_tau")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--horizon-s", type=float, default=300.0, help="arrivals stop here (s); smaller for a quick look")
    ap.add_argument("--overhead", default=None,
                    help="engine overhead preset for every run (default: the profile's declared preset)")
    ap.add_argument("--out", default=str(ROOT / "docs"), help="folder for sjf_tau_curve.md and .png")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = list(range(args.seeds))
    pricing = [f'engine.overhead="{args.overhead}"'] if args.overhead else []
    table = []
    for name, ov in policies():
        r = np.array([run(pricing + ov, s, args.horizon_s) for s in seeds], dtype=float)
        table.append((name, *r.mean(axis=0)))
        print(f"{name:28s} mean e2e {table[-1][1]:8.3f} s  p99 {table[-1][2]:8.2f} s  srpt-order tau {table[-1][3]:.3f}",
              file=sys.stderr, flush=True)  # (progress; stdout carries only the Markdown table)
    lines = ["| policy | mean e2e (s) | p99 e2e (s) | admission-order tau vs SRPT |", "|---|---:|---:|---:|"]
    lines += [f"| {n} | {m:.3f} | {p:.2f} | {t:.3f} |" for n, m, p, t in table]
    flag = f" --overhead {args.overhead}" if args.overhead else ""
    load = [f"horizon_s={args.horizon_s:g}"] + [x for x in HIGH_LOAD if not x.startswith("horizon_s=")]
    (out / "sjf_tau_curve.md").write_text(
        f"Seeds {seeds}; scenario `{SCENARIO.relative_to(ROOT)}` with {' '.join(load)}; engine overhead "
        f"`{PRICED_WITH[0]}`; produced by `python -m scripts.sjf_tau_curve{flag}` on {datetime.date.today()}.\n\n"
        + "\n".join(lines) + "\n")
    print(f"Seeds {seeds}; engine overhead `{PRICED_WITH[0]}`.\n\n" + "\n".join(lines))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    by = {n: m for n, m, _, _ in table}
    fig, ax = plt.subplots(figsize=(6, 4))
    ys = [by[f"sjf_rank(noisy, tau={t})"] for t in TAUS]
    ax.plot(TAUS, ys, "o-", label="sjf_rank(noisy, tau)")
    for n, style in (("fcfs", "r--"), ("sjf_rank(oracle)", "g--"), ("srpt_oracle", "k:")):
        ax.axhline(by[n], color=style[0], linestyle=style[1:], label=n)
    ax.set_xlabel("predictor Kendall tau vs true output length")
    ax.set_ylabel("mean end-to-end latency (s)")
    ax.set_title("ShareGPT lengths, Poisson arrivals, high load")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "sjf_tau_curve.png", dpi=120)
    print(f"wrote {out / 'sjf_tau_curve.png'} and {out / 'sjf_tau_curve.md'}")


if __name__ == "__main__":
    main()
