"""Distribution shift: the learned ranker's Kendall tau and mean latency per time window, with
FCFS for reference, on workloads/scenarios/distribution_shift.toml.
Writes docs/figures/distribution_shift.png and prints a markdown table. The scenario's load was
sized against the profile's step prices without engine overhead, so the figure is drawn with
``--overhead none`` (as tests/test_distribution_shift.py runs it); at the profile's declared
overhead the steps cost a little more and the ranker's advantage and its loss after the shift
show the same way.
Run: python -m scripts.distribution_shift [--overhead NAME]"""
from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from sim import load_scenario, simulate  # noqa: E402

WINDOW_S = 60.0


def per_window(req):
    fin = req[req.status == "finished"]
    w = (fin.arrival_s // WINDOW_S).astype(int)
    return fin.groupby(w)["e2e_s"].mean()


def main():
    ap = argparse.ArgumentParser(prog="python -m scripts.distribution_shift", description=__doc__.splitlines()[0])
    ap.add_argument("--overhead", default=None,
                    help="engine overhead preset (default: the profile's declared preset; the figure: none)")
    args = ap.parse_args()
    pricing = [f'engine.overhead="{args.overhead}"'] if args.overhead else []
    learned = simulate(load_scenario("distribution_shift", overrides=pricing))
    fcfs = simulate(load_scenario("distribution_shift", overrides=['policy={name="fcfs"}', *pricing]))
    print(f"engine overhead: {learned.summary_dict['profile'].get('overhead')}\n")
    taus = [t for t in learned.summary_dict["run"]["policy"]["predictor"]["tau_windows"] if t["tau"] is not None]
    e_l, e_f = per_window(learned.requests), per_window(fcfs.requests)
    print("| window (s) | mean e2e, sjf_rank(learned) | mean e2e, fcfs | ratio |")
    print("|---|---|---|---|")
    for w in e_l.index:
        print(f"| {w * WINDOW_S:.0f}-{(w + 1) * WINDOW_S:.0f} | {e_l[w]:.2f} | {e_f[w]:.2f} | {e_l[w] / e_f[w]:.2f} |")
    print("\nranker tau per window of 200 finished requests (time = window end):")
    print(", ".join(f"{t['t_s']:.0f}s: {t['tau']:+.2f}" for t in taus))
    fig, (a, b) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    a.plot([t["t_s"] for t in taus], [t["tau"] for t in taus], "o-")
    a.axvline(300, color="grey", ls=":", label="traffic mix changes")
    a.set(ylabel="Kendall tau (predicted vs true length)", title="Learned ranker after a distribution shift")
    a.legend()
    mid = (np.asarray(e_l.index) + 0.5) * WINDOW_S
    b.plot(mid, e_l.to_numpy(), "o-", label="sjf_rank (learned)")
    b.plot((np.asarray(e_f.index) + 0.5) * WINDOW_S, e_f.to_numpy(), "s--", label="fcfs")
    b.axvline(300, color="grey", ls=":")
    b.set(xlabel="arrival time (s)", ylabel="mean end-to-end latency (s)")
    b.legend()
    for ax in (a, b):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(__file__).resolve().parents[1] / "docs" / "figures" / "distribution_shift.png"
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
