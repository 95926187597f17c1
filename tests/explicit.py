"""Build scenarios from an explicit list of requests (hand-checked cases).

Each class gets one CSV trace stream written to a temporary folder; ``t0 = 0`` keeps the
arrival times as given.
"""
from __future__ import annotations

import copy
from pathlib import Path

from sim import scenario_from_dict, simulate

STEP = {"kind": "linear", "base_s": 1.0, "prefill_token_s": 0.0, "decode_token_s": 0.0, "context_token_s": 0.0}


def explicit_scenario(tmp_path: Path, requests: list[tuple], classes: list[tuple],
                      engine: dict, policy: str = "priority", max_tokens: int | None = None,
                      classes_extra: dict | None = None, **top) -> dict:
    """``requests``: (arrival_s, class, prompt_tokens, output_tokens) in request-id order
    (ids follow arrival order, ties by class declaration order). ``classes``: (name, priority)
    or (name, priority, reserved_blocks)."""
    streams = []
    for name, *_ in classes:
        rows = [r for r in requests if r[1] == name]
        if not rows:
            continue
        path = tmp_path / f"{name}.csv"
        path.write_text("t,p,o\n" + "".join(f"{a},{p},{o}\n" for a, _, p, o in rows))
        s = {"tenant": name, "class": name,
             "trace": {"format": "csv", "path": str(path), "t0": 0,
                       "columns": {"arrival_s": "t", "prompt_tokens": "p", "output_tokens": "o"}}}
        if max_tokens is not None:
            s["max_tokens"] = max_tokens
        streams.append(s)
    eng = {"profile": dict(STEP), "block_size": 16, "kv_blocks": 1000, "max_num_seqs": 16,
           "max_batched_tokens": 8192, "preempt_for_waiting": "never", "timeseries_interval_s": 1.0}
    eng.update(engine)
    sc = {"name": "explicit", "seed": 0, "horizon_s": 1000.0, "drain": True, "engine": eng,
          "policy": {"name": policy}, "classes": [{"name": c[0], "priority": c[1], "reserved_blocks": c[2] if len(c) > 2 else 0}
                      for c in classes],
          "streams": streams}
    for c in sc["classes"]:
        c.update((classes_extra or {}).get(c["name"], {}))
    sc.update(top)
    return sc


def run_explicit(tmp_path, requests, classes, engine, **kw):
    sc = explicit_scenario(tmp_path, requests, classes, engine, **{k: v for k, v in kw.items() if k != "trace"})
    return simulate(scenario_from_dict(copy.deepcopy(sc), base_dir=tmp_path), trace_iterations=True,
                    check_invariants=True)
