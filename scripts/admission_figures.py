"""The figures of docs/admission.md ("Measured"): the fairness accountant on ``tenant_flood`` and
deadline shedding on ``overload``, each side by side with the safeguard off, at the scenarios'
own seed and at the profile's declared engine overhead unless ``--overhead`` names another.

* ``tenant_flood`` as shipped (30 s, no drain), ``fairness.enabled`` false / true: the small
  tenant's share of all output tokens (``tenants.small.token_share``), its TTFT p99, and the
  accountant's largest counter gap against its bound;
* ``tenant_flood`` shortened to 15 s, the variant ``tests/test_fairness.py`` runs (priced without
  engine overhead, as the test is): the small tenant's share of output tokens over the seconds in
  which both tenants had a request queued (the test's definition), and its TTFT p99;
* ``overload`` as shipped (60 s, spike 10-50 s), ``admission.shed`` none / deadline: goodput
  (requests/s meeting their SLOs, ``overall.goodput_rps``), interactive requests shed, and the
  batch class's output tokens/s during the spike and after it, and the deadline estimator's
  accuracy (``run.admission.ttft_actual_over_estimate_p50/p90``, admitted requests).

Prints Markdown. Run: ``python -m scripts.admission_figures [--overhead none]`` (a few seconds
per run, ten runs).
"""
from __future__ import annotations

import argparse

import numpy as np

from sim import load_scenario, simulate

SPIKE = (10.0, 50.0)  # overload.toml: interactive at 65 req/s from 10 s to 50 s


def _run(name: str, overrides: list[str]):
    return simulate(load_scenario(name, overrides=overrides))


def share_while_both_backlogged(res) -> float:
    """Small tenant's share of output tokens over the time-series instants at which both tenants
    had a request arrived and not yet admitted (tests/test_fairness.py's definition)."""
    rq = res.requests
    ts = res.timeseries.drop_duplicates("t_s").set_index("t_s")
    both = []
    for t in ts.index:
        if all(bool(((g["arrival_s"] <= t) & ~(g["admitted_s"] <= t)).any())
               for g in (rq[rq["tenant"] == ten] for ten in ("small", "flood"))):
            both.append(t)
    a = ts.loc[both, "tenant_tokens_per_s[small]"].sum()
    b = ts.loc[both, "tenant_tokens_per_s[flood]"].sum()
    return float(a / (a + b))


def flood(pricing: list[str]) -> list[str]:
    out = ["### tenant_flood (30 s, as shipped)", "",
           "| fairness | small tenant's share of output tokens | small / flood output tokens/s "
           "| small tenant TTFT p99 (s) | small requests finished / arrived | max counter gap / bound |",
           "|---|---:|---:|---:|---:|---:|"]
    for on in (False, True):
        s = _run("tenant_flood", [*pricing, f"fairness.enabled={str(on).lower()}"]).summary_dict
        sm, fl = s["tenants"]["small"], s["tenants"]["flood"]
        fr = s["run"]["policy"]["fairness"]
        out.append(f"| {'on' if on else 'off'} | {sm['token_share']:.1%} | {sm['output_tokens_per_s']:,.0f} / "
                   f"{fl['output_tokens_per_s']:,.0f} | {sm['ttft_p99_s']:.1f} | {sm['finished']} / {sm['arrived']} "
                   f"| {fr['max_counter_gap']:,.0f} / {fr['counter_gap_bound']:,.0f} |")
    out += ["", "### tenant_flood, 15 s (the variant tests/test_fairness.py runs)", "",
            "| pricing | fairness | small share while both backlogged | small tenant TTFT p99 (s) |",
            "|---|---|---:|---:|"]
    variants = [("none (the test)", ['engine.overhead="none"'])]
    if pricing != ['engine.overhead="none"']:
        variants.append((_pricing_name(pricing), pricing))
    for label, pr in variants:
        for on in (False, True):
            res = _run("tenant_flood", [*pr, "horizon_s=15", f"fairness.enabled={str(on).lower()}"])
            out.append(f"| {label} | {'on' if on else 'off'} | {share_while_both_backlogged(res):.1%} "
                       f"| {res.summary_dict['tenants']['small']['ttft_p99_s']:.1f} |")
    return out


def overload(pricing: list[str]) -> list[str]:
    out = ["### overload (60 s, spike to 65 req/s from 10 s to 50 s)", "",
           "| shed | goodput (req/s) | interactive shed | interactive TTFT p99 (s) | seconds with shedding "
           "| batch tokens/s during the spike (mean) | batch at 0 tokens/s during the spike | batch tokens/s, 50-60 s "
           "| TTFT actual / estimate, p50 / p90 |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for shed in ("none", "deadline"):
        res = _run("overload", [*pricing, f"admission.shed={shed}"])
        s = res.summary_dict
        inter = s["classes"]["interactive"]
        rq = res.requests
        shed_s = np.floor(rq.loc[rq["reject_reason"] == "deadline", "arrival_s"])
        span = f"{shed_s.min():.0f}-{shed_s.max() + 1:.0f} s" if len(shed_s) else "-"
        ts = res.timeseries
        batch = ts[ts["class"] == "batch"].set_index("t_s")["tokens_per_s"]
        during = batch[(batch.index >= SPIKE[0]) & (batch.index < SPIKE[1])]
        after = batch[batch.index >= SPIKE[1]]
        adm = s["run"].get("admission") or {}
        acc = (f"{adm['ttft_actual_over_estimate_p50']:.2f} / {adm['ttft_actual_over_estimate_p90']:.2f}"
               if adm.get("ttft_actual_over_estimate_p50") is not None else "-")
        out.append(f"| {shed} | {s['overall']['goodput_rps']:.1f} | {inter['reject_reasons'].get('deadline', 0)} "
                   f"| {inter['ttft_p99_s']:.1f} | {span} | {during.mean():,.0f} | {_zero_run(during)} "
                   f"| {after.mean():,.0f} | {acc} |")
    return out


def _zero_run(tokens_per_s) -> str:
    """The longest run of whole seconds at 0 tokens/s, as 'a-b s' (b exclusive), or '-'."""
    best, start = (0, None, None), None
    for t, v in tokens_per_s.items():
        if v == 0:
            start = t if start is None else start
            if t + 1 - start > best[0]:
                best = (t + 1 - start, start, t + 1)
        else:
            start = None
    return f"{best[1]:.0f}-{best[2]:.0f} s" if best[0] else "-"


def _pricing_name(pricing: list[str]) -> str:
    return pricing[0].split("=", 1)[1].strip('"') if pricing else "default (the profile's preset)"


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m scripts.admission_figures", description=__doc__.splitlines()[0])
    ap.add_argument("--overhead", default=None,
                    help="engine overhead preset for every run (default: the profile's declared preset)")
    args = ap.parse_args()
    pricing = [f'engine.overhead="{args.overhead}"'] if args.overhead else []
    print(f"Engine overhead: {_pricing_name(pricing)}; each scenario's own seed.\n")
    print("\n".join(flood(pricing) + [""] + overload(pricing)))


if __name__ == "__main__":
    main()
