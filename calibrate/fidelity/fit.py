"""Fit each engine-overhead preset to the published rows declared ``split = fit`` for it.

Least squares on relative error (simulated / published - 1), every term between 0 and a physical
upper bound (:data:`BOUNDS`, each with its reason in :data:`WHY`; ``scipy.optimize.least_squares``
with bounds; the simulator is in the loop, so the Jacobian is taken by finite differences). The
rows marked ``held-out`` never enter the fit; the report shows them separately. The fitted terms,
the rows used and the residuals are written into the preset's metadata in ``sim/core/overheads.json``.

    python -m calibrate.fidelity.fit                 # fit every preset, write sim/core/overheads.json
    python -m calibrate.fidelity.fit --preset sglang --dry-run
    python -m calibrate.fidelity.fit --loso          # leave-one-source-out evaluation (loso.csv)
    python -m calibrate.fidelity.fit --flops-efficiency h100-sxm   # one GPU's achieved FLOPs fraction

``--loso``: for each independent publisher (the table's ``source_kind``), every engine era is
fitted on the rows of the *other* publishers (all their reproducible rows of that era, fit and
held-out alike; not ``host`` rows, which describe their publisher's host) and the held-out
publisher's rows, all of them, are simulated with those terms (:func:`loso`).

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
import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from calibrate.fidelity.suite import HELD_OUT, load_table, run_table, summary
from sim.core.overhead import PRESETS_PATH

#: The last leave-one-source-out evaluation (``--loso``), which docs/fidelity.md shows.
LOSO_PATH = Path(__file__).resolve().parent / "loso.csv"

#: The terms fitted, with the unit the optimiser works in (so that all are of order 1..100).
#: ``sample_s`` is not fitted: across the table's models the vocabulary varies too little (128k
#: to 152k) to tell it from ``seq_s``; it is set from an estimate (SAMPLE_S) and ``seq_s`` takes the rest.
FITTED = {"step_s": 1e-6, "seq_s": 1e-6, "admit_s": 1e-6, "allreduce_latency_s": 1e-6, "frontend_s": 1e-6,
          "frontend_busy_s": 1e-6}
#: Each term's physical range (s; kv_reread a fraction): no fit may leave it. Lower bounds are 0.
BOUNDS = {"step_s": (0.0, 5e-3), "seq_s": (0.0, 200e-6), "admit_s": (0.0, 2e-3),
          "allreduce_latency_s": (0.0, 100e-6), "frontend_s": (0.0, 30e-3), "frontend_busy_s": (0.0, 25e-3),
          "kv_reread": (0.0, 1.0)}
#: Tighter ranges for one engine era (the term's WHY_PRESET says why).
PRESET_BOUNDS = {"vllm-v1": {"seq_s": (0.0, 30e-6), "admit_s": (0.0, 0.3e-3)}}
#: Why each upper bound is where it is (docs/fidelity.md prints these).
WHY = {
    "step_s": "one scheduler call, input preparation and the step's kernel launches on the host CPU: "
              "vLLM 0.5.3, the slowest era measured, kept an H100 busy only 38 % of the time on an 8B model "
              "(vLLM v0.6.0 blog), i.e. a few ms of CPU per ~5 ms step; 5 ms is above that",
    "seq_s": "per-sequence Python bookkeeping of a step (block table, sampling metadata, output object, "
             "incremental detokenisation): tens of us in vLLM V0; 200 us would make a 256-sequence batch "
             "spend 50 ms of CPU per step, ten times a decode step's GPU time",
    "admit_s": "taking a new request into the engine (request object, prefix-cache hashes of its blocks, "
               "block allocation; the prompt is tokenised once): a 1k-token prompt tokenises in about 1 ms, "
               "so 2 ms per admitted request",
    "allreduce_latency_s": "a small-message NCCL all-reduce: 10-30 us over NVLink, up to about 100 us over "
                           "PCIe; on top of the profile's own 10 us",
    "frontend_s": "API server to first streamed chunk outside the GPU step: HTTP parsing, chat template, "
                  "tokenisation, hand-off to the engine process, detokenising and sending the first chunk; "
                  "published TTFTs of today's vLLM at light load are 25-50 ms in total, so 30 ms",
    "frontend_busy_s": "the API server's serial CPU work per request (one asyncio process: HTTP, chat template, "
                       "tokenisation, hand-off, then detokenising and streaming every chunk back): a single "
                       "API-server process becomes the bottleneck of a fast GPU (vLLM RFC 'Scale the API server "
                       "across multiple CPUs', github.com/vllm-project/vllm/issues/12705, February 2025, which led "
                       "to --api-server-count), and vLLM's 2023 API server kept an A100 half as busy as the LLM class "
                       "on a 13B model (github.com/vllm-project/vllm/issues/580); a V1 server must still keep up "
                       "with the fastest served runs in the table (1000 ShareGPT requests at 48 req/s on one H100, "
                       "at most 21 ms a request at full load), so 25 ms",
    "kv_reread": "a fraction: 0 reads each KV head once, 1 once per query head",
}
#: Why a preset's own range is tighter (docs/fidelity.md prints these).
WHY_PRESET = {
    ("vllm-v1", "seq_s"): "the V1 engine core keeps a persistent batch and applies only each step's changes to "
                          "it, and detokenisation and output objects moved to the API-server process (vLLM blog "
                          "2025-01-27 'vLLM V1'): a few us of scheduler bookkeeping per running sequence, so 30 us "
                          "(256 sequences: under 8 ms a step)",
    ("vllm-v1", "admit_s"): "the V1 engine core only schedules a new request (request object, prefix-cache "
                            "hashes, block allocation: sub-millisecond); tokenisation and the rest of a request's "
                            "CPU work run in the API-server process (frontend_s, frontend_busy_s), so 0.3 ms",
}
#: Presets whose fit rows identify only some terms: those are fitted, the others keep the
#: preset's current values or take another preset's (SHARED). vllm-0.4's rows are all batch-1 runs
#: (one sequence per step, one admission, no front end): per step and per sequence cannot be told
#: apart, so ``seq_s`` and ``admit_s`` are vllm-0.6's and the step cost takes the rest; its
#: context-dependent rows identify the decode kernel's KV re-reads. vllm-v1 has no
#: tensor-parallel fit row, so its all-reduce latency is not fitted either. The vLLM V0 fit rows
#: are offline runs (the LLM class: no API server) whose front end is not seen, so it is shared.
FITTED_BY_PRESET = {"vllm-0.6": ("step_s", "seq_s", "admit_s", "allreduce_latency_s"),
                    "vllm-0.4": ("step_s", "allreduce_latency_s", "kv_reread"),
                    "vllm-v1": ("step_s", "seq_s", "admit_s", "frontend_busy_s"),
                    "sglang": ("step_s", "seq_s", "admit_s", "allreduce_latency_s", "frontend_s"),
                    "sglang-0.5": ("step_s", "seq_s", "admit_s", "allreduce_latency_s", "frontend_s")}
#: Terms a preset takes from another preset's fit (that one is fitted first). The vLLM eras' front
#: end is SGLang 0.3's, fitted on sgl-project's benchmark_vllm_060 runs: the same benchmark client
#: on the same hosts served vLLM 0.6.0 too, and both servers are a Python OpenAI-compatible front
#: end in a process of its own handing requests to the engine over ZMQ (vLLM from 0.6.0, V1 too;
#: vLLM 0.4 ran it in the engine's process, so its value is a lower estimate). The V0 fit rows never
#: identify it; V1's light-load TTFT rows come from one publisher's hosts, whose API server is
#: slower than the others' (split ``host``), so V1's fit would price that host for everyone.
SHARED = {"vllm-0.6": {"frontend_s": "sglang"}, "vllm-v1": {"frontend_s": "sglang"},
          "vllm-0.4": {"seq_s": "vllm-0.6", "admit_s": "vllm-0.6", "frontend_s": "sglang"}}
#: Presets derived from a fitted one (no fit rows of their own): base preset and the terms added.
#: None now: sglang-0.5 was SGLang 0.3's fit plus the overlap scheduler SGLang 0.4 made the
#: default until SGLang 0.4+ rows of two publishers (GPUStack's 0.5, sgl-project's PR #6168 runs
#: of 0.4.6) came into the table; it is an era of its own, fitted on them, its overlap_schedule
#: term kept (it is not fitted). SGLang 0.4's batch scheduler is another engine's CPU path (LMSYS
#: blog 2024-12-04 'SGLang v0.4: zero-overhead batch scheduler'), so 0.3's per-step terms do not
#: carry over, as vLLM V0's do not to V1.
#: vllm-v1-async: vLLM V1 with async scheduling (the default from vLLM 0.14, PR #27614): V1's
#: CPU terms hidden under the GPU's work (the scheduler forms step n+1 while step n runs), and an
#: arrival joining the step after next. Its rows (the vLLM blog's FP8-KV post's BF16 rows: Table 4
#: states no version, the post's other runs are 0.19.1) are fitted with vllm-v1's, each priced
#: with what its preset adds (``family``).
DERIVED: dict[str, tuple[str, dict]] = {"vllm-v1-async": ("vllm-v1", {"overlap_schedule": 1, "cpu_overlap": 1.0})}
#: The order presets are fitted in (SHARED terms come from presets fitted before).
ORDER = ("sglang", "sglang-0.5", "vllm-0.6", "vllm-v1", "vllm-0.4")
#: The optimiser's unit (order-1 values) of every term.
UNITS = {**FITTED, "kv_reread": 1e-2}
#: Where a leave-one-source-out fit starts (no held-out information in it): about a tenth of each
#: bound, kv_reread at half.
NEUTRAL = {"step_s": 5e-4, "seq_s": 2e-5, "admit_s": 2e-4, "allreduce_latency_s": 1e-5, "frontend_s": 5e-3,
           "frontend_busy_s": 2e-3, "kv_reread": 0.5}
#: s per sequence per vocabulary entry: a softmax + sampling pass reading fp32 logits once or twice
#: at about 1 TB/s effective (about 1 us per sequence for a 128k vocabulary) - an estimate.
SAMPLE_S = 8e-12
#: Metric -> the kind the evaluation groups it under (decode_tok_s_batch1 is output tokens over one
#: request's end-to-end time).
KINDS = {"ttft_median_ms": "TTFT", "ttft_p99_ms": "TTFT", "tpot_median_ms": "TPOT/ITL", "tpot_p99_ms": "TPOT/ITL",
         "itl_median_ms": "TPOT/ITL", "mean_latency_ms": "E2E/latency", "e2e_median_ms": "E2E/latency",
         "decode_tok_s_batch1": "E2E/latency", "throughput_req_s": "throughput",
         "throughput_out_tok_s": "throughput", "throughput_total_tok_s": "throughput"}

#: Sources each preset's metadata cites (the fit rows' publishers).
SOURCES = {
    "vllm-0.6": ["vLLM performance CI (Buildkite vllm/performance-benchmark, build 9515 and A100 runs, late 2024)",
                 "QwenLM/Qwen2.5 docs/source/benchmark/speed_benchmark.rst (vLLM 0.6.3, A100)",
                 "vLLM blog 2024-09-05 'vLLM v0.6.0': GPU busy 38 % of the time for Llama-3-8B on H100 in v0.5.3 "
                 "(why per-step and per-sequence CPU terms exist)",
                 "front end: the sglang preset's (sgl-project/sglang benchmark/benchmark_vllm_060, same client "
                 "and hosts as its vLLM 0.6.0 runs)"],
    "vllm-v1": ["gpustack/gpustack docs/performance-lab (vLLM 0.11.0 default-settings runs, H100 / A100)",
                "vLLM blog 2026-04-22 FP8 KV cache post (BF16 rows)",
                "vllm-project/vllm pull-request benchmarks of the V1 engine, March 2025 (PRs #14152 and #14431: "
                "1000 ShareGPT requests at once on an H100, engine_version 0.8.0 defaults)",
                "front end: the sglang preset's (sgl-project/sglang benchmark/benchmark_vllm_060, same client "
                "and hosts as its vLLM 0.6.0 runs; V1's API server is the same kind of process)"],
    "vllm-0.4": ["QwenLM/Qwen2.5 docs/source/benchmark/speed_benchmark.rst, Qwen2 tables (vLLM 0.4.2, A100)",
                 "vLLM 0.4 decodes with its own paged-attention kernel, one thread block per query head "
                 "(why the KV re-read term exists)",
                 "per sequence and per admission: the vllm-0.6 preset's; front end: the sglang preset's"],
    "sglang": ["sgl-project/sglang benchmark/benchmark_vllm_060/README.md (SGLang 0.3.0, A100)"],
    "sglang-0.5": ["gpustack/gpustack docs/performance-lab (SGLang 0.5 default-settings runs, H100 / A100)",
                   "sgl-project/sglang pull request #6168 (SGLang 0.4.6, H200, FlashAttention-3 backend)",
                   "LMSYS blog 2024-12-04 'SGLang v0.4: zero-overhead batch scheduler' (why overlap_schedule)"],
}


def _rounded(terms: dict) -> dict:
    """4 significant digits; terms under 100 ns (per unit) are written as 0 (the bound the
    optimiser stops at, far below anything the rows can see)."""
    return {k: int(v) if k in ("overlap_schedule", "scheduler_steps") else
            0.0 if (v < 1e-7 and k != "sample_s") else float(f"{v:.4g}") for k, v in terms.items()}


def fitted_terms(preset: str) -> tuple[str, ...]:
    """The terms the fit of ``preset`` moves (the others keep their current values)."""
    return FITTED_BY_PRESET.get(preset, tuple(FITTED))


def bound(preset: str, term: str) -> tuple[float, float]:
    """The physical range of ``term`` in ``preset``'s fit (its own, else the common one)."""
    return PRESET_BOUNDS.get(preset, {}).get(term, BOUNDS[term])


def bounds_of(names, preset: str = "") -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper bounds of terms ``names`` in the optimiser's units (``preset``'s own
    ranges where it has them)."""
    lo = np.array([bound(preset, k)[0] / UNITS[k] for k in names])
    hi = np.array([bound(preset, k)[1] / UNITS[k] for k in names])
    return lo, hi


def family(preset: str) -> dict[str, dict]:
    """The presets priced by ``preset``'s terms (it and those derived from it), each with the
    terms it adds (``{"sglang": {}, "sglang-0.5": {"overlap_schedule": 1}}``)."""
    return {preset: {}, **{name: extra for name, (base, extra) in DERIVED.items() if base == preset}}


def _overhead(x: np.ndarray, names: tuple[str, ...] = tuple(FITTED), base: dict | None = None) -> dict:
    """An inline overhead table: ``base`` (the preset's current terms), sampling at SAMPLE_S, and
    the fitted ``names`` from the optimiser's ``x`` (in UNITS)."""
    return {**(base or {}), "sample_s": SAMPLE_S, **{k: float(v) * UNITS[k] for k, v in zip(names, x)}}


def fit_preset(preset: str, df, x0: dict | None = None, verbose: bool = True, rows=None,
               max_nfev: int = 12) -> tuple[dict, object]:
    """Fit ``preset`` on its fit rows (or on ``rows``: rows of it and of the presets derived from
    it, each priced with the terms plus what it adds); returns (terms, scipy result). Terms not
    fitted keep their value in ``x0``; every fitted one stays within :data:`BOUNDS`."""
    fam = family(preset)
    if rows is None:
        rows = df[df.overhead.isin(list(fam)) & (df.split == "fit")]
    rows = rows[rows.overhead.isin(list(fam)) & (rows.split != "excluded")]
    if rows.empty:
        raise ValueError(f"no fit rows for preset '{preset}'")
    names = fitted_terms(preset)
    base = {k: v for k, v in (x0 or {}).items() if k not in names}
    lo, hi = bounds_of(names, preset)
    start = np.clip(np.array([(x0 or {}).get(k, 0.0) / UNITS[k] for k in names]), lo, hi)
    n_eval = [0]

    def residuals(x):
        terms = _overhead(np.clip(x, lo, hi), names, base)
        res = run_table(rows, overhead={p: {**terms, **extra} for p, extra in fam.items()})
        n_eval[0] += 1
        if verbose:
            print(f"  eval {n_eval[0]:3d}: " + " ".join(f"{v:8.3g}" for v in x)
                  + f"  median |err| {res.error.abs().median() * 100:5.1f} %", flush=True)
        return res.error.to_numpy()

    sol = least_squares(residuals, start, bounds=(lo, hi), diff_step=0.05,
                        x_scale=np.maximum(np.abs(start), 1.0), max_nfev=max_nfev, loss="soft_l1", f_scale=0.1)
    return _overhead(np.clip(sol.x, lo, hi), names, base), sol


def _with_shared(preset: str, terms: dict, fitted: dict[str, dict]) -> dict:
    """``terms`` with the terms ``preset`` takes from other presets' fits (SHARED)."""
    return {**terms, **{k: fitted[src][k] for k, src in SHARED.get(preset, {}).items() if src in fitted}}


def metric_kind(metric: str) -> str:
    """TTFT, TPOT/ITL, E2E/latency or throughput."""
    return KINDS[metric]


def loso(df: pd.DataFrame, start: dict[str, dict] | None = None, presets=ORDER, max_nfev: int = 6,
         verbose: bool = False) -> pd.DataFrame:
    """Leave-one-source-out: for each ``source_kind``, fit every preset of ``presets`` (with the
    presets derived from it) on the reproducible rows of the other sources (not their ``host``
    rows), then simulate that source's rows of the preset's era with those terms. ``start``: each
    preset's terms before the fit (the terms it does not fit keep these values; default: the
    shipped presets'); the fitted ones start from :data:`NEUTRAL`, so nothing of the held-out rows
    enters.

    Returns one row per held-out row: id, source_kind, overhead, metric, kind, published,
    simulated, error; a row whose era has no row in any other source gets NaN (``evaluated``
    False)."""
    if start is None:
        doc = json.loads(PRESETS_PATH.read_text())
        start = {p: doc[p]["terms"] for p in presets if p in doc}
    df = df[df.split != "excluded"]
    if "family" in df:  # (MoE / FP8 rows are judged apart, on presets fitted without them)
        df = df[df.family.fillna("") == ""]
    out = []
    for source in sorted(set(df.source_kind)):
        held = df[df.source_kind == source]
        rest = df[(df.source_kind != source) & (df.split != "host")]
        fitted: dict[str, dict] = {}
        # a preset is fitted when the held-out source has rows of its era, or a preset that does
        # takes terms from it
        wanted = {p for p in presets if held.overhead.isin(list(family(p))).any()}
        wanted |= {src for p in wanted for src in SHARED.get(p, {}).values()}
        for preset in presets:
            if preset not in wanted:
                continue
            fam = family(preset)
            mine = held[held.overhead.isin(list(fam))]
            train = rest[rest.overhead.isin(list(fam))]
            x0 = _with_shared(preset, {**start.get(preset, {}), **{k: NEUTRAL[k] for k in fitted_terms(preset)}},
                              fitted)
            if train.empty:
                fitted[preset] = _with_shared(preset, dict(start.get(preset, {})), fitted)
                out += [{"id": r.id, "source_kind": source, "overhead": r.overhead, "metric": r.metric,
                         "kind": metric_kind(r.metric), "published": float(r.value), "simulated": math.nan,
                         "error": math.nan, "evaluated": False} for r in mine.itertuples()]
                continue
            if verbose:
                print(f"{source}: fitting {preset} on {len(train)} rows of other sources", flush=True)
            terms, _ = fit_preset(preset, df, x0=x0, verbose=verbose, rows=train, max_nfev=max_nfev)
            fitted[preset] = terms = _with_shared(preset, _rounded(terms), fitted)
            if mine.empty:
                continue
            res = run_table(mine, overhead={p: {**terms, **extra} for p, extra in fam.items()})
            for r in res.itertuples():
                out.append({"id": r.id, "source_kind": source, "overhead": r.overhead, "metric": r.metric,
                            "kind": metric_kind(r.metric), "published": r.published, "simulated": r.simulated,
                            "error": r.error, "evaluated": True})
            if verbose:
                print(f"  {source} / {preset}: " + ", ".join(f"{k}={v:.4g}" for k, v in terms.items()
                                                           if k in fitted_terms(preset)), flush=True)
    return pd.DataFrame(out, columns=["id", "source_kind", "overhead", "metric", "kind", "published", "simulated",
                                      "error", "evaluated"])


def loso_summary(res: pd.DataFrame) -> dict[str, dict]:
    """Median and worst |error| of the evaluated rows of a :func:`loso` result: ``all`` and each
    metric kind (rows, median, worst, within_10, within_25)."""
    ev = res[res.evaluated.astype(bool)] if len(res) else res
    out = {}
    for name, sub in [("all", ev)] + [(k, ev[ev.kind == k]) for k in ("TTFT", "TPOT/ITL", "E2E/latency", "throughput")]:
        e = sub.error.abs()
        out[name] = {"rows": int(len(sub)), "median": float(e.median()) if len(sub) else math.nan,
                     "worst": float(e.max()) if len(sub) else math.nan,
                     "within_10": int((e <= 0.10).sum()), "within_25": int((e <= 0.25).sum())}
    out["not_evaluated"] = {"rows": int(len(res) - len(ev))}
    return out


def kind_summary(res: pd.DataFrame) -> dict[str, dict]:
    """The same by metric kind for a run of the table (:func:`calibrate.fidelity.suite.run_table`)."""
    return loso_summary(res.assign(kind=res.metric.map(metric_kind), evaluated=True))


def soft_l1(err: np.ndarray, f_scale: float = 0.1) -> float:
    """scipy's soft-L1 loss of the relative errors (the objective of :func:`fit_preset`, and of
    calibrate.runs.fit's with its weighted residuals)."""
    return float(np.sum(2 * f_scale**2 * (np.sqrt(1 + (err / f_scale) ** 2) - 1)))


def fit_flops_efficiency(device: str, df, bounds=(0.3, 0.9), verbose: bool = True) -> tuple[float, object]:
    """Fit ``device``'s achieved FLOPs fraction on the fit rows whose profile is that device's;
    returns (value, scipy result). Profiles are regenerated from calibrate.roofline per trial."""
    import re
    import tempfile

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
            val = soft_l1(run_table(trial).error.to_numpy())
            if verbose:
                print(f"  flops_efficiency {eff:.4f}: loss {val:.5f}", flush=True)
            return val
        sol = minimize_scalar(loss, bounds=bounds, method="bounded", options={"xatol": 0.005})
    return float(sol.x), sol


def print_loso(res: pd.DataFrame, echo=print) -> dict:
    """Print a :func:`loso` result (every row, then the summary by metric kind); returns the summary."""
    echo(f"{'held-out source':14s} {'id':36s} {'metric':22s} {'published':>10s} {'simulated':>10s} {'error':>8s}")
    for r in res.itertuples():
        err = f"{r.error * 100:+7.1f}%" if r.evaluated else "    n/a"
        sim = f"{r.simulated:10.4g}" if r.evaluated else f"{'-':>10s}"
        echo(f"{r.source_kind:14s} {r.id:36s} {r.metric:22s} {r.published:10.4g} {sim} {err}")
    s = loso_summary(res)
    for k, v in s.items():
        if k == "not_evaluated":
            if v["rows"]:
                echo(f"not evaluated (no other source has rows of their era): {v['rows']} rows")
            continue
        if v["rows"]:
            echo(f"{k:12s} rows {v['rows']:3d}  median |error| {v['median'] * 100:5.1f} %  "
                 f"worst {v['worst'] * 100:5.1f} %  within 10 %: {v['within_10']}  within 25 %: {v['within_25']}")
    return s


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", action="append", help="fit only this preset (repeatable)")
    ap.add_argument("--dry-run", action="store_true", help="print the fit, do not write sim/core/overheads.json")
    ap.add_argument("--loso", action="store_true",
                    help="leave-one-source-out evaluation: printed and written to calibrate/fidelity/loso.csv "
                         "(docs/fidelity.md shows it; --dry-run: printed only)")
    ap.add_argument("--neutral-start", action="store_true",
                    help="start every fitted term from the neutral values the leave-one-source-out fits use "
                         "(NEUTRAL) instead of the preset's current ones (after a change of the model's terms)")
    ap.add_argument("--max-nfev", type=int, default=None,
                    help="optimiser evaluations per fit (default 12; 6 for --loso)")
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
    if args.loso:
        res = loso(df, presets=tuple(args.preset or ORDER), max_nfev=args.max_nfev or 6, verbose=True)
        print_loso(res)
        if not args.dry_run:
            from sim.outdir import write_file
            write_file(LOSO_PATH, res.to_csv(index=False, float_format="%.6g"))
            print(f"wrote {LOSO_PATH}")
        return
    doc = json.loads(PRESETS_PATH.read_text())
    fitted = {p: doc[p]["terms"] for p in ORDER}
    for preset in [p for p in ORDER if p in (args.preset or ORDER)]:
        cur = _with_shared(preset, doc[preset]["terms"], fitted)
        if args.neutral_start:
            cur = {**cur, **{k: NEUTRAL[k] for k in fitted_terms(preset)}}
        fam = family(preset)
        mine = df.overhead.isin(list(fam))
        print(f"fitting {preset} on {int((mine & (df.split == 'fit')).sum())} rows", flush=True)
        terms, sol = fit_preset(preset, df, x0=cur, max_nfev=args.max_nfev or 12)
        terms = _rounded(terms)
        fitted[preset] = terms
        res = run_table(df[df.overhead.isin(list(fam))], overhead={p: {**terms, **x} for p, x in fam.items()})
        s = summary(res)
        print(f"  {preset}: " + ", ".join(f"{k}={v:.4g}" for k, v in terms.items()))
        print(f"  fit rows: median {s['fit']['median'] * 100:.1f} %, worst {s['fit']['worst'] * 100:.1f} %; "
              f"held-out: median {s['held-out']['median'] * 100:.1f} %, worst {s['held-out']['worst'] * 100:.1f} %")
        doc[preset]["terms"] = {**{k: cur.get(k, 0.0) for k in ("allreduce_bytes_per_s",)}, **terms}
        meta = doc[preset].setdefault("meta", {})
        meta.update({
            "status": "fitted", "fitted_by": "python -m calibrate.fidelity.fit",
            "date": _dt.date.today().isoformat(), "sources": SOURCES.get(preset, []),
            "fit_rows": sorted(res[res.split == "fit"].id), "held_out_rows": sorted(res[res.split.isin(HELD_OUT)].id),
            "fit_median_abs_error": round(s["fit"]["median"], 4), "fit_worst_abs_error": round(s["fit"]["worst"], 4),
            "held_out_median_abs_error": round(s["held-out"]["median"], 4),
            "held_out_worst_abs_error": round(s["held-out"]["worst"], 4),
            "method": "scipy.optimize.least_squares on relative error, soft-L1 loss (f_scale 0.1), each term "
                      "within its physical bounds (calibrate/fidelity/fit.py BOUNDS)",
            "bounds": {k: list(bound(preset, k)) for k in fitted_terms(preset)},
        })
        meta["fitted_terms"] = list(fitted_terms(preset))
        if preset in SHARED:
            meta["shared_terms"] = dict(SHARED[preset])
        if not (df[mine & (df.split == "fit")].tp > 1).any():
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
