"""Fit each engine-overhead preset to the published rows declared ``split = fit`` for it.

Least squares on relative error (simulated / published - 1), every term non-negative
(``scipy.optimize.least_squares`` with bounds; the simulator is in the loop, so the Jacobian is
taken by finite differences). The rows marked ``held-out`` never enter the fit; the report shows
them separately. The fitted terms, the rows used and the residuals are written into the preset's
metadata in ``sim/core/overheads.json``.

    python -m calibrate.fidelity.fit                 # fit every preset, write sim/core/overheads.json
    python -m calibrate.fidelity.fit --preset sglang --dry-run
    python -m calibrate.fidelity.fit --flops-efficiency h100-sxm   # one GPU's achieved FLOPs fraction

``--flops-efficiency DEVICE`` fits the analytic profiles' achieved fraction of peak dense FLOP/s
for one GPU (calibrate/roofline.py, ``flops_efficiency``) on the fit rows priced with that GPU's
profiles, every preset held at its current terms: a bounded scalar minimisation of the same
soft-L1 loss. It prints the value; the value is written into that device's constants by hand,
with the fit's date and rows as its source.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json

import numpy as np
from scipy.optimize import least_squares

from calibrate.fidelity.suite import load_table, run_table, summary
from sim.core.overhead import PRESETS_PATH

#: The terms fitted, with the unit the optimiser works in (so that all are of order 1..100).
#: ``sample_s`` is not fitted: across the table's models the vocabulary varies too little (128k
#: to 152k) to tell it from ``seq_s``; it is set from an estimate (SAMPLE_S) and ``seq_s`` takes the rest.
FITTED = {"step_s": 1e-6, "seq_s": 1e-6, "admit_s": 1e-6, "allreduce_latency_s": 1e-6, "frontend_s": 1e-6}
#: Presets whose fit rows identify only some terms: those are fitted, the others keep the
#: preset's current values. vllm-0.4's rows are all batch-1 runs (one sequence per step, no
#: admissions during decode, no front end): per step and per sequence cannot be told apart,
#: so ``seq_s`` stays the vllm-0.6 value it starts from and the step cost takes the rest; its
#: context-dependent rows identify the decode kernel's KV re-reads.
#: vllm-v1 has no tensor-parallel fit row, so its all-reduce latency is not fitted either.
FITTED_BY_PRESET = {"vllm-0.4": ("step_s", "allreduce_latency_s", "kv_reread"),
                    "vllm-v1": ("step_s", "seq_s", "admit_s", "frontend_s")}
#: Presets derived from a fitted one (no fit rows of their own): base preset and the terms added.
#: sglang-0.5 is SGLang 0.3's fit plus the overlap scheduler SGLang 0.4 made the default.
DERIVED = {"sglang-0.5": ("sglang", {"overlap_schedule": 1})}
#: The optimiser's unit (order-1 values) and upper bound of terms that are not seconds.
UNITS = {**FITTED, "kv_reread": 1e-2}
UPPER = {"kv_reread": 1.0}
#: s per sequence per vocabulary entry: a softmax + sampling pass reading fp32 logits once or twice
#: at about 1 TB/s effective (about 1 us per sequence for a 128k vocabulary) - an estimate.
SAMPLE_S = 8e-12

#: Sources each preset's metadata cites (the fit rows' publishers).
SOURCES = {
    "vllm-0.6": ["vLLM performance CI (Buildkite vllm/performance-benchmark, build 9515 and A100 runs, late 2024)",
                 "QwenLM/Qwen2.5 docs/source/benchmark/speed_benchmark.rst (vLLM 0.6.3, A100)",
                 "vLLM blog 2024-09-05 'vLLM v0.6.0': GPU busy 38 % of the time for Llama-3-8B on H100 in v0.5.3 "
                 "(why per-step and per-sequence CPU terms exist)"],
    "vllm-v1": ["gpustack/gpustack docs/performance-lab (vLLM 0.11.0 default-settings runs, H100 / A100)",
                "vLLM blog 2026-04-22 FP8 KV cache post (held out)"],
    "vllm-0.4": ["QwenLM/Qwen2.5 docs/source/benchmark/speed_benchmark.rst, Qwen2 tables (vLLM 0.4.2, A100)",
                 "vLLM 0.4 decodes with its own paged-attention kernel, one thread block per query head "
                 "(why the KV re-read term exists)"],
    "sglang": ["sgl-project/sglang benchmark/benchmark_vllm_060/README.md (SGLang 0.3.0, A100)",
               "gpustack/gpustack docs/performance-lab (SGLang 0.5, held out)"],
}


def _rounded(terms: dict) -> dict:
    """4 significant digits; terms under 100 ns (per unit) are written as 0 (the bound the
    optimiser stops at, far below anything the rows can see)."""
    return {k: 0.0 if (v < 1e-7 and k != "sample_s") else float(f"{v:.4g}") for k, v in terms.items()}


def fitted_terms(preset: str) -> tuple[str, ...]:
    """The terms the fit of ``preset`` moves (the others keep their current values)."""
    return FITTED_BY_PRESET.get(preset, tuple(FITTED))


def _overhead(x: np.ndarray, names: tuple[str, ...] = tuple(FITTED), base: dict | None = None) -> dict:
    """An inline overhead table: ``base`` (the preset's current terms), sampling at SAMPLE_S, and
    the fitted ``names`` from the optimiser's ``x`` (in UNITS)."""
    return {**(base or {}), "sample_s": SAMPLE_S, **{k: float(v) * UNITS[k] for k, v in zip(names, x)}}


def fit_preset(preset: str, df, x0: dict | None = None, verbose: bool = True) -> tuple[dict, object]:
    """Fit ``preset`` on its fit rows; returns (terms, scipy result)."""
    rows = df[(df.overhead == preset) & (df.split == "fit")]
    if rows.empty:
        raise ValueError(f"no fit rows for preset '{preset}'")
    names = fitted_terms(preset)
    base = {k: v for k, v in (x0 or {}).items() if k not in names}
    start = np.array([(x0 or {}).get(k, 0.0) / UNITS[k] for k in names])
    upper = np.array([UPPER.get(k, np.inf) / UNITS[k] for k in names])
    n_eval = [0]

    def residuals(x):
        res = run_table(rows, overhead={preset: _overhead(np.clip(x, 0.0, upper), names, base)})
        n_eval[0] += 1
        if verbose:
            print(f"  eval {n_eval[0]:3d}: " + " ".join(f"{v:8.3g}" for v in x)
                  + f"  median |err| {res.error.abs().median() * 100:5.1f} %", flush=True)
        return res.error.to_numpy()

    sol = least_squares(residuals, np.clip(start, 0.0, upper), bounds=(0.0, upper), diff_step=0.05,
                        x_scale=np.maximum(np.abs(start), 1.0), max_nfev=12, loss="soft_l1", f_scale=0.1)
    return _overhead(sol.x, names, base), sol


def _soft_l1(err: np.ndarray, f_scale: float = 0.1) -> float:
    """scipy's soft-L1 loss of the relative errors (the objective of :func:`fit_preset`)."""
    return float(np.sum(2 * f_scale**2 * (np.sqrt(1 + (err / f_scale) ** 2) - 1)))


def fit_flops_efficiency(device: str, df, bounds=(0.3, 0.9), verbose: bool = True) -> tuple[float, object]:
    """Fit ``device``'s achieved FLOPs fraction on the fit rows whose profile is that device's;
    returns (value, scipy result). Profiles are regenerated from calibrate.roofline per trial."""
    import re
    import tempfile
    from pathlib import Path

    from scipy.optimize import minimize_scalar

    from calibrate.roofline import roofline_profile
    rows = df[(df.split == "fit") & df.profile.str.startswith(device + "-")].copy()
    if rows.empty:
        raise ValueError(f"no fit rows priced with a '{device}' profile")
    with tempfile.TemporaryDirectory(prefix="priosim-fit-eff-") as d:
        def loss(eff):
            def path(name):
                m = re.match(r"(.*)-tp(\d+)$", name[len(device) + 1:])
                shape, tp = (m.group(1), int(m.group(2))) if m else (name[len(device) + 1:], 1)
                f = Path(d) / f"{name}-{eff:.6f}.json"
                f.write_text(json.dumps(roofline_profile(device, shape, "bf16", tp, flops_efficiency=eff)))
                return str(f)
            trial = rows.assign(profile=rows.profile.map(path))
            val = _soft_l1(run_table(trial).error.to_numpy())
            if verbose:
                print(f"  flops_efficiency {eff:.4f}: loss {val:.5f}", flush=True)
            return val
        sol = minimize_scalar(loss, bounds=bounds, method="bounded", options={"xatol": 0.005})
    return float(sol.x), sol


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", action="append", help="fit only this preset (repeatable)")
    ap.add_argument("--dry-run", action="store_true", help="print the fit, do not write sim/core/overheads.json")
    ap.add_argument("--flops-efficiency", metavar="DEVICE",
                    help="fit this GPU's achieved FLOPs fraction (calibrate.roofline device key) and print it")
    args = ap.parse_args(argv)
    df = load_table()
    if args.flops_efficiency:
        n = int(((df.split == "fit") & df.profile.str.startswith(args.flops_efficiency + "-")).sum())
        print(f"fitting {args.flops_efficiency} flops_efficiency on {n} rows", flush=True)
        eff, _ = fit_flops_efficiency(args.flops_efficiency, df)
        print(f"  {args.flops_efficiency}: flops_efficiency={eff:.3f}")
        return
    doc = json.loads(PRESETS_PATH.read_text())
    for preset in args.preset or ["vllm-0.6", "vllm-v1", "sglang", "vllm-0.4"]:
        cur = doc[preset]["terms"]
        print(f"fitting {preset} on {int(((df.overhead == preset) & (df.split == 'fit')).sum())} rows", flush=True)
        terms, sol = fit_preset(preset, df, x0=cur)
        terms = _rounded(terms)
        res = run_table(df[df.overhead == preset], overhead={preset: terms})
        s = summary(res)
        print(f"  {preset}: " + ", ".join(f"{k}={v:.4g}" for k, v in terms.items()))
        print(f"  fit rows: median {s['fit']['median'] * 100:.1f} %, worst {s['fit']['worst'] * 100:.1f} %; "
              f"held-out: median {s['held-out']['median'] * 100:.1f} %, worst {s['held-out']['worst'] * 100:.1f} %")
        doc[preset]["terms"] = {**{k: cur.get(k, 0.0) for k in ("allreduce_bytes_per_s",)}, **terms}
        meta = doc[preset].setdefault("meta", {})
        meta.update({
            "status": "fitted", "fitted_by": "python -m calibrate.fidelity.fit",
            "date": _dt.date.today().isoformat(), "sources": SOURCES.get(preset, []),
            "fit_rows": sorted(res[res.split == "fit"].id), "held_out_rows": sorted(res[res.split == "held-out"].id),
            "fit_median_abs_error": round(s["fit"]["median"], 4), "fit_worst_abs_error": round(s["fit"]["worst"], 4),
            "held_out_median_abs_error": round(s["held-out"]["median"], 4),
            "held_out_worst_abs_error": round(s["held-out"]["worst"], 4),
            "method": "scipy.optimize.least_squares on relative error, terms >= 0, soft-L1 loss (f_scale 0.1)",
        })
        meta["fitted_terms"] = list(fitted_terms(preset))
        if not (df[(df.overhead == preset) & (df.split == "fit")].tp > 1).any():
            meta["note"] = ("no tensor-parallel fit row: allreduce_latency_s is not identified by this fit "
                            "and is not fitted (it keeps its value)")
        else:
            meta.pop("note", None)
        for name, (base, extra) in DERIVED.items():
            if base == preset:  # a derived preset follows its base's refit
                doc[name]["terms"] = {**doc[preset]["terms"], **extra}
    if not args.dry_run:
        PRESETS_PATH.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {PRESETS_PATH}")


if __name__ == "__main__":
    main()
