"""priosim replay: each result-file reader on its file, the round trip (simulate, export in each
client's schema, read, replay: the same metrics), the sequential closed loop, and the CLI."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from calibrate.runs import read_run, replay
from calibrate.runs.compare import REQUIRED, client_metrics
from calibrate.runs.export import FORMATS, export_text, simulated_table
from calibrate.runs.scenario import model_differs, process_times
from sim.cli import main
from sim.core.costs import find_profile
from tests.replay_files import PROFILE, simulated_file

RUNS = Path(__file__).resolve().parent / "data" / "runs"


@pytest.mark.parametrize("name,fmt,n,mc,rate", [
    ("vllm_concurrency8.json", "vllm", 60, 8, math.inf),
    ("sglang_rate8.jsonl", "sglang", 60, None, 8.0),
    ("guidellm_concurrent4.json", "guidellm", 40, 4, math.inf),
    ("genai_perf_concurrency4.json", "genai-perf", 30, 4, math.inf),
])
def test_each_reader_reads_its_file(name, fmt, n, mc, rate):
    run = read_run(RUNS / name)
    assert run.format == fmt and len(run.requests) == n
    assert run.settings["max_concurrency"] == mc and run.settings["request_rate"] == rate
    first = run.requests.iloc[0]
    assert int(first.input_tokens) == 245  # (the generator's first prompt, in every file)
    assert (run.requests["e2e_s"] >= run.requests["ttft_s"]).all()


def test_vllm_values_are_read_exactly():
    run = read_run(RUNS / "vllm_concurrency8.json")
    doc = json.loads((RUNS / "vllm_concurrency8.json").read_text())
    assert list(run.requests["output_tokens"]) == doc["output_lens"]
    assert run.requests["ttft_s"].iloc[3] == doc["ttfts"][3]
    assert run.requests["e2e_s"].iloc[3] == pytest.approx(doc["ttfts"][3] + sum(doc["itls"][3]))
    assert run.duration_s == doc["duration"]
    assert run.settings["model"] == "meta-llama/Meta-Llama-3-8B-Instruct"


def test_vllm_failed_requests_are_dropped_as_vllm_drops_them(tmp_path):
    doc = {"num_prompts": 3, "request_rate": 2.0, "burstiness": 0.5, "max_concurrency": None, "mean_ttft_ms": 1,
           "input_lens": [10, 20, 30], "output_lens": [3, 0, 2], "ttfts": [0.1, 0.0, 0.2],
           "itls": [[0.01, 0.02], [], [0.03]], "errors": ["", "timeout", ""]}
    (tmp_path / "r.json").write_text(json.dumps(doc))
    run = read_run(tmp_path / "r.json")
    assert list(run.requests["input_tokens"]) == [10, 30]
    assert run.settings["burstiness"] == 0.5 and not run.has_starts


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_replays_to_the_same_metrics(fmt, tmp_path):
    """A simulated run exported in ``fmt`` and replayed on the same profile: within 2 %."""
    path = tmp_path / f"run.{fmt}.json"
    path.write_text(simulated_file(fmt, math.inf if fmt != "sglang" else 6.0, 3 if fmt != "sglang" else None, 24))
    cmp = replay(read_run(path), profile=PROFILE)
    for name in REQUIRED:
        m = cmp.metrics[name]
        assert abs(m["error"]) <= 0.02, (fmt, name, m)


def test_replay_exports_again_to_itself(tmp_path):
    """Exported from a replay's simulated side, read back: the same request table."""
    run = read_run(RUNS / "guidellm_concurrent4.json")
    cmp = replay(run, profile=PROFILE)
    table = simulated_table(cmp)
    (tmp_path / "again.json").write_text(export_text("guidellm", table, run.settings))
    again = read_run(tmp_path / "again.json")
    assert np.allclose(again.requests["ttft_s"], table["ttft_s"])
    assert list(again.requests["output_tokens"]) == list(table["output_tokens"])


def test_closed_loop_keeps_at_most_c_in_flight_in_list_order():
    cmp = replay(read_run(RUNS / "vllm_concurrency8.json"), profile=PROFILE)
    req = cmp.results.requests.sort_values("request_id")
    starts, ends = req["arrival_s"].to_numpy(), req["finish_s"].to_numpy()
    assert (np.diff(starts) >= 0).all()  # sent in the file's order
    assert (starts[:8] == 0).all() and (starts[8:] > 0).all()
    for t in starts:
        assert ((starts <= t) & (ends > t)).sum() <= 8
    # each later request goes when one in flight ends (zero think time)
    assert set(np.round(starts[8:], 9)) <= set(np.round(ends, 9))


def test_vllm_arrival_process_is_gamma_with_burstiness():
    t = process_times(20001, 4.0, 0.25, seed=3)
    gaps = np.diff(t)
    assert t[0] == 0 and gaps.mean() == pytest.approx(0.25, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(2.0, rel=0.05)  # cv = 1 / sqrt(burstiness)
    assert (process_times(5, math.inf, 1.0, 0) == 0).all()


def test_vllm_tpot_excludes_single_token_requests_and_itl_pools_chunks():
    m = client_metrics("vllm", np.array([0.1, 0.2]), np.array([0.5, 0.2]), np.array([5, 1]), np.array([0.5, 0.2]),
                       [[0.1] * 4, []], 1.0)
    assert m["tpot_mean_ms"] == pytest.approx(100.0) and m["itl_p50_ms"] == pytest.approx(100.0)
    g = client_metrics("guidellm", np.array([0.1]), np.array([0.5]), np.array([5]), np.array([0.5]), None, 1.0)
    assert g["tpot_mean_ms"] == pytest.approx(100.0)  # GuideLLM: last token / output tokens
    assert g["itl_mean_ms"] == pytest.approx(100.0)


def test_model_warning_only_when_the_profile_is_another_model():
    assert model_differs("meta-llama/Meta-Llama-3-8B-Instruct", "h200-llama-3-8b") is None
    assert "qwen" in model_differs("meta-llama/Meta-Llama-3-8B-Instruct", "h100-sxm-qwen3-8b")


def test_cli_prints_the_table_and_writes_json_and_figure(tmp_path):
    out, fig = tmp_path / "m.json", tmp_path / "p.png"
    res = CliRunner().invoke(main, ["replay", str(RUNS / "sglang_rate8.jsonl"), "--profile", PROFILE,
                                    "--json", str(out), "--figure", str(fig)])
    assert res.exit_code == 0, res.output
    assert "ttft_p50_ms" in res.stdout and "output_throughput" in res.stdout
    doc = json.loads(out.read_text())
    assert set(REQUIRED) <= set(doc["metrics"])
    assert abs(doc["metrics"]["e2e_p50_ms"]["error"]) < 0.02
    assert fig.read_bytes()[:4] == b"\x89PNG"
    again = CliRunner().invoke(main, ["replay", str(RUNS / "sglang_rate8.jsonl"), "--json", str(out)])
    assert again.exit_code == 2 and "--json" in again.stderr


def test_cli_warns_when_the_profile_models_another_model():
    res = CliRunner().invoke(main, ["replay", str(RUNS / "vllm_concurrency8.json"), "--profile", "h100-sxm-qwen3-8b",
                                    "--set", "engine.max_num_seqs=64"])
    assert res.exit_code == 0, res.output
    assert res.stderr.count("warning:") == 1 and "Meta-Llama-3-8B" in res.stderr


def test_cli_says_which_vllm_release_prices_an_unversioned_run(tmp_path):
    """A vLLM run replayed on a shipped profile without engine.engine_version gets one note
    naming the release that prices it; with the release given, or against a profile fitted to
    runs (which priced them the same way), none."""
    def notes(*args):
        res = CliRunner().invoke(main, ["replay", str(RUNS / "vllm_concurrency8.json"), *args])
        assert res.exit_code == 0, res.output
        return [ln for ln in res.stdout.splitlines() if ln.startswith("note: the run is priced as vLLM")]

    assert len(notes("--profile", PROFILE)) == 1
    assert notes("--profile", PROFILE, "--set", 'engine.engine_version="0.15.1"') == []
    fitted = tmp_path / "fitted.json"
    doc = json.loads(find_profile(PROFILE).read_text())
    doc.setdefault("meta", {})["fitted_from_runs"] = {"runs": []}
    fitted.write_text(json.dumps(doc))
    assert notes("--profile", str(fitted)) == []


def test_sequential_order_needs_a_trace():
    from workloads import WorkloadError, validate_streams

    with pytest.raises(WorkloadError, match="order"):
        validate_streams([{"tenant": "a", "class": "c", "prompt_tokens": 5, "output_tokens": 5,
                           "arrival": {"process": "closed_loop", "users": 2, "order": "sequential"}}], {"c"}, Path("."))


# -- summary-only files (no --save-detailed / --output-details) -------------------------------

def _fixed_length_files(tmp_path, n: int = 24, prompt: int = 300, output: int = 40):
    """A vLLM run of ``n`` requests of one length (3 in flight), simulated and exported with
    --save-detailed, and the same run as vLLM writes it without: the per-request lists dropped,
    the summary keys vLLM computes kept (mean, median, p99 of TTFT, TPOT, ITL and E2E)."""
    from calibrate.runs.compare import measured_metrics
    from calibrate.runs.table import frame, settings

    st = settings(request_rate=math.inf, burstiness=1.0, max_concurrency=3, num_prompts=n,
                  model="meta-llama/Meta-Llama-3-8B-Instruct", backend="vllm")
    seed = tmp_path / "lengths.json"
    seed.write_text(export_text("vllm", frame(np.full(n, prompt), np.full(n, output), None, np.zeros(n), None,
                                              np.zeros(n)).assign(start_s=0.0), st))
    cmp = replay(read_run(seed), profile=PROFILE, mode="closed", trace=True)
    detailed = tmp_path / "detailed.json"
    detailed.write_text(export_text("vllm", simulated_table(cmp), st))
    doc = json.loads(detailed.read_text())
    m = measured_metrics(read_run(detailed))
    for ours, theirs in (("ttft", "ttft"), ("tpot", "tpot"), ("itl", "itl"), ("e2e", "e2el")):
        doc[f"mean_{theirs}_ms"] = m[f"{ours}_mean_ms"]
        doc[f"median_{theirs}_ms"] = m[f"{ours}_p50_ms"]
        doc[f"p99_{theirs}_ms"] = m[f"{ours}_p99_ms"]
    for k in ("input_lens", "output_lens", "start_times", "ttfts", "itls", "generated_texts", "errors"):
        doc.pop(k, None)
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps(doc))
    return detailed, summary, m


def test_summary_only_vllm_file_replays_at_its_mean_lengths(tmp_path):
    """Read as `completed` requests at the totals' mean lengths, compared with the file's own
    summary; a run of one length replays exactly as its detailed file does."""
    from calibrate.runs.compare import measured_metrics

    detailed, summary, m = _fixed_length_files(tmp_path)
    run = read_run(summary)
    assert run.summary_only and not read_run(detailed).summary_only
    assert list(run.requests["input_tokens"]) == [300] * 24 and list(run.requests["output_tokens"]) == [40] * 24
    assert any("summary-only result (no --save-detailed)" in n for n in run.notes)
    got = measured_metrics(run)
    for k in ("ttft_mean_ms", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "itl_mean_ms", "e2e_p99_ms",
              "request_throughput", "output_throughput"):
        assert got[k] == pytest.approx(m[k], rel=1e-9), k
    assert math.isnan(got["ttft_p90_ms"])  # (vLLM keeps p99 alone unless --metric-percentiles says more)
    a, b = replay(read_run(detailed), profile=PROFILE, mode="closed"), replay(run, profile=PROFILE, mode="closed")
    for name in REQUIRED:
        assert b.metrics[name]["simulated"] == a.metrics[name]["simulated"], name
        assert abs(b.metrics[name]["error"]) <= 0.02, (name, b.metrics[name])


def test_summary_only_lengths_add_up_to_the_totals(tmp_path):
    doc = {"backend": "sglang", "dataset_name": "random", "request_rate": 1.0, "max_concurrency": None,
           "total_input_tokens": 1003, "total_output_tokens": 10, "mean_e2e_latency_ms": 900.0,
           "median_e2e_latency_ms": 850.0, "median_ttft_ms": 80.0, "median_itl_ms": 13.0,
           "output_throughput": 40.0, "duration": 3.0, "completed": 4}
    p = tmp_path / "online.jsonl"
    p.write_text(json.dumps(doc) + "\n")
    run = read_run(p)
    assert run.format == "sglang" and run.summary_only
    assert list(run.requests["input_tokens"]) == [251, 251, 251, 250]
    assert list(run.requests["output_tokens"]) == [3, 3, 2, 2]
    from calibrate.runs.compare import measured_metrics

    got = measured_metrics(run)
    assert got["e2e_mean_ms"] == 900.0 and got["e2e_p50_ms"] == 850.0 and got["itl_p50_ms"] == 13.0
    assert math.isnan(got["ttft_mean_ms"]) and math.isnan(got["request_throughput"])
    assert any("--output-details" in n for n in run.notes)
    bad = dict(doc, completed=0)
    p.write_text(json.dumps(bad) + "\n")
    res = CliRunner().invoke(main, ["replay", str(p)])
    assert res.exit_code == 2 and "completed: must be a whole number >= 1 (got 0)" in res.stderr


def test_summary_only_file_has_no_parity_figure(tmp_path):
    _, summary, _ = _fixed_length_files(tmp_path, n=6)
    fig = tmp_path / "p.png"
    res = CliRunner().invoke(main, ["replay", str(summary), "--figure", str(fig)])
    assert res.exit_code == 2 and "summary-only" in res.stderr and "Traceback" not in res.output
    assert not fig.exists()
    ok = CliRunner().invoke(main, ["replay", str(summary)])
    assert ok.exit_code == 0 and "note: summary-only result" in ok.stdout


def test_pooled_itl_is_numpys_linear_percentile_of_every_gap():
    """vLLM's ITL from a simulation's pooled gaps (distinct values and counts) equals numpy's
    linear percentiles and mean over the pool written out gap by gap."""
    from calibrate.runs.compare import _weighted_stats

    rng = np.random.default_rng(3)
    for _ in range(50):
        vals = np.unique(rng.integers(1, 400, rng.integers(1, 30))).astype(float) / 1e3
        counts = rng.integers(1, 9, len(vals))
        pool = np.repeat(vals, counts)
        got = _weighted_stats(vals, counts, "itl")
        assert got["itl_mean_ms"] == pytest.approx(pool.mean() * 1e3, rel=1e-12)
        for q in (50, 90, 99):
            assert got[f"itl_p{q}_ms"] == pytest.approx(np.percentile(pool, q) * 1e3, rel=1e-12), q


def test_replayed_itl_pools_the_simulated_steps(tmp_path):
    """A vLLM run's simulated ITL is every simulated inter-token gap pooled (a chunked prefill's
    long step among the decode steps), not each request's mean gap."""
    cmp = replay(read_run(RUNS / "vllm_concurrency8.json"), profile=PROFILE)
    vals, counts = cmp.results.itl_gaps
    pool = np.repeat(vals / 1e9, counts)
    sim = cmp.results.requests
    assert len(pool) == int((sim["generated_tokens"] - 1).clip(lower=0).sum())  # (one gap a token after the first)
    for q in (50, 99):
        assert cmp.metrics[f"itl_p{q}_ms"]["simulated"] == pytest.approx(np.percentile(pool, q) * 1e3, rel=1e-9)
    assert np.percentile(pool, 99) > 1.5 * np.percentile(pool, 50)  # (stalls: steps with a prefill in them)


def test_a_file_of_several_results_is_each_a_run_of_the_fit(tmp_path):
    """vLLM's --append-result and SGLang's output file keep one result a line: replay reads the
    last, read_runs every one (numbered), and calibrate --from-runs fits them all."""
    from calibrate.runs.table import read_runs

    line = (RUNS / "sglang_rate8.jsonl").read_text().strip()
    several = tmp_path / "sweep.jsonl"
    several.write_text(f"{line}\n{line}\n{line}\n")
    runs = read_runs(several)
    assert [r.part for r in runs] == [1, 2, 3] and [r.label for r in runs] == ["sweep.jsonl#1", "sweep.jsonl#2",
                                                                             "sweep.jsonl#3"]
    assert read_run(several).part is None and len(read_runs(RUNS / "vllm_concurrency8.json")) == 1
    sweep = json.loads((RUNS / "guidellm_concurrent4.json").read_text())
    sweep["benchmarks"] = sweep["benchmarks"] * 2  # (a GuideLLM sweep: several benchmarks)
    (tmp_path / "g.json").write_text(json.dumps(sweep))
    g = read_runs(tmp_path / "g.json")
    assert [r.part for r in g] == [1, 2] and not any("was read" in n for r in g for n in r.notes)
    assert any("benchmark 0 was read" in n for n in read_run(tmp_path / "g.json").notes)
    doc = json.loads(line)
    doc["input_lens"] = [2 * n for n in doc["input_lens"]]
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(f"{line}\n{json.dumps(doc)}\n")
    first, second = read_runs(mixed)
    for run in (first, second):  # (each replays its own line's requests, not the file's last)
        sim = replay(run, profile=PROFILE).results.requests.sort_values("request_id")
        assert sorted(sim["prompt_tokens"]) == sorted(run.requests["input_tokens"])
    assert sorted(second.requests["input_tokens"]) == sorted(2 * first.requests["input_tokens"])
    out = tmp_path / "p.json"
    res = CliRunner().invoke(main, ["calibrate", "--from-runs", str(several), "--profile", PROFILE, "--no-loro",
                                    "--set", 'engine.engine="sglang"', "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "note: " + str(several) + ": 3 results, one per line" in res.stdout
    meta = json.loads(out.read_text())["meta"]["fitted_from_runs"]
    assert [r["result"] for r in meta["runs"]] == [1, 2, 3] and set(meta["residuals"]) == {r.label for r in runs}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(f"[1, 2]\n{line}\n")
    res = CliRunner().invoke(main, ["calibrate", "--from-runs", str(bad), "--profile", PROFILE, "--out",
                                    str(tmp_path / "q.json")])
    assert res.exit_code == 2 and "bad.jsonl line 1: not an SGLang result" in res.stderr


def test_summary_only_vllm_e2e_from_the_latencies_it_keeps(tmp_path):
    """Recent vLLM keeps `latencies` without --save-detailed (its E2E keys only when asked):
    the measured E2E comes from them when no request failed (the list holds failed ones too)."""
    from calibrate.runs.compare import measured_metrics

    lat = [1.0, 1.2, 0.9, 1.5, 1.1]
    doc = {"backend": "vllm", "num_prompts": 5, "request_rate": 2.0, "burstiness": 1.0, "max_concurrency": None,
           "duration": 3.0, "completed": 5, "failed": 0, "total_input_tokens": 500, "total_output_tokens": 100,
           "request_throughput": 5 / 3, "output_throughput": 100 / 3, "mean_ttft_ms": 30.0, "median_ttft_ms": 29.0,
           "p99_ttft_ms": 40.0, "latencies": lat}
    p = tmp_path / "r.json"
    p.write_text(json.dumps(doc))
    got = measured_metrics(read_run(p))
    assert got["e2e_mean_ms"] == pytest.approx(np.mean(lat) * 1e3) and got["e2e_p99_ms"] == pytest.approx(
        np.percentile(lat, 99) * 1e3)
    assert got["ttft_mean_ms"] == 30.0
    p.write_text(json.dumps(dict(doc, failed=1, completed=4, latencies=lat)))
    assert math.isnan(measured_metrics(read_run(p))["e2e_mean_ms"])


def test_summary_only_sglang_random_lines_replay_their_dataset_lengths(tmp_path):
    """SGLang's random dataset draws prompts uniformly from [max(int(L r), 1), L] and answers from
    [int(L_out r), L_out]: a summary line of it replays that law (scaled to its totals), and is
    fitted on every metric; another dataset, or totals far off that law, at its mean lengths."""
    base = {"backend": "sglang", "dataset_name": "random", "request_rate": 2.0, "max_concurrency": None,
            "random_input_len": 1000, "random_output_len": 200, "random_range_ratio": 0.5, "completed": 400,
            "total_input_tokens": 400 * 740, "total_output_tokens": 400 * 150, "mean_e2e_latency_ms": 900.0,
            "median_ttft_ms": 80.0, "duration": 200.0}
    p = tmp_path / "r.jsonl"
    p.write_text(json.dumps(base) + "\n")
    run = read_run(p)
    inp, out = run.requests["input_tokens"], run.requests["output_tokens"]
    assert run.lengths == "law" and inp.sum() == 400 * 740 and out.sum() == 400 * 150
    assert 485 <= inp.min() <= 510 and 980 <= inp.max() <= 1010 and 95 <= out.min() and out.max() <= 205
    assert abs(np.corrcoef(inp, out)[0, 1]) < 0.2  # (independent draws)
    assert any("random dataset's lengths" in n for n in run.notes)
    for other in (dict(base, dataset_name="sharegpt"), dict(base, total_input_tokens=400 * 400)):
        p.write_text(json.dumps(other) + "\n")
        again = read_run(p)
        assert again.lengths == "means" and again.requests["input_tokens"].nunique() <= 2


def test_replay_takes_one_result_of_several(tmp_path):
    """`priosim replay --result N` replays the N-th result of a file of several (what the fit
    calls FILE#N); out of range is one line and exit 2."""
    line = (RUNS / "sglang_rate8.jsonl").read_text().strip()
    doc = json.loads(line)
    doc["input_lens"] = [2 * n for n in doc["input_lens"]]
    p = tmp_path / "two.jsonl"
    p.write_text(f"{line}\n{json.dumps(doc)}\n")
    first = CliRunner().invoke(main, ["replay", str(p), "--result", "1"])
    last = CliRunner().invoke(main, ["replay", str(p)])
    assert first.exit_code == 0 and last.exit_code == 0, first.output + last.output
    assert f"{p}#1: sglang, 60 requests" in first.stdout and "2 result lines: the last one was read" in last.stdout
    assert first.stdout.split("ttft_mean_ms")[1] != last.stdout.split("ttft_mean_ms")[1]
    bad = CliRunner().invoke(main, ["replay", str(p), "--result", "3"])
    assert bad.exit_code == 2 and "--result: " in bad.stderr and "holds 2 result(s)" in bad.stderr


def test_one_result_of_several_is_read_alone(tmp_path):
    """A replay of FILE#N reads that result alone (every trial of a fit reads it again): another
    line's mistake does not stop it, as it stops reading them all."""
    from calibrate.runs.table import RunError, read_runs

    line = (RUNS / "sglang_rate8.jsonl").read_text().strip()
    bad = json.dumps(dict(json.loads(line), burstiness=-1.0))
    p = tmp_path / "two.jsonl"
    p.write_text(f"{bad}\n{line}\n")
    (run,) = read_runs(p, only=2)
    assert run.part == 2 and run.label == "two.jsonl#2"
    with pytest.raises(RunError, match="line 1: burstiness: must be > 0"):
        read_runs(p)
    with pytest.raises(RunError, match=r"result: the file holds 2 result\(s\) \(got 3\)"):
        read_runs(p, only=3)


def test_a_max_model_len_refuses_each_request_by_its_own_max_tokens():
    """A benchmark client sends each request's output length as its max_tokens: replayed with
    the server's --max-model-len, exactly the requests whose prompt plus output is longer are
    refused (not every request measured against the run's longest output), and the note says
    how many and why."""
    run = read_run(RUNS / "vllm_concurrency8.json")
    req = run.requests
    limit = int(np.median(req.input_tokens + req.output_tokens))
    over = int(((req.input_tokens + req.output_tokens) > limit).sum())
    assert 0 < over < len(req) and int((req.input_tokens + req.output_tokens.max() > limit).sum()) > over
    cmp = replay(run, [f"engine.max_model_len={limit}"], profile=PROFILE)
    assert int((cmp.requests.status == "rejected").sum()) == over
    assert any(f"{over} refused at arrival as too_long" in n for n in cmp.notes)


# -- output files: missing folders, two outputs on one file, an output on an input ------------

def test_outputs_in_a_missing_folder_are_made_there(tmp_path):
    """As ``run --out``: the missing folders are made (the nearest existing one is checked
    writable before any work), no traceback."""
    out, fig = tmp_path / "new" / "a" / "m.json", tmp_path / "new" / "b" / "p.png"
    res = CliRunner().invoke(main, ["replay", str(RUNS / "vllm_concurrency8.json"), "--json", str(out),
                                    "--figure", str(fig)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["metrics"] and fig.read_bytes()[:4] == b"\x89PNG"
    (tmp_path / "afile").write_text("mine")
    bad = CliRunner().invoke(main, ["replay", str(RUNS / "vllm_concurrency8.json"), "--json",
                                    str(tmp_path / "afile" / "m.json")])
    assert bad.exit_code == 2 and len(bad.stderr.splitlines()) == 1 and "is a file" in bad.stderr
    assert (tmp_path / "afile").read_text() == "mine"


def test_json_and_figure_on_one_file_are_refused_before_any_work(tmp_path):
    out = tmp_path / "same"
    res = CliRunner().invoke(main, ["replay", str(RUNS / "vllm_concurrency8.json"), "--json", str(out),
                                    "--figure", str(tmp_path / "." / "same")])
    assert res.exit_code == 2 and len(res.stderr.splitlines()) == 1
    assert "--figure" in res.stderr and "is also the file --json names" in res.stderr
    assert not out.exists() and "metric" not in res.stdout


def test_an_output_on_the_input_file_is_refused_even_with_overwrite(tmp_path):
    run = tmp_path / "X.json"
    run.write_bytes((RUNS / "vllm_concurrency8.json").read_bytes())
    before = run.read_bytes()
    for flag in ("--json", "--figure"):
        res = CliRunner().invoke(main, ["replay", str(run), flag, str(run), "--overwrite"])
        assert res.exit_code == 2 and len(res.stderr.splitlines()) == 1, res.output
        assert f"{flag} {run}: is the input file" in res.stderr and "Traceback" not in res.output
    link = tmp_path / "link.json"
    link.symlink_to(run)
    res = CliRunner().invoke(main, ["replay", str(run), "--json", str(link), "--overwrite"])
    assert res.exit_code == 2 and "is the input file" in res.stderr
    assert run.read_bytes() == before


@pytest.mark.parametrize("mode,need", [("closed", "max_concurrency"), ("recorded", "per-request send times")])
def test_an_arrival_mode_the_file_lacks_what_for_is_one_line(mode, need):
    """The SGLang file has a rate, no concurrency limit and no send times: ``closed`` and
    ``recorded`` say so (was a TypeError, and a horizon of NaN)."""
    res = CliRunner().invoke(main, ["replay", str(RUNS / "sglang_rate8.jsonl"), "--arrivals", mode])
    assert res.exit_code == 2 and len(res.stderr.splitlines()) == 1 and "Traceback" not in res.output
    line = res.stderr
    assert f"--arrivals {mode} needs" in line and need in line and "sglang_rate8.jsonl" in line
    assert "request_rate 8/s, no concurrency limit, no per-request send times" in line
    assert "expected --arrivals auto or process" in line


def test_an_empty_file_is_said_to_be_empty(tmp_path):
    (tmp_path / "e.json").write_text("\n")
    res = CliRunner().invoke(main, ["replay", str(tmp_path / "e.json")])
    assert res.exit_code == 2 and res.stderr.strip() == (f"error: {tmp_path / 'e.json'}: is empty (expected a "
                                                         f"benchmark result file: vLLM, GuideLLM, SGLang or genai-perf)")


def _notes(*args) -> list[str]:
    res = CliRunner().invoke(main, ["replay", *map(str, args)])
    assert res.exit_code == 0, res.output
    return [ln for ln in res.stdout.splitlines() if ln.startswith("note: ")]


def test_redrawn_arrivals_are_noted_with_their_seed():
    """A file without send times (every SGLang file) is sent by arrivals drawn again from its
    process: a note says so and names the seed; recorded times, or a rate of inf, draw nothing."""
    drawn = [n for n in _notes(RUNS / "sglang_rate8.jsonl", "--seed", 5) if "drawn again" in n]
    assert len(drawn) == 1 and "Poisson at 8 req/s" in drawn[0] and "seed 5" in drawn[0]
    assert "independent draws" in drawn[0]
    assert not [n for n in _notes(RUNS / "vllm_concurrency8.json") if "drawn again" in n]
    assert not [n for n in _notes(RUNS / "vllm_concurrency8.json", "--arrivals", "process") if "drawn again" in n]


def test_sglang_runs_say_which_release_prices_them():
    """As vLLM's: a note naming the default SGLang release and how to give the server's; none
    once engine.engine_version is given."""
    from sim.engines.sglang import LATEST

    said = [n for n in _notes(RUNS / "sglang_rate8.jsonl") if "priced as SGLang" in n]
    assert len(said) == 1 and LATEST in said[0] and "engine.engine_version" in said[0]
    assert not [n for n in _notes(RUNS / "sglang_rate8.jsonl", "--set", 'engine.engine_version="0.4.6"')
                if "priced as SGLang" in n]


def test_summary_only_input_is_warned_about(tmp_path):
    """No per-request lengths: one warning saying so, that the requests under max_concurrency
    move in lockstep and that calibrating on it is unreliable, with the flag that saves them."""
    _, summary, _ = _fixed_length_files(tmp_path, n=6)
    res = CliRunner().invoke(main, ["replay", str(summary)])
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("warning:")]
    assert len(lines) == 1 and str(summary) in lines[0]
    assert "per-request lengths are not in the file" in lines[0] and "lockstep" in lines[0]
    assert "unreliable" in lines[0] and "--save-detailed" in lines[0]
    ok = CliRunner().invoke(main, ["replay", str(RUNS / "vllm_concurrency8.json")])
    assert "warning:" not in ok.stderr


def test_failed_requests_are_noted_with_their_count(tmp_path):
    doc = {"num_prompts": 3, "request_rate": 2.0, "max_concurrency": 2, "input_lens": [10, 20, 30],
           "output_lens": [3, 0, 2], "ttfts": [0.1, 0.0, 0.2], "itls": [[0.01, 0.02], [], [0.03]],
           "errors": ["", "timeout", ""]}
    (tmp_path / "r.json").write_text(json.dumps(doc))
    run = read_run(tmp_path / "r.json")
    said = [n for n in run.notes if "failed" in n]
    assert len(said) == 1 and said[0].startswith("1 of 3 requests failed") and "concurrency slot" in said[0]
    assert not [n for n in read_run(RUNS / "vllm_concurrency8.json").notes if "failed" in n]


def test_per_request_times_against_the_files_own_summary(tmp_path):
    """ttfts saved in milliseconds (1000x the file's mean_ttft_ms / 1000): one warning naming
    the key, both values and the likely cause; the file as written, none."""
    doc = json.loads((RUNS / "vllm_concurrency8.json").read_text())
    assert read_run(RUNS / "vllm_concurrency8.json").warnings == []
    doc["ttfts"] = [t * 1000 for t in doc["ttfts"]]
    (tmp_path / "ms.json").write_text(json.dumps(doc))
    res = CliRunner().invoke(main, ["replay", str(tmp_path / "ms.json")])
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("warning:")]
    assert len(lines) == 1 and "ttfts: mean" in lines[0] and f"mean_ttft_ms {doc['mean_ttft_ms']:.4g} ms" in lines[0]
    assert "(1e+03x)" in lines[0] and "milliseconds where seconds belong" in lines[0]


def test_a_gpu_the_file_names_is_checked_against_the_profile(tmp_path):
    """No client writes its GPU, but ``vllm bench serve --metadata gpu=...`` adds the key: a GPU
    of another family than the profile's is one warning; the same family, or no key, none."""
    doc = json.loads((RUNS / "vllm_concurrency8.json").read_text())
    for gpu, warned in (("NVIDIA H100 80GB HBM3", True), ("H200", False)):
        (tmp_path / "g.json").write_text(json.dumps({**doc, "gpu": gpu}))
        res = CliRunner().invoke(main, ["replay", str(tmp_path / "g.json"), "--profile", "h200-llama-3-8b"])
        lines = [ln for ln in res.stderr.splitlines() if ln.startswith("warning:")]
        assert res.exit_code == 0 and len(lines) == int(warned), (gpu, lines)
        if warned:
            assert f"GPU {gpu!r}" in lines[0] and "H200" in lines[0]


def test_genai_perf_model_is_its_payloads():
    """genai-perf's export has no top-level model: the requests' payloads name it, so the
    model-mismatch warning works for it too."""
    run = read_run(RUNS / "genai_perf_concurrency4.json")
    assert run.settings["model"] == "meta-llama/Meta-Llama-3-8B-Instruct"
    res = CliRunner().invoke(main, ["replay", str(RUNS / "genai_perf_concurrency4.json"), "--profile",
                                    "h100-sxm-qwen3-8b"])
    assert res.exit_code == 0 and res.stderr.count("warning:") == 1 and "qwen" in res.stderr


def test_json_records_what_was_simulated(tmp_path):
    """Beside the metrics (their names and structure unchanged): the notes printed, the
    warnings, the --set overrides as given, the engine flags, every override the scenario got,
    the seed, the arrival mode and the profile's name and file; the same bytes when run again."""
    out = tmp_path / "m.json"
    args = ["replay", str(RUNS / "sglang_rate8.jsonl"), "--profile", PROFILE, "--seed", "2", "--set",
            "engine.max_batched_tokens=4096", "--sglang-args", "--max-running-requests 64"]
    res = CliRunner().invoke(main, [*args, "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert set(REQUIRED) <= set(doc["metrics"]) and set(doc["metrics"]["ttft_p50_ms"]) == {"measured", "simulated",
                                                                                           "error"}
    assert doc["seed"] == 2 and doc["profile"] == PROFILE and doc["profile_name"] == PROFILE
    assert doc["profile_path"] == str(find_profile(PROFILE).resolve())
    assert doc["sets"] == ["engine.max_batched_tokens=4096"] and doc["sglang_args"] == "--max-running-requests 64"
    assert "engine.max_num_seqs=64" in doc["overrides"] and doc["engine_args"] is None
    assert doc["arrivals"] == {"asked": "auto", "sent": "process", "redrawn": True}
    printed = [ln.removeprefix("note: ") for ln in res.stdout.splitlines() if ln.startswith("note: ")]
    assert doc["notes"] == printed and any("seed 2" in n for n in printed) and doc["warnings"] == []
    again = tmp_path / "again.json"
    assert CliRunner().invoke(main, [*args, "--json", str(again)]).exit_code == 0
    assert again.read_bytes() == out.read_bytes()
