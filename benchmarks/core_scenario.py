"""The benchmark scenario shared by benchmarks: Poisson arrivals, two classes, lognormal
lengths, strict priority with recompute preemption, on the default H200 / Llama-3-8B profile;
and the overrides that make the shipped ``servegen_multitenant`` scenario the 16-replica
ServeGen cluster the speed rows measure (:func:`servegen_overrides`).

Two pricings: ``"default"`` leaves ``engine.overhead`` unset, so the profile's default preset
prices the steps (what users run; the headline rows), ``"none"`` pins the profile's step times
alone (the rows before 2026-12-06, kept as a second table).

``SATURATION_RPS_MEASURED`` is the replica's sustainable request rate for this length mix under
each pricing, found by ``python -m benchmarks.core_scenario`` (:func:`search`: a bisection on the
arrival rate for the highest one whose completions keep pace with it, next to a saturated run's
throughput). ``load`` multiplies it.
"""
from __future__ import annotations

PRICINGS = ("default", "none")


def scenario(n_requests: int, load: float = 0.8, fast_forward: bool = True, sat_rps: float | None = None,
             seed: int = 7, pricing: str = "default", batching: str = "mixed") -> dict:
    """The core scenario with ``n_requests`` expected arrivals at ``load`` times the saturation
    rate (requests/s) of ``pricing`` (or ``sat_rps``); ``batching``: ``engine.batching``."""
    if pricing not in PRICINGS:
        raise ValueError(f"pricing: expected one of {', '.join(PRICINGS)} (got {pricing!r})")
    sat = sat_rps or SATURATION_RPS_MEASURED[pricing]
    rate = load * sat
    horizon = n_requests / rate
    # "none": the profile's step times alone; "default": no key, so the default preset applies
    overhead = {"overhead": "none"} if pricing == "none" else {}
    return {
        "name": f"bench-{n_requests}", "seed": seed, "horizon_s": horizon, "drain": True,
        "engine": {"profile": "h200-llama-3-8b", **overhead, "max_num_seqs": 256, "max_batched_tokens": 8192,
                   "preemption": "recompute", "preempt_for_waiting": "strict",
                   "fast_forward": fast_forward, "timeseries_interval_s": 10.0,
                   **({} if batching == "mixed" else {"batching": batching})},
        "policy": {"name": "priority"},
        "classes": [{"name": "interactive", "priority": 0, "ttft_slo_s": 0.5},
                    {"name": "batch", "priority": 1}],
        "streams": [
            {"tenant": "chat", "class": "interactive", "arrival": {"process": "poisson", "rate": rate * 0.3},
             "prompt_tokens": {"dist": "lognormal", "median": 600, "sigma": 0.8, "min": 8, "max": 8000},
             "output_tokens": {"dist": "lognormal", "median": 150, "sigma": 0.8, "min": 4, "max": 2000},
             "max_tokens": 2000},
            {"tenant": "jobs", "class": "batch", "arrival": {"process": "poisson", "rate": rate * 0.7},
             "prompt_tokens": {"dist": "lognormal", "median": 600, "sigma": 0.8, "min": 8, "max": 8000},
             "output_tokens": {"dist": "lognormal", "median": 150, "sigma": 0.8, "min": 4, "max": 2000},
             "max_tokens": 2000},
        ],
    }


# requests/s, by pricing (python -m benchmarks.core_scenario; see results.md); measure again after
# a refit of the profile or of the default preset, which move it.
SATURATION_RPS_MEASURED = {"default": 25.3, "none": 25.6}  # measured 2026-12-06


def servegen_overrides(horizon_s: float, pinned: bool = True) -> list[str]:
    """``--set`` overrides of ``servegen_multitenant`` for the 16-replica ServeGen cluster over
    ``horizon_s`` seconds: the whole day's traces, unsampled, and (``pinned``) the pricing pinned
    to no engine overhead, as the core cases (the rows measure the engine's speed; the default
    preset's longer steps make a heavier workload, see results.md). Run at ``load_scale=2.0``.
    ``pinned=False`` keeps the scenario's own preset, as docs/cluster.md runs it: queues build
    and waiters preempt running requests, the path a KV-bound replica takes."""
    return ([f"horizon_s={horizon_s:g}", "cluster={replicas=16}"] + (['engine.overhead="none"'] if pinned else [])
            + [f"streams.{i}.trace.sample=1.0" for i in range(3)]
            + [f"streams.{i}.trace.window=[0.0, 86400.0]" for i in range(3)])



def _second_half_rate(pricing: str, rate: float, n: int, seed: int) -> float:
    """Completions per second over the second half of a run with Poisson arrivals at ``rate``
    (requests/s) for ``n`` expected requests, not drained: equal to ``rate`` (up to noise) while
    the replica keeps pace, its capacity once the queue grows."""
    from sim import scenario_from_dict, simulate

    d = scenario(n, load=1.0, sat_rps=rate, seed=seed, pricing=pricing) | {"drain": False}
    res = simulate(scenario_from_dict(d))
    r = res.requests
    half = res.summary_dict["run"]["end_s"] / 2
    return float(((r.status == "finished") & (r.finish_s > half)).sum() / half)


def search(pricing: str, n: int = 20_000, steps: int = 7, keep_pace: float = 0.98, seed: int = 7) -> dict:
    """The saturation rate (requests/s) under ``pricing``: first a saturated run's throughput
    (arrivals at 150/s, completions per second over its second half), then a bisection on the
    arrival rate between half and 1.2 times it for the highest rate whose completions keep pace
    (at least ``keep_pace`` of the rate over the second half), ``steps`` probes of ``n``
    requests each. Returns both and the probes."""
    saturated = _second_half_rate(pricing, 150.0, n, seed)
    lo, hi, probes = 0.5 * saturated, 1.2 * saturated, []
    for _ in range(steps):
        mid = (lo + hi) / 2
        done = _second_half_rate(pricing, mid, n, seed)
        probes.append((round(mid, 2), round(done, 2)))
        lo, hi = (mid, hi) if done >= keep_pace * mid else (lo, mid)
    return {"pricing": pricing, "saturated_rps": round(saturated, 2), "sustainable_rps": round(lo, 2),
            "probes": probes}



if __name__ == "__main__":
    for p in PRICINGS:
        print(search(p), flush=True)
