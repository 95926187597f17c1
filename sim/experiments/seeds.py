"""What a scenario's seed changes, so that a sweep over seeds never repeats identical runs.

The seed feeds four random streams (``sim.run``): the workload (arrival processes, length
draws, a trace's ``sample``, ``assign`` fractions, synthetic prefixes, closed-loop users), the
policy (e.g. a noisy length predictor), speculative decoding (accepted tokens per step) and a
cluster's router (e.g. ``power_of_two``). A pure trace replay under deterministic parts gives
the same bytes under every seed, so more seeds would be duplicated work, not replication.

Each part is judged by what it does, not by its name, so a user's own policy or router is
judged the same way: the workload is built under two seeds and compared; a policy runs the
conformance suite's reference schedule (:func:`policies.check.uses_seed`) under two seeds; a
router routes a fixed sequence of requests under two seeds. Speculative decoding always draws.
"""
from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from sim.config import Scenario


def _workload_random(sc: Scenario) -> bool:
    from sim.assembly import build_workload

    a, b = (build_workload(sc.model_copy(update={"seed": s})) for s in (sc.seed, sc.seed + 1))
    return bool(a.closed) or not a.open.equals(b.open)


def _policy_random(name: str, params: dict) -> bool:
    from policies.check import uses_seed

    return uses_seed(name, **params)


def _router_random(name: str, params: dict) -> bool:
    from sim.routers import make_router

    reqs = [SimpleNamespace(request_id=i, cls="c", tenant="t", priority=0, prompt_tokens=100 + i,
                            max_tokens=100, arrival_s=i * 0.1) for i in range(64)]
    picks = []
    for seed in (1, 2):
        router = make_router(name, **params)
        router.bind(8, seed)
        cands = [SimpleNamespace(index=i, group="g", outstanding=(3 * i) % 4, kv_used=0.1 * (i % 3),
                                 waiting=0, running=0) for i in range(8)]
        picks.append([router.route(r, cands, i).index for i, r in enumerate(reqs)])
    return picks[0] != picks[1]


def seed_sources(sc: Scenario, cache: dict | None = None, *, first: bool = False) -> list[str]:
    """The parts of ``sc`` the seed changes (``workload``, ``policy``, ``speculative decoding``,
    ``router``); empty when every seed gives the same run. ``cache`` (a dict) is reused across
    calls so that a sweep judges each distinct workload, policy and router once. ``first``: stop
    at the first part found (whether the seed matters at all), judging the cheapest parts first
    (a policy's reference schedule under two seeds takes about 0.25 s)."""
    cache = {} if cache is None else cache
    if first:
        return _first_source(sc, cache)
    return [name for name, judge in _judges(sc, cache) if judge()]


def _first_source(sc: Scenario, cache: dict) -> list[str]:
    """The first part of ``sc`` the seed changes (a list of at most one), cheapest checks first."""
    cheap_first = ("speculative decoding", "router", "workload", "policy")
    judges = sorted(_judges(sc, cache), key=lambda nj: cheap_first.index(nj[0]))
    return next(([name] for name, judge in judges if judge()), [])


def _judges(sc: Scenario, cache: dict) -> list[tuple]:
    """``(part, judge)`` pairs in report order; ``judge()`` tells whether the seed changes the part
    (memoised in ``cache`` by what decides it)."""
    def memo(key: tuple, fn, *args) -> bool:
        k = json.dumps(key, sort_keys=True, default=str)
        if k not in cache:
            cache[k] = fn(*args)
        return cache[k]

    policies: list[Any] = [sc.policy]
    engines: list[Any] = [sc.engine]
    out = [("workload", lambda: memo(("workload", sc.streams, sc.horizon_s, sc.base_dir), _workload_random, sc))]
    if sc.cluster:
        from sim.cluster import parse_cluster

        spec = parse_cluster(sc)
        policies += [g.policy for g in spec.groups]
        engines += [g.engine for g in spec.groups]
        out.append(("router", lambda: memo(("router", spec.router, spec.router_params), _router_random,
                                           spec.router, spec.router_params)))
    out.append(("policy", lambda: any(memo(("policy", p.name, p.params()), _policy_random, p.name, p.params())
                                      for p in policies)))
    out.append(("speculative decoding", lambda: any(e.speculative is not None for e in engines)))
    return out


def drop_seed_repeats(specs: list, scenarios: list[Scenario]) -> tuple[list, int]:
    """Of sweep run specs (``sim.experiments.sweep.RunSpec``, with their validated ``scenarios``) that differ
    only in the seed, keep the first alone when the seed changes nothing in them. Returns the
    kept specs, in order, and how many were dropped."""
    cache: dict = {}
    first: dict[str, int] = {}
    inert: dict[str, bool] = {}
    keep = []
    for i, (spec, sc) in enumerate(zip(specs, scenarios)):
        cell = json.dumps([{k: v for k, v in spec.scenario.items() if k != "seed"}, spec.load_scale,
                           {k: v for k, v in spec.axes.items() if k != "seed"}], sort_keys=True, default=str)
        if cell not in first:
            first[cell] = i
            keep.append(spec)
            continue
        if cell not in inert:
            inert[cell] = not seed_sources(scenarios[first[cell]], cache, first=True)
        if not inert[cell]:
            keep.append(spec)
    return keep, len(specs) - len(keep)


__all__ = ["seed_sources", "drop_seed_repeats"]
