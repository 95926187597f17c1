"""Real engines' defaults and flags (sim.engines): each version's defaults on each GPU, the flags
translated to scenario keys, unmodelled flags named, and keys a scenario sets always winning."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.config import load_scenario
from sim.core.errors import ScenarioError
from sim.engines import flags_to_overrides, version_tuple

MINIMAL = """name = "e"
horizon_s = 2.0
[engine]
{engine}
[[classes]]
name = "chat"
priority = 0
[[streams]]
tenant = "a"
class = "chat"
arrival = {{ process = "poisson", rate = 2.0 }}
prompt_tokens = 100
output_tokens = 10
"""


def scenario(tmp_path, engine: str, sets=()):
    p = tmp_path / "s.toml"
    p.write_text(MINIMAL.format(engine=engine))
    return load_scenario(p, overrides=list(sets))


@pytest.mark.parametrize("profile, version, seqs, tokens", [
    ("h100-sxm-llama-3-8b", "0.11.0", 1024, 8192),   # >= 70 GiB, not an A100
    ("h200-llama-3-8b", "0.11.0", 1024, 8192),
    ("a100-80gb-llama-3-8b", "0.11.0", 256, 2048),   # A100 keeps the small defaults (vLLM PR #17885)
    ("a100-80gb-llama-3-8b", "0.8.5", 256, 2048),
    ("h100-sxm-llama-3-8b", "0.8.5", 1024, 8192),    # 0.8: H100/H200 by name, 1024 sequences
    ("a100-80gb-llama-3-8b", "0.8.0", 1024, 2048),   # 1024 sequences everywhere until 0.8.4 (PR #16158)
    ("h100-sxm-llama-3-8b", "0.6.3", 256, 8192),     # V0
])
def test_vllm_batch_defaults_by_version_and_gpu(tmp_path, profile, version, seqs, tokens):
    sc = scenario(tmp_path, f'engine = "vllm"\nengine_version = "{version}"\nprofile = "{profile}"')
    assert (sc.engine.max_num_seqs, sc.engine.max_batched_tokens) == (seqs, tokens)
    v1 = version_tuple(version, "0") >= (0, 8, 0)
    assert sc.engine.overhead == ("vllm-v1" if v1 else "vllm-0.6")  # (before 0.14: no async scheduling)
    assert sc.engine.preempt_for_waiting == ("never" if v1 else "priority")
    assert sc.engine.chunked_prefill is v1 and sc.engine.prefix_caching is v1
    assert sc.engine.batching == ("mixed" if v1 else "prefill_first")  # V0: _schedule_default


@pytest.mark.parametrize("engine, sets, overhead", [
    ('engine = "vllm"\nengine_version = "0.15.1"', [], "vllm-v1-async"),  # async by default from 0.14 (PR #27614)
    ('engine = "vllm"\nengine_version = "0.13.0"', [], "vllm-v1"),
    ('engine = "vllm"\nengine_version = "0.11.0"', ["engine.overlap_scheduling=true"], "vllm-v1-async"),
    ('engine = "vllm"\nengine_version = "0.15.1"', ["engine.overlap_scheduling=false"], "vllm-v1"),
    ('engine = "sglang"\nengine_version = "0.5.5"', [], "sglang-0.5"),
    ('engine = "sglang"\nengine_version = "0.5.5"', ["engine.overlap_scheduling=false"],
     {"preset": "sglang-0.5", "overlap_schedule": 0}),                    # --disable-overlap-schedule
    ('engine = "sglang"\nengine_version = "0.3.0"', [], "sglang"),
])
def test_overlap_scheduling_picks_the_versions_overhead(tmp_path, engine, sets, overhead):
    """The scheduler forming the next batch while the GPU runs the current one (vLLM's async
    scheduling, SGLang's overlap scheduler) is priced by the era's overhead preset; the version's
    default unless engine.overlap_scheduling (the engines' flags) says otherwise."""
    sc = scenario(tmp_path, engine + '\nprofile = "h100-sxm-llama-3-8b"', sets)
    assert sc.engine.overhead == overhead


def test_async_scheduling_hides_the_step_cpu_and_defers_an_arrival_one_step(tmp_path):
    """vllm-v1-async is vllm-v1's terms with the CPU work hidden under the GPU's and the batch
    formed a step ahead: the flags map to engine.overlap_scheduling, and a V0 engine (no async
    scheduling), the key without an engine, or the key beside an explicit overhead are told."""
    from sim.core.overhead import resolve_overhead
    v1, ahead = resolve_overhead("vllm-v1"), resolve_overhead("vllm-v1-async")
    assert {**v1.terms(), "overlap_schedule": 1, "cpu_overlap": 1.0} == ahead.terms()
    assert 'engine.overlap_scheduling=true' in flags_to_overrides("vllm", "--async-scheduling")[0]
    assert 'engine.overlap_scheduling=false' in flags_to_overrides("vllm", "--no-async-scheduling")[0]
    assert 'engine.overlap_scheduling=false' in flags_to_overrides("sglang", "--disable-overlap-schedule")[0]
    with pytest.raises(ScenarioError, match="vLLM 0.6.3 has no async scheduling"):
        scenario(tmp_path, 'engine = "vllm"\nengine_version = "0.6.3"', ["engine.overlap_scheduling=true"])
    with pytest.raises(ScenarioError, match="overlap_scheduling: set without engine.engine"):
        scenario(tmp_path, 'overlap_scheduling = true')
    with pytest.warns(UserWarning, match="overlap_scheduling does nothing: engine.overhead is set"):
        sc = scenario(tmp_path, 'engine = "vllm"\noverhead = "vllm-v1"\noverlap_scheduling = true')
    assert sc.engine.overhead == "vllm-v1"


def test_overlap_scheduling_that_does_nothing_is_told_once(tmp_path):
    """Against a profile fitted to vLLM's own runs, engine.overlap_scheduling does nothing: one
    line says so; with engine.overhead set as well, one line still (the overhead's), not two."""
    import json
    import warnings
    from pathlib import Path

    import sim
    doc = json.loads((Path(sim.__file__).parent / "core" / "profiles" / "h100-sxm-llama-3-8b.json").read_text())
    doc["overhead"] = {"step_s": 2e-4, "frontend_s": 0.015}
    doc.setdefault("meta", {})["fitted_from_runs"] = {"engine": "vllm"}
    prof = tmp_path / "fitted.json"
    prof.write_text(json.dumps(doc))
    for extra, says in (("", "fitted to vllm's own runs"), ('\noverhead = "vllm-v1"', "engine.overhead is set")):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            scenario(tmp_path, f'engine = "vllm"\nprofile = "{prof}"\noverlap_scheduling = true{extra}')
        told = [str(w.message) for w in caught if "overlap_scheduling does nothing" in str(w.message)]
        assert len(told) == 1 and says in told[0], told


@pytest.mark.parametrize("engine, sets, batching", [
    ('engine = "vllm"\nengine_version = "0.6.3"', ["engine.chunked_prefill=true"], "mixed"),
    ('engine = "vllm"\nengine_version = "0.4.2"\nchunked_prefill = false', [], "prefill_first"),
    ('engine = "vllm"\nengine_version = "0.6.3"\nchunked_prefill = true\nbatching = "prefill_first"', [],
     "prefill_first"),                                        # batching set: it wins
    ('engine = "vllm"\nengine_version = "0.11.0"\nchunked_prefill = false', [], "mixed"),  # V1: mixed always
    ('engine = "sglang"\nengine_version = "0.3.0"', [], "prefill_first"),
    ('engine = "sglang"\nengine_version = "0.5.5"\nchunked_prefill = false', [], "prefill_first"),
    ('engine = "sglang"', ['engine.batching="mixed"'], "mixed"),  # --enable-mixed-chunk
])
def test_era_batching_follows_chunked_prefill_unless_set(tmp_path, engine, sets, batching):
    sc = scenario(tmp_path, engine + '\nprofile = "h100-sxm-llama-3-8b"', sets)
    assert sc.engine.batching == batching


@pytest.mark.parametrize("flags, batching", [
    ("--enable-chunked-prefill", "mixed"), ("--no-enable-chunked-prefill", "prefill_first"), ("", "prefill_first")])
def test_chunked_prefill_flags_imply_the_v0_batching(tmp_path, flags, batching):
    sets, _ = flags_to_overrides("vllm", flags)
    sc = scenario(tmp_path, 'engine_version = "0.6.3"\nprofile = "h100-sxm-llama-3-8b"', sets)
    assert sc.engine.batching == batching


def test_speculative_decoding_keeps_mixed_batching(tmp_path):
    sc = scenario(tmp_path, 'engine = "sglang"\nprofile = "h100-sxm-llama-3-8b"\n'
                            '[engine.speculative]\nk = 3\nacceptance = 0.7')
    assert sc.engine.batching == "mixed"


def test_offline_entrypoint_has_the_larger_budget(tmp_path):
    sc = scenario(tmp_path, 'engine = "vllm"\nentrypoint = "offline"\nprofile = "h100-sxm-llama-3-8b"')
    assert sc.engine.max_batched_tokens == 16384


def test_keys_the_scenario_sets_win_and_are_kept_as_written(tmp_path):
    sc = scenario(tmp_path, 'engine = "vllm"\nmax_num_seqs = 64\nprofile = "h100-sxm-llama-3-8b"')
    assert sc.engine.max_num_seqs == 64 and sc.engine.max_batched_tokens == 8192
    written = sc.to_dict()["engine"]
    assert written["max_num_seqs"] == 64 and "max_batched_tokens" not in written  # a default, not written
    assert "max_batched_tokens" in sc.engine.defaults_applied


def test_a_changed_profile_takes_its_own_gpus_defaults(tmp_path):
    """The scenario as written leaves the defaults out, so an override of the profile (a sweep)
    re-derives them for the new GPU instead of keeping the first GPU's."""
    from sim.config import scenario_from_dict

    sc = scenario(tmp_path, 'engine = "vllm"\nprofile = "h100-sxm-llama-3-8b"')
    again = scenario_from_dict(sc.to_dict(), overrides=['engine.profile="a100-80gb-llama-3-8b"'])
    assert again.engine.max_num_seqs == 256 and sc.engine.max_num_seqs == 1024


def test_memory_fraction_sets_the_kv_blocks(tmp_path):
    base = scenario(tmp_path, 'profile = "h100-sxm-llama-3-8b"')
    lo = scenario(tmp_path, 'engine = "vllm"\ngpu_memory_utilization = 0.5\nprofile = "h100-sxm-llama-3-8b"')
    hi = scenario(tmp_path, 'engine = "vllm"\nprofile = "h100-sxm-llama-3-8b"')
    from sim.core.costs import load_profile
    assert hi.engine.kv_blocks == load_profile("h100-sxm-llama-3-8b").kv_blocks(16)  # the profile's 0.9
    assert 0 < lo.engine.kv_blocks < hi.engine.kv_blocks and base.engine.kv_blocks == 0
    # 0.4 of 80 GiB less: 0.4 x 85.5 GB / (128 KiB per token x 16 tokens)
    assert hi.engine.kv_blocks - lo.engine.kv_blocks == pytest.approx(0.4 * 85_520_809_984 / (131072 * 16), abs=2)


def test_sglang_pool_is_what_its_static_fraction_leaves_after_the_weights(tmp_path):
    sg = scenario(tmp_path, 'engine = "sglang"\nprofile = "h100-sxm-qwen3-32b"')
    vl = scenario(tmp_path, 'engine = "vllm"\nprofile = "h100-sxm-qwen3-32b"')
    assert sg.engine.block_size == 1 and sg.engine.overhead == "sglang-0.5"
    sg_tokens, vl_tokens = sg.engine.kv_blocks, vl.engine.kv_blocks * vl.engine.block_size
    assert 0.5 * vl_tokens < sg_tokens < vl_tokens  # SGLang reserves more than vLLM's activation guess


def test_weights_that_do_not_fit_are_one_line(tmp_path):
    with pytest.raises(ScenarioError, match="leave no KV memory"):
        scenario(tmp_path, 'engine = "vllm"\ngpu_memory_utilization = 0.5\nprofile = "h100-sxm-qwen3-32b"')


def test_the_other_engines_memory_key_is_refused(tmp_path):
    with pytest.raises(ScenarioError, match="mem_fraction_static: not a setting of vllm"):
        scenario(tmp_path, 'engine = "vllm"\nmem_fraction_static = 0.8')


def test_flags_become_overrides_and_unmodelled_flags_are_named():
    sets, unmodelled = flags_to_overrides(
        "vllm", "--max-num-seqs 64 --max-num-batched-tokens=2048 --gpu-memory-utilization 0.85 "
                "--enable-prefix-caching --scheduling-policy priority --kv-cache-dtype fp8 --port 8000 "
                "--enforce-eager")
    assert sets == ['engine.engine="vllm"', "engine.max_num_seqs=64", "engine.max_batched_tokens=2048",
                    "engine.gpu_memory_utilization=0.85", "engine.prefix_caching=true", 'policy.name="priority"',
                    'engine.kv_dtype="fp8"']
    assert unmodelled == ["--enforce-eager"]  # --port changes no simulated time
    sets, _ = flags_to_overrides("sglang", "--max-running-requests 32 --enable-priority-scheduling --disable-radix-cache")
    assert sets == ['engine.engine="sglang"', 'engine.preempt_for_waiting="threshold"', "engine.max_num_seqs=32",
                    'policy.name="priority"', "engine.prefix_caching=false"]
    # what a flag implies never overrules a flag given, in whatever order they come
    sets, unmodelled = flags_to_overrides("sglang", "--disable-priority-preemption --enable-priority-scheduling "
                                                    "--schedule-low-priority-values-first")
    assert sets[-2:] == ['engine.preempt_for_waiting="never"', 'policy.name="priority"'] and not unmodelled
    sets, unmodelled = flags_to_overrides("sglang", "--enable-mixed-chunk")
    assert sets == ['engine.engine="sglang"', 'engine.batching="mixed"'] and not unmodelled
    # (--dtype: auto or 16 bits is the profiles' own format, passed quietly; another is named)
    assert flags_to_overrides("vllm", "--dtype bfloat16 --dtype=auto") == (['engine.engine="vllm"'], [])
    assert flags_to_overrides("vllm", "--dtype float32")[1] == ["--dtype float32"]


def test_the_tensor_parallel_flag_must_be_the_profiles_own_degree(tmp_path):
    """--tensor-parallel-size (vLLM; -tp) and --tp-size / --tp (SGLang) set engine.tp: beside a
    measured profile its own degree passes quietly (a replica then spans that many GPUs, as a
    derived profile's does), another is refused in one line naming the profile's; with
    engine.model it derives the profile at that degree."""
    from sim.cluster.spec import parse_cluster
    for engine, flags in (("vllm", "--tensor-parallel-size 4"), ("vllm", "-tp 4"), ("sglang", "--tp 4"),
                          ("sglang", "--tp-size=4")):
        sets, unmodelled = flags_to_overrides(engine, flags + " --host 0.0.0.0 --max-log-len 100"
                                              if engine == "vllm" else flags + " --enable-metrics")
        assert "engine.tp=4" in sets and not unmodelled, (flags, unmodelled)
    sets, _ = flags_to_overrides("vllm", "--tensor-parallel-size 4")
    sc = scenario(tmp_path, 'profile = "h200-llama-3-70b-tp4"', [*sets, "cluster.replicas=2"])
    assert sc.engine.tp == 4 and parse_cluster(sc).gpus == 8
    with pytest.raises(ScenarioError, match="engine.tp = 4: h200-llama-3-8b is measured at tensor-parallel degree 1"):
        scenario(tmp_path, 'profile = "h200-llama-3-8b"', sets)
    derived = scenario(tmp_path, 'model = "llama-3.1-70b"\ngpu = "h200"', sets)
    assert derived.engine.profile["meta"]["name"] == "h200-llama-3.1-70b-tp4"


def test_an_fp8_kv_cache_beside_a_measured_profile_halves_its_kv_bytes_and_decode_reads(tmp_path):
    """--kv-cache-dtype fp8 (engine.kv_dtype) beside a measured or fitted 16-bit profile: a block
    holds the same tokens in half the bytes (twice the blocks in the same KV memory) and a decode
    step's per-context-token term halves; the rest of the step, and the scenario as written
    (the profile's name), are kept. auto, or the profile's own format, changes nothing; a profile
    priced from measured tables cannot say and is refused in one line."""
    from sim.core.costs import load_profile
    sets, unmodelled = flags_to_overrides("vllm", "--kv-cache-dtype fp8_e4m3")
    assert 'engine.kv_dtype="fp8"' in sets and not unmodelled
    assert flags_to_overrides("vllm", "--kv-cache-dtype auto") == (['engine.engine="vllm"'], [])
    base = scenario(tmp_path, 'profile = "h100-sxm-llama-3-8b"')
    fp8 = scenario(tmp_path, 'profile = "h100-sxm-llama-3-8b"', sets)
    same = scenario(tmp_path, 'profile = "h100-sxm-llama-3-8b"\nkv_dtype = "bf16"')
    assert same.engine.profile == "h100-sxm-llama-3-8b"
    b, f = load_profile(base.engine.profile, tmp_path), load_profile(fp8.engine.profile, tmp_path)
    assert f.name == "h100-sxm-llama-3-8b+kv-fp8" and fp8.engine.as_written()["profile"] == "h100-sxm-llama-3-8b"
    assert f.shape.kv_bytes_per_token * 2 == b.shape.kv_bytes_per_token
    assert f.kv_blocks(16) in (2 * b.kv_blocks(16), 2 * b.kv_blocks(16) + 1)
    assert f.step.decode_ctx_s == b.step.decode_ctx_s / 2 and f.step.base_s == b.step.base_s
    assert f.step_ns(2048, 0, 2048 ** 2, 0, 0, 1, 1) == b.step_ns(2048, 0, 2048 ** 2, 0, 0, 1, 1)  # (a prefill)
    with pytest.raises(ScenarioError, match="kv_dtype: set with a profile whose decode steps are measured tables"):
        scenario(tmp_path, 'profile = "h100-llama-3-8b-measured"\nkv_dtype = "fp8"')


def test_a_request_longer_than_the_models_context_is_refused_at_arrival(tmp_path):
    """--max-model-len (vLLM; 32k = 32000, 32K = 32768) and --context-length (SGLang) set
    engine.max_model_len: a request whose prompt plus max_tokens exceeds it is refused at its
    arrival (reason too_long), as the server answers it; the others are served as without it."""
    from sim import simulate
    assert flags_to_overrides("vllm", "--max-model-len 32K")[0][1] == "engine.max_model_len=32768"
    assert flags_to_overrides("sglang", "--context-length 8192")[0][1] == "engine.max_model_len=8192"
    # MINIMAL's requests are 100 + 10 tokens, here declaring max_tokens = 10
    declared = ["streams.0.max_tokens=10"]
    ok = simulate(scenario(tmp_path, 'max_model_len = 110', declared)).requests
    refused = simulate(scenario(tmp_path, 'max_model_len = 109', declared)).requests
    plain = simulate(scenario(tmp_path, '', declared)).requests
    assert ok.equals(plain) and (ok.status == "finished").all()
    assert (refused.status == "rejected").all() and (refused.reject_reason == "too_long").all()
    # declaring none, a request may generate what the context leaves (the servers' default)
    # and is served, its output cut there; one whose prompt fills the context is refused
    cut = simulate(scenario(tmp_path, 'max_model_len = 109')).requests
    assert (cut.status == "finished").all() and (cut.max_tokens == 9).all() and (cut.generated_tokens == 9).all()
    full = simulate(scenario(tmp_path, 'max_model_len = 100')).requests
    assert (full.reject_reason == "too_long").all()



@pytest.mark.parametrize("engine, expected", [
    ('engine = "vllm"', 40960),  # qwen3-8b's max_position_embeddings
    ('engine = "sglang"', 40960),
    ('engine = "vllm"\nmax_model_len = 1000', 1000),  # set: it wins
    ("", None),  # no engine named: no limit, as before
])
def test_a_named_engines_max_model_len_defaults_to_the_models_context(tmp_path, engine, expected):
    """vLLM's --max-model-len and SGLang's --context-length default to the model config's context
    length: a longer request is refused as the server refuses it (it was served)."""
    sc = scenario(tmp_path, f'model = "qwen3-8b"\ngpu = "h200"\n{engine}')
    assert sc.engine.max_model_len == expected
    if expected == 40960:
        assert "max_model_len" in sc.engine.defaults_applied and "max_model_len" not in sc.to_dict()["engine"]
    # YaRN-scaled configs as vLLM derives them: the original length times the factor
    assert scenario(tmp_path, 'model = "deepseek-v3"\ngpu = "h200"\ntp = 8\nengine = "vllm"').engine.max_model_len \
        == 163840

@pytest.mark.parametrize("text, message", [
    ("--max-num-seqs", "--max-num-seqs needs a value"),
    ("--max-num-seqs 0", "expected an integer >= 1"),
    ("--gpu-memory-utilization 1.5", "expected a fraction in (0, 1]"),
    ("--scheduling-policy lifo", "expected fcfs or priority"),
    ("64", "is not a flag"),
])
def test_bad_flag_values_are_one_line(text, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        flags_to_overrides("vllm", text)


def test_run_takes_engine_flags(tmp_path):
    out = tmp_path / "r"
    res = CliRunner().invoke(main, ["run", "--engine-args", "--max-num-seqs 8 --enforce-eager", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "does not model --enforce-eager" in res.output
    eng = json.loads((out / "scenario.json").read_text())["engine"]
    assert eng["engine"] == "vllm" and eng["max_num_seqs"] == 8
    res = CliRunner().invoke(main, ["run", "--engine-args", "--max-num-seqs 8", "--sglang-args", "--page-size 1"])
    assert res.exit_code == 2 and "give one" in res.output


def test_priosim_only_knobs_are_named():
    from sim.engines import priosim_only, priosim_only_settings

    assert priosim_only("classes.batch.max_prefill_tokens_per_step", 512)
    assert priosim_only("engine.preempt_for_waiting", "strict")
    assert priosim_only("engine.preempt_for_waiting", "never") is None  # vLLM V1's behaviour
    assert priosim_only("engine.max_num_seqs", 64) is None
    sc = load_scenario(None, overrides=["classes.batch.max_prefill_tokens_per_step=512"])
    assert any(s.startswith("classes.batch.max_prefill_tokens_per_step = 512") for s in priosim_only_settings(sc))


@pytest.mark.parametrize("engine, sets, block, prefix", [
    ('engine = "vllm"', ["engine.block_size=32"], 32, 32),      # vLLM hashes whole blocks: --block-size 32
    ('engine = "vllm"', [], 16, 16),
    ('engine = "sglang"', ["engine.block_size=64"], 64, 64),    # SGLang matches whole pages: --page-size 64
    ('engine = "sglang"', [], 1, 16),                           # page size 1: priosim's 16-token groups
])
def test_a_block_size_set_is_the_engines_prefix_matching_granularity(tmp_path, engine, sets, block, prefix):
    e = scenario(tmp_path, engine + '\nprofile = "h100-sxm-llama-3-8b"', sets).engine
    assert (e.block_size, e.prefix_block_tokens) == (block, prefix)


@pytest.mark.parametrize("text, near", [("--max-num-seq 64", "--max-num-seqs"),
                                        ("--enable-prefix-cache", "--enable-prefix-caching"),
                                        ("--gpu-memory-utilisation 0.8", "--gpu-memory-utilization")])
def test_a_misspelt_flag_is_refused_with_the_flag_it_looks_like(text, near):
    with pytest.raises(ValueError, match=f"did you mean {near}"):
        flags_to_overrides("vllm", text)
    assert flags_to_overrides("vllm", "--frobnicate 3")[1] == ["--frobnicate 3"]  # (unknown: named, not refused)


def test_batch_limits_vllm_refuses_are_refused(tmp_path):
    with pytest.raises(ScenarioError, match="max_batched_tokens = 16 is less than engine.max_num_seqs = 1024"):
        scenario(tmp_path, 'engine = "vllm"\nprofile = "h100-sxm-llama-3-8b"', ["engine.max_batched_tokens=16"])
    scenario(tmp_path, 'profile = "h100-sxm-llama-3-8b"', ["engine.max_batched_tokens=16"])  # (priosim's own engine may)


def test_run_names_priosim_only_settings_and_flags_it_overrules(tmp_path):
    res = CliRunner().invoke(main, ["run", "chat_vs_batch", "--set", "horizon_s=1", "--policy", "priority",
                                    "--engine-args", "--scheduling-policy fcfs", "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    assert "priosim-only beside engine.engine = 'vllm': engine.preempt_for_waiting = 'strict'" in res.output
    assert '--policy = "priority" overrules the flags\' policy.name = "fcfs"' in res.output
    res = CliRunner().invoke(main, ["run", "chat_vs_batch", "--set", "horizon_s=1", "--out", str(tmp_path / "q")])
    assert "priosim-only" not in res.output  # (no engine named: priosim's own knobs are the point)


def test_sglang_priority_preemption_needs_its_threshold_and_vllm_v1_has_no_swap():
    """SGLang's --enable-priority-scheduling lets a waiting request preempt a running one only
    more than --priority-scheduling-preemption-threshold (10 by default, SGLang's server_args)
    more urgent: the defaults carry 10, a flag or key given wins. vLLM V1 (0.8 on) preempts by
    recompute only: swap is refused in one line naming the release."""
    from sim.engines import resolve

    def threshold(*over):
        sc = load_scenario("chat_vs_batch", overrides=['engine.engine="sglang"', *over])
        return resolve(sc.engine, ".", "s").preempt_threshold

    assert threshold() == 10 and threshold("engine.preempt_threshold=3") == 3
    with pytest.raises(ScenarioError, match=r'engine.preemption = "swap": vLLM 0.11.0 \(V1\) preempts by recompute '
                                            r'only \(expected "recompute", or an engine_version before 0.8'):
        load_scenario("chat_vs_batch", overrides=['engine.engine="vllm"', 'engine.preemption="swap"'])
    sc = load_scenario("chat_vs_batch", overrides=['engine.engine="vllm"', 'engine.engine_version="0.6.3"',
                                                   'engine.preemption="swap"'])
    assert sc.engine.preemption == "swap"
