"""Per-class prefill cap: ``[[classes]] max_prefill_tokens_per_step`` bounds one class's prompt
tokens in a step, so its prefill cannot stretch the steps other classes decode in."""
from __future__ import annotations

import pytest

from sim import load_scenario, simulate
from tests.explicit import run_explicit

LIN = {"kind": "linear", "base_s": 0.01, "prefill_token_s": 1e-5, "decode_token_s": 0.0, "context_token_s": 0.0}


def test_cap_bounds_class_prefill_per_step_and_others_pass(tmp_path):
    """Two 300-token batch prompts and one 40-token chat prompt at t=0; budget 1000, batch capped
    at 100 prompt tokens per step: each step carries at most 100 batch prefill tokens, and the chat
    request (behind the batch ones in FCFS order) is not held back by the batch cap."""
    reqs = [(0.0, "batch", 300, 4), (0.0, "batch", 300, 4), (0.0, "chat", 40, 4)]
    res = run_explicit(tmp_path, reqs, [("chat", 0), ("batch", 1)],
                       {"profile": dict(LIN), "max_batched_tokens": 1000, "block_size": 16},
                       policy="fcfs", classes_extra={"batch": {"max_prefill_tokens_per_step": 100}})
    it = res.iterations
    cls = res.requests.set_index("request_id")["class"]
    pre = it[it.kind == "prefill"].assign(cls=lambda d: d.request_id.map(cls))
    per_step = pre[pre.cls == "batch"].groupby("iteration")["tokens"].sum()
    assert per_step.max() <= 100 and per_step.sum() == 600
    chat_id = cls[cls == "chat"].index[0]
    assert it[(it.request_id == chat_id) & (it.kind == "prefill")].iteration.min() == 0


def test_capping_batch_prefill_protects_interactive_tpot():
    base = simulate(load_scenario("chat_vs_batch"))
    capped = simulate(load_scenario("chat_vs_batch", overrides=["classes.1.max_prefill_tokens_per_step=512"]))
    b, c = base.summary_dict["classes"], capped.summary_dict["classes"]
    assert c["interactive"]["tpot_p99_s"] < 0.5 * b["interactive"]["tpot_p99_s"]
    assert c["batch"]["finished"] == b["batch"]["finished"] == 1000


def test_capped_waiters_not_scanned_one_by_one(monkeypatch):
    """When every waiter left is a prefill of a class whose cap this step is used up, admission
    stops instead of skipping them one at a time: the same outputs as skipping each (the counts
    that allow the shortcut are inflated here, so it never fires), chunked or not."""
    import pandas as pd
    from sim.core.engine import Engine

    over = ["classes.1.max_prefill_tokens_per_step=512", "horizon_s=15.0"]
    for extra in ([], ["engine.chunked_prefill=false"]):
        fast = simulate(load_scenario("chat_vs_batch", overrides=over + extra))
        with monkeypatch.context() as m:
            push = Engine.push_waiting

            def push_inflated(self, req, now_ns):
                push(self, req, now_ns)
                self.queues.waiting_prefills[req.cls_idx] += 10**9

            m.setattr(Engine, "push_waiting", push_inflated)
            slow = simulate(load_scenario("chat_vs_batch", overrides=over + extra))
        pd.testing.assert_frame_equal(fast.requests, slow.requests)
        pd.testing.assert_frame_equal(fast.timeseries, slow.timeseries)


@pytest.mark.pure_python  # (counts calls by patching the engine: see tests/conftest.py)
def test_capped_prompts_chunk_inside_fast_forwarded_runs(monkeypatch):
    """A prompt chunked by its class's cap (chat_vs_batch's 4,000-token batch prompts at 512 a
    step) goes on chunking inside a fast-forwarded run beside the decoders, while its chunks
    hold back every waiter of its class or every slot is taken: the same outputs as stepping
    (with the invariants checked), in a fraction of the events it took when every chunk was a
    step of its own."""
    import pandas as pd
    from sim.core import fastforward

    over = ["classes.1.max_prefill_tokens_per_step=512", "horizon_s=30.0"]
    fast = simulate(load_scenario("chat_vs_batch", overrides=over), check_invariants=True)
    stepped = simulate(load_scenario("chat_vs_batch", overrides=over + ["engine.fast_forward=false",
                                                                         "engine.lazy_batch=false"]))
    pd.testing.assert_frame_equal(fast.requests, stepped.requests)
    pd.testing.assert_frame_equal(fast.timeseries, stepped.timeseries)
    assert fast.summary_dict["classes"] == stepped.summary_dict["classes"]
    chunking = fastforward._chunking
    monkeypatch.setattr(fastforward, "_chunking",  # (only plans whose prefills all end their prompts run on)
                        lambda eng, plan: (True, None) if chunking(eng, plan) == (True, None) else (False, None))
    monkeypatch.setattr(fastforward, "_capped_out", lambda eng, pf: False)
    apart = simulate(load_scenario("chat_vs_batch", overrides=over))
    pd.testing.assert_frame_equal(fast.requests, apart.requests)
    assert fast.summary_dict["run"]["engine_events"] < 0.5 * apart.summary_dict["run"]["engine_events"]


@pytest.mark.pure_python  # (counts calls by patching the engine: see tests/conftest.py)
def test_prompts_chunked_by_the_budget_chunk_inside_fast_forwarded_runs(monkeypatch):
    """A prompt chunked by what the step budget leaves beside the decoders (diurnal_two_class:
    2,048 tokens a step, batch prompts of thousands) goes on chunking inside a fast-forwarded
    run when it ranks last, holding every waiter back: the same outputs as stepping (with the
    invariants checked), in fewer events than when each such chunk was a step of its own."""
    import pandas as pd
    from sim.core import fastforward

    over = ["horizon_s=120.0"]
    sc = load_scenario("diurnal_two_class", overrides=over)
    fast = simulate(sc, load_scale=0.2, check_invariants=True)
    stepped = simulate(load_scenario("diurnal_two_class", overrides=over + ["engine.fast_forward=false",
                                                                            "engine.lazy_batch=false"]),
                       load_scale=0.2)
    pd.testing.assert_frame_equal(fast.requests, stepped.requests)
    pd.testing.assert_frame_equal(fast.timeseries, stepped.timeseries)
    chunking = fastforward._chunking

    def by_caps_only(eng, plan):
        ok, pf = chunking(eng, plan)
        if pf is not None and fastforward._takes_budget(eng, pf):
            return False, None
        return ok, pf
    monkeypatch.setattr(fastforward, "_chunking", by_caps_only)
    apart = simulate(sc, load_scale=0.2)
    pd.testing.assert_frame_equal(fast.requests, apart.requests)
    assert fast.summary_dict["run"]["engine_events"] < 0.9 * apart.summary_dict["run"]["engine_events"]
