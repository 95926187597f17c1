"""Differential fuzz of the engine's fast paths against stepping: random small scenarios, each run
twice, with the fast paths on (fast-forward, the decode cohort, a cluster's runs held past
arrivals routed elsewhere) and stepped (``fast_forward = false``, ``lazy_batch = false``, every
cluster run stopped at every arrival), and compared: the request table, the time series and
summary.json. The tests hold a few such scenarios each; this draws as many as you like.

    python -m scripts.exactness_fuzz [--kind cluster|replica|prefix|join|disagg|prefill_first] [--start S] [--trials N]

Run from the repository root. Trial ``i`` draws its scenario from seed ``i``, so a mismatch
printed as ``trial i`` reproduces with ``--start i --trials 1``. Each scenario draws a policy,
a router or replica groups (clusters), a preemption mode and who may evict, the KV pool, the
step budget and prefill caps, overlap scheduling (with the CPU work hidden under the GPU's, by
seed) and front-end delay, speculation, the fairness accountant and drain, and (by seed) SGLang's
admission estimate and retraction order; ``replica`` adds
closed-loop users, admission gates, the ``prefix_aware`` victim rule and prefills without
chunking; ``prefix`` turns prefix caching on (one replica or a cluster); ``join`` draws clusters
whose requests may join runs in flight
(count routing, a fixed ranking, nothing else for a boundary's plan to decide); ``disagg`` draws
disaggregated clusters (prefill and decode groups, sometimes a co-located one beside them, each
with its own pool and preemption mode, a link preset or pipelining, a decode router, prefix
caching); ``prefill_first`` draws one of the other kinds' scenarios (no speculation) with
``engine.batching = "prefill_first"``, sometimes without chunked prefill (vLLM V0's shape).
Left out of the
summary comparison: what only the engine's speed changes (event counts, wall and CPU seconds,
the fast-path settings it echoes); the fairness accountant's books (per-window service, GPU
seconds, counters, the gap) are compared too.
Exit status 1 when any trial differs or fails.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import traceback

import numpy as np
import pandas as pd

from sim import ScenarioError, scenario_from_dict, simulate
from sim.cluster import simulate_cluster

LINEAR = {"kind": "linear", "base_s": 0.01, "prefill_token_s": 1e-5, "decode_token_s": 1e-4,
          "context_token_s": 1e-7, "swap_block_s": 1e-4}
POLICIES = ["fcfs", "priority", "wfq", "aging", "mlfq", "srpt_oracle", "sjf_rank"]
ROUTERS = ["least_outstanding", "round_robin", "least_kv", "power_of_two"]
#: what :func:`draw` can draw
KINDS = ("cluster", "replica", "prefix", "join", "disagg", "prefill_first")
#: summary.json keys (any part of the dotted path) that are not compared (see the docstring)
NOT_COMPARED = ("engine_events", "wall_s", "cpu_s", "run.lazy_batch", "run.fast_forward")


def _stream(tenant: str, cls: str, rate: float, prompt: tuple[int, int], output: tuple[int, int]) -> dict:
    return {"tenant": tenant, "class": cls, "arrival": {"process": "poisson", "rate": rate},
            "prompt_tokens": {"dist": "uniform", "low": prompt[0], "high": prompt[1]},
            "output_tokens": {"dist": "uniform", "low": output[0], "high": output[1]}, "max_tokens": output[1]}


def draw(kind: str, rng: np.random.Generator) -> dict:
    """A random small scenario (a dict for ``scenario_from_dict``) of the given kind."""
    if kind == "prefill_first":
        return _prefill_first(rng)
    rate = float(rng.choice([0.3, 1.0, 2.0, 4.0]))
    short = rng.random() < 0.3  # answers of a few tokens: runs go on past them
    d: dict = {
        "name": f"fuzz-{kind}", "seed": int(rng.integers(0, 10_000)), "horizon_s": float(rng.choice([5.0, 10.0, 20.0])),
        "drain": bool(rng.integers(0, 2)),
        "engine": {"profile": dict(LINEAR), "max_num_seqs": int(rng.choice([4, 8, 16])),
                   "max_batched_tokens": int(rng.choice([128, 256, 512])), "block_size": 16,
                   "kv_blocks": int(rng.choice([40, 64, 128, 400])), "swap_blocks": 32,
                   "preemption": str(rng.choice(["recompute", "swap", "off", "auto"])),
                   "preempt_for_waiting": str(rng.choice(["strict", "never", "priority", "threshold", "policy"])),
                   "timeseries_interval_s": float(rng.choice([0.5, 1.0, 3.0]))},
        "policy": {"name": str(rng.choice(POLICIES))},
        "classes": [{"name": "hi", "priority": 0, "ttft_slo_s": 1.0}, {"name": "lo", "priority": 1}],
        "streams": [_stream("a", "hi", rate, (10, 200), (1, 4) if short else (5, 150)),
                    _stream("b", "lo", rate * float(rng.choice([0.5, 1.0, 2.0])), (50, 400), (20, 300))],
    }
    e = d["engine"]
    if rng.random() < 0.3:
        d["classes"][1]["max_prefill_tokens_per_step"] = int(rng.choice([32, 64, 128]))
    if rng.random() < 0.2:
        d["classes"][0]["reserved_blocks"] = 8
    if rng.random() < 0.3:
        e["overhead"] = ({"preset": "none", "overlap_schedule": 1, "step_s": 0.002} if rng.random() < 0.5
                         else {"preset": "none", "step_s": 0.001, "frontend_s": 0.003})
        if "frontend_s" in e["overhead"] and d["seed"] % 2:  # (a busy front end; by seed: no draw taken)
            e["overhead"]["frontend_busy_s"] = 0.004
        if "overlap_schedule" in e["overhead"] and d["seed"] % 3 == 0:
            # the CPU work hidden under the GPU's: small batches on a decode line, large ones
            # (100 us per running request) the CPU's, stepped one by one (by seed: no draw taken)
            e["overhead"].update(cpu_overlap=1.0, seq_s=1e-4)
    if rng.random() < 0.2:
        e["max_prefill_chunk"] = 64
    if d["seed"] % 4 == 1:  # (vLLM V1's walk of the running requests; by seed: no draw taken)
        e["running_order"] = "admission"
    if kind != "join":  # (SGLang's estimate keeps requests out of runs in flight: join draws go without)
        if d["seed"] % 5 == 3:  # (SGLang's admission estimate and retraction order; by seed: no draw taken)
            e.update(admission_estimate="sglang", victim="sglang")
        elif d["seed"] % 7 == 4:  # (SGLang's retraction order alone)
            e["victim"] = "sglang"
    if rng.random() < 0.2:
        e["watermark"] = 0.05
    if rng.random() < 0.15 and kind != "prefix":
        e["speculative"] = {"k": 2, "acceptance": 0.6}
    if rng.random() < 0.25:
        d["fairness"] = {"enabled": bool(rng.random() < 0.75), "measure": str(rng.choice(["tokens", "gpu_seconds"])),
                         "window_s": 2.0}
        d["tenants"] = [{"name": "a", "share": 1.0}, {"name": "b", "share": 2.0}]
    if kind == "replica":
        _replica_extras(d, rng)
    if kind == "join":
        _joinable(d, rng)
    if kind == "prefix":
        e.update(prefix_caching=True, prefix_block_tokens=32)
        for s in d["streams"]:
            s["prefix"] = {"system_tokens": int(rng.choice([32, 64, 128])), "conversations": int(rng.integers(1, 6)),
                           "block_tokens": 32}
        if rng.random() < 0.4:
            e["victim"] = "prefix_aware"
        if rng.random() < 0.2:
            d["policy"] = {"name": "lpm"}
    if kind == "disagg":
        _disaggregated(d, rng)
        return d
    if kind == "cluster" or (kind == "prefix" and rng.random() < 0.5):
        d["cluster"] = ({"groups": [{"name": "fast", "replicas": 1, "classes": ["hi"]},
                                    {"name": "bulk", "replicas": 2, "classes": ["lo"], "engine": {"kv_blocks": 96}}],
                         "router": "class_aware"} if rng.random() < 0.2
                        else {"replicas": int(rng.choice([2, 3, 4])), "router": str(rng.choice(ROUTERS))})
    return d


def _prefill_first(rng: np.random.Generator) -> dict:
    """A scenario of another kind (drawn first: replica, cluster, prefix, join or disagg) whose
    steps hold prefill work apart from decodes (``engine.batching = "prefill_first"``), without
    speculation (refused with it); sometimes without chunked prefill, as vLLM V0 ran."""
    d = draw(str(rng.choice(["replica", "cluster", "prefix", "join", "disagg"])), rng)
    e = d["engine"]
    e.pop("speculative", None)
    e["batching"] = "prefill_first"
    if rng.random() < 0.3:
        e.update(chunked_prefill=False, max_batched_tokens=int(rng.choice([512, 1024])))
    return d


def _disaggregated(d: dict, rng: np.random.Generator) -> None:
    """A cluster of prefill and decode groups (``sim.cluster.disagg``): 1-2 prefill replicas,
    1-3 decode replicas with their own pool and preemption mode, sometimes a co-located group
    serving one class, a link (preset or pipelined), a decode router, sometimes prefix caching,
    sometimes closed-loop users; in a third of the draws (by the scenario's seed, so that the
    draws before stay as they were) the first token streams from the prefill replica
    (``first_token = "prefill"``)."""
    e = d["engine"]
    e.pop("speculative", None) if rng.random() < 0.5 else None
    decode_engine = {"kv_blocks": int(rng.choice([48, 96, 200])),
                     "preemption": str(rng.choice(["recompute", "swap", "auto", "off"]))}
    groups = [{"name": "p", "role": "prefill", "replicas": int(rng.choice([1, 2]))},
              {"name": "d", "role": "decode", "replicas": int(rng.choice([1, 2, 3])), "engine": decode_engine}]
    router = str(rng.choice(["least_outstanding", "round_robin", "least_kv", "power_of_two"]))
    if rng.random() < 0.3:  # a co-located group for the urgent class beside the P/D pools
        groups[0]["classes"] = groups[1]["classes"] = ["lo"]
        groups.append({"name": "c", "role": "both", "replicas": 1, "classes": ["hi"]})
        router = "class_aware"
    d["cluster"] = {"groups": groups, "router": router,
                    "decode_router": str(rng.choice(["least_kv", "least_outstanding", "round_robin"])),
                    "link": {"preset": str(rng.choice(["nvlink", "ib-200", "pcie4"])), "kv_bytes_per_token": 131072,
                             "layers": 32, "pipelined": bool(rng.random() < 0.5)} if rng.random() < 0.5 else
                    {"bandwidth_bytes_per_s": float(rng.choice([1e8, 1e9])), "latency_s": 0.002,
                     "pipelined": bool(rng.random() < 0.5), "kv_bytes_per_token": 131072, "layers": 32}}
    if rng.random() < 0.25:
        e.update(prefix_caching=True, prefix_block_tokens=32)
        for s in d["streams"]:
            s["prefix"] = {"system_tokens": 64, "conversations": 3, "block_tokens": 32}
    if rng.random() < 0.3:  # closed-loop users beside the open streams (sometimes without thinking)
        think = {"dist": "exponential", "mean": 0.3} if rng.random() < 0.6 else {"dist": "constant", "value": 0.0}
        d["streams"].append({"tenant": "u", "class": str(rng.choice(["hi", "lo"])),
                             "arrival": {"process": "closed_loop", "users": int(rng.integers(1, 6)), "think": think},
                             "prompt_tokens": {"dist": "uniform", "low": 10, "high": 200},
                             "output_tokens": {"dist": "uniform", "low": 1, "high": 60}, "max_tokens": 60})
        if "tenants" in d:
            d["tenants"].append({"name": "u", "share": 1.0})
    if d["seed"] % 3 == 0:
        d["cluster"]["first_token"] = "prefill"


def _joinable(d: dict, rng: np.random.Generator) -> None:
    """A cluster whose requests may join runs in flight (``sim.cluster.replicas.Replica.join``):
    routed by counts, a fixed ranking, and nothing else for a boundary's plan to decide (no
    prefill caps, reservations, speculation, fairness accountant or overlap scheduling); the
    KV pool, budgets, preemption, drain and front-end delay still vary."""
    d["policy"] = {"name": str(rng.choice(["fcfs", "priority"]))}
    d["cluster"] = {"replicas": int(rng.choice([2, 3, 4])),
                    "router": str(rng.choice(["least_outstanding", "round_robin"]))}
    for c in d["classes"]:
        c.pop("max_prefill_tokens_per_step", None)
        c.pop("reserved_blocks", None)
    e = d["engine"]
    e.pop("speculative", None)
    e.get("overhead", {}).pop("overlap_schedule", None)
    d.pop("fairness", None)
    d.pop("tenants", None)
    if e["preemption"] == "off":
        e["preemption"] = "recompute"


def _replica_extras(d: dict, rng: np.random.Generator) -> None:
    """One replica's extra features: closed-loop users, admission gates, the victim rule, prefills
    that do not chunk."""
    e = d["engine"]
    if rng.random() < 0.3:
        d["streams"].append({"tenant": "u", "class": "hi",
                             "arrival": {"process": "closed_loop", "users": int(rng.integers(1, 5)),
                                         "think": {"dist": "exponential", "mean": 0.3}},
                             "prompt_tokens": {"dist": "uniform", "low": 10, "high": 100},
                             "output_tokens": {"dist": "uniform", "low": 1, "high": 60}, "max_tokens": 60})
        if "tenants" in d:
            d["tenants"].append({"name": "u", "share": 1.0})
    if rng.random() < 0.3:
        gates = {"shed": "deadline", "memory_budget": 0.8, "class_concurrency": {"lo": 3}}
        d["admission"] = {k: v for k, v in gates.items() if rng.random() < 0.5}
    if rng.random() < 0.2:
        e["victim"] = "prefix_aware"
    if rng.random() < 0.2:
        e.update(chunked_prefill=False, max_batched_tokens=1024)


def _run(d: dict, fast: bool):
    d = copy.deepcopy(d)
    if not fast:
        d["engine"].update(fast_forward=False, lazy_batch=False)
    sc = scenario_from_dict(d)
    if "cluster" in d:
        return simulate_cluster(sc, fast=fast, per_replica=False)
    return simulate(sc)


def _flat(node, path: str = "") -> dict[str, str]:
    """summary.json as dotted path -> JSON text of each leaf."""
    if isinstance(node, dict):
        return {k: v for key, val in node.items() for k, v in _flat(val, f"{path}.{key}").items()}
    if isinstance(node, list):
        return {k: v for i, val in enumerate(node) for k, v in _flat(val, f"{path}[{i}]").items()}
    return {path: json.dumps(node, default=str)}


def differences(fast, stepped) -> list[str]:
    """What differs between two runs' results (empty when they agree)."""
    out = []
    for table in ("requests", "timeseries"):
        try:
            pd.testing.assert_frame_equal(getattr(stepped, table), getattr(fast, table))
        except AssertionError as exc:
            out.append(f"{table}: {' '.join(str(exc).split())[:300]}")
    a, b = _flat(stepped.summary_dict), _flat(fast.summary_dict)
    keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k) and not any(x in k for x in NOT_COMPARED))
    if keys:
        out.append(f"summary.json: {', '.join(keys[:6])}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scripts.exactness_fuzz", description=__doc__.splitlines()[0])
    ap.add_argument("--kind", choices=KINDS, default="cluster")
    ap.add_argument("--start", type=int, default=0, help="first trial (its draw's seed)")
    ap.add_argument("--trials", type=int, default=100)
    args = ap.parse_args(argv)
    bad = 0
    for i in range(args.start, args.start + args.trials):
        d = draw(args.kind, np.random.default_rng(i))
        try:
            diff = differences(_run(d, True), _run(d, False))
        except ScenarioError as exc:  # (a draw the schema refuses: say so, it is the fuzz's fault)
            print(f"trial {i}: skipped, not a valid scenario: {exc}", flush=True)
            continue
        except Exception:  # noqa: BLE001 - a crash is a finding too
            diff = [traceback.format_exc(limit=-3)]
        if diff:
            bad += 1
            print(f"trial {i}: DIFFERENT\n  " + "\n  ".join(diff) + f"\n  scenario: {json.dumps(d)}", flush=True)
    print(f"{args.trials} {args.kind} trials from {args.start}: {bad} differ", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
