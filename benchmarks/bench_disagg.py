"""A disaggregated cluster's engine time per request against a co-located cluster's, with the same
GPUs and traffic, in one run (``docs/disaggregation.md``):

    python -m benchmarks.bench_disagg [--write]

Two cases: ``diurnal_two_class`` over 600 s at half its load (both designs keep up) and the
shipped ``disaggregated_chat_batch``; each as 2 prefill + 2 decode replicas and as 4 co-located
replicas. Each design runs ``REPEATS`` times, alternating, in this process (imports warm), and
the quickest run of each counts: ``simulate_cluster(per_replica=False)`` from the workload to the
cluster's table. ``--write`` puts the table into benchmarks/results.md (section "Disaggregated
against co-located") and a row into benchmarks/history.csv.
"""
from __future__ import annotations

import csv
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SECTION = "## Disaggregated against co-located"
REPEATS = 5
PD = 'cluster={groups=[{name="prefill",role="prefill",replicas=2},{name="decode",role="decode",replicas=2}]}'
CO = "cluster={replicas=4}"
CASES = [("diurnal_two_class, 600 s at load 0.5", "diurnal_two_class", ["horizon_s=600"], 0.5),
         ("disaggregated_chat_batch", "disaggregated_chat_batch", [], 1.0)]


def _time(name: str, over: list[str], load: float) -> tuple[float, int, int]:
    from sim import load_scenario
    from sim.cluster import simulate_cluster
    sc = load_scenario(name, overrides=over)
    t0 = time.perf_counter()
    res = simulate_cluster(sc, load_scale=load, per_replica=False)
    return time.perf_counter() - t0, len(res.requests), res.summary_dict["run"]["engine_events"]


def measure() -> list[dict]:
    rows = []
    for label, name, over, load in CASES:
        best: dict[str, tuple] = {}
        for _ in range(REPEATS):
            for design, cl in (("co-located", CO), ("2P2D", PD)):
                t, n, ev = _time(name, over + [cl], load)
                if design not in best or t < best[design][0]:
                    best[design] = (t, n, ev)
        (tc, nc, evc), (tp, np_, evp) = best["co-located"], best["2P2D"]
        rows.append({"case": label, "co_us": tc / nc * 1e6, "pd_us": tp / np_ * 1e6, "co_ev": evc / nc,
                     "pd_ev": evp / np_, "ratio": (tp / np_) / (tc / nc), "requests": nc})
    return rows


def build() -> str:
    """Which engine this process runs: the compiled build where ``import sim`` took it."""
    import sim.core.engine
    return "compiled build (mypyc)" if sim.core.engine.__file__.endswith(".so") else "pure Python"


def markdown(rows: list[dict]) -> list[str]:
    md = [SECTION, "", f"{time.strftime('%Y-%m-%d %H:%M')}, {build()}, `python -m benchmarks.bench_disagg`: "
          f"the quickest of {REPEATS} alternating runs of each design, in one process (a ratio of two "
          "times taken together needs no yardstick).", "",
          "| traffic | requests | co-located, µs per request | 2P2D, µs per request | ratio "
          "| engine events per request (co-located / 2P2D) |",
          "|---|---:|---:|---:|---:|---|"]
    for r in rows:
        md.append(f"| {r['case']} | {r['requests']:,} | {r['co_us']:.0f} | {r['pd_us']:.0f} | {r['ratio']:.2f} | "
                  f"{r['co_ev']:.2f} / {r['pd_ev']:.2f} |")
    return md


def write(md: list[str], rows: list[dict]) -> None:
    out = HERE / "results.md"
    text = out.read_text()
    block = "\n".join(md) + "\n"
    if SECTION in text:
        head, rest = text.split(SECTION, 1)
        tail = rest.split("\n## ", 1)
        text = head + block + ("\n## " + tail[1] if len(tail) > 1 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    out.write_text(text)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=HERE.parent).stdout.strip()
    with open(HERE / "history.csv", "a", newline="") as f:
        csv.writer(f).writerow([time.strftime("%Y-%m-%d %H:%M"), commit, "", f"python -m benchmarks.bench_disagg ({build()}): "
                                + "; ".join(f"{r['case']} 2P2D / co-located engine time per request {r['ratio']:.2f}"
                                            for r in rows)])


def main() -> None:
    rows = measure()
    md = markdown(rows)
    print("\n".join(md))
    if "--write" in sys.argv:
        write(md, rows)


if __name__ == "__main__":
    main()
