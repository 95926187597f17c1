"""The readers on the shapes real result files have (seen in public files of each client and in
the clients' writer code; the values here are made up): genai-perf without ``--streaming``, with
a usage chunk, with failed and splintered responses, Triton's own service kind; GuideLLM 0.2-0.3
reports (their TPOT definition, a sampled request list) and 0.7+ ones (stripped lists, null
first-token times); SGLang's ``request_rate: "trace"``; summary-only and partial vLLM files.
tests/data/runs/README.md says which public files these shapes come from."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from calibrate.runs import read_run
from calibrate.runs.compare import measured_metrics
from calibrate.runs.table import RunError
from sim.cli import main

NS = 1_000_000_000


def _write(tmp_path, name, doc):
    p = tmp_path / name
    p.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return p


def _sse(obj) -> dict:
    return {"response": "data: " + json.dumps(obj) + "\n\n"}


def _delta(text):
    return {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}}]}


def _payload(words: int) -> dict:
    body = {"model": "m", "messages": [{"role": "user", "content": " ".join(["w"] * words)}], "stream": True}
    return {"payload": json.dumps(body)}


# -- genai-perf -------------------------------------------------------------------------------

def test_genai_perf_non_streamed_answers_use_their_usage(tmp_path):
    """genai-perf's default (no --streaming): one bare chat.completion body per request, with
    usage; perf_analyzer writes mode request_rate, value 0 when no rate was set."""
    def answer(p, c):
        return {"response": json.dumps({"object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "a b c"}}],
            "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}})}
    doc = {"experiments": [{"experiment": {"mode": "request_rate", "value": 0.0}, "requests": [
        {"timestamp": 10 * NS, "request_inputs": _payload(5), "response_timestamps": [10 * NS + 400_000_000],
         "response_outputs": [answer(33, 32)]},
        {"timestamp": 11 * NS, "request_inputs": _payload(5), "response_timestamps": [11 * NS + 500_000_000],
         "response_outputs": [answer(40, 16)]}]}],
           "version": "", "service_kind": "openai", "endpoint": "v1/chat/completions"}
    run = read_run(_write(tmp_path, "profile_export.json", doc))
    assert list(run.requests["input_tokens"]) == [33, 40]
    assert list(run.requests["output_tokens"]) == [32, 16]
    assert list(run.requests["ttft_s"]) == pytest.approx([0.4, 0.5])  # one piece: first = last
    assert list(run.requests["e2e_s"]) == pytest.approx([0.4, 0.5])
    assert run.settings["request_rate"] == math.inf and run.settings["max_concurrency"] is None
    assert not any("approximated" in n for n in run.notes)


def test_genai_perf_streamed_with_usage_and_failures(tmp_path):
    """A usage-only last chunk gives exact counts; a request with no response and one whose only
    chunk is an error body are dropped (genai-perf skips them), with a note."""
    usage = {"id": "c", "object": "chat.completion.chunk", "choices": [],
             "usage": {"prompt_tokens": 120, "completion_tokens": 3}}
    t = NS
    doc = {"experiments": [{"experiment": {"mode": "concurrency", "value": 2}, "requests": [
        {"timestamp": t, "request_inputs": _payload(100),
         "response_timestamps": [t + 50, t + 100_000_000, t + 120_000_000, t + 150_000_000, t + 151_000_000,
                                 t + 152_000_000],
         "response_outputs": [_sse({"choices": [{"delta": {"role": "assistant"}}]}), _sse(_delta("Hi")),
                              _sse(_delta(" there")), _sse(_delta("!")), _sse(usage),
                              {"response": "data: [DONE]\n\n"}]},
        {"timestamp": t + 1, "request_inputs": _payload(10), "response_timestamps": [], "response_outputs": []},
        {"timestamp": t + 2, "request_inputs": _payload(10), "response_timestamps": [t + 9_000_000],
         "response_outputs": [{"response": json.dumps({"object": "error", "message": "overloaded"})}]}]}]}
    run = read_run(_write(tmp_path, "p.json", doc))
    assert len(run.requests) == 1
    r = run.requests.iloc[0]
    assert (r.input_tokens, r.output_tokens) == (120, 3)
    assert r.ttft_s == pytest.approx(0.1) and r.e2e_s == pytest.approx(0.15)
    assert r.itl_s == pytest.approx([0.02, 0.03])
    assert run.settings["max_concurrency"] == 2
    assert any("2 of 3 requests had no response with text" in n for n in run.notes)


def test_genai_perf_every_request_failed_is_one_line(tmp_path):
    doc = {"experiments": [{"experiment": {"mode": "concurrency", "value": 1}, "requests": [
        {"timestamp": 1, "request_inputs": _payload(3), "response_timestamps": [], "response_outputs": []}]}]}
    with pytest.raises(RunError, match=r"no request has a response with text"):
        read_run(_write(tmp_path, "p.json", doc))


def test_genai_perf_splintered_sse_chunk_is_joined(tmp_path):
    """An event split over two responses (the second without ``data:``): joined, as genai-perf
    does, so its text and the earlier response's time count once."""
    whole = "data: " + json.dumps(_delta("lo")) + "\n\n"
    doc = {"experiments": [{"experiment": {"mode": "concurrency", "value": 1}, "requests": [
        {"timestamp": 0, "request_inputs": _payload(4), "response_timestamps": [100, 200, 300],
         "response_outputs": [_sse(_delta("Hel")), {"response": whole[:20]}, {"response": whole[20:]}]}]}]}
    run = read_run(_write(tmp_path, "p.json", doc))
    r = run.requests.iloc[0]
    assert r.output_tokens == 2 and r.e2e_s == pytest.approx(200e-9)


def test_genai_perf_triton_service_kind(tmp_path):
    doc = {"service_kind": "triton", "experiments": [{"experiment": {"mode": "concurrency", "value": 1}, "requests": [
        {"timestamp": 0, "request_inputs": {"text_input": "one two three four", "max_tokens": 8},
         "response_timestamps": [100, 300, 600], "response_outputs": [{"text_output": "I"}, {"text_output": " like"},
                                                                       {"text_output": " dogs"}]}]}]}
    run = read_run(_write(tmp_path, "p.json", doc))
    r = run.requests.iloc[0]
    assert (r.input_tokens, r.output_tokens) == (4, 3) and r.itl_s == pytest.approx([200e-9, 300e-9])


# -- GuideLLM ---------------------------------------------------------------------------------

def _guidellm_03(n_listed=2, total=46):
    """GuideLLM 0.2-0.3 layout: top-level first/last token times and per-request stats."""
    reqs = []
    for i in range(n_listed):
        s = 1000.0 + i
        first, last, out = s + 0.020, s + 0.020 + 0.005 * 127, 128
        reqs.append({"type_": "generative_text_response", "request_id": f"r{i}", "prompt_tokens": 257,
                     "output_tokens": out, "start_time": s, "end_time": last + 0.0001, "first_token_time": first,
                     "last_token_time": last, "request_latency": last + 0.0001 - s,
                     "time_to_first_token_ms": 1e3 * (first - s),
                     "time_per_output_token_ms": 1e3 * (last - first) / out,
                     "inter_token_latency_ms": 1e3 * (last - first) / (out - 1),
                     "scheduler_info": {"request_start": s, "request_end": last}})
    return {"benchmarks": [{"type_": "generative_benchmark", "args": {"strategy": {"type_": "synchronous"}},
                            "run_stats": {"requests_made": {"successful": n_listed}},
                            "request_totals": {"successful": total, "errored": 0, "incomplete": 1, "total": total + 1},
                            "worker": {"backend_model": "example_model"},
                            "requests": {"successful": reqs, "errored": [], "incomplete": []}}]}


def test_guidellm_03_tpot_and_itl_are_the_reports_own(tmp_path):
    """0.2-0.3 define TPOT from the first token ((last - first) / output), not from the send as
    0.4+ do: the measured side equals the report's per-request numbers."""
    doc = _guidellm_03()
    run = read_run(_write(tmp_path, "benchmarks.json", doc))
    assert run.metrics == "guidellm-0.3"
    m = measured_metrics(run)
    reqs = doc["benchmarks"][0]["requests"]["successful"]
    assert m["tpot_mean_ms"] == pytest.approx(np.mean([r["time_per_output_token_ms"] for r in reqs]))
    assert m["itl_mean_ms"] == pytest.approx(np.mean([r["inter_token_latency_ms"] for r in reqs]))
    assert m["ttft_p50_ms"] == pytest.approx(np.median([r["time_to_first_token_ms"] for r in reqs]))
    assert run.settings["max_concurrency"] == 1 and run.settings["model"] == "example_model"


def test_guidellm_sampled_list_is_noted(tmp_path):
    run = read_run(_write(tmp_path, "benchmarks.json", _guidellm_03(n_listed=1, total=46)))
    assert len(run.requests) == 1
    assert any("lists 1 of the 46 successful requests" in n for n in run.notes)


def test_guidellm_08_stripped_report_is_one_line_exit_2(tmp_path):
    """GuideLLM 0.7+ layout (metadata/config at the top, scheduler_metrics per benchmark) with
    its request lists emptied, as in a stripped fixture: refused in one line."""
    b = {"type_": "generative_benchmark", "config": {"strategy": {"type_": "constant", "rate": 2.0}},
         "scheduler_metrics": {"requests_made": {"successful": 2, "errored": 0, "incomplete": 0, "total": 2}},
         "requests": {"successful": [], "errored": [], "incomplete": []}}
    p = _write(tmp_path, "report.json", {"metadata": {"version": 2}, "config": {}, "benchmarks": [b, b]})
    res = CliRunner().invoke(main, ["replay", str(p)])
    assert res.exit_code == 2 and "Traceback" not in res.output
    line = res.output.strip()
    assert "\n" not in line and "requests.successful: empty" in line and "2 succeeded" in line


def test_guidellm_07_request_without_first_token_is_dropped(tmp_path):
    def req(s, first):
        timings = {"request_start": s, "request_end": s + 0.5, "first_token_iteration": first,
                   "last_token_iteration": s + 0.49 if first else None}
        return {"type_": "generative_request_stats", "request_id": "x", "info": {"timings": timings},
                "request_start_time": s, "request_end_time": s + 0.5, "request_latency": 0.5,
                "prompt_tokens": 100, "output_tokens": 10 if first else 0,
                "time_to_first_token_ms": None if first is None else 1e3 * (first - s)}
    b = {"config": {"strategy": {"type_": "concurrent", "streams": 2}, "backend": {"model": "m"}},
         "requests": {"successful": [req(5.0, 5.1), req(6.0, None)]}}
    run = read_run(_write(tmp_path, "r.json", {"benchmarks": [b]}))
    assert len(run.requests) == 1 and run.metrics == "guidellm"
    assert run.requests["ttft_s"].iloc[0] == pytest.approx(0.1)
    assert any("without a first-token time" in n for n in run.notes)


# -- vLLM / SGLang ----------------------------------------------------------------------------

def test_sglang_trace_request_rate_reads(tmp_path):
    doc = {"backend": "sglang-oai", "request_rate": "trace", "max_concurrency": None, "mean_e2e_latency_ms": 1.0,
           "duration": 2.0, "completed": 2, "input_lens": [10, 20], "output_lens": [2, 3], "ttfts": [0.1, 0.2],
           "itls": [[0.01], [0.02, 0.03]], "generated_texts": ["", ""], "errors": ["", ""],
           "server_info": {"a": 1}}
    run = read_run(_write(tmp_path, "s.jsonl", json.dumps(doc) + "\n"))
    assert run.format == "sglang" and run.settings["request_rate"] == math.inf
    assert any("'trace'" in n for n in run.notes)


def test_summary_only_sglang_lines_without_totals_are_one_line_exit_2(tmp_path):
    """SGLang appends summary-only lines without --output-details (and writes Infinity); one
    without its token totals cannot be replayed at its mean lengths."""
    line = ('{"backend": "sglang", "dataset_name": "random", "request_rate": Infinity, "max_concurrency": null, '
            '"mean_e2e_latency_ms": 7840.6, "median_ttft_ms": 85.7, "duration": 298.4, "completed": 300}')
    p = _write(tmp_path, "online.jsonl", line + "\n" + line.replace("Infinity", "1.0") + "\n")
    res = CliRunner().invoke(main, ["replay", str(p)])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "input_lens: missing" in res.output and "--output-details" in res.output


def test_vllm_lengths_without_times_name_what_is_missing(tmp_path):
    doc = {"date": "20250513-045648", "backend": "openai", "num_prompts": 2, "request_rate": 3.6, "burstiness": 100.0,
           "max_concurrency": None, "mean_ttft_ms": 1.0, "request_goodput:": None,
           "input_lens": [10, 20], "output_lens": [2, 3]}
    with pytest.raises(RunError, match=r"ttfts: missing \(the file keeps input_lens, output_lens"):
        read_run(_write(tmp_path, "v.json", doc))


# -- replay runs on them ----------------------------------------------------------------------

def test_replay_runs_on_the_real_shapes(tmp_path):
    p = _write(tmp_path, "benchmarks.json", _guidellm_03(n_listed=3, total=46))
    out = tmp_path / "m.json"
    res = CliRunner().invoke(main, ["replay", str(p), "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "note: the report lists 3 of the 46" in res.output
    m = json.loads(out.read_text())["metrics"]
    assert m["tpot_mean_ms"]["measured"] == pytest.approx(5.0 * 127 / 128)


def _guidellm_05(windowed: bool):
    """GuideLLM 0.4+ layout, synchronous, five requests 10 s apart, output 4, 8, 2, 6, 3 tokens;
    with ``windowed`` a measured window that leaves out the first (warmup) and last (cooldown)."""
    reqs = []
    for i, out in enumerate((4, 8, 2, 6, 3)):
        s = 100.0 + 10 * i
        first, last = s + 0.05 * (i + 1), s + 0.05 * (i + 1) + 0.01 * (out - 1)
        timings = {"request_start": s, "first_token_iteration": first, "last_token_iteration": last,
                   "request_end": last + 0.001}
        reqs.append({"type_": "generative_request_stats", "info": {"timings": timings}, "request_start_time": s,
                     "request_end_time": last + 0.001, "request_latency": last + 0.001 - s, "prompt_tokens": 50,
                     "output_tokens": out, "time_to_first_token_ms": 1e3 * (first - s)})
    sm = {"measure_start_time": 105.0, "measure_end_time": 139.0} if windowed else {
        "measure_start_time": 100.0, "measure_end_time": reqs[-1]["request_end_time"]}
    sm["requests_made"] = {"successful": 5}
    return {"metadata": {"guidellm_version": "0.5.0"},
            "benchmarks": [{"config": {"strategy": {"type_": "synchronous"}}, "scheduler_metrics": sm,
                            "requests": {"successful": reqs}}]}


def test_guidellm_warmup_and_cooldown_requests_are_dropped(tmp_path):
    """Listed but outside scheduler_metrics' window: GuideLLM's metrics leave them out; a
    request counts when it ends after the window opens and starts before it closes."""
    run = read_run(_write(tmp_path, "r.json", _guidellm_05(windowed=True)))
    assert list(run.requests["output_tokens"]) == [8, 2, 6]
    assert run.requests["start_s"].iloc[0] == 0.0
    assert any("2 requests outside GuideLLM's measured window" in n for n in run.notes)
    assert len(read_run(_write(tmp_path, "all.json", _guidellm_05(windowed=False))).requests) == 5


def test_guidellm_04_tpot_is_token_weighted_and_percentiles_are_its_own(tmp_path):
    """0.4+: TPOT weighted by output tokens, ITL by output - 1; percentiles are the lower value
    where the CDF reaches p (for five requests, p50 is the third smallest, not an interpolation)."""
    doc = _guidellm_05(windowed=False)
    run = read_run(_write(tmp_path, "r.json", doc))
    reqs = doc["benchmarks"][0]["requests"]["successful"]
    tpot = [(r["info"]["timings"]["last_token_iteration"] - r["request_start_time"]) * 1e3 / r["output_tokens"]
            for r in reqs]
    outs = [r["output_tokens"] for r in reqs]
    m = measured_metrics(run)
    assert m["tpot_mean_ms"] == pytest.approx(np.average(tpot, weights=outs))
    assert m["itl_mean_ms"] == pytest.approx(10.0)  # every gap is 10 ms
    ttft = sorted(r["time_to_first_token_ms"] for r in reqs)
    assert m["ttft_p50_ms"] == pytest.approx(ttft[2]) and m["ttft_p90_ms"] == pytest.approx(ttft[4])


def test_vllm_ramp_up_run_replays_with_a_ramp(tmp_path):
    """``--ramp-up-strategy linear`` 1 -> 9 req/s, no send times: the replay's arrivals ramp as
    vLLM's do (request i at the rate after i / (n - 1) of the list), not all at once."""
    n = 40
    doc = {"date": "20260101-000000", "backend": "vllm", "num_prompts": n, "request_rate": "inf", "burstiness": 1.0,
           "max_concurrency": None, "ramp_up_strategy": "linear", "ramp_up_start_rps": 1, "ramp_up_end_rps": 9,
           "mean_ttft_ms": 1.0, "duration": 10.0, "input_lens": [20] * n, "output_lens": [4] * n,
           "ttfts": [0.02] * n, "itls": [[0.01] * 3] * n, "errors": [""] * n}
    run = read_run(_write(tmp_path, "v.json", doc))
    assert run.settings["ramp_up"] == ("linear", 1.0, 9.0)
    from calibrate.runs.scenario import process_times
    # a nearly regular process (burstiness 10,000): each gap is 1 / the rate reached at its request
    t = process_times(n, math.inf, 10_000.0, seed=3, ramp=run.settings["ramp_up"])
    rates = 1 + 8 * np.arange(n) / (n - 1)
    assert t[0] == 0.0 and np.diff(t) == pytest.approx(1 / rates[1:], rel=0.05)
    with pytest.raises(RunError, match="ramp_up_start_rps: must be a rate > 0"):
        read_run(_write(tmp_path, "bad.json", {**doc, "ramp_up_start_rps": 0}))


def test_vllm_append_result_file_reads_its_last_run(tmp_path):
    """``vllm bench serve --append-result`` writes one result object per line."""
    def one(ttft):
        return {"date": "20260101-000000", "backend": "vllm", "num_prompts": 2, "request_rate": "inf",
                "max_concurrency": 2, "mean_ttft_ms": 1e3 * ttft, "duration": 1.0, "input_lens": [10, 20],
                "output_lens": [2, 3], "ttfts": [ttft, ttft], "itls": [[0.01], [0.01, 0.02]], "errors": ["", ""]}
    p = _write(tmp_path, "v.json", json.dumps(one(0.1)) + "\n" + json.dumps(one(0.3)))
    run = read_run(p)
    assert run.format == "vllm" and list(run.requests["ttft_s"]) == [0.3, 0.3]
    assert any("--append-result" in n for n in run.notes)
