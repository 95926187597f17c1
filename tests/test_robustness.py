"""Robustness: runs that cannot progress end with one clear error; runs that can, end.

Covers the engine's progress guarantee (arrival sizing with speculative draft slots, eviction
for a waiter only at a token boundary under ``preempt_for_waiting = "policy"``, stall detection,
the ``max_events`` safety stop), ``simulate()`` on a ``[cluster]`` scenario, and sweeps sharing
one folder.
"""
from __future__ import annotations

import copy
import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import sim.core.engine
import sim.core.loop
import sim.core.observe
from sim import scenario_from_dict, simulate
from sim.core.errors import ScenarioError, StallError

ROOT = Path(__file__).resolve().parents[1]
LIN = {"kind": "linear", "base_s": 0.01, "prefill_token_s": 1e-5, "decode_token_s": 1e-4, "context_token_s": 0.0}

# speculative decoding with a 4-block pool: a 61-token prompt with k = 4 drafts needs 66 slots
TINY_SPEC = {
    "name": "tiny_spec", "seed": 685, "horizon_s": 120.0,
    "engine": {"kv_blocks": 4, "max_prefill_chunk": 1, "preemption": "swap", "swap_blocks": 4,
               "speculative": {"k": 4, "acceptance": 0.5, "draft_cost_fraction": 0.5}, "max_events": 20000},
    "classes": [{"name": "c0", "priority": 0}],
    "streams": [
        {"tenant": "t1", "class": "c0", "arrival": {"process": "poisson", "rate": 0.6208},
         "prompt_tokens": {"dist": "lognormal", "median": 61.0, "sigma": 1.16, "min": 1, "max": 4000},
         "output_tokens": 1},
        {"tenant": "t1", "class": "c0",
         "arrival": {"process": "closed_loop", "users": 1, "think": {"dist": "exponential", "mean": 0.2, "max": 30.0}},
         "prompt_tokens": 1, "output_tokens": 100},
    ],
}

# FastServe-style MLFQ, any request may evict what the policy ranks below it, recompute: a batch
# of long prompts, 2 slots, prefill 16 tokens a step, starvation promotion every 0.5 s
MLFQ_POLICY = {
    "name": "mlfq_policy", "seed": 1, "horizon_s": 1.0,
    "engine": {"profile": LIN, "kv_blocks": 2000, "max_num_seqs": 2, "max_prefill_chunk": 16,
               "preemption": "recompute", "preempt_for_waiting": "policy", "max_events": 30000},
    "policy": {"name": "mlfq", "starve_limit_s": 0.5},
    "classes": [{"name": "c", "priority": 0}],
    "streams": [{"tenant": "t", "class": "c", "arrival": {"process": "batch", "n": 20},
                 "prompt_tokens": {"dist": "uniform", "low": 600, "high": 1000},
                 "output_tokens": {"dist": "uniform", "low": 5, "high": 50}}],
}


def _sim(d: dict, **kw):
    return simulate(scenario_from_dict(copy.deepcopy(d)), **kw)


def _all_final(res) -> None:
    assert set(res.requests["status"]) <= {"finished", "rejected", "unfinished"}
    assert not (res.requests["status"] == "unfinished").any()  # drained


@pytest.mark.parametrize("preemption", ["swap", "recompute"])
def test_speculation_with_a_tiny_pool_ends(preemption):
    """Requests whose prompt, output and k draft slots cannot fit the pool are rejected at arrival
    (before: a negative delay with swap, an endless thrash with recompute)."""
    d = copy.deepcopy(TINY_SPEC)
    d["engine"]["preemption"] = preemption
    res = _sim(d, check_invariants=True)
    _all_final(res)
    req = res.requests
    big = req[req["prompt_tokens"] + req["max_tokens"] + 4 > 4 * 16]
    assert len(big) and (big["status"] == "rejected").all()
    assert set(big["reject_reason"]) == {"too_large"}
    small = req[req["prompt_tokens"] + req["max_tokens"] + 4 <= 4 * 16]
    assert len(small) and (small["status"] == "finished").all()


def test_draft_slots_count_only_when_drafts_take_blocks():
    """Sized with k draft slots under preemption; without preemption (blocks reserved to
    max_tokens up front, drafts take none) a request that fits to max_tokens is served."""
    d = copy.deepcopy(TINY_SPEC)
    d["streams"] = [{"tenant": "t", "class": "c0", "arrival": {"process": "batch", "n": 1},
                     "prompt_tokens": 60, "output_tokens": 2}]  # 62 tokens: 4 blocks; 66 with drafts
    assert _sim(d).requests["reject_reason"].tolist() == ["too_large"]
    d["engine"]["preemption"] = "off"
    assert _sim(d).requests["status"].tolist() == ["finished"]


def test_closed_loop_user_rejected_at_arrival_sends_again_without_a_negative_delay():
    """A closed-loop request rejected at its arrival instant (before the boundary where the
    engine sees it) answers its user then; the next send may already be due: no crash."""
    d = copy.deepcopy(TINY_SPEC)
    d["streams"] = d["streams"][1:]  # 1 + 100 tokens (+4): never fits 4 blocks
    d["horizon_s"] = 5.0
    res = _sim(d)
    assert (res.requests["reject_reason"] == "too_large").all() and len(res.requests) > 5


def test_mlfq_with_policy_preemption_finishes():
    """Starvation promotion kept evicting requests before they finished, and recompute
    discarded their work each time: nothing finished (a livelock). The oldest running request,
    once preempted, is not evicted for a waiter again: every request finishes, in few events."""
    res = _sim(MLFQ_POLICY, check_invariants=True)
    assert (res.requests["status"] == "finished").all() and len(res.requests) == 20
    assert res.summary_dict["run"]["engine_events"] < 5000  # (30,000 were not enough before)


def test_policy_mode_still_preempts_for_a_more_urgent_waiter():
    """The guard leaves a first preemption alone: under MLFQ a short request arriving while a
    long one runs (one slot) still evicts it."""
    d = copy.deepcopy(MLFQ_POLICY)
    d["engine"].update(max_num_seqs=1, max_prefill_chunk=0)
    d["policy"] = {"name": "mlfq", "base_quantum_s": 0.01, "starve_limit_s": None}
    d["streams"] = [{"tenant": "t", "class": "c", "arrival": {"process": "batch", "n": 1},
                     "prompt_tokens": 10, "output_tokens": 400},
                    {"tenant": "t", "class": "c", "arrival": {"process": "batch", "n": 1, "at_s": 0.5},
                     "prompt_tokens": 10, "output_tokens": 2}]
    req = _sim(d).requests.set_index("request_id")
    assert req.loc[0, "preemptions"] == 1 and req.loc[1, "finish_s"] < req.loc[0, "finish_s"]


def test_a_livelock_stops_with_one_line_naming_requests_and_cause(monkeypatch):
    """Recreate the old sizing bug (draft slots not counted): requests that can never fit thrash
    forever; the progress check stops the run with a StallError naming them and the cause."""
    monkeypatch.setattr(sim.core.observe, "STALL_MIN", 2048)
    monkeypatch.setattr(sim.core.loop, "PROGRESS_EVERY", 256)
    init = sim.core.engine.Engine.__init__

    def without_draft_slots(self, *a, **k):
        init(self, *a, **k)
        self.limits.draft_slots = 0

    monkeypatch.setattr(sim.core.engine.Engine, "__init__", without_draft_slots)
    d = copy.deepcopy(TINY_SPEC)
    d["engine"].update(preemption="recompute", max_events=0)
    with pytest.raises(StallError) as err:
        _sim(d)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("engine.stalled: no token emitted and no request ended")
    assert "preempted again and again" in msg and "request " in msg and "tokens recomputed" in msg


def test_progress_check_changes_nothing(monkeypatch):
    """Checking progress every few events gives the very same results."""
    a = _sim(MLFQ_POLICY)
    monkeypatch.setattr(sim.core.loop, "PROGRESS_EVERY", 7)
    b = _sim(MLFQ_POLICY)
    assert a.requests.equals(b.requests)


def test_max_events_is_a_one_line_safety_stop():
    d = copy.deepcopy(MLFQ_POLICY)
    d["engine"]["max_events"] = 50
    with pytest.raises(StallError, match=r"^engine.max_events: the run exceeded 50 engine events at t=") as err:
        _sim(d)
    assert isinstance(err.value, ScenarioError) and "\n" not in str(err.value)


def test_simulate_runs_the_cluster():
    """The Python API runs a [cluster] scenario on its replicas, as the CLI does."""
    from sim.cluster import ClusterResults
    d = copy.deepcopy(MLFQ_POLICY)
    d["engine"].update(preempt_for_waiting="never", max_events=0)
    d["policy"] = {"name": "fcfs"}
    d["cluster"] = {"replicas": 2, "router": "round_robin"}
    res = _sim(d)
    assert isinstance(res, ClusterResults) and len(res.replicas) == 2
    assert sorted(res.requests["request_id"]) == list(range(20))


# ---- sweeps sharing one folder ----------------------------------------------------------------
def _sweep_cmd(out: Path, policies: str) -> list[str]:
    return [sys.executable, "-m", "sim.cli", "sweep", "overload", "--policies", policies, "--out", str(out),
            "--workers", "1", "--no-plots", "--no-progress", "--set", "horizon_s=4.0"]


def test_a_second_sweep_waits_for_the_first_instead_of_deleting_its_runs(tmp_path):
    """While another sweep holds the folder (its run in progress as a part folder), a second
    sweep into it waits; nothing of the first is deleted."""
    out = tmp_path / "sw"
    (out / "runs").mkdir(parents=True)
    part = out / "runs" / ".policy=fcfs__load=1__seed=1.part-999999"
    part.mkdir()
    with open(out / ".sweep.lock", "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # "the first sweep"
        proc = subprocess.Popen(_sweep_cmd(out, "fcfs"), cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        first = proc.stderr.readline()  # (blocks until the second sweep meets the lock)
        assert "another sweep is writing into" in first and "waiting for it to finish" in first
        time.sleep(0.5)
        assert proc.poll() is None and part.exists()
        fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert (out / "runs" / "policy=fcfs__load=1__seed=1" / "requests.parquet").is_file()
    assert not part.exists()  # a dead sweep's leftover goes once the folder is free


def test_two_overlapping_sweeps_into_one_folder_both_complete(tmp_path):
    out = tmp_path / "sw"
    a = subprocess.Popen(_sweep_cmd(out, "fcfs,priority"), cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    b = subprocess.Popen(_sweep_cmd(out, "priority,srpt_oracle"), cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    for p in (a, b):
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    runs = sorted(p.name for p in (out / "runs").iterdir())
    assert runs == [f"policy={p}__load=1__seed=1" for p in ("fcfs", "priority", "srpt_oracle")]
    assert all((out / "runs" / r / "requests.parquet").is_file() for r in runs)


def test_read_only_sweep_folder_fails_before_any_run(tmp_path):
    """A folder the sweep cannot write into fails in one line before any run. Root writes into
    a chmod 555 folder, so as root the folder is one that nobody can write into: under /proc."""
    if os.geteuid() == 0:
        out = Path("/proc/self/priosim-sweep")
        done = subprocess.run(_sweep_cmd(out, "fcfs"), cwd=ROOT, capture_output=True, text=True)
    else:
        out = tmp_path / "ro"
        out.mkdir()
        out.chmod(0o555)
        try:
            done = subprocess.run(_sweep_cmd(out, "fcfs"), cwd=ROOT, capture_output=True, text=True)
        finally:
            out.chmod(0o755)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "cannot write" in done.stderr
    assert not out.exists() or not any(out.iterdir())
