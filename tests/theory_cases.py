"""Single-server queueing cases with closed-form answers, shared by tests/test_theory.py and
scripts/validation_table.py.

The engine is configured as one server: ``max_num_seqs = 1``, an inline linear profile whose
only cost is a constant step time ``STEP_S`` (no per-token or context cost), prompts of one
token (its prefill is one step that emits the first token) and a huge KV pool. A request's
service time is therefore ``output_tokens * STEP_S`` exactly, and Poisson arrivals per class
make the replica an M/G/1 queue. Theory values are computed from the simulated requests' own
service-time moments and arrival counts, so only the queueing discipline is being tested.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from sim import scenario_from_dict, simulate

STEP_S = 0.005          # s per step = per output token
MEAN_TOKENS = 20        # mean output tokens: E[S] = 0.1 s


def single_server(*, policy: dict, classes: list[tuple[str, int, float]], horizon_s: float, seed: int,
                  preempt_for_waiting: str = "never", preemption: str = "recompute",
                  output: object = None, max_num_seqs: int = 1, drain: bool = True) -> dict:
    """Scenario dict: one Poisson stream per class ``(name, priority, rate)``."""
    output = output if output is not None else {"dist": "exponential", "mean": MEAN_TOKENS}
    return {
        "name": "single_server", "seed": seed, "horizon_s": horizon_s, "drain": drain,
        "engine": {"max_num_seqs": max_num_seqs, "max_batched_tokens": 64, "block_size": 16,
                   "kv_blocks": 1_000_000, "swap_blocks": 1_000_000, "preemption": preemption,
                   "preempt_for_waiting": preempt_for_waiting,
                   "profile": {"kind": "linear", "base_s": STEP_S, "prefill_token_s": 0.0,
                               "decode_token_s": 0.0, "context_token_s": 0.0, "swap_block_s": 0.0}},
        "policy": policy,
        "classes": [{"name": n, "priority": p} for n, p, _ in classes],
        "streams": [{"tenant": n, "class": n, "arrival": {"process": "poisson", "rate": r},
                     "prompt_tokens": 1, "output_tokens": output} for n, _, r in classes],
    }


def run(sc: dict) -> pd.DataFrame:
    res = simulate(scenario_from_dict(sc))
    df = res.requests.copy()
    df["service_s"] = df["output_tokens"] * STEP_S
    df["wait_s"] = df["admitted_s"] - df["arrival_s"]           # first admission
    df["sojourn_s"] = df["finish_s"] - df["arrival_s"]
    return df


def moments(df: pd.DataFrame, horizon_s: float, classes: list[str]) -> list[tuple[float, float, float]]:
    """Per class (lambda, E[S], E[S^2]) of the simulated requests."""
    out = []
    for c in classes:
        s = df.loc[df["class"] == c, "service_s"].to_numpy()
        out.append((len(s) / horizon_s, float(s.mean()), float((s ** 2).mean())))
    return out


def pk_wait(lam: float, es: float, es2: float) -> float:
    """Pollaczek-Khinchine: W = lambda E[S^2] / (2 (1 - rho)), rho = lambda E[S]."""
    return lam * es2 / (2 * (1 - lam * es))


def cobham_waits(m: list[tuple[float, float, float]]) -> list[float]:
    """Non-preemptive priority: W_k = W0 / ((1 - s_{k-1})(1 - s_k)), W0 = sum lambda_i E[S_i^2]/2."""
    w0 = sum(l * e2 for l, _, e2 in m) / 2
    out, s = [], 0.0
    for l, e, _ in m:
        prev, s = s, s + l * e
        out.append(w0 / ((1 - prev) * (1 - s)))
    return out


def preemptive_sojourns(m: list[tuple[float, float, float]]) -> list[float]:
    """Preemptive-resume priority: T_k = E[S_k]/(1 - s_{k-1})
    + (sum_{i<=k} lambda_i E[S_i^2] / 2) / ((1 - s_{k-1})(1 - s_k))."""
    out, s, r = [], 0.0, 0.0
    for l, e, e2 in m:
        prev, s = s, s + l * e
        r += l * e2 / 2
        out.append(e / (1 - prev) + r / ((1 - prev) * (1 - s)))
    return out


# ---- the five cases (parameters shared by the tests and the validation table) --------------
SEEDS = (1, 2, 3)


def case_pk(seed: int, horizon_s: float = 2000.0):
    """FCFS, one class, load 0.7. Returns (simulated mean wait, P-K mean wait)."""
    rate = 0.7 / (MEAN_TOKENS * STEP_S)
    df = run(single_server(policy={"name": "fcfs"}, classes=[("a", 0, rate)], horizon_s=horizon_s, seed=seed))
    (lam, es, es2), = moments(df, horizon_s, ["a"])
    return float(df["wait_s"].mean()), pk_wait(lam, es, es2)


PRIO_CLASSES = [("c0", 0, 2.0), ("c1", 1, 2.0), ("c2", 2, 3.0)]  # loads 0.2, 0.2, 0.3: total 0.7


def case_priority(seed: int, preemptive: bool, horizon_s: float = 2000.0):
    """Strict priority, three classes at total load 0.7. Returns (simulated, theory) per class:
    mean wait before first admission (non-preemptive, Cobham) or mean sojourn (preemptive-resume)."""
    kw = dict(preempt_for_waiting="strict", preemption="swap") if preemptive else {}
    df = run(single_server(policy={"name": "priority"}, classes=PRIO_CLASSES, horizon_s=horizon_s,
                           seed=seed, **kw))
    names = [c[0] for c in PRIO_CLASSES]
    m = moments(df, horizon_s, names)
    col = "sojourn_s" if preemptive else "wait_s"
    sim = [float(df.loc[df["class"] == c, col].mean()) for c in names]
    theory = preemptive_sojourns(m) if preemptive else cobham_waits(m)
    return sim, theory, df


WFQ_WEIGHTS = {"gold": 8, "silver": 2, "bronze": 1}


def case_wfq(seed: int, horizon_s: float = 120.0):
    """WFQ (8, 2, 1), three saturated classes of equal lengths, 4 slots, no drain.
    Returns (simulated token shares, w_k / sum w)."""
    classes = [(n, 0, 60.0) for n in WFQ_WEIGHTS]  # each class alone offers 1.5x capacity
    sc = single_server(policy={"name": "wfq", "weights": WFQ_WEIGHTS}, classes=classes,
                       horizon_s=horizon_s, seed=seed, output=10, max_num_seqs=4, drain=False)
    res = simulate(scenario_from_dict(sc))
    tok = res.requests.groupby("class")["generated_tokens"].sum()
    total = float(tok.sum())
    wsum = sum(WFQ_WEIGHTS.values())
    return ([float(tok[n]) / total for n in WFQ_WEIGHTS], [w / wsum for w in WFQ_WEIGHTS.values()])


AGING_ALPHA = 1.0  # priority levels per second: the bound is 3 s plus one service time


def case_aging(seed: int, policy: str, horizon_s: float = 1000.0):
    """Class 0 at load 0.9 plus a rare class 3 (load 0.01), non-preemptive.
    Returns (worst wait class 0, worst wait class 3, largest service time)."""
    pol = {"name": "aging", "alpha": AGING_ALPHA} if policy == "aging" else {"name": policy}
    classes = [("c0", 0, 0.9 / (MEAN_TOKENS * STEP_S)), ("c3", 3, 0.1)]
    df = run(single_server(policy=pol, classes=classes, horizon_s=horizon_s, seed=seed))
    w = df.groupby("class")["wait_s"].max()
    return float(w["c0"]), float(w["c3"]), float(df["service_s"].max())
