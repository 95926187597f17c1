"""calibrate/: shapes, the decoder, fitting, measured and analytic profiles, the validation loop.

All on CPU with the ``tiny`` shape; the whole file runs in well under 90 s.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")

from calibrate import fit as F  # noqa: E402
from calibrate.roofline import ASSUMPTIONS, DEVICES, roofline_profile, write_roofline_profiles  # noqa: E402
from calibrate.shapes import get_shape  # noqa: E402
from sim.core.costs import load_profile, profile_from_dict  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted((ROOT / "sim" / "core" / "profiles").glob("*.json"))


# ---- shapes ---------------------------------------------------------------------------------

def test_llama3_8b_bf16_kv_bytes_per_token_is_131072():
    """2 (K,V) x 32 layers x 8 KV heads x 128 head dim x 2 bytes = 131,072."""
    s = get_shape("llama-3-8b")
    assert s.kv_bytes_per_token("bf16") == 131_072
    assert abs(s.params - 8.03e9) / 8.03e9 < 1e-3


def test_tensor_parallel_shard_divides_heads_ffn_and_kv():
    s = get_shape("llama-3-70b-tp4")
    assert (s.heads, s.kv_heads, s.ffn, s.layers, s.tp) == (16, 2, 7168, 80, 4)
    assert s.kv_bytes_per_token("bf16") == 2 * 80 * 2 * 128 * 2


def test_unknown_shape_suggests_a_name():
    with pytest.raises(KeyError, match="did you mean 'llama-3-8b'"):
        get_shape("llama-3-8")


# ---- the decoder ----------------------------------------------------------------------------

def test_cached_prefill_chunk_and_decode_match_a_full_forward():
    """Prefill 20 tokens, a 10-token chunk on that prefix, then 5 decodes batched with another
    sequence's prefill: each next token equals the argmax of an uncached forward."""
    from calibrate.model import Decoder, Item
    torch.set_num_threads(1)
    m = Decoder(get_shape("tiny"), slots=2, max_len=64, seed=1)
    toks = torch.randint(0, m.shape.vocab, (35,), generator=torch.Generator().manual_seed(0))
    ref = m.reference_forward(toks).argmax(-1)
    assert m.forward(m.plan([Item(0, 20, 0)], toks[:20])).item() == ref[19].item()
    assert m.forward(m.plan([Item(0, 10, 20)], toks[20:30])).item() == ref[29].item()
    for i in range(30, 35):
        out = m.forward(m.plan([Item(0, 1, i), Item(1, 4, 0)], torch.cat([toks[i:i + 1], toks[:4]])))
        assert out[0].item() == ref[i].item()


def test_logits_match_transformers_llama_when_installed():
    """The same random weights in transformers' LlamaForCausalLM give the same logits
    (transformers is in the dev extra; skipped only outside it)."""
    transformers = pytest.importorskip("transformers")
    from calibrate.model import Decoder
    s = get_shape("tiny")
    m = Decoder(s, slots=1, max_len=32, seed=2)
    cfg = transformers.LlamaConfig(
        vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=s.ffn,
        num_hidden_layers=s.layers, num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
        head_dim=s.head_dim, rope_theta=s.rope_theta, rms_norm_eps=1e-5,
        tie_word_embeddings=False, max_position_embeddings=64, attention_bias=False)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    H, KV, hd = s.heads * s.head_dim, s.kv_heads * s.head_dim, s.head_dim
    with torch.no_grad():
        hf.model.embed_tokens.weight.copy_(m.embed)
        for L, layer in zip(m.layers, hf.model.layers):
            layer.self_attn.q_proj.weight.copy_(L["wqkv"][:, :H].T)
            layer.self_attn.k_proj.weight.copy_(L["wqkv"][:, H:H + KV].T)
            layer.self_attn.v_proj.weight.copy_(L["wqkv"][:, H + KV:].T)
            layer.self_attn.o_proj.weight.copy_(L["wo"].T)
            layer.mlp.gate_proj.weight.copy_(L["w_gate_up"][:, :s.ffn].T)
            layer.mlp.up_proj.weight.copy_(L["w_gate_up"][:, s.ffn:].T)
            layer.mlp.down_proj.weight.copy_(L["w_down"].T)
            layer.input_layernorm.weight.copy_(L["attn_norm"])
            layer.post_attention_layernorm.weight.copy_(L["mlp_norm"])
        hf.model.norm.weight.copy_(m.final_norm)
        hf.lm_head.weight.copy_(m.lm_head.T)
        toks = torch.randint(0, s.vocab, (20,), generator=torch.Generator().manual_seed(0))
        ours = m.reference_forward(toks)
        theirs = hf(toks[None]).logits[0]
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


def test_padded_decode_step_loaded_into_a_captured_batch_matches_a_fresh_step():
    """A decode step planned with its keys padded to the cache length and copied into another
    planned batch of the same shapes (what a captured CUDA graph replays) gives the same next
    tokens as the step planned exactly; mismatched shapes are refused."""
    from calibrate.model import Decoder, Item, load_inputs
    torch.set_num_threads(1)
    m = Decoder(get_shape("tiny"), slots=4, max_len=48, seed=2)
    g = torch.Generator().manual_seed(1)
    for slot, n in ((0, 9), (1, 21), (2, 30)):
        m.forward(m.plan([Item(slot, n, 0)], torch.randint(0, m.shape.vocab, (n,), generator=g)))
    items = [Item(0, 1, 9), Item(1, 1, 21), Item(2, 1, 30)]
    toks = [5, 7, 11]
    exact = m.forward(m.plan(items, toks)).tolist()
    captured = m.plan([Item(i, 1, 1) for i in range(3)], dec_len=48)
    load_inputs(captured, m.plan(items, toks, dec_len=48))
    assert m.forward(captured).tolist() == exact
    # padded means masked, even where every context fills the keys (the same kernels)
    assert m.plan([Item(0, 1, 47)], dec_len=48).dec_mask is not None
    assert m.plan([Item(0, 1, 47)]).dec_mask is None
    with pytest.raises(ValueError, match="does not fit the captured"):
        load_inputs(captured, m.plan(items[:2], toks[:2], dec_len=48))
    with pytest.raises(ValueError, match="must hold the longest context"):
        m.plan(items, toks, dec_len=20)


def test_a_cells_batches_keep_its_aggregates_and_bounds_but_not_its_shapes():
    """A decode or mixed cell is timed over several batches with the cell's aggregates (as a
    serving batch's contexts change every step); a single decoder has one batch."""
    from calibrate.measure import VARIANTS, _items, _variants, aggregates
    for kind, p in (("decode", dict(batch=16, context=128)), ("mixed", dict(batch=8, context=64, chunk=32))):
        items = _items(kind, p)[0]
        batches = _variants(items)
        assert len(batches) == VARIANTS and batches[0] == items
        starts = [it.start for it in items if it.n == 1]
        for b in batches:
            assert aggregates(b) == aggregates(items)
            assert all(min(starts) <= it.start <= max(starts) for it in b if it.n == 1)
        assert len({tuple(it.start for it in b) for b in batches}) == VARIANTS
    assert _variants(_items("decode", dict(batch=1, context=128))[0]) == [_items("decode", dict(batch=1, context=128))[0]]


def test_key_buckets_pad_by_less_than_a_step_and_stay_few():
    from calibrate.model import key_bucket
    assert [key_bucket(c, 321) for c in (2, 64, 65, 320, 321)] == [64, 64, 128, 320, 321]
    assert key_bucket(513, 4096) == 1024 and key_bucket(4000, 4096) == 4096
    assert len({key_bucket(c, 4096) for c in range(2, 4097)}) == 15
    assert all(0 <= key_bucket(c, 8192) - c < (64 if c <= 512 else 512) for c in range(2, 8193))


def test_serving_loop_replays_decode_only_steps_from_their_bucket_with_the_eager_tokens(tmp_path):
    """The serving loop's decode-only steps go to the runner of their batch size and key
    bucket (on a GPU, a captured graph); a stand-in that loads the step into the captured
    batch and runs it gives the next tokens the eager step gives, for every such step."""
    from calibrate.model import Decoder, load_inputs
    from calibrate.validate import _decode_graphs, _forward_fn, _requests, _serve

    torch.set_num_threads(1)
    m = Decoder(get_shape("tiny"), slots=4, max_len=150, seed=3)
    calls = []

    class StandIn:   # what GraphedStep does, without CUDA: load the inputs, run the captured batch
        def __init__(self, model, batch):
            self.batch = batch

        def run(self, items, tokens):
            calls.append((self.batch.n_dec, self.batch.dec_len))
            fresh = m.plan(items, tokens)
            load_inputs(self.batch, m.plan(items, tokens, dec_len=self.batch.dec_len))
            out = m.forward(self.batch)
            assert out.tolist() == m.forward(fresh).tolist()
            return out

    graphs = _decode_graphs(m, 4, capture=StandIn)
    assert set(graphs) == {(d, k) for d in range(1, 5) for k in (64, 128, 150)}
    trace = pd.DataFrame({"arrival_s": [0.0, 0.0, 0.001, 0.5], "prompt_tokens": [40, 70, 20, 90],
                          "output_tokens": [30, 60, 12, 40]})
    clock = [0.0]
    forward = _forward_fn(m, torch.Generator().manual_seed(0), graphs)

    def execute(parts):
        forward(parts)
        clock[0] += 0.01

    def wait_until(t):
        clock[0] = max(clock[0], t)

    out = _serve(_requests(trace), {"token_budget": 64, "max_num_seqs": 4}, execute, lambda: clock[0], wait_until)
    assert out["finish_s"].notna().all()
    assert {k for _, k in calls} >= {128, 150} and len(calls) > 50


# ---- fitting --------------------------------------------------------------------------------

def _synthetic_rows():
    rows = []
    for B in (1, 2, 4):
        for L in (16, 64, 128):
            rows.append(dict(kind="prefill", batch=B, P=B * L, D=0, sum_l2=B * L * L, sum_lc=0, sum_ctx=0))
    for c in (16, 64):
        for p in (64, 192):
            rows.append(dict(kind="chunk", P=c, D=0, sum_l2=c * c, sum_lc=c * p, sum_ctx=0))
    for B in (1, 4, 16, 64):
        for ctx in (32, 128, 256):
            rows.append(dict(kind="decode", P=0, D=B, sum_l2=0, sum_lc=0, sum_ctx=B * ctx))
    for T in (8, 32, 96, 192, 256, 512):
        rows.append(dict(kind="dense", P=T, D=0, sum_l2=T * T, sum_lc=0, sum_ctx=0))
    for D, ctx, L in ((4, 128, 64), (8, 64, 32), (16, 128, 128), (2, 256, 16), (12, 128, 16)):
        rows.append(dict(kind="mixed", P=L, D=D, sum_l2=L * L, sum_lc=0, sum_ctx=D * ctx, chunks=1))
    return rows


@pytest.mark.parametrize("extra", ["prefill_token_s", "decode_seq_s"])
def test_fit_recovers_known_coefficients_exactly(extra):
    """Times generated by known coefficients (either P or D carrying the extra per-token term)
    are fitted back to the same coefficients, and the leave-one-out error is ~0."""
    truth = {"base_s": 2e-3, "token_knots": [0.0, 16.0, 64.0, 256.0],
             "token_s": [0.0, 1e-3, 3e-3, 1.2e-2], "prefill_token_s": 0.0, "decode_seq_s": 0.0,
             "prefill_attn_s": 5e-9, "chunk_attn_s": 6e-8, "decode_ctx_s": 1.7e-6,
             "prefill_step_s": 4e-3, "prefill_chunk_s": 1.2e-3, "mixed_step_s": 2.5e-3}
    truth[extra] = 1.5e-5
    rows = _synthetic_rows()
    for r, t in zip(rows, F.predict(truth, rows)):
        r["time_s"] = float(t)
    step, report = F.fit_step(rows, knots=truth["token_knots"])
    for k, v in truth.items():
        np.testing.assert_allclose(step[k], v, rtol=1e-7, atol=1e-12, err_msg=k)
    assert report["extra_token_term"] == extra
    assert report["loo_rel_err_max"] < 1e-7


def test_fitted_step_prices_like_the_simulator():
    """The simulator's step_ns, given each row's chunks, prices a fitted step as the fit does,
    eager-step terms included; a profile without them prices exactly as before."""
    rows = _synthetic_rows()
    for r in rows:
        r["time_s"] = (1e-3 + 1e-5 * (r["P"] + r["D"]) + 1e-9 * r["sum_l2"] + 1e-7 * r["sum_ctx"]
                       + (r["P"] > 0) * (3e-3 + 1e-3 * F.chunks(r) + 2e-3 * (r["D"] > 0)))
    step, _ = F.fit_step(rows)
    assert min(step["prefill_step_s"], step["prefill_chunk_s"], step["mixed_step_s"]) > 0
    cm = profile_from_dict({"schema": "priosim.profile/1", "meta": {}, "step": step}, "t", "t")
    sim = [cm.step_ns(r["P"], r["D"], r["sum_l2"], r["sum_lc"], r["sum_ctx"], F.chunks(r)) / 1e9 for r in rows]
    np.testing.assert_allclose(sim, F.predict(step, rows), rtol=1e-6)
    plain = {k: v for k, v in step.items() if k not in ("prefill_step_s", "prefill_chunk_s", "mixed_step_s")}
    cm0 = profile_from_dict({"schema": "priosim.profile/1", "meta": {}, "step": plain}, "t", "t")
    zero = {**plain, "prefill_step_s": 0.0, "prefill_chunk_s": 0.0, "mixed_step_s": 0.0}
    cmz = profile_from_dict({"schema": "priosim.profile/1", "meta": {}, "step": zero}, "t", "t")
    for r in rows:
        args = (r["P"], r["D"], r["sum_l2"], r["sum_lc"], r["sum_ctx"], F.chunks(r))
        assert cm0.step_ns(*args) == cmz.step_ns(*args)


def test_swap_fit_is_latency_plus_per_block():
    rows = [dict(kind="swap", method="gather", direction=d, blocks=n, time_s=1e-5 + n * 2e-6)
            for d in ("d2h", "h2d") for n in (1, 8, 32)]
    swap, _ = F.fit_swap(rows, block_bytes=4096)
    assert swap["latency_s"] == pytest.approx(1e-5)
    assert swap["bytes_per_s"] == pytest.approx(4096 / 2e-6)


# ---- a measured profile ---------------------------------------------------------------------

@pytest.fixture(scope="session")
def measured(tmp_path_factory, worker_id):
    """The quick grid measured on this CPU once per test run: under pytest-xdist the workers
    share one measurement through the run's common temporary folder (the first to take the
    lock measures; pytest-xdist's own recipe for a session fixture made once)."""
    import fcntl

    from calibrate.measure import calibrate_profile

    def measure(folder: Path) -> tuple[Path, dict]:
        path, saved = folder / "cpu-tiny.json", folder / "cpu-tiny.doc.json"
        if not saved.exists():
            doc = calibrate_profile("cpu", "tiny", None, "quick", path, progress=False)
            saved.write_text(json.dumps(doc))
        return path, json.loads(saved.read_text())

    if worker_id == "master":  # (not under xdist)
        return measure(tmp_path_factory.mktemp("cal"))
    shared = tmp_path_factory.getbasetemp().parent  # this run's, common to its workers
    with open(shared / "cpu-tiny.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return measure(shared)


def test_written_profile_has_the_schema_and_prices_a_step(measured):
    path, doc = measured
    data = json.loads(path.read_text())
    assert data["schema"] == "priosim.profile/1"
    meta = data["meta"]
    assert meta["kind"] == "measured" and meta["dtype"] == "fp32" and meta["threads"] == 1
    for key in ("device", "torch", "cuda_graphs", "shape", "block_size", "grid", "date", "wall_s",
                "fit_loo_rel_err_median"):
        assert key in meta, key
    assert "loo_rel_err_median" in data["fit"] and data["rows"]
    cm = load_profile(str(path))
    assert cm.shape.kv_bytes_per_token == get_shape("tiny").kv_bytes_per_token("fp32")
    assert 0 < cm.step_s(P=64, sum_l2=64 * 64) < 1.0
    assert 0 < cm.step_s(D=8, sum_ctx=8 * 128) < 1.0
    assert cm.swap_ns(4, 16) > 0 and cm.kv_blocks(16) > 0


def test_measured_times_are_positive_finite_and_monotone_ish(measured):
    _, doc = measured
    rows = doc["rows"]
    assert all(math.isfinite(r["time_s"]) and r["time_s"] > 0 for r in rows)
    assert all(r["p10_s"] <= r["time_s"] <= r["p90_s"] for r in rows)

    def t(kind, **kw):
        (r,) = [r for r in rows if r["kind"] == kind and all(r.get(k) == v for k, v in kw.items())]
        return r["time_s"]
    # generous factors: the machine is shared and noisy, the trends are not subtle
    assert t("prefill", batch=4, length=128) > 1.5 * t("prefill", batch=1, length=16)
    assert t("dense", tokens=512) > 2 * t("dense", tokens=8)
    assert t("decode", batch=16, context=256) > t("decode", batch=1, context=32)
    swap = dict(method="gather", direction="d2h")
    assert t("swap", blocks=128, **swap) > t("swap", blocks=1, **swap)
    assert doc["fit"]["rel_err_median"] < 0.25


# ---- analytic profiles ----------------------------------------------------------------------

def test_h200_llama3_8b_roofline_reproduces_the_simulators_default():
    ours = roofline_profile("h200", "llama-3-8b")
    theirs = json.loads((ROOT / "sim" / "core" / "profiles" / "h200-llama-3-8b.json").read_text())
    for sec in ("step", "swap", "memory"):
        for k, v in theirs[sec].items():
            np.testing.assert_allclose(ours[sec][k], v, rtol=1e-4, err_msg=f"{sec}.{k}")
    assert ours["meta"]["kind"] == "analytic"


def test_every_roofline_constant_has_a_source():
    doc = roofline_profile("a100-80gb", "llama-3-70b", tp=4)
    for k, c in doc["meta"]["constants"].items():
        assert c["source"] and isinstance(c["value"], float), k
    assert set(ASSUMPTIONS) <= set(doc["meta"]["constants"])
    assert DEVICES["h100-sxm"].v("bf16_flops") == 989e12 and DEVICES["a100-80gb"].v("bf16_flops") == 312e12


def test_roofline_generator_writes_loadable_profiles(tmp_path):
    paths = write_roofline_profiles(tmp_path)
    assert (tmp_path / "h100-sxm-llama-3-70b-tp4.json") in paths
    assert (tmp_path / "h200-llama-3-8b-roofline.json") in paths


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_each_shipped_profile_loads_and_prices_a_step(path):
    cm = load_profile(str(path))
    assert cm.meta["kind"] in ("analytic", "measured")
    t = cm.step_s(P=512, D=16, sum_l2=512 * 512, sum_ctx=16 * 1024)
    assert math.isfinite(t) and t > cm.step_s(D=1, sum_ctx=128) > 0
    assert cm.swap_ns(8, 16) > 0 and cm.kv_blocks(16) > 0


# ---- validation -----------------------------------------------------------------------------

def _linear_profile(tmp_path) -> Path:
    doc = {"schema": "priosim.profile/1", "meta": {"kind": "analytic", "device_type": "cpu",
                                                   "shape": "tiny", "dtype": "fp32", "threads": 1},
           "step": {"base_s": 0.01, "prefill_token_s": 0.001, "decode_seq_s": 0.0}}
    p = tmp_path / "lin.json"
    p.write_text(json.dumps(doc))
    return p


def test_priced_loop_follows_fcfs_chunked_prefill_semantics(tmp_path):
    """Budget 8, step = 10 ms + 1 ms per prefill token. Request 0 (prompt 12, output 3) arrives
    at 0: step 1 prefills 8 (18 ms), step 2 the last 4 (14 ms) -> first token at 32 ms; two decode
    steps of 10 ms -> finish at 52 ms; TPOT = 20 ms / 2 = 10 ms."""
    from calibrate.validate import run_priced
    df = pd.DataFrame({"arrival_s": [0.0], "cls": ["a"], "prompt_tokens": [12], "output_tokens": [3]})
    out = run_priced(_linear_profile(tmp_path), df, {"token_budget": 8, "max_num_seqs": 4})
    r = out.iloc[0]
    assert r.ttft_s == pytest.approx(0.032) and r.e2e_s == pytest.approx(0.052)
    assert r.tpot_s == pytest.approx(0.010)
    assert r.token_s == pytest.approx([0.032, 0.042, 0.052])  # each token's time after the arrival
    assert out.attrs["steps"] == 4


def test_harness_runs_refuse_a_profile_they_cannot_run_in_one_line(tmp_path, capsys):
    """A CUDA profile where torch sees no GPU (or a file that is not a profile): one line, exit 2,
    and no run file written."""
    import torch
    from scripts.harness_runs import main as harness_main
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    cases = [str(bad)] + ([] if torch.cuda.is_available() else ["sim/core/profiles/h100-llama-3-8b-measured.json"])
    for prof in cases:
        with pytest.raises(SystemExit) as exc:
            harness_main(["--profile", prof, "--loads", "0.5", "--requests", "4", "--no-progress",
                          "--out", str(tmp_path / "o")])
        err = capsys.readouterr().err.strip()
        assert exc.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("error:"), err
        assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_harness_runs_are_vllm_result_files_that_replay(tmp_path):
    """A harness run written by scripts.harness_runs reads back as a vLLM result file with the
    loop's own token times (its ITLs are the gaps between them), and replays."""
    from calibrate.runs import read_run, replay
    from calibrate.validate import run_priced
    from scripts.harness_runs import run_file
    prof = _linear_profile(tmp_path)
    df = pd.DataFrame({"arrival_s": [0.0, 0.005, 0.02], "cls": ["a"] * 3, "prompt_tokens": [12, 4, 6],
                       "output_tokens": [3, 5, 1]})
    loop = run_priced(prof, df, {"token_budget": 8, "max_num_seqs": 4})
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run_file(loop, 0.5, {"shape": "tiny"}), allow_nan=False))
    run = read_run(str(path))
    assert run.format == "vllm" and len(run.requests) == 3 and run.has_starts
    for (_, got), (_, want) in zip(run.requests.iterrows(), loop.iterrows()):
        assert got.ttft_s == pytest.approx(want.ttft_s) and got.e2e_s == pytest.approx(want.e2e_s)
        assert list(got.itl_s) == pytest.approx(list(np.diff(want.token_s)))
    cmp = replay(run, ["engine.overhead=none", "engine.max_num_seqs=4", "engine.max_batched_tokens=8",
                       "engine.kv_blocks=64"],
                 profile=str(prof), seed=0)
    assert cmp.metrics["request_throughput"]["measured"] > 0


def test_real_loop_runs_a_short_trace_and_compare_reports_every_metric(measured):
    from calibrate.validate import builtin_trace, compare, run_priced, run_real
    path, _ = measured
    tr = builtin_trace(path, n=12, seed=3)
    real = run_real(path, tr, {"token_budget": 128, "max_num_seqs": 8})
    assert len(real) == 12 and real[["ttft_s", "e2e_s"]].notna().all().all()
    assert (real.e2e_s >= real.ttft_s).all() and (real.ttft_s > 0).all()
    wall = run_real(path, tr, {"max_batched_tokens": 128, "max_num_seqs": 8}, clock="wall")
    assert (wall.e2e_s >= wall.ttft_s).all() and wall.attrs["executor"] == "real (wall clock)"
    sim = run_priced(path, tr, {"token_budget": 128, "max_num_seqs": 8})
    res = compare(real, sim)
    names = {(m["class"], m["metric"]) for m in res["metrics"]}
    for c in set(tr.cls):
        for m in ("ttft", "tpot", "e2e"):
            assert (c, f"{m}_p50") in names and (c, f"{m}_p90") in names
    assert ("all", "throughput") in names
    json.dumps(res)


def test_cli_calibrate_then_run_then_validate(tmp_path, monkeypatch):
    """The calibrate-then-simulate loop through the command line: measure a tiny CPU profile,
    simulate with it, and validate a short trace real vs simulated, into a relative --out from
    a folder that is not the project's. (The quick grid timed fewer times: tests/quick_calibrate.py.)"""
    import json

    from click.testing import CliRunner

    from calibrate import measure
    from sim.cli import main
    from tests.quick_calibrate import quick_grid

    monkeypatch.setitem(measure.GRIDS, "quick", quick_grid())

    prof = tmp_path / "p.json"
    r = CliRunner().invoke(main, ["calibrate", "--device", "cpu", "--shape", "tiny", "--grid", "quick",
                                  "--out", str(prof)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "leave-one-out" in r.output
    r = CliRunner().invoke(main, ["run", "--set", f'engine.profile="{prof}"', "--set", "horizon_s=2.0",
                                  "--set", "engine.kv_blocks=20000", "--no-plots", "--out", str(tmp_path / "run")],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sim.progress.INTERVAL_S", 0.05)  # stderr is not a terminal: progress lines
    r = CliRunner().invoke(main, ["validate", "--profile", "p.json", "--requests", "40", "--repeats", "1",
                                  "--out", "results/val"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "validate: tiny for real: " in r.stderr and " requests (" in r.stderr
    out = tmp_path / "results" / "val"
    rep = json.loads((out / "validation.json").read_text())
    names = {(m["class"], m["metric"]) for m in rep["metrics"]}
    for c in ("interactive", "batch"):
        for m in ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90", "e2e_p50", "e2e_p90"):
            assert (c, m) in names
    assert ("all", "throughput") in names
    assert all(np.isfinite(m["real"]) and np.isfinite(m["sim"]) for m in rep["metrics"])
    assert (out / "validation_cdf.png").is_file()


def test_simulator_matches_the_priced_serving_loop_exactly(tmp_path):
    """The simulator's engine and calibrate's independent mini serving loop (run in virtual time
    on the same profile) agree on every request's times: same batching semantics."""
    from calibrate.against_sim import simulate_trace
    from calibrate.validate import DEFAULT_ENGINE, builtin_trace, run_priced

    prof = Path(__file__).resolve().parents[1] / "sim" / "core" / "profiles" / "cpu-tiny.json"
    trace = builtin_trace(prof, n=150, seed=3)
    priced = run_priced(prof, trace, DEFAULT_ENGINE).set_index("request_id").sort_index()
    sim = simulate_trace(prof, trace, DEFAULT_ENGINE, tmp_path).set_index("request_id").sort_index()
    for col in ("first_token_s", "finish_s"):
        np.testing.assert_allclose(sim[col].to_numpy(), priced[col].to_numpy(), rtol=1e-9, atol=1e-9)


def test_measured_profile_prices_pure_batches_from_its_tables():
    """Pure decode and pure prefill batches inside the measured grid cost what was measured
    (bilinear between grid points); other shapes use the fitted model."""
    from sim.core.costs import load_profile

    prof = Path(__file__).resolve().parents[1] / "sim" / "core" / "profiles" / "cpu-tiny.json"
    cm = load_profile(prof)
    rows = json.loads(prof.read_text())["rows"]
    for r in rows:
        if r["kind"] in ("decode", "prefill"):
            assert cm.step_s(r["P"], r["D"], r["sum_l2"], r["sum_lc"], r["sum_ctx"]) == pytest.approx(r["time_s"], rel=1e-6)
    dec = {(r["batch"], r["context"]): r["time_s"] for r in rows if r["kind"] == "decode"}
    mid = cm.step_s(D=1, sum_ctx=1 * (80 + 1))  # context 80: between the 32 and 128 columns
    lo, hi = sorted((dec[(1, 32)], dec[(1, 128)]))
    assert lo <= mid <= hi
    mixed = [r for r in rows if r["kind"] == "mixed"][0]
    fitted = cm.step_s(mixed["P"], mixed["D"], mixed["sum_l2"], mixed["sum_lc"], mixed["sum_ctx"])
    assert fitted > 0 and fitted != mixed["time_s"]


@pytest.mark.parametrize("grid", ["shipped", "fidelity"])
def test_every_shipped_roofline_profile_is_regenerated_by_the_command(tmp_path, grid):
    """``python -m calibrate roofline --grid NAME`` writes each profile of the grid as shipped
    (all but the date it was written)."""
    from calibrate.__main__ import main
    from calibrate.roofline import GRIDS, PROFILE_DIR, profile_filename
    assert main(["roofline", "--grid", grid, "--out-dir", str(tmp_path)]) == 0
    for d, s, tp in GRIDS[grid]:
        name = profile_filename(d, s, tp)
        made, shipped = (json.loads(p.read_text()) for p in (tmp_path / name, Path(PROFILE_DIR) / name))
        made["meta"].pop("date"), shipped["meta"].pop("date")
        assert made == shipped, name


@pytest.mark.parametrize("args,says", [
    (["--device", "bogus"], "--device: 'bogus' is not a device (expected cpu, cuda, cuda:N or auto)"),
    (["--shape", "nope"], "--shape: 'shape' must be one of"),
    (["--dtype", "fp7"], "--dtype: 'fp7' is not a dtype (expected fp32, bf16 or fp16)"),
    ([], "already exists (pass --overwrite to replace it"),
])
def test_python_m_calibrate_refuses_bad_input_in_one_line(tmp_path, capsys, args, says):
    """``python -m calibrate`` (the measurement without the priosim CLI) checks its arguments
    before measuring: one line, exit 2, no traceback; an existing ``--out`` is kept."""
    from calibrate.__main__ import main
    out = tmp_path / "mine.json"
    out.write_text("{}")
    assert main(["--device", "cpu", "--out", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err and err.count("\n") == 1, err
    assert out.read_text() == "{}"
    assert main(["roofline", "--out-dir", str(out / "sub")]) == 2  # (a file where the folder goes)
    assert "cannot write the profiles" in capsys.readouterr().err


def test_gpu_script_runs_its_whole_path_on_cpu(tmp_path):
    """scripts/gpu_calibrate.sh in smoke mode with DEVICE=cpu SHAPE=tiny: calibrate, then
    validate on that profile, everything in the one folder, the step report included. (priosim
    with the quick grid timed fewer times, through the script's PRIOSIM: tests/quick_calibrate.py.)"""
    import os
    import subprocess
    import sys
    env = {**os.environ, "DEVICE": "cpu", "SHAPE": "tiny", "PY": sys.executable, "MPLBACKEND": "Agg",
           "PRIOSIM": f"{sys.executable} -m tests.quick_calibrate"}
    done = subprocess.run(["bash", "scripts/gpu_calibrate.sh", str(tmp_path), "smoke"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    log = (tmp_path / "log.txt").read_text()
    assert "calibrate: exit 0" in log and "validate: exit 0" in log, log[-3000:]
    report = json.loads((tmp_path / "validate" / "validation.json").read_text())
    assert {m["metric"] for m in report["metrics"]} >= {"ttft_p50", "tpot_p50", "e2e_p50", "throughput"}
    assert set(report["steps"]) >= {"decode"} and report["steps"]["decode"]["steps"] > 0
    steps = pd.read_parquet(tmp_path / "validate" / "real_steps.parquet")
    assert {"measured_s", "priced_s", "kind", "chunks"} <= set(steps.columns)
    assert load_profile(str(tmp_path / "h200-tiny-measured.json")).meta["grid"] == "quick"


@pytest.mark.parametrize("name, device", [("h200-llama-3-8b-measured", "NVIDIA H200"),
                                          ("h100-llama-3-8b-measured", "NVIDIA H100 80GB HBM3")])
def test_shipped_gpu_measurement_is_listed_and_runs_a_scenario(tmp_path, name, device):
    """Each measured GPU profile is a shipped name with its provenance, and a scenario runs on it."""
    from click.testing import CliRunner
    from sim.cli import main

    cm = load_profile(name)
    meta = cm.meta
    assert meta["kind"] == "measured" and meta["device"] == device and meta["cuda_graphs"] is True
    for key in ("driver", "torch", "cuda", "dtype", "grid", "grid_spec", "date", "shape"):
        assert meta.get(key), key
    assert cm.step.prefill_step_s > 0   # eager steps with prefill cost more than graphed decode steps
    r = CliRunner().invoke(main, ["profiles"])
    assert name in r.output
    r = CliRunner().invoke(main, ["run", "--set", f'engine.profile="{name}"', "--set",
                                  "horizon_s=20", "--no-plots", "--out", str(tmp_path / "r")])
    assert r.exit_code == 0, r.output
    assert f"profile={name}" in r.output
