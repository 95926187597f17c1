"""Swap against recompute per victim on the shipped H200 / Llama-3-8B roofline: what preempting
one victim of a given length costs each way, and the length above which swap is cheaper.

Priced by ``swap_cost_ns`` and ``recompute_cost_ns`` of ``sim/core/preemption.py`` on the engine
``tests/test_preemption.py`` builds, at the profile's declared engine overhead unless
``--overhead`` names another. No simulation runs (well under a second). Prints Markdown.
Run: ``python -m scripts.preemption_costs [--overhead NAME]``
"""
from __future__ import annotations

import argparse

from sim import load_scenario
from sim.core.costs import load_profile
from sim.core.engine import Engine
from sim.core.kvpool import KVPool
from sim.core.preemption import recompute_cost_ns, swap_cost_ns
from sim.core.telemetry import Telemetry

PROFILE = "h200-llama-3-8b"
LENGTHS = (128, 512, 2048, 8000)  # victim lengths of the table (tokens)
DECODERS = (1, 32, 128)  # sequences decoding in the step the re-prefill joins


def engine(overhead: str | None, decoders: int) -> Engine:
    """An auto-preemption engine on the shipped profile with ``decoders`` running sequences."""
    costs = load_profile(PROFILE, overhead=overhead)
    cfg = load_scenario(None, overrides=["engine.preemption=\"auto\"", "engine.swap_blocks=100000"]).engine
    pool = KVPool(costs.kv_blocks(16), 16, [0], [0], host_total=100000)
    eng = Engine(None, cfg, costs, None, [None], pool, Telemetry(["c"], 10**9))
    eng.queues.running = dict.fromkeys(range(decoders))
    return eng


def crossover(eng: Engine, decoders: int) -> int:
    """The victim length (tokens, a multiple of 16) from which swap is always priced below
    recompute, up to 16k tokens. Not simply the first length where swap wins: with engine
    overhead a one-block victim's re-prefill pays a whole extra sequence's CPU time, so swap
    can win below a stretch where recompute wins."""
    last = 0
    for n in range(16, 16_384, 16):
        if swap_cost_ns(eng, eng.pool.blocks_for(n)) >= recompute_cost_ns(eng, n, decoders):
            last = n
    return last + 16


def table(overhead: str | None) -> list[str]:
    """The Markdown lines: costs per victim length, then the crossover per batch size."""
    engs = {d: engine(overhead, d) for d in DECODERS}
    out = [f"Engine overhead: `{engs[1].costs.overhead.name}`.", "",
           "| victim length (tokens) | swap out + in | recompute, alone (1 decoder) | recompute beside 128 decoders |",
           "|---|---|---|---|"]
    for n in LENGTHS:
        e1 = engs[1]
        swap = swap_cost_ns(e1, e1.pool.blocks_for(n)) / 1e6
        alone = recompute_cost_ns(e1, n, 1) / 1e6
        beside = recompute_cost_ns(engs[128], n, 128) / 1e6
        out.append(f"| {n:,} | {swap:.2f} ms | {alone:.2f} ms | {beside:.2f} ms |")
    out += ["", "| decoders in the step | crossover: swap is cheaper from (tokens) |", "|---|---|"]
    out += [f"| {d} | {crossover(engs[d], d)} |" for d in DECODERS]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scripts.preemption_costs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--overhead", default=None,
                    help="engine overhead preset (default: the profile's declared preset)")
    args = ap.parse_args(argv)
    print("\n".join(table(args.overhead)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
