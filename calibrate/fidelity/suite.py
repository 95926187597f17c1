"""Run the fidelity table: one generated scenario per published measurement, the simulated value
of the same metric, and the relative error.

Scenario kinds (column ``scenario``):

* ``fixed_batch``: ``n`` requests at t=0 handed to the engine together (vLLM's latency benchmark);
  ``mean_latency_ms`` is the time until the last finishes.
* ``batch1``: one request at t=0; ``decode_tok_s_batch1`` = output tokens / its end-to-end time
  (the Qwen tables time the whole ``generate`` call, prefill included).
* ``offline``: ``n`` requests at t=0; throughputs are totals over the time the last finishes.
* ``poisson``: ``n`` requests at Poisson ``rate``; medians / p99 over the requests (ITL over
  all inter-token gaps).
* ``concurrency``: ``concurrency`` closed-loop clients with no think time, the first ``n``
  requests count (``vllm bench serve --max-concurrency``).

A row's ``engine_settings`` are engine keys, plus ``num_scheduler_steps`` (vLLM's multi-step
scheduling), which goes to the overhead model as its ``scheduler_steps`` term. A row that ran an
engine's defaults says so with ``engine=vllm; engine_version=0.11.0`` (sim.engines fills every
engine key the row does not give, as for a scenario naming its engine); a row without ``engine``
gets the suite's own base settings (below) under its explicit ones, with the ``engine.batching``
its engine's era used (:func:`era_batching`: vLLM V0 without chunked prefill and SGLang run
prefill-only steps) unless it gives one. A row measured through
vLLM's ``LLM`` class (the latency and throughput benchmarks, the Qwen speed tables: no API
server) says ``entrypoint=offline``, so no front-end term prices it.

A row whose ``profile`` is empty derives its profile from a bundled model config instead: its
``engine_settings`` give the model keys (``model``, ``gpu``, ``dtype``, ``kv_dtype``, ``tp``,
``ep``; docs/models.md), as a scenario naming ``engine.model`` does, with ``typical_context`` the
mean prompt + output length of the row's requests unless it gives one. The MoE and FP8 rows are of
this kind; column ``family`` (``moe``, ``fp8``, ``moe-fp8``; empty: a dense 16-bit model) marks them, and
:func:`summary` reports them apart.
"""
from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from calibrate.fidelity import workload
from sim import scenario_from_dict, simulate
from sim.config import parse_value

TABLE = Path(__file__).resolve().parent / "published.csv"

#: Metrics the suite can compute, and how ("lower is better" ones are times).
METRICS = ("mean_latency_ms", "throughput_req_s", "throughput_out_tok_s", "throughput_total_tok_s",
           "decode_tok_s_batch1", "e2e_median_ms", "ttft_median_ms", "ttft_p99_ms", "tpot_median_ms",
           "tpot_p99_ms", "itl_median_ms")


def load_table(path: str | Path = TABLE) -> pd.DataFrame:
    """The published table (one row per measurement; see docs/fidelity.md for the columns)."""
    df = pd.read_csv(path, dtype={"engine_settings": str, "not_reproduced": str, "profile": str, "family": str},
                     keep_default_na=False)
    if "family" not in df:
        df["family"] = ""
    bad = sorted(set(df.metric) - set(METRICS))
    if bad:
        raise ValueError(f"{path}: metric '{bad[0]}' is not one of {', '.join(METRICS)}")
    return df


def engine_settings(text: str) -> dict:
    """``"key=value; key=value"`` (TOML values) -> dict."""
    out = {}
    for part in (text or "").split(";"):
        if part.strip():
            k, _, v = part.partition("=")
            out[k.strip()] = parse_value(v.strip())
    return out


def engine_defaults(eng: dict) -> dict:
    """The defaults sim.engines gives the engine keys of ``eng`` when it names an engine
    (``engine``, ``engine_version``, ``entrypoint``) on its profile's GPU; {} when it names none."""
    if eng.get("engine") is None:
        return {}
    from sim.engines import family, gpu as gpus, version_tuple
    fam = family(eng["engine"])
    gpu = gpus.load(_profile_doc(eng), Path(".")) or gpus.Gpu("", 0.0, 0.0, 0.0, 0.9, 1)
    return fam.defaults(version_tuple(eng.get("engine_version"), fam.latest), gpu,
                        eng.get("entrypoint", "server"), gpu.tp)


#: The engine version each overhead preset stands for (its era), for rows that do not name one.
ERA_VERSION = {"vllm-0.4": "0.4.2", "vllm-0.6": "0.6.3", "vllm-v1": "0.11.0", "sglang": "0.3.0",
               "sglang-0.5": "0.5.5"}


def era_batching(row: dict, chunked_prefill: bool) -> str:
    """The ``engine.batching`` of the row's engine (column ``engine``) in the era of its overhead
    preset, with chunked prefill on or off (sim.engines' rule); "mixed" for another preset."""
    from sim.engines import batching, family, version_tuple
    version = ERA_VERSION.get(row["overhead"])
    if not row.get("engine") or version is None:
        return "mixed"
    fam = family(row["engine"])
    return batching(fam, version_tuple(version, fam.latest), chunked_prefill)


def _profile_doc(eng: dict):
    """The engine's profile: its ``profile`` value, or the one derived for its ``model`` keys."""
    if eng.get("model") is None:
        return eng["profile"]
    from sim.config import MODEL_KEYS
    from sim.models import derived
    keys = {k: eng.get(k) for k in MODEL_KEYS}
    return derived(keys["model"], keys["gpu"], keys["dtype"], keys["kv_dtype"], keys["tp"], keys["ep"],
                   keys["typical_context"], Path("."))


def scenario_for(row: dict, trace_dir: Path, overhead=None, seed: int = 0) -> dict:
    """The scenario dict reproducing ``row`` (its requests written as a CSV trace in
    ``trace_dir``); ``overhead`` overrides the row's preset (a name or a table of terms)."""
    p, o = workload.lengths(row, seed)
    n = len(p)
    ov = row["overhead"] if overhead is None else overhead
    settings = engine_settings(row.get("engine_settings", ""))
    steps = settings.pop("num_scheduler_steps", 1)
    if steps != 1:
        # multi-step scheduling (vLLM --num-scheduler-steps) is priced by the overhead model
        ov = {**(ov if isinstance(ov, dict) else {"preset": ov}), "scheduler_steps": steps}
    eng = {"overhead": ov, "timeseries_interval_s": 10.0}
    if row["profile"]:  # (else the row's engine_settings name a model: its profile is derived)
        eng["profile"] = row["profile"]
    if "engine" not in settings:
        eng.update({"max_num_seqs": 256, "max_batched_tokens": 8192, "chunked_prefill": True,
                    "preemption": "recompute", "preempt_for_waiting": "never",
                    "batching": era_batching(row, bool(settings.get("chunked_prefill", True)))})
    eng.update(settings)
    if eng.get("model") is not None and "typical_context" not in eng:
        # a derived profile averages windowed layers' KV and attention at the typical context,
        # which docs/models.md asks a scenario to set to its typical prompt + output length
        eng["typical_context"] = max(1, int(round(float(p.mean() + o.mean()))))
    path = trace_dir / f"{row['id']}.csv"
    cls = [{"name": "all", "priority": 0}]
    base = {"name": f"fidelity-{row['id']}", "seed": seed, "drain": True, "engine": eng,
            "policy": {"name": "fcfs"}, "classes": cls}
    if row["scenario"] == "concurrency":
        pd.DataFrame({"p": p, "o": o, "t": np.zeros(n)}).to_csv(path, index=False)
        users = int(row["concurrency"])
        # long enough for n requests at a pessimistic 30 ms per output token per wave
        horizon = float(o.mean()) * 0.03 * (n / users + 1) + 60.0
        stream = {"tenant": "clients", "class": "all",
                  "arrival": {"process": "closed_loop", "users": users, "think": {"dist": "constant", "value": 0}},
                  "trace": {"format": "csv", "path": str(path), "t0": 0,
                            "columns": {"arrival_s": "t", "prompt_tokens": "p", "output_tokens": "o",
                                        "max_tokens": "o"}}}
        return {**base, "horizon_s": horizon, "streams": [stream]}
    t = workload.arrivals(row, n, seed)
    # each request asks for its own output length (max_tokens), as both benchmark clients send it
    cols = {"arrival_s": "t", "prompt_tokens": "p", "output_tokens": "o", "max_tokens": "o"}
    fills = engine_defaults(eng)
    if eng.get("prefix_caching", fills.get("prefix_caching")):
        # the engine's prefix cache is on (vLLM V1 and SGLang defaults); prompts are unique, so
        # each request's blocks get ids of their own: what the cache keeps for a request is its
        # own computed prompt, which makes re-admission after a recompute preemption cheap
        g = int(eng.get("prefix_block_tokens", fills.get("prefix_block_tokens", 512)))
        path = path.with_suffix(".jsonl")
        with path.open("w") as f:
            for i in range(n):
                ids = [i * 1_000_000 + j for j in range(-(-int(p[i]) // g))]
                f.write(json.dumps({"t": float(t[i]), "p": int(p[i]), "o": int(o[i]), "h": ids}) + "\n")
        trace = {"format": "jsonl", "path": str(path), "t0": 0, "columns": {**cols, "hash_ids": "h"}}
    else:
        pd.DataFrame({"t": t, "p": p, "o": o}).to_csv(path, index=False)
        trace = {"format": "csv", "path": str(path), "t0": 0, "columns": cols}
    stream = {"tenant": "clients", "class": "all", "trace": trace}
    return {**base, "horizon_s": float(t[-1]) + 1.0, "streams": [stream]}


def metric_value(row: dict, res) -> float:
    """The row's metric from a run's request table and summary."""
    r = res.requests.sort_values("arrival_s", kind="stable")
    if row["scenario"] == "concurrency":
        r = r.head(int(row["n"]))
    fin = r[r.status == "finished"]
    if len(fin) < len(r):
        raise RuntimeError(f"fidelity row {row['id']}: {len(r) - len(fin)} requests did not finish")
    m = row["metric"]
    span = float(fin.finish_s.max() - r.arrival_s.min())
    if m == "mean_latency_ms":
        return span * 1e3
    if m == "throughput_req_s":
        return len(fin) / span
    if m == "throughput_out_tok_s":
        return float(fin.output_tokens.sum()) / span
    if m == "throughput_total_tok_s":
        return float(fin.output_tokens.sum() + fin.prompt_tokens.sum()) / span
    if m == "decode_tok_s_batch1":
        return float(fin.output_tokens.sum()) / float(fin.e2e_s.sum())
    if m == "itl_median_ms":
        return float(res.summary_dict["classes"]["all"]["itl_p50_s"]) * 1e3
    col, q = {"e2e_median_ms": ("e2e_s", 0.5), "ttft_median_ms": ("ttft_s", 0.5), "ttft_p99_ms": ("ttft_s", 0.99),
              "tpot_median_ms": ("tpot_s", 0.5), "tpot_p99_ms": ("tpot_s", 0.99)}[m]
    return float(fin[col].quantile(q)) * 1e3


def run_table(df: pd.DataFrame, overhead=None, progress=None) -> pd.DataFrame:
    """Every reproducible row of ``df``: published, simulated and relative error (simulated /
    published - 1). Rows whose ``split`` is ``excluded`` are skipped. ``overhead``: a preset for
    every row, or a dict {preset name: overhead} replacing the rows' presets."""
    out = []
    cache: dict[tuple, Any] = {}  # run key -> the simulation's Results
    for row in df.to_dict("records"):
        if row["split"] == "excluded":
            continue
        ov = overhead.get(row["overhead"]) if isinstance(overhead, dict) else overhead
        # rows that differ only in the metric share a run
        key = (row["profile"], row["scenario"], row["dataset"], row["n"], row["prompt_tokens"],
               row["output_tokens"], row["rate"], row["concurrency"], row["engine_settings"],
               row["prompt_mean"], row["output_mean"], row["overhead"], repr(ov))
        if key not in cache:
            with tempfile.TemporaryDirectory(prefix="priosim-fidelity-") as d:
                sc = scenario_from_dict(scenario_for(row, Path(d), ov), base_dir=d)
                cache[key] = simulate(sc)
        res = cache[key]
        sim = metric_value(row, res)
        out.append({"id": row["id"], "metric": row["metric"], "unit": row["unit"], "split": row["split"],
                    "family": row.get("family", ""),
                    "overhead": row["overhead"], "published": float(row["value"]), "simulated": sim,
                    "error": sim / float(row["value"]) - 1.0})
        if progress is not None:
            progress(out[-1])
    return pd.DataFrame(out)


#: ``split`` values of rows that never enter a preset's fit. ``held-out`` rows are judged on
#: presets fitted without them; ``host`` rows are kept out of the leave-one-source-out fits as well:
#: their publisher's own runs show the value set by that host's API server (its serial CPU work per
#: request) more than by the engine, which a preset for every host cannot carry (docs/fidelity.md,
#: "The host CPU"). Both count as held out in the summary; ``excluded`` rows are not run.
HELD_OUT = ("held-out", "host")

#: Model families the summary reports apart (column ``family``), and the summary's key for them.
FAMILIES = ("moe", "fp8", "moe-fp8")
FAMILY_KEY = "moe/fp8"


def summary(res: pd.DataFrame) -> dict:
    """Median and worst |relative error| over all rows, the fit rows, the held-out rows (``host``
    rows with them) and the rows of MoE or FP8 models (key ``"moe/fp8"``; column ``family``)."""
    def stats(sub):
        e = sub.error.abs()
        return {"rows": int(len(sub)), "median": float(e.median()) if len(sub) else math.nan,
                "worst": float(e.max()) if len(sub) else math.nan,
                "within_10": int((e <= 0.10).sum()), "within_25": int((e <= 0.25).sum())}
    return {"all": stats(res), "fit": stats(res[res.split == "fit"]),
            "held-out": stats(res[res.split.isin(HELD_OUT)]),
            FAMILY_KEY: stats(res[res.family.isin(FAMILIES)] if "family" in res else res.iloc[:0])}
