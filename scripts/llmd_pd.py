"""llm-d's measured P/D runs against co-located vLLM, replayed: docs/disaggregation-llmd.md.

``python -m scripts.llmd_pd DIR [--write]``: DIR holds llm-d-benchmark's
``collected/data/openshift/exp-7`` tree (``{H100,A100}/{design}/benchmark_*.json``; fetch it
from ``llm-d/llm-d-benchmark`` at commit ``77115656``). Every file is replayed
(:func:`calibrate.runs.replay`) on its GPU's profile with its design as a ``[cluster]``
(:data:`DESIGNS`); the table has measured and simulated TTFT, TPOT, median ITL and throughput
per run, then per GPU and pair the disaggregated / co-located ratio of mean TTFT and mean TPOT,
measured and simulated, against the tolerance the page states (:data:`TOLERANCE`). ``--write``
puts the tables into the page's Results section.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

PROFILES = {"H100": "h100-sxm-llama-3-8b", "A100": "a100-80gb-llama-3-8b"}
_PD = ('cluster={{link="nvlink",groups=[{{name="prefill",role="prefill",replicas={p}}},'
       '{{name="decode",role="decode",replicas=1}}]}}')
#: design folder -> (the --set that builds it, GPUs, the co-located design it is compared with)
DESIGNS = {"vllm-2replicas": ("cluster={replicas=2}", 2, None),
           "vllm-3replicas": ("cluster={replicas=3}", 3, None),
           "llm-d-1p1d": (_PD.format(p=1), 2, "vllm-2replicas"),
           "llm-d-2p1d": (_PD.format(p=2), 3, "vllm-3replicas")}
METRICS = ("ttft_mean_ms", "tpot_mean_ms", "itl_p50_ms", "request_throughput")
#: the page's tolerance on the ratios (stated before the disaggregated runs), and the band
#: around 1 inside which the sign of a measured ratio is not judged
TOLERANCE, SIGN_BAND = 0.15, 0.05
PAGE = Path(__file__).resolve().parents[1] / "docs" / "disaggregation-llmd.md"


#: the design a calibrated reading is fitted on (``priosim calibrate --from-runs`` on its runs)
FIT_ON = "vllm-2replicas"


def calibrated_profiles(root: Path, out: Path) -> dict[str, str]:
    """Per GPU, the profile ``calibrate --from-runs`` fits on its :data:`FIT_ON` runs (the
    user's workflow: calibrate on the engine one runs, then ask about another design), written
    into ``out``; its path by GPU."""
    import json

    from calibrate.runs import read_run
    from calibrate.runs.fit import fit_runs, profile_document

    got = {}
    for gpu, base in PROFILES.items():
        files = sorted(root.glob(f"{gpu}/{FIT_ON}/benchmark_*.json"))
        if not files:
            continue
        fit = fit_runs([read_run(f) for f in files], base, [DESIGNS[FIT_ON][0]], loro=False)
        path = out / f"{gpu.lower()}-llmd-fit.json"
        path.write_text(json.dumps(profile_document(fit, path.stem, [DESIGNS[FIT_ON][0]])))
        got[gpu] = str(path)
    return got


def replay_all(root: Path, profiles: dict[str, str] = PROFILES) -> list[dict]:
    from calibrate.runs import read_run, replay

    rows = []
    for f in sorted(root.glob("*/*/benchmark_*.json")):
        gpu, design = f.parent.parent.name, f.parent.name
        if gpu not in profiles or design not in DESIGNS:
            continue
        cmp = replay(read_run(f), [DESIGNS[design][0]], profile=profiles[gpu])
        rows.append({"gpu": gpu, "design": design, "file": f.name,
                     **{m: (cmp.metrics[m]["measured"], cmp.metrics[m]["simulated"]) for m in METRICS}})
    return rows


def ratios(rows: list[dict]) -> list[dict]:
    """Per GPU and disaggregated design: mean over repeats of each metric, divided by the
    co-located design's, measured and simulated."""
    out = []
    for gpu in PROFILES:
        for design, (_, gpus, base) in DESIGNS.items():
            if base is None:
                continue
            pd_rows = [r for r in rows if r["gpu"] == gpu and r["design"] == design]
            co_rows = [r for r in rows if r["gpu"] == gpu and r["design"] == base]
            if not pd_rows or not co_rows:
                continue
            row = {"gpu": gpu, "pair": f"{design} / {base}", "gpus": gpus}
            ok = True
            for m in ("ttft_mean_ms", "tpot_mean_ms"):
                meas = np.mean([r[m][0] for r in pd_rows]) / np.mean([r[m][0] for r in co_rows])
                sim = np.mean([r[m][1] for r in pd_rows]) / np.mean([r[m][1] for r in co_rows])
                row[m] = (meas, sim)
                ok &= abs(sim / meas - 1) <= TOLERANCE
                if abs(meas - 1) > SIGN_BAND:
                    ok &= (sim > 1) == (meas > 1)
            row["reproduced"] = ok
            out.append(row)
    return out


def markdown(rows: list[dict], rat: list[dict]) -> list[str]:
    md = ["| GPU | design | file | TTFT mean, ms | TPOT mean, ms | ITL median, ms | requests/s |",
          "|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [f"{r[m][0]:.4g} / {r[m][1]:.4g} ({r[m][1] / r[m][0] - 1:+.0%})" for m in METRICS]
        md.append(f"| {r['gpu']} | {r['design']} | {r['file'].removeprefix('benchmark_')} | " + " | ".join(cells) + " |")
    md += ["", "Each cell: measured / simulated (error).", "",
           "| GPU | disaggregated / co-located | GPUs | TTFT mean ratio, measured / simulated | "
           "TPOT mean ratio, measured / simulated | within ±15 % (and the side of 1) |", "|---|---|---:|---|---|---|"]
    for r in rat:
        t, p = r["ttft_mean_ms"], r["tpot_mean_ms"]
        md.append(f"| {r['gpu']} | {r['pair']} | {r['gpus']} | {t[0]:.3f} / {t[1]:.3f} | {p[0]:.3f} / {p[1]:.3f} | "
                  f"{'yes' if r['reproduced'] else 'no'} |")
    return md


def main(argv: list[str]) -> None:
    import tempfile

    args = [a for a in argv if not a.startswith("--")]
    if not args:
        sys.exit("usage: python -m scripts.llmd_pd DIR [--write]  (DIR: llm-d-benchmark's exp-7 tree)")
    root = Path(args[0])
    rows = replay_all(root)
    md = ["### As shipped (each GPU's profile, the `vllm-v1` pricing)", ""] + markdown(rows, ratios(rows))
    with tempfile.TemporaryDirectory() as tmp:
        fitted = calibrated_profiles(root, Path(tmp))
        rows_c = replay_all(root, fitted)
    md += ["", f"### Calibrated on the {FIT_ON} runs (`priosim calibrate --from-runs`, then replayed)", ""]
    md += markdown(rows_c, ratios(rows_c))
    print("\n".join(md))
    if "--write" in argv:
        text = PAGE.read_text()
        head, rest = text.split("## Results", 1)
        keep = rest.split("\n## ", 1)
        PAGE.write_text(head + "## Results\n\n`python -m scripts.llmd_pd DIR --write`, pure Python (under a minute):\n\n"
                        + "\n".join(md) + "\n" + ("\n## " + keep[1] if len(keep) > 1 else ""))


if __name__ == "__main__":
    main(sys.argv[1:])
