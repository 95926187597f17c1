"""Calibrate-then-simulate, validated: run a trace for real on the device, simulate the same
trace with priosim's engine on the measured profile, compare per class.

``validate(profile_path, out_dir, scenario=None, n=300, repeats=3)`` writes
``validation.json`` (``{"metrics": [{"class", "metric", "real", "sim", "rel_error"}, ...]}``,
and ``steps``: per kind of step, measured against priced), ``real.parquet``, ``sim.parquet``,
``real_steps.parquet`` (every step of the first real run, see
:func:`calibrate.validate.step_report`) and ``validation_cdf.png`` (real vs simulated CDFs of TTFT and
end-to-end latency per class). The simulated run uses the real loop's semantics: FCFS,
continuous batching with the same token budget, slot count and chunked prefill, no preemption
(the built-in trace never fills the KV cache), a first token at the end of the step that
finishes the prompt.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from calibrate.validate import DEFAULT_ENGINE, builtin_trace, compare, run_real, step_report
from sim import jsonout


def simulate_trace(profile_path: str | Path, trace: pd.DataFrame, engine_params: dict, work_dir: Path) -> pd.DataFrame:
    """Simulate ``trace`` (arrival_s, cls, prompt_tokens, output_tokens) on the profile."""
    from sim import scenario_from_dict, simulate

    work_dir = Path(work_dir).resolve()  # (the scenario's trace paths resolve against it: absolute, not doubled)
    work_dir.mkdir(parents=True, exist_ok=True)
    classes = sorted(set(trace["cls"]))
    streams = []
    for c in classes:
        part = trace[trace["cls"] == c]
        path = work_dir / f"trace-{c}.csv"
        part[["arrival_s", "prompt_tokens", "output_tokens"]].to_csv(path, index=False)
        streams.append({"tenant": c, "class": c, "max_tokens": int(trace["output_tokens"].max()),
                        "trace": {"format": "csv", "path": str(path), "t0": 0,
                                  "columns": {"arrival_s": "arrival_s", "prompt_tokens": "prompt_tokens",
                                              "output_tokens": "output_tokens"}}})
    horizon = float(trace["arrival_s"].max()) + 1.0
    sc = {"name": "validate", "seed": 0, "horizon_s": horizon, "drain": True,
          "engine": {"profile": str(Path(profile_path).resolve()), "max_num_seqs": int(engine_params["max_num_seqs"]),
                     "max_batched_tokens": int(engine_params["token_budget"]),
                     "chunked_prefill": bool(engine_params["chunked_prefill"]), "kv_blocks": 1_000_000,
                     "preemption": "recompute", "preempt_for_waiting": "never"},
          "policy": {"name": "fcfs"},
          "classes": [{"name": c, "priority": 0} for c in classes], "streams": streams}
    res = simulate(scenario_from_dict(sc, base_dir=work_dir))
    out = res.requests.rename(columns={"class": "cls"})
    return out


def _cdf_figure(real: pd.DataFrame, sim: pd.DataFrame, path: Path) -> None:
    import matplotlib
    import matplotlib.ticker
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    classes = sorted(set(real["cls"]))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, col, label in ((axes[0], "ttft_s", "time to first token (s)"), (axes[1], "e2e_s", "end-to-end latency (s)")):
        for c in classes:
            for df, style, who in ((real, "-", "real"), (sim, "--", "simulated")):
                v = np.sort(df.loc[df["cls"] == c, col].dropna().to_numpy())
                ax.plot(v, np.arange(1, len(v) + 1) / max(len(v), 1), style, label=f"{c}, {who}")
        ax.set(xlabel=label, ylabel="fraction of requests", xscale="log", title=f"CDF of {label.split(' (')[0]}")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # no crowded minor labels
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Real execution vs simulation on the measured profile")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def validate(profile_path: str | Path, out_dir: str | Path, trace: pd.DataFrame | None = None,
             n: int = 300, repeats: int = 3, engine_params: dict | None = None, seed: int = 0,
             progress: bool | None = False) -> dict:
    """The module docstring's comparison; ``progress`` shows the real runs' progress (requests
    finished; see :func:`sim.progress.progress_bar`)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    params = {**DEFAULT_ENGINE, **(engine_params or {})}
    if trace is None:
        trace = builtin_trace(profile_path, n=n, seed=seed)
    real = run_real(profile_path, trace, params, repeats=repeats, seed=seed, progress=progress)
    sim = simulate_trace(profile_path, trace, params, out / "sim-inputs")
    report = compare(real, sim)
    report["meta"] = {"profile": str(profile_path), "requests": int(len(trace)), "repeats": repeats,
                      "engine": params, "real_executor": real.attrs.get("executor", "real")}
    if real.attrs.get("step_log") is not None:   # the first real run's steps, against their prices
        steps, report["steps"] = step_report(real.attrs["step_log"], profile_path)
        steps.to_parquet(out / "real_steps.parquet")
    from sim.outdir import write_file, write_marker

    write_file(out / "validation.json", jsonout.dumps(report, indent=1))
    write_marker(out, "validation")
    for df, name in ((real, "real.parquet"), (sim, "sim.parquet")):
        table = df.drop(columns=[c for c in df.columns if df[c].dtype == object and c != "cls"])
        table.attrs = {}  # the step log stays out of the parquet metadata
        table.to_parquet(out / name)
    _cdf_figure(real, sim, out / "validation_cdf.png")
    return report
