"""Write docs/validation.md: simulated vs theoretical values for the five theory cases.

Runs the same cases as tests/test_theory.py (tests/theory_cases.py), pooled over the same seeds,
and writes a Markdown table. Usage: ``python -m scripts.validation_table [--out docs/validation.md]``.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from tests import theory_cases as tc

ROOT = Path(__file__).resolve().parent.parent


def rows() -> list[tuple[str, str, float, float, str]]:
    out = []
    sim, th = np.mean([tc.case_pk(s) for s in tc.SEEDS], axis=0)
    out.append(("FCFS, M/G/1, load 0.7", "mean wait (s), Pollaczek-Khinchine", sim, th, "5 %"))
    for pre, label, formula in ((False, "priority, never", "mean wait (s), Cobham"),
                                (True, "priority, strict + swap (zero cost)", "mean sojourn (s), preemptive-resume")):
        runs = [tc.case_priority(s, pre)[:2] for s in tc.SEEDS]
        sim = np.mean([r[0] for r in runs], axis=0)
        th = np.mean([r[1] for r in runs], axis=0)
        for k in range(3):
            out.append((f"{label}, class {k}", formula, sim[k], th[k], "8 %"))
    sims = [tc.case_wfq(s)[0] for s in (1, 2)]
    th = tc.case_wfq(1)[1]
    sim = np.mean(sims, axis=0)
    for k, n in enumerate(tc.WFQ_WEIGHTS):
        out.append((f"wfq (8, 2, 1), class {n}", "token share (%), w_k / sum w", 100 * sim[k], 100 * th[k], "3 points"))
    for seed in tc.SEEDS[:2]:
        w0p, w3p, _ = tc.case_aging(seed, "priority")
        w0a, w3a, smax = tc.case_aging(seed, "aging")
        bound = 3 / tc.AGING_ALPHA + smax
        out.append((f"aging alpha=1, seed {seed}", "max W3 - max W0 (s) <= 3/alpha + S_max", w3a - w0a, bound, "bound"))
        out.append((f"priority (no aging), seed {seed}", "max W3 - max W0 (s)", w3p - w0p, bound, "exceeds bound"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=str(ROOT / "docs" / "validation.md"))
    args = ap.parse_args()
    lines = [
        "# Validation against queueing theory",
        "",
        "Produced by `python -m scripts.validation_table` from the cases of `tests/test_theory.py`",
        "(`tests/theory_cases.py`). The engine is configured as one M/G/1 server: `max_num_seqs = 1`,",
        f"an inline linear profile with a constant step of {tc.STEP_S * 1e3:g} ms and no per-token cost,",
        "one-token prompts, exponential output lengths (mean 20 tokens, E[S] = 0.1 s), Poisson arrivals",
        "per class. Theory is computed from each run's own arrival counts and service-time moments;",
        f"values are means over seeds {', '.join(map(str, tc.SEEDS))} (WFQ: 1, 2; aging: per seed).",
        "",
        "| case | quantity, formula | simulated | theory | rel. error | tolerance |",
        "|---|---|---:|---:|---:|---|",
    ]
    for case, what, sim, th, tol in rows():
        err = "" if tol in ("bound", "exceeds bound") else f"{100 * (sim - th) / th:+.1f} %"
        lines.append(f"| {case} | {what} | {sim:.4g} | {th:.4g} | {err} | {tol} |")
    lines += [
        "",
        "Formulas: P-K W = λE[S²] / (2(1-ρ)); Cobham W_k = W0 / ((1-s_{k-1})(1-s_k)),",
        "W0 = Σ λ_i E[S_i²]/2, s_k = ρ_0+…+ρ_k; preemptive-resume T_k = E[S_k]/(1-s_{k-1}) +",
        "(Σ_{i≤k} λ_i E[S_i²]/2) / ((1-s_{k-1})(1-s_k)); WFQ share w_k/Σw; aging bound",
        "(p_low - p_high)/α + one service time. For the aging rows, *theory* is the bound.",
        "",
    ]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
