"""Engine overhead in the cost model: ``none`` is today's pricing byte for byte, presets are
validated, and priced steps stay exact under fast-forward (see test_exactness for the
exactness tests, parametrised over presets)."""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from sim import load_scenario, scenario_from_dict, simulate
from sim.cli import main
from sim.core.costs import ProfileError, load_profile
from sim.core.errors import ScenarioError
from sim.core.overhead import OverheadError, preset_names, resolve_overhead
from tests.conftest import small_scenario

GOLDEN = Path(__file__).resolve().parent / "data" / "overhead_none_golden.json"


def _digest(case: dict) -> tuple[str, int]:
    res = simulate(load_scenario(case["scenario"], overrides=case["overrides"] + ['engine.overhead="none"']))
    return hashlib.sha256(res.requests.to_csv(index=False).encode()).hexdigest(), len(res.requests)


@pytest.mark.parametrize("case", json.loads(GOLDEN.read_text())["cases"],
                         ids=lambda c: c["scenario"] + ("-" + c["overrides"][-1].split("=")[-1].strip('"')
                                                        if len(c["overrides"]) > 1 else ""))
def test_overhead_none_reproduces_the_request_tables_of_before(case):
    """Shipped scenarios with engine.overhead = "none" give the request tables (sha256 of the
    CSV bytes) the simulator gave before engine overhead existed."""
    digest, rows = _digest(case)
    assert rows == case["rows"]
    assert digest == case["requests_sha256"]


def test_none_prices_exactly_like_the_profile_alone():
    plain = load_profile("h200-llama-3-70b-tp4", overhead="none")
    assert not plain.overhead_on
    for shape in [(0, 8, 0, 0, 8 * 300), (512, 3, 512 * 512, 0, 900), (4096, 0, 4096 ** 2, 4096 * 100, 0)]:
        c = plain.step
        t = c.base_s + plain._tokens_s(shape[0] + shape[1]) + c.prefill_token_s * shape[0] \
            + c.prefill_attn_s * shape[2] + c.chunk_attn_s * shape[3] + c.decode_seq_s * shape[1] \
            + c.decode_ctx_s * shape[4]
        assert plain.step_ns(*shape, 3, 2) == max(1, round(t * 1_000_000_000))


def test_overhead_terms_add_up():
    """A step's overhead: fixed + per sequence (incl. sampling over the vocabulary) + per
    admission + all-reduce latency per layer for TP > 1."""
    o = {"step_s": 1e-3, "seq_s": 2e-5, "sample_s": 1e-11, "admit_s": 5e-4, "allreduce_latency_s": 1e-5}
    tp1 = load_profile("h200-llama-3-8b", overhead="none")
    one = load_profile("h200-llama-3-8b", overhead=o)
    vocab = one.shape.vocab
    got = one.step_ns(100, 6, 100 * 100, 0, 6 * 50, 1, 1) - tp1.step_ns(100, 6, 100 * 100, 0, 6 * 50)
    want = (1e-3 + (2e-5 + 1e-11 * vocab) * 7 + 5e-4) * 1e9
    assert abs(got - want) <= 2
    tp4 = load_profile("h200-llama-3-70b-tp4", overhead=o)
    base4 = load_profile("h200-llama-3-70b-tp4", overhead="none")
    got = tp4.step_ns(0, 1, 0, 0, 10) - base4.step_ns(0, 1, 0, 0, 10)
    want = (1e-3 + 2 * 80 * 1e-5 + 2e-5 + 1e-11 * tp4.shape.vocab * 4) * 1e9
    assert abs(got - want) <= 2


def test_cpu_overlap_prices_the_longer_of_cpu_and_gpu_and_zero_changes_nothing():
    """cpu_overlap h: a step's CPU terms (per step, sequence, admission) c beside its GPU time g
    take g + c - h min(g, c): the sum at 0 (bit for bit as without the term), the longer at 1,
    so a small batch is the GPU's and a large one the CPU's. A batch whose GPU time is the longer
    even at no context has a decode line (the CPU's part not hidden, a constant) that prices its
    steps bit for bit; one whose CPU time can be the longer has none (stepped one by one)."""
    cpu = {"step_s": 1e-3, "seq_s": 2e-4, "admit_s": 5e-4}
    gpu_only = load_profile("h200-llama-3-70b-tp4", overhead={"allreduce_latency_s": 1e-5})
    summed = load_profile("h200-llama-3-70b-tp4", overhead={**cpu, "allreduce_latency_s": 1e-5})
    zero = load_profile("h200-llama-3-70b-tp4", overhead={**cpu, "allreduce_latency_s": 1e-5, "cpu_overlap": 0.0})
    full = load_profile("h200-llama-3-70b-tp4", overhead={**cpu, "allreduce_latency_s": 1e-5, "cpu_overlap": 1.0})
    half = load_profile("h200-llama-3-70b-tp4", overhead={**cpu, "allreduce_latency_s": 1e-5, "cpu_overlap": 0.5})
    for P, D, n_pre, n_adm in ((0, 8, 0, 0), (0, 600, 0, 0), (512, 40, 1, 1)):
        sh = (P, D, P * P, 0, D * 700, n_pre, n_adm)
        g = gpu_only.step_ns(*sh)
        c = (1e-3 + 2e-4 * (D + n_pre) + 5e-4 * n_adm) * 1e9
        assert zero.step_ns(*sh) == summed.step_ns(*sh)
        assert abs(full.step_ns(*sh) - max(g, c)) <= 2
        assert abs(half.step_ns(*sh) - (g + c - 0.5 * min(g, c))) <= 2
    assert full.step_ns(0, 8, 0, 0, 8 * 700) == gpu_only.step_ns(0, 8, 0, 0, 8 * 700)  # (GPU-bound)
    assert full.step_ns(0, 600, 0, 0, 600 * 700) > gpu_only.step_ns(0, 600, 0, 0, 600 * 700)  # (CPU-bound)
    assert zero.decode_line(8) == summed.decode_line(8)
    assert full.decode_line(8) == gpu_only.decode_line(8)  # (all of the CPU's hidden)
    assert full.decode_line(600) is None and half.decode_line(600) is None  # (the CPU's the longer at no context)
    a, b = half.decode_line(8)
    for ctx in (0, 8 * 700, 8 * 5000, 8 * 131072):
        assert half.step_ns(0, 8, 0, 0, ctx) == round((a + b * ctx) * 1e9)


def test_kv_reread_scales_decode_context_cost_and_zero_changes_nothing():
    """kv_reread r multiplies the per-context-token decode cost by 1 + r (heads/kv_heads - 1);
    r = 0 prices every step exactly as without the term."""
    o = {"step_s": 1e-3, "seq_s": 2e-5}
    base = load_profile("h200-llama-3-8b", overhead=o)
    zero = load_profile("h200-llama-3-8b", overhead={**o, "kv_reread": 0.0})
    half = load_profile("h200-llama-3-8b", overhead={**o, "kv_reread": 0.5})
    shapes = [(0, 8, 0, 0, 8 * 3000), (512, 3, 512 * 512, 0, 900), (0, 1, 0, 0, 30000)]
    for sh in shapes:
        assert zero.step_ns(*sh) == base.step_ns(*sh)
    assert zero.decode_line(8) == base.decode_line(8)
    g = half.shape.heads / half.shape.kv_heads                     # 4 for Llama-3-8B
    got = half.step_ns(0, 1, 0, 0, 30000) - base.step_ns(0, 1, 0, 0, 30000)
    want = base.step.decode_ctx_s * 30000 * 0.5 * (g - 1) * 1e9
    assert abs(got - want) <= 2 and got > 0
    a, b = half.decode_line(4)
    assert half.step_ns(0, 4, 0, 0, 5000) == max(1, round((a + b * 5000) * 1e9))


def test_scheduler_steps_divides_the_step_term_of_decode_steps_only():
    """Multi-step scheduling: a step without prefill pays step_s once per N steps (seq_s, each
    token's output processing, sampling and all-reduces stay per step); a step with prefill
    pays in full; N = 1 is exactly the single-step pricing."""
    o = {"step_s": 1e-3, "seq_s": 2e-5, "sample_s": 1e-11, "allreduce_latency_s": 1e-5}
    none = load_profile("h200-llama-3-70b-tp4", overhead="none")
    one = load_profile("h200-llama-3-70b-tp4", overhead=o)
    same = load_profile("h200-llama-3-70b-tp4", overhead={**o, "scheduler_steps": 1})
    ten = load_profile("h200-llama-3-70b-tp4", overhead={**o, "scheduler_steps": 10})
    dec, pre = (0, 16, 0, 0, 16 * 400), (256, 4, 256 * 256, 0, 4 * 400)
    for sh in (dec, pre):
        assert same.step_ns(*sh, 1, 1) == one.step_ns(*sh, 1, 1)
    assert ten.step_ns(*pre, 1, 1) == one.step_ns(*pre, 1, 1)
    vocab = ten.shape.vocab * 4
    got = ten.step_ns(*dec) - none.step_ns(*dec)
    want = (1e-3 / 10 + 2 * 80 * 1e-5 + (2e-5 + 1e-11 * vocab) * 16) * 1e9
    assert abs(got - want) <= 2
    a, b = ten.decode_line(16)
    assert ten.step_ns(*dec) == max(1, round((a + b * dec[4]) * 1e9))


def test_shipped_gpu_profiles_use_the_default_preset_and_inline_profiles_none():
    from sim.core.overhead import default_preset
    for name in ("h200-llama-3-8b", "a100-80gb-llama-3-8b", "h100-sxm-llama-3-70b-tp4", "h200-qwen2.5-7b"):
        assert load_profile(name).overhead.name == default_preset()
    assert not load_profile({"kind": "linear", "base_s": 0.01, "prefill_token_s": 0.0, "decode_token_s": 0.0,
                         "context_token_s": 0.0}).overhead_on
    assert not load_profile("cpu-tiny").overhead_on


def test_presets_resolve_and_inline_tables_start_from_a_preset():
    for name in preset_names():
        assert resolve_overhead(name).name == name
    o = resolve_overhead({"preset": "vllm-0.6", "step_s": 0.0})
    assert o.step_s == 0.0 and o.seq_s == resolve_overhead("vllm-0.6").seq_s


@pytest.mark.parametrize("spec,words", [
    ("vllm-9", ["no overhead preset 'vllm-9'", "none", "vllm-0.6", "vllm-v1", "sglang"]),
    ({"step_s": -1e-3}, ["step_s", "-0.001", ">= 0", "seq_s"]),
    ({"stepp_s": 1e-3}, ["unknown key 'stepp_s'", "step_s"]),
    ({"kv_reread": 1.5}, ["kv_reread", "1.5", "between 0 and 1", "scheduler_steps"]),
    ({"kv_reread": -0.1}, ["kv_reread", "-0.1", ">= 0", "step_s"]),
    ({"scheduler_steps": 0}, ["scheduler_steps", "0", "integer >= 1", "kv_reread"]),
    ({"scheduler_steps": 2.5}, ["scheduler_steps", "2.5", "integer >= 1"]),
    ({"overlap_schedule": 2}, ["overlap_schedule", "2", "0 or 1", "frontend_s"]),
])
def test_bad_overhead_is_one_line_naming_the_choices(spec, words):
    with pytest.raises(OverheadError) as e:
        resolve_overhead(spec)
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg
    sc = small_scenario()
    sc["engine"]["overhead"] = spec
    with pytest.raises(ScenarioError) as e2:
        scenario_from_dict(sc)
    assert "engine.overhead" in str(e2.value) and "\n" not in str(e2.value)
    with pytest.raises(ProfileError):
        load_profile("h200-llama-3-8b", overhead=spec)


def test_cli_bad_preset_exits_2_and_profiles_lists_presets():
    r = CliRunner().invoke(main, ["run", "--set", 'engine.overhead="vllm-9"', "--no-plots"], catch_exceptions=False)
    assert r.exit_code == 2
    line = r.output.strip().splitlines()[-1]
    assert "engine.overhead" in line and "vllm-0.6" in line and "sglang" in line
    r = CliRunner().invoke(main, ["profiles"], catch_exceptions=False)
    assert r.exit_code == 0
    for name in preset_names():
        assert f"  {name} " in r.output


def test_overhead_slows_steps_and_keeps_runs_reproducible(run):
    """A non-zero preset makes every step dearer (never cheaper) and the same seed gives the same
    table."""
    sc = small_scenario()
    a = run(sc)
    sc["engine"]["overhead"] = {"step_s": 2e-3, "seq_s": 1e-4, "admit_s": 1e-3}
    b = run(sc)
    c = run(sc)
    assert b.requests.equals(c.requests)
    fa, fb = a.requests.set_index("request_id"), b.requests.set_index("request_id")
    both = fa.index.intersection(fb.index)
    assert (fb.loc[both, "e2e_s"].mean() > fa.loc[both, "e2e_s"].mean())


def test_frontend_latency_delays_the_engine_not_the_arrival(tmp_path):
    """frontend_s: a lone request reaches an idle engine that much later; its arrival time is
    kept, so its TTFT and end-to-end time grow by exactly that; no step gets dearer."""
    from tests.explicit import run_explicit
    reqs = [(0.5, "c", 100, 20)]
    eng = {"profile": {"kind": "linear", "base_s": 0.01, "prefill_token_s": 1e-4, "decode_token_s": 0.0,
                       "context_token_s": 0.0}}
    a = run_explicit(tmp_path, reqs, [("c", 0)], eng).requests.iloc[0]
    eng["overhead"] = {"frontend_s": 0.05}
    b = run_explicit(tmp_path, reqs, [("c", 0)], eng).requests.iloc[0]
    assert b.arrival_s == a.arrival_s == 0.5
    assert round(b.ttft_s - a.ttft_s, 9) == 0.05 and round(b.e2e_s - a.e2e_s, 9) == 0.05
    assert round(b.tpot_s - a.tpot_s, 12) == 0


def test_frontend_visible_times_follow_lindleys_recursion():
    """The closed form of the front end's FIFO queue (a running maximum) is the recursion
    s_i = max(a_i, s_(i-1) + busy) exactly, in integer ns; with no busy time it is a + delay."""
    import numpy as np

    from sim.core.source import frontend_visible_ns
    rng = np.random.default_rng(3)
    a = np.sort(rng.integers(0, 10**9, size=500)).astype(np.int64)
    a[100:140] = a[100]  # a burst
    for busy in (1, 7_000_000, 30_000_000):
        s, want = None, []
        for x in a.tolist():
            s = x if s is None else max(x, s + busy)
            want.append(s + 50)
        assert frontend_visible_ns(a, 50, busy).tolist() == want
    assert frontend_visible_ns(a, 50, 0).tolist() == (a + 50).tolist()


def test_frontend_busy_queues_a_burst_but_not_spaced_requests(tmp_path):
    """frontend_busy_s: a burst of requests is seen by the engine one busy time apart (request i
    of a burst at t=0 not before frontend_s + i * busy); requests further apart than busy time
    are not delayed at all (the very same table as without it); arrival times are kept."""
    from tests.explicit import run_explicit
    eng = {"profile": {"kind": "linear", "base_s": 0.01, "prefill_token_s": 1e-4, "decode_token_s": 0.0,
                       "context_token_s": 0.0}, "overhead": {"frontend_s": 0.05}}
    spaced = [(0.5 * i, "c", 100, 20) for i in range(4)]
    a = run_explicit(tmp_path, spaced, [("c", 0)], eng).requests
    eng["overhead"] = {"frontend_s": 0.05, "frontend_busy_s": 0.02}
    b = run_explicit(tmp_path, spaced, [("c", 0)], eng).requests
    assert b.equals(a)
    burst = [(0.0, "c", 100, 20) for _ in range(6)]
    r = run_explicit(tmp_path, burst, [("c", 0)], eng).requests.sort_values("request_id")
    assert (r.arrival_s == 0.0).all()
    for i, ttft in enumerate(r.ttft_s):
        assert ttft >= 0.05 + 0.02 * i - 1e-9, (i, ttft)
    eng["overhead"] = {"frontend_s": 0.05}
    free = run_explicit(tmp_path, burst, [("c", 0)], eng).requests
    assert r.ttft_s.max() > free.ttft_s.max()


def test_offline_entrypoint_has_no_front_end():
    """engine.entrypoint = "offline" (vLLM's LLM class: no API server): neither the front end's
    latency nor its throughput limit applies; the step terms still do."""
    sc = small_scenario()
    sc["engine"]["overhead"] = {"step_s": 1e-3}
    plain = simulate(scenario_from_dict(sc))
    sc["engine"]["overhead"] = {"step_s": 1e-3, "frontend_s": 0.05, "frontend_busy_s": 0.01}
    served = simulate(scenario_from_dict(sc))
    sc["engine"]["entrypoint"] = "offline"
    offline = simulate(scenario_from_dict(sc))
    assert offline.requests.equals(plain.requests)
    assert served.requests.ttft_s.min() >= plain.requests.ttft_s.min() + 0.05 - 1e-9
    o = resolve_overhead({"step_s": 1e-3, "frontend_s": 0.05, "frontend_busy_s": 0.01})
    assert o.without_frontend().frontend_s == o.without_frontend().frontend_busy_s == 0
    assert o.without_frontend().step_s == 1e-3
    assert resolve_overhead({"step_s": 1e-3}).without_frontend() is not None


def test_overlap_schedule_holds_a_mid_step_arrival_back_one_step(tmp_path, run):
    """overlap_schedule = 1: the next batch was formed when the running step started, so a
    request arriving during a step joins the batch after next (its TTFT grows by exactly one
    step); a request reaching an idle engine starts at once; 0 changes nothing."""
    from tests.explicit import run_explicit
    # A alone at t=0: prefill step 0-20 ms, then 10 ms decode steps; B arrives at 25 ms, during
    # the step that started at 20 ms
    reqs = [(0.0, "c", 100, 20), (0.025, "c", 100, 20)]
    eng = {"profile": {"kind": "linear", "base_s": 0.01, "prefill_token_s": 1e-4, "decode_token_s": 0.0,
                       "context_token_s": 0.0}}
    a = run_explicit(tmp_path, reqs, [("c", 0)], eng).requests.set_index("request_id")
    eng["overhead"] = {"overlap_schedule": 1}
    b = run_explicit(tmp_path, reqs, [("c", 0)], eng).requests.set_index("request_id")
    assert b.loc[0, "ttft_s"] == a.loc[0, "ttft_s"]
    assert round(b.loc[1, "ttft_s"] - a.loc[1, "ttft_s"], 9) == 0.01
    sc = small_scenario()
    sc["engine"]["overhead"] = {"step_s": 2e-3, "seq_s": 1e-4}
    x = run(sc)
    sc["engine"]["overhead"] = {"step_s": 2e-3, "seq_s": 1e-4, "overlap_schedule": 0, "scheduler_steps": 1,
                                "kv_reread": 0.0}
    assert run(sc).requests.equals(x.requests)


def test_an_overlap_scheduled_run_goes_on_through_the_step_an_arrival_waits_out(run):
    """One replica fed open arrivals under overlap scheduling: a run that an arrival would stop at
    a boundary where it is only held back takes the step after too (the arrival joins at that
    one's end): the same bytes as stepping every iteration, and not one engine event an arrival
    more than without overlap scheduling."""
    sc = small_scenario(engine__kv_blocks=4096, engine__overhead={"step_s": 2e-3, "frontend_s": 1e-3})
    plain = run(sc)
    sc["engine"]["overhead"] = {"step_s": 2e-3, "frontend_s": 1e-3, "overlap_schedule": 1}
    ahead = run(sc)
    sc["engine"]["fast_forward"] = False
    stepped = run(sc)
    assert ahead.requests.equals(stepped.requests)
    assert (ahead.requests.ttft_s > plain.requests.ttft_s).any()  # (held back a step)
    events = {r: x.summary_dict["run"]["engine_events"] for r, x in (("plain", plain), ("ahead", ahead))}
    assert events["ahead"] <= events["plain"] * 1.1, events


def test_derived_presets_follow_their_base():
    """A derived preset is its base's fit plus its own terms (calibrate.fidelity.fit keeps it so);
    sglang-0.5 is an era fitted on its own rows, its overlap scheduling kept through the fit."""
    from calibrate.fidelity.fit import DERIVED, fitted_terms
    for name, (base, extra) in DERIVED.items():
        assert resolve_overhead(name).terms() == {**resolve_overhead(base).terms(), **extra}
    o = resolve_overhead("sglang-0.5")
    assert o.overlap_schedule == 1 and "overlap_schedule" not in fitted_terms("sglang-0.5")
    assert o.meta["fit_rows"] and o.meta["status"] == "fitted"


def test_fidelity_command_runs_a_couple_of_rows():
    r = CliRunner().invoke(main, ["fidelity", "--rows", "ci9515-lat-8b", "--rows", "qwen25-7b-in1"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "ci9515-lat-8b" in r.output and "qwen25-7b-in1" in r.output and "median |error|" in r.output
    r = CliRunner().invoke(main, ["fidelity", "--rows", "nope"], catch_exceptions=False)
    assert r.exit_code == 2 and "nope" in r.output
    r = CliRunner().invoke(main, ["fidelity", "--rows", "ci9515-lat-8b", "--overhead", "bogus"],
                           catch_exceptions=False)
    assert r.exit_code == 2 and "vllm-0.6" in r.output


def test_fidelity_rows_declare_multi_step_scheduling_to_the_overhead_model(tmp_path):
    """A row's num_scheduler_steps setting becomes the overhead's scheduler_steps (on the row's
    preset, or on a fit's table of terms); rows without it keep the plain preset."""
    from calibrate.fidelity.suite import load_table, scenario_for
    t = load_table().set_index("id", drop=False)
    ms = t.loc["sgl060-vllm-8b-offline-req"].to_dict()
    eng = scenario_for(ms, tmp_path)["engine"]
    assert eng["overhead"] == {"preset": "vllm-0.6", "scheduler_steps": 10}
    assert "num_scheduler_steps" not in eng
    eng = scenario_for(ms, tmp_path, overhead={"step_s": 1e-3})["engine"]
    assert eng["overhead"] == {"step_s": 1e-3, "scheduler_steps": 10}
    assert scenario_for(t.loc["ci9515-lat-8b"].to_dict(), tmp_path)["engine"]["overhead"] == "vllm-0.6"


def test_fidelity_table_has_sources_and_enough_coverage():
    from calibrate.fidelity.suite import load_table
    t = load_table()
    assert len(t) >= 20 and t.source_kind.nunique() >= 4
    assert (t.source.str.len() > 10).all() and t.id.is_unique
    assert t.gpu.nunique() >= 2 and (t.tp > 1).any()
    assert {"fit", "held-out"} <= set(t.split)


# ---- physical bounds, host factor, default preset, leave-one-source-out --------------------------
def test_shipped_presets_keep_every_term_within_its_physical_bound():
    """Each fitted term of each shipped preset lies in calibrate.fidelity.fit.BOUNDS, and every
    engine era has a front-end term."""
    from calibrate.fidelity.fit import BOUNDS, PRESET_BOUNDS, WHY, WHY_PRESET, bound
    assert set(WHY) >= set(BOUNDS)
    assert set(WHY_PRESET) == {(p, k) for p, terms in PRESET_BOUNDS.items() for k in terms}
    for name in preset_names():
        if name == "none":
            continue
        o = resolve_overhead(name)
        for k in BOUNDS:
            lo, hi = bound(name, k)
            assert lo <= getattr(o, k) <= hi, (name, k, getattr(o, k))
        assert o.frontend_s > 0, name


def test_host_cpu_scales_the_cpu_terms_only_and_one_is_identity():
    o = resolve_overhead("vllm-v1")
    assert o.on_host(1.0) is o
    slow = o.on_host(1.5)
    for k in ("step_s", "seq_s", "admit_s", "frontend_s", "frontend_busy_s"):
        assert getattr(slow, k) == getattr(o, k) * 1.5
    for k in ("sample_s", "allreduce_latency_s", "allreduce_bytes_per_s", "kv_reread", "scheduler_steps",
              "overlap_schedule"):
        assert getattr(slow, k) == getattr(o, k)
    ov = {"step_s": 1e-3, "seq_s": 2e-5, "sample_s": 1e-11, "admit_s": 5e-4, "allreduce_latency_s": 1e-5}
    base = load_profile("h200-llama-3-70b-tp4", overhead="none")
    one = load_profile("h200-llama-3-70b-tp4", overhead=ov, host_cpu=1.0)
    two = load_profile("h200-llama-3-70b-tp4", overhead=ov, host_cpu=2.0)
    shape = (100, 6, 100 * 100, 0, 6 * 50, 1, 1)
    extra1, extra2 = (m.step_ns(*shape) - base.step_ns(*shape) for m in (one, two))
    cpu = (1e-3 + 2e-5 * 7 + 5e-4) * 1e9  # the CPU part of the step's overhead
    assert abs((extra2 - extra1) - cpu) <= 2


def test_host_cpu_in_a_scenario_delays_first_tokens_and_one_changes_nothing():
    sc = small_scenario()
    sc["engine"]["overhead"] = {"step_s": 1e-3, "frontend_s": 0.02}
    plain = simulate(scenario_from_dict(sc))
    sc["engine"]["host_cpu"] = 1.0
    same = simulate(scenario_from_dict(sc))
    assert same.requests.equals(plain.requests)
    sc["engine"]["host_cpu"] = 2.0
    slow = simulate(scenario_from_dict(sc))
    assert slow.requests.ttft_s.min() >= plain.requests.ttft_s.min() + 0.02 - 1e-9
    sc["engine"]["host_cpu"] = 0
    with pytest.raises(ScenarioError, match="host_cpu"):
        scenario_from_dict(sc)


def test_the_default_preset_is_vllm_v1():
    from sim.core.overhead import default_preset
    assert default_preset() == "vllm-v1"
    assert load_profile("h100-sxm-llama-3-8b").overhead.name == "vllm-v1"


def _tiny_table() -> "pd.DataFrame":
    """Three publishers' batch-1 rows of one era, made from a known overhead: what leave-one-
    source-out should recover on each from the other two."""
    import pandas as pd
    from calibrate.fidelity.suite import run_table
    rows = []
    for src, (p, o) in {"a": (64, 16), "b": (256, 32), "c": (1024, 24)}.items():
        rows.append({"id": f"{src}-row", "source_kind": src, "metric": "decode_tok_s_batch1", "value": 1.0,
                     "unit": "tok/s", "scenario": "batch1", "dataset": "fixed", "n": 1, "prompt_tokens": p,
                     "output_tokens": o, "spread": "", "rate": "", "concurrency": "", "prompt_mean": "",
                     "output_mean": "", "profile": "h200-llama-3-8b", "overhead": "vllm-0.4",
                     "engine_settings": "max_num_seqs=8", "split": "fit", "tp": 1})
    df = pd.DataFrame(rows)
    truth = {"step_s": 2e-3, "allreduce_latency_s": 0.0, "kv_reread": 0.0, "sample_s": 8e-12}
    made = run_table(df, overhead={"vllm-0.4": truth})
    return df.assign(value=made.simulated.to_numpy())


def test_leave_one_source_out_fits_on_the_other_sources_and_reports_each_row():
    from calibrate.fidelity.fit import loso, loso_summary
    df = _tiny_table()
    start = {"vllm-0.4": {"seq_s": 0.0, "admit_s": 0.0, "frontend_s": 0.0}}
    res = loso(df, start=start, presets=("vllm-0.4",), max_nfev=4)
    assert sorted(res.id) == ["a-row", "b-row", "c-row"]
    assert (res.source_kind == res.id.str[0]).all() and res.evaluated.all()
    assert set(res.kind) == {"E2E/latency"}
    s = loso_summary(res)
    assert s["all"]["rows"] == 3 and s["all"]["worst"] < 0.05  # the step cost is recovered
    assert s["TTFT"]["rows"] == 0
    one = loso(df[df.source_kind == "a"], start=start, presets=("vllm-0.4",), max_nfev=2)
    assert not one.evaluated.any() and one.error.isna().all()  # no other source: not evaluated


def test_host_rows_are_judged_but_never_fitted():
    """A ``host`` row (its publisher's host, not the engine, set its value: here three times the
    engine's time) is evaluated with its publisher held out and counted as held out, but no
    leave-one-source-out fit of another publisher sees it: those still recover the step cost."""
    import pandas as pd
    from calibrate.fidelity.fit import loso
    from calibrate.fidelity.suite import summary
    df = _tiny_table()
    slow = df[df.source_kind == "b"].assign(id="b-host", split="host", value=lambda d: d.value / 3)
    df = pd.concat([df, slow], ignore_index=True)
    start = {"vllm-0.4": {"seq_s": 0.0, "admit_s": 0.0, "frontend_s": 0.0}}
    res = loso(df, start=start, presets=("vllm-0.4",), max_nfev=4).set_index("id")
    assert res.loc["b-host", "evaluated"] and res.loc["b-host", "error"] > 1.5  # judged: 3x off
    assert abs(res.loc["a-row", "error"]) < 0.05 and abs(res.loc["c-row", "error"]) < 0.05  # never fitted
    s = summary(pd.DataFrame({"id": ["f", "h", "x"], "split": ["fit", "host", "held-out"],
                              "family": "", "error": [0.0, 0.5, 0.1]}))
    assert s["held-out"]["rows"] == 2 and s["fit"]["rows"] == 1


def test_fidelity_rows_naming_their_engine_get_its_defaults_on_their_gpu(tmp_path):
    """The GPUStack vLLM 0.11 A100 rows ran the defaults: 256 sequences and a 2048-token budget
    on an A100 (1024 / 8192 on an H100); sim.engines fills them, the row's preset stays."""
    from calibrate.fidelity.suite import load_table, scenario_for
    t = load_table().set_index("id", drop=False)
    for rid, seqs, budget in [("gs-q3-14b-a100-vllm-sharegpt", 256, 2048), ("gs-q3-14b-h100-vllm-sharegpt", 1024, 8192)]:
        d = scenario_for(t.loc[rid].to_dict(), tmp_path)
        assert d["engine"]["engine"] == "vllm" and "max_num_seqs" not in d["engine"]
        eng = scenario_from_dict(d, base_dir=str(tmp_path)).engine
        assert (eng.max_num_seqs, eng.max_batched_tokens, eng.prefix_caching) == (seqs, budget, True)
        assert eng.overhead == "vllm-v1"


if __name__ == "__main__" and "--write" in sys.argv:  # regenerate the golden digests
    doc = json.loads(GOLDEN.read_text())
    for case in doc["cases"]:
        case["requests_sha256"], case["rows"] = _digest(case)
    GOLDEN.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {GOLDEN}")
