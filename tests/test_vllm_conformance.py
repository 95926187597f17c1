"""Small cases restated from vLLM's own scheduler tests (vllm-project/vllm, tests/v1/core), replayed with
``preempt_for_waiting = "never"`` (vLLM V1) through the iteration trace.

Every request is present before the first step: all arrive at t = 0 in one trace stream, in
order of the case's arrival times, and a per-row priority column assigns the class. Our request
id k is the k-th arrival; ``vid`` maps it back to the case's own request id.
"""
from __future__ import annotations

import copy

import numpy as np

from sim import scenario_from_dict, simulate
from tests.explicit import STEP


def _case(tmp_path, priorities, arrivals, prompt=10, output=16, engine=None, policy="priority"):
    order = np.argsort(arrivals, kind="stable")  # our id k  <->  case id order[k]
    rows = "".join(f"0,{prompt if np.isscalar(prompt) else prompt[i]},{output},{priorities[i]}\n" for i in order)
    path = tmp_path / "case.csv"
    path.write_text("t,p,o,prio\n" + rows)
    prios = sorted(set(priorities))
    eng = {"profile": dict(STEP), "block_size": 16, "kv_blocks": 1000, "max_num_seqs": 16,
           "max_batched_tokens": 8192, "preempt_for_waiting": "never", "chunked_prefill": True}
    eng.update(engine or {})
    sc = {"name": "vllm-case", "seed": 0, "horizon_s": 100.0, "drain": True, "engine": eng,
          "policy": {"name": policy},
          "classes": [{"name": f"p{p}", "priority": p} for p in prios],
          "streams": [{"tenant": "t", "class": f"p{prios[0]}",
                       "trace": {"format": "csv", "path": str(path), "t0": 0,
                                 "columns": {"arrival_s": "t", "prompt_tokens": "p", "output_tokens": "o",
                                             "f_prio": "prio"}},
                       "assign": [{"column": "f_prio", "equals": p, "class": f"p{p}"} for p in prios]}]}
    # every class must be named by a stream: add empty-rate placeholders for the others
    res = simulate(scenario_from_dict(copy.deepcopy(sc), base_dir=tmp_path), trace_iterations=True,
                   check_invariants=True)
    vid = {k: int(order[k]) for k in range(len(order))}
    return res, vid


def _admission_order(res, vid):
    it = res.iterations
    first = it[it.kind.isin(["prefill"])].drop_duplicates("request_id")
    return [vid[r] for r in first.request_id]


def test_case1_order(tmp_path):
    res, vid = _case(tmp_path, [2, 0, 1], [1, 2, 3])
    it = res.iterations
    assert [vid[r] for r in it[it.iteration == 0].request_id] == [1, 2, 0]


def test_case2_ties_by_arrival(tmp_path):
    res, vid = _case(tmp_path, [1, 1, 1], [3, 1, 2])
    it = res.iterations
    assert [vid[r] for r in it[it.iteration == 0].request_id] == [1, 2, 0]


def test_case3_mixed(tmp_path):
    res, vid = _case(tmp_path, [2, 1, 1, 0], [1, 3, 2, 4])
    it = res.iterations
    assert [vid[r] for r in it[it.iteration == 0].request_id] == [3, 2, 1, 0]


def test_case4_fcfs_fallback(tmp_path):
    res, vid = _case(tmp_path, [1, 1, 1, 1], [4, 1, 3, 2])
    it = res.iterations
    assert [vid[r] for r in it[it.iteration == 0].request_id] == [1, 3, 2, 0]


def test_case5_cap_respects_priority(tmp_path):
    res, vid = _case(tmp_path, [3, 1, 2, 0], [1, 2, 3, 4], engine={"max_num_seqs": 2})
    it = res.iterations
    assert sorted(vid[r] for r in it[it.iteration == 0].request_id) == [1, 3]
    assert _admission_order(res, vid) == [3, 1, 2, 0]


def test_case6_one_slot(tmp_path):
    res, vid = _case(tmp_path, [3, 1, 2, 0], [1, 2, 3, 4], engine={"max_num_seqs": 1})
    it = res.iterations
    assert [vid[r] for r in it[it.iteration == 0].request_id] == [3]
    assert _admission_order(res, vid) == [3, 1, 2, 0]


def test_case7_preempt_on_kv_exhaustion_then_recompute(tmp_path):
    """4 blocks of 16. low (prio 1, 30-token prompt) prefills at step 0 and decodes at step 1;
    high (prio 0, 32 tokens) joins at step 1. At step 2 low needs 2 blocks and high 3: 5 > 4,
    so low is preempted; when high finishes, low re-prefills 32 = 30 + 2 generated tokens."""
    path = tmp_path / "c7.csv"
    path.write_text("t,p,o,prio\n0,30,6,1\n1,32,12,0\n")
    sc = {"name": "c7", "seed": 0, "horizon_s": 100.0, "drain": True,
          "engine": {"profile": dict(STEP), "block_size": 16, "kv_blocks": 4, "max_num_seqs": 2,
                     "max_batched_tokens": 200, "preempt_for_waiting": "never"},
          "policy": {"name": "priority"},
          "classes": [{"name": "high", "priority": 0}, {"name": "low", "priority": 1}],
          "streams": [{"tenant": "t", "class": "low", "max_tokens": 12,
                       "trace": {"format": "csv", "path": str(path), "t0": 0,
                                 "columns": {"arrival_s": "t", "prompt_tokens": "p", "output_tokens": "o",
                                             "f_prio": "prio"}},
                       "assign": [{"column": "f_prio", "equals": 0, "class": "high"},
                                  {"column": "f_prio", "equals": 1, "class": "low"}]}]}
    res = simulate(scenario_from_dict(sc, base_dir=tmp_path), trace_iterations=True, check_invariants=True)
    it = res.iterations
    low, high = 0, 1
    step = lambda i: list(zip(it[it.iteration == i].request_id, it[it.iteration == i].kind,  # noqa: E731
                              it[it.iteration == i].tokens))
    assert step(0) == [(low, "prefill", 30)]
    assert step(1) == [(low, "decode", 1), (high, "prefill", 32)]
    assert step(2) == [(high, "decode", 1)]  # low preempted: 2 + 3 blocks > 4
    rec = it[(it.request_id == low) & (it.kind == "recompute")]
    assert list(rec.tokens) == [32]  # 30 prompt + 2 generated
    high_finish = res.requests.set_index("request_id").loc[high, "finish_s"]
    assert rec.start_s.iloc[0] == high_finish  # resumes the step after high finishes
    r = res.requests.set_index("request_id")
    assert r.loc[low, "preemptions"] == 1 and r.loc[low, "generated_tokens"] == 6


def test_case8_chunked_prefill_per_request_cap(tmp_path):
    res, vid = _case(tmp_path, [0, 0, 0], [1, 2, 3], prompt=800,
                     engine={"max_batched_tokens": 1024, "max_prefill_chunk": 400})
    it = res.iterations
    tok = lambda i: [(vid[r], k, t) for r, k, t in zip(it[it.iteration == i].request_id,  # noqa: E731
                                                       it[it.iteration == i].kind, it[it.iteration == i].tokens)]
    assert tok(0) == [(0, "prefill", 400), (1, "prefill", 400), (2, "prefill", 224)]
    assert tok(1) == [(0, "prefill", 400), (1, "prefill", 400), (2, "prefill", 224)]
    assert tok(2) == [(0, "decode", 1), (1, "decode", 1), (2, "prefill", 352)]


def test_case9_fcfs_victim_is_newest(tmp_path):
    """10 blocks of 16, budget 100: the first request (79-token prompt here, so that both fill
    exactly 5 blocks after one step each) needs a 6th block; the newer one is preempted.
    (vLLM's version counts 80 tokens with its reserved null block; the arithmetic is the same.)"""
    path = tmp_path / "c9.csv"
    path.write_text("t,p,o\n0,79,20\n1,80,20\n")
    sc = {"name": "c9", "seed": 0, "horizon_s": 100.0, "drain": True,
          "engine": {"profile": dict(STEP), "block_size": 16, "kv_blocks": 10, "max_num_seqs": 8,
                     "max_batched_tokens": 100, "preempt_for_waiting": "never"},
          "policy": {"name": "fcfs"}, "classes": [{"name": "c", "priority": 0}],
          "streams": [{"tenant": "t", "class": "c", "trace": {"format": "csv", "path": str(path), "t0": 0,
                       "columns": {"arrival_s": "t", "prompt_tokens": "p", "output_tokens": "o"}}}]}
    res = simulate(scenario_from_dict(sc, base_dir=tmp_path), trace_iterations=True, check_invariants=True)
    it = res.iterations
    assert list(zip(it[it.iteration == 1].request_id, it[it.iteration == 1].kind)) == [(0, "decode"), (1, "prefill")]
    assert list(it[it.iteration == 2].request_id) == [0]  # 1 preempted, 0 keeps running
    r = res.requests.set_index("request_id")
    assert r.loc[1, "preemptions"] >= 1 and r.loc[0, "preemptions"] == 0


def _two_prompts(tmp_path, running_order: str, prompt: int = 400, kv_blocks: int = 1000):
    """A ``prompt``-token prompt of priority 1 at t = 0, then one of priority 0 during the first
    step; budget 100 tokens, at most 60 prompt tokens per request per step, priority scheduling."""
    path = tmp_path / "order.csv"
    path.write_text(f"t,p,o,prio\n0,{prompt},4,1\n0.000001,{prompt},4,0\n")
    sc = {"name": "order", "seed": 0, "horizon_s": 100.0, "drain": True,
          "engine": {"profile": dict(STEP), "block_size": 16, "kv_blocks": kv_blocks, "max_num_seqs": 8,
                     "max_batched_tokens": 100, "max_prefill_chunk": 60, "preempt_for_waiting": "never",
                     "running_order": running_order, "watermark": 0, "preemption": "recompute"},
          "policy": {"name": "priority"}, "classes": [{"name": "p0", "priority": 0}, {"name": "p1", "priority": 1}],
          "streams": [{"tenant": "t", "class": "p1", "trace": {
              "format": "csv", "path": str(path), "t0": 0,
              "columns": {"arrival_s": "t", "prompt_tokens": "p", "output_tokens": "o", "f_prio": "prio"}},
              "assign": [{"column": "f_prio", "equals": p, "class": f"p{p}"} for p in (0, 1)]}]}
    res = simulate(scenario_from_dict(sc, base_dir=tmp_path), trace_iterations=True, check_invariants=True)
    it = res.iterations
    return [list(zip(it[it.iteration == i].request_id, it[it.iteration == i].tokens)) for i in range(3)]


def test_v1_running_requests_take_the_budget_in_admission_order(tmp_path):
    """vLLM V1 walks its running list in the order requests were admitted, priority scheduling
    or not (Scheduler.schedule: ``self.running``, appended to at each admission): the urgent
    request admitted second gets what the budget leaves after the earlier one's chunk.
    ``engine.running_order = "rank"`` (priosim's own) serves the more urgent first."""
    steps = _two_prompts(tmp_path, "admission")
    assert steps[0] == [(0, 60)] and steps[1] == [(0, 60), (1, 40)]
    assert steps[2] == [(0, 60), (1, 40)]  # (the urgent one still second)
    assert _two_prompts(tmp_path, "rank")[2] == [(1, 60), (0, 40)]


def test_a_chunk_keeps_its_size_while_it_preempts(tmp_path):
    """vLLM V1 keeps a running request's ``num_new_tokens`` while it preempts for its blocks:
    the tokens a victim scheduled earlier in the step gives back do not enlarge the chunk the
    blocks were freed for (a larger one could need more blocks than are free). 200-token
    prompts in 15 blocks of 16: in the third step the earlier, low-priority request takes its
    60 tokens (the last 4 blocks), the urgent one's 40 need 2 more and preempt it; the urgent
    one still takes 40."""
    steps = _two_prompts(tmp_path, "admission", prompt=200, kv_blocks=15)
    assert steps[1] == [(0, 60), (1, 40)]
    assert steps[2] == [(1, 40)]


def test_vllm_v1_defaults_walk_running_requests_as_admitted():
    from sim.config import load_scenario
    from sim.engines import resolve

    for engine, version, order in (("vllm", "0.11.0", "admission"), ("vllm", "0.6.3", "rank"),
                                   ("sglang", "0.5.5", "admission")):
        sc = load_scenario("chat_vs_batch", overrides=[f'engine.engine="{engine}"',
                                                       f'engine.engine_version="{version}"'])
        assert resolve(sc.engine, ".", "s").running_order == order, (engine, version)
