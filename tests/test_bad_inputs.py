"""Every bad input gets exit status 2 and one line naming the file / key / line, the value and
what was expected: no traceback, and nothing left behind that looks like a result.

The cases below are also the table in docs/errors.md, which ``test_errors_doc_is_current``
checks; regenerate it with ``PRIOSIM_WRITE_DOCS=1 python -m pytest tests/test_bad_inputs.py``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner

from sim.cli import main

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "errors.md"

BASE = """name = "bad"
horizon_s = 5.0
[engine]
profile = {{ kind = "linear", base_s = 0.01, prefill_token_s = 1e-5, decode_token_s = 1e-4, context_token_s = 0.0 }}
kv_blocks = 400
{engine}
[policy]
name = "{policy}"
{policy_extra}
[[classes]]
name = "chat"
priority = 0
[[classes]]
name = "batch"
priority = 1
[[streams]]
tenant = "a"
class = "chat"
arrival = {arrival}
prompt_tokens = {prompt}
output_tokens = 20
[[streams]]
tenant = "b"
class = "{cls}"
{stream2}
"""
STREAM2 = 'arrival = { process = "poisson", rate = 1.0 }\nprompt_tokens = 100\noutput_tokens = 20'
TRACE = "trace = {{ format = \"{fmt}\", path = \"{path}\", columns = {{ arrival_s = \"t\", prompt_tokens = \"p\", output_tokens = \"o\" }} }}"


def _damaged_gzip() -> str:
    """A gzip file (as latin-1 text, how the cases write files) whose compressed body is damaged."""
    import gzip
    body = gzip.compress(b"t,p,o\n" + b"".join(b"%d,5,5\n" % i for i in range(20000)))
    return (body[:200] + bytes(b ^ 0x55 for b in body[200:400]) + body[400:]).decode("latin-1")


DAMAGED_GZIP = _damaged_gzip()


def scenario(*, engine: str = "", policy: str = "fcfs", policy_extra: str = "",
             arrival: str = '{ process = "poisson", rate = 1.0 }', prompt: str = "100", cls: str = "batch",
             stream2: str = STREAM2, top: str = "") -> str:
    text = BASE.format(engine=engine, policy=policy, policy_extra=policy_extra, arrival=arrival, prompt=prompt,
                       cls=cls, stream2=stream2)
    return top + text if top else text


def trace_scenario(fmt: str, path: str) -> str:
    return scenario(stream2=TRACE.format(fmt=fmt, path=path))


@dataclass
class Case:
    id: str
    what: str  # the bad input, for the table
    args: list[str]
    files: dict[str, str | bytes] = field(default_factory=dict)  # bytes: written as they are
    skip: str = ""  # why this case cannot run here (its line in docs/errors.md is kept)


def _profile(change) -> str:
    """The shipped measured profile cpu-tiny as JSON text, with ``change(doc)`` applied."""
    import json

    doc = json.loads((ROOT / "sim" / "core" / "profiles" / "cpu-tiny.json").read_text())
    change(doc)
    return json.dumps(doc)


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return True  # (then calibrate fails differently: not this case)
    return bool(torch.cuda.is_available())


RUN = ["run", "s.toml", "--no-plots", "--out", "out"]

# a user's policies that break the contract (docs/own-policy.md), loaded as p.py:<Class>
POLICY_FILE = """import math
from policies import BasePolicy


class Fifo(BasePolicy):
    name = "fifo"

    def key(self, req, now):
        return (req.arrival_s, req.request_id)


class WritesCls(Fifo):
    def key(self, req, now):
        req.cls = "chat"
        return super().key(req, now)


class WritesPrompt(Fifo):
    def key(self, req, now):
        req.prompt_tokens = 1
        return super().key(req, now)


class Lead(Fifo):
    LEAD = 0

    def key(self, req, now):
        return (self.LEAD if req.request_id == 1 else 0, req.arrival_s, req.request_id)


class NanKey(Lead):
    LEAD = math.nan


class StrKey(Lead):
    LEAD = "urgent"


class NoneKey(Lead):
    LEAD = None


class NanChange(Fifo):
    def next_change(self, now):
        return math.nan


class KeyRaises(Fifo):
    def key(self, req, now):
        return (self.deadlines[req.cls], req.arrival_s, req.request_id)


class FinishRaises(Fifo):
    def on_finish(self, req, now):
        self.done = 1 / 0


class ReadsLength(Fifo):
    def key(self, req, now):
        return (req.true_output_tokens, req.arrival_s, req.request_id)


class NoTieBreak(Fifo):
    def key(self, req, now):
        return (req.request_id, req.arrival_s)


class BindRaises(Fifo):
    def bind(self, classes, seed):
        self.slo = classes["interactive"]["ttft_slo_s"]
"""


def policy_case(cls: str) -> dict[str, str]:
    return {"s.toml": scenario(policy=f"p.py:{cls}"), "p.py": POLICY_FILE}
RUN_MARKER = '{"kind": "run", "files": ["manifest.json", "summary.json", "scenario.json", "requests.parquet"]}'
CASES = [
    # absurd sizes: refused before any allocation, with the limit
    Case("rate_huge", "arrival rate 1e12 requests/s", RUN,
         {"s.toml": scenario(arrival='{ process = "poisson", rate = 1e12 }')}),
    Case("batch_huge", "a batch of 10^12 requests", RUN,
         {"s.toml": scenario(arrival='{ process = "batch", n = 1000000000000 }')}),
    Case("users_huge", "10^9 closed-loop users", RUN,
         {"s.toml": scenario(arrival='{ process = "closed_loop", users = 1000000000, think = 1.0 }')}),
    Case("sweep_load_zero", "sweep --loads with a multiplier of 0", ["sweep", "s.toml", "--loads", "0.5,0",
                                                                      "--out", "out"], {"s.toml": scenario()}),
    Case("sweep_load_huge", "sweep --loads 1e9 (each rate times 10^9)",
         ["sweep", "s.toml", "--loads", "1e9", "--out", "out", "--no-plots"], {"s.toml": scenario()}),
    # scenario keys
    Case("seed_negative", "seed = -1", RUN, {"s.toml": scenario(top="seed = -1\n")}),
    Case("interval_inf", "engine.timeseries_interval_s = inf", RUN,
         {"s.toml": scenario(engine="timeseries_interval_s = inf")}),
    Case("horizon_nan", "horizon_s = nan", RUN + ["--set", "horizon_s=nan"], {"s.toml": scenario()}),
    Case("set_into_number", "--set seed.x=1 (seed is a number)", RUN + ["--set", "seed.x=1"],
         {"s.toml": scenario(top="seed = 1\n")}),
    Case("wfq_weight_class", "wfq weights naming no class", RUN,
         {"s.toml": scenario(policy="wfq", policy_extra="weights = { nosuch = 2.0 }")}),
    Case("group_wfq_weight_class", "a replica group's wfq weights naming no class", RUN + ["--set",
         'cluster={groups=[{replicas=1}, {replicas=1, policy={name="wfq", weights={nosuch=2.0}}}]}'],
         {"s.toml": scenario()}),
    Case("autoscale_policy", "an unknown autoscaler policy", RUN + ["--set",
         'cluster={replicas=1, autoscale={policy="nosuch", max=3}}'], {"s.toml": scenario()}),
    Case("autoscale_limits", "autoscale max below min", RUN + ["--set",
         'cluster={replicas=2, autoscale={policy="slo", min=3, max=2}}'], {"s.toml": scenario()}),
    Case("autoscale_start", "a cluster starting outside its autoscaler's limits", RUN + ["--set",
         'cluster={replicas=5, autoscale={policy="slo", max=3}}'], {"s.toml": scenario()}),
    Case("autoscale_migrate", "autoscale drain = 'migrate' (not modelled)", RUN + ["--set",
         'cluster={replicas=1, autoscale={policy="slo", max=3, drain="migrate"}}'], {"s.toml": scenario()}),
    Case("autoscale_param", "an autoscaler parameter out of range", RUN + ["--set",
         'cluster={replicas=1, autoscale={policy={name="target_utilisation", target=1.5}, max=3}}'],
         {"s.toml": scenario()}),
    Case("autoscale_class", "an slo autoscaler watching a misspelt class", RUN + ["--set",
         'cluster={replicas=1, autoscale={policy={name="slo", classes=["Chat"]}, max=3}}'], {"s.toml": scenario()}),
    Case("autoscale_param_unknown", "an unknown autoscaler parameter", RUN + ["--set",
         'cluster={replicas=1, autoscale={policy={name="slo", target=0.5}, max=3}}'], {"s.toml": scenario()}),
    Case("router_param_unknown", "an unknown router parameter", RUN + ["--set",
         'cluster={replicas=2, router={name="power_of_two", dd=2}}'], {"s.toml": scenario()}),
    Case("link_preset_unknown", "a link table naming no preset", RUN + ["--set",
         'cluster={groups=[{name="p", role="prefill"}, {name="d", role="decode"}], link={preset="ib-800"}}'],
         {"s.toml": scenario()}),
    Case("link_bandwidth_zero", "a link bandwidth of 0", RUN + ["--set",
         'cluster={groups=[{name="p", role="prefill"}, {name="d", role="decode"}], link={bandwidth_bytes_per_s=0}}'],
         {"s.toml": scenario()}),
    Case("gpu_price_negative", "a negative gpu_hour_usd", RUN + ["--set",
         'cluster={replicas=1, gpu_hour_usd=-2}'], {"s.toml": scenario()}),
    Case("gpu_price_key", "gpu_hour_usd naming no group or GPU", RUN + ["--set",
         'cluster={replicas=1, gpu_hour_usd={h100=2.0}}'], {"s.toml": scenario()}),
    Case("gpu_price_entry", "a gpu_hour_usd table entry that is not a number", RUN + ["--set",
         'cluster={groups=[{name="a"}, {name="b"}], gpu_hour_usd={a=2.0, b="cheap"}}'], {"s.toml": scenario()}),
    Case("linear_profile_terms", "inline linear profile missing terms", RUN + ["--set",
         'engine.profile={kind="linear",base_s=0.01}'], {"s.toml": scenario()}),
    Case("empirical_sum", "empirical probabilities summing to 1.1", RUN,
         {"s.toml": scenario(prompt='{ dist = "empirical", values = [10, 20], probs = [0.5, 0.6] }')}),
    Case("acceptance_class", "speculative acceptance table naming no class", RUN,
         {"s.toml": scenario(engine="speculative = { k = 2, acceptance = { nosuch = 0.5 } }")}),
    Case("batching_unknown", "engine.batching = \"chunky\"", RUN,
         {"s.toml": scenario(engine='batching = "chunky"')}),
    Case("batching_speculative", "prefill_first batching with speculative decoding", RUN,
         {"s.toml": scenario(engine='batching = "prefill_first"\nspeculative = { k = 2, acceptance = 0.6 }')}),
    Case("policy_writes_cls", "a user policy writing req.cls in key()", RUN, policy_case("WritesCls")),
    Case("policy_writes_prompt", "a user policy writing req.prompt_tokens in key()", RUN,
         policy_case("WritesPrompt")),
    Case("policy_key_nan", "a user policy's key holding NaN", RUN, policy_case("NanKey")),
    Case("policy_key_str", "a user policy's key holding a string", RUN, policy_case("StrKey")),
    Case("policy_key_none", "a user policy's key holding None", RUN, policy_case("NoneKey")),
    Case("policy_next_change_nan", "a user policy's next_change() returning NaN", RUN, policy_case("NanChange")),
    Case("policy_syntax_error", "a user policy file that does not parse", RUN,
         {"s.toml": scenario(policy="p.py:Fifo"), "p.py": "from policies import BasePolicy\n\nclass Fifo(BasePolicy)\n"}),
    Case("policy_import_error", "a user policy file importing a module that is not there", RUN,
         {"s.toml": scenario(policy="p.py:Fifo"), "p.py": POLICY_FILE.replace("import math", "import mathh")}),
    Case("policy_no_key", "a user policy subclassing BasePolicy without a key()", RUN,
         {"s.toml": scenario(policy="p.py:NoKey"),
          "p.py": "from policies import BasePolicy\n\nclass NoKey(BasePolicy):\n    pass\n"}),
    Case("policy_bind_raises", "a user policy's bind() raising", RUN, policy_case("BindRaises")),
    Case("policy_key_raises", "a user policy's key() raising during the run", RUN, policy_case("KeyRaises")),
    Case("policy_on_finish_raises", "a user policy's on_finish() raising during the run", RUN,
         policy_case("FinishRaises")),
    Case("policy_reads_true_length", "a user policy reading req.true_output_tokens, not an oracle", RUN,
         policy_case("ReadsLength")),
    Case("policy_key_no_tiebreak", "a user policy's key not ending in (arrival_s, request_id)", RUN,
         policy_case("NoTieBreak")),
    Case("stream_class_typo", "a stream naming a misspelt class", RUN, {"s.toml": scenario(cls="bach")}),
    Case("name_escapes", 'name = "../../escape"', RUN[:-2] + ["--set", 'name="../../escape"'],
         {"s.toml": scenario()}),
    Case("name_empty", 'name = ""', RUN[:-2] + ["--set", 'name=""'], {"s.toml": scenario()}),
    # traces
    Case("trace_empty_csv", "an empty trace CSV", RUN, {"s.toml": trace_scenario("csv", "t.csv"), "t.csv": ""}),
    Case("trace_empty_csv_lenient", "an empty trace CSV, --lenient", RUN + ["--lenient"],
         {"s.toml": trace_scenario("csv", "t.csv"), "t.csv": ""}),
    Case("trace_header_only", "a header-only trace CSV", RUN,
         {"s.toml": trace_scenario("csv", "t.csv"), "t.csv": "t,p,o\n"}),
    Case("trace_empty_jsonl", "an empty JSONL trace", RUN,
         {"s.toml": trace_scenario("jsonl", "t.jsonl"), "t.jsonl": ""}),
    Case("trace_huge_length", "a trace length of 99999999999999999999", RUN,
         {"s.toml": trace_scenario("csv", "t.csv"), "t.csv": "t,p,o\n0.5,10,99999999999999999999\n"}),
    Case("trace_extra_field", "a CSV row with an extra field", RUN,
         {"s.toml": trace_scenario("csv", "t.csv"), "t.csv": "t,p,o\n0.5,10,5,7\n0.7,3,4\n"}),
    Case("trace_gzip_corrupt", "a trace.csv.gz whose compressed body is damaged", RUN,
         {"s.toml": trace_scenario("csv", "t.csv.gz"), "t.csv.gz": DAMAGED_GZIP}),
    Case("trace_json_deep", "a JSONL trace line nested 100,000 deep", RUN,
         {"s.toml": trace_scenario("jsonl", "t.jsonl"), "t.jsonl": "[" * 100_000 + "]" * 100_000 + "\n"}),
    Case("trace_datetime_no_unit", "datetimes in a trace's arrival column, no time_unit", RUN,
         {"s.toml": trace_scenario("csv", "t.csv"), "t.csv": "t,p,o\n2024-05-10 12:00:01.5,10,5\n"}),
    Case("trace_class_unknown", "a trace's class column naming no class", RUN,
         {"s.toml": scenario(stream2=TRACE.format(fmt="csv", path="t.csv").replace(
             'output_tokens = \"o\"', 'output_tokens = \"o\", class = \"k\"')),
          "t.csv": "t,p,o,k\n0.5,10,5,chat\n0.7,3,4,vip\n"}),
    # command line
    Case("workers_zero", "sweep --workers 0", ["sweep", "s.toml", "--workers", "0", "--out", "out"],
         {"s.toml": scenario()}),
    Case("workers_negative", "sweep --workers -3", ["sweep", "s.toml", "--workers", "-3", "--out", "out"],
         {"s.toml": scenario()}),
    Case("run_out_under_file", "run --out under a file", ["run", "s.toml", "--no-plots", "--out", "f/out"],
         {"s.toml": scenario(), "f": "x"}),
    Case("sweep_out_under_file", "sweep --out under a file", ["sweep", "s.toml", "--out", "f/out"],
         {"s.toml": scenario(), "f": "x"}),
    Case("validate_profile_not_json", "validate --profile with a file that is not JSON",
         ["validate", "--profile", "p.json", "--out", "out"], {"p.json": "not json\n"}),
    # sensitivity
    Case("sensitivity_no_range", "sensitivity of a knob without a default range",
         ["sensitivity", "s.toml", "--knobs", "engine.block_size", "--out", "out"], {"s.toml": scenario()}),
    Case("sensitivity_empty_range", "sensitivity --ranges with LOW > HIGH",
         ["sensitivity", "s.toml", "--knobs", "engine.max_num_seqs", "--ranges", "engine.max_num_seqs=64..16",
          "--out", "out"], {"s.toml": scenario()}),
    Case("sensitivity_bad_value", "sensitivity range giving an invalid scenario (max_num_seqs 0)",
         ["sensitivity", "s.toml", "--knobs", "engine.max_num_seqs", "--ranges", "engine.max_num_seqs=0..8",
          "--out", "out"], {"s.toml": scenario()}),
    Case("sensitivity_metric_unknown", "sensitivity --metric naming no metric",
         ["sensitivity", "s.toml", "--knobs", "load", "--metric", "nosuch", "--out", "out"], {"s.toml": scenario()}),
    Case("sensitivity_sobol_choices", "sensitivity --method sobol over choices",
         ["sensitivity", "s.toml", "--knobs", "policy.name", "--ranges", "policy.name=fcfs,priority", "--method",
          "sobol", "--out", "out"], {"s.toml": scenario()}),
    # replay of a benchmark result file
    Case("replay_not_json", "replay of a file that is not JSON", ["replay", "r.json"], {"r.json": "{\"ttfts\": [0.1, 0.2"}),
    Case("replay_empty", "replay of an empty file", ["replay", "r.json"], {"r.json": "\n"}),
    Case("replay_closed_without_limit", "replay --arrivals closed of a run without max_concurrency",
         ["replay", "r.json", "--arrivals", "closed"],
         {"r.json": '{"num_prompts": 2, "request_rate": 4.0, "mean_ttft_ms": 100.0, "input_lens": [5, 6], '
                    '"output_lens": [3, 2], "ttfts": [0.1, 0.1], "itls": [[0.01, 0.01], [0.01]]}'}),
    Case("replay_json_is_figure", "replay --json and --figure naming one file",
         ["replay", "r.json", "--json", "m.out", "--figure", "m.out"], {"r.json": "{}"}),
    Case("replay_figure_suffix", "replay --figure naming a file whose suffix is no figure format",
         ["replay", "r.json", "--figure", "parity.txt"], {"r.json": "{}"}),
    Case("replay_json_is_the_run", "replay --json naming the run file itself, with --overwrite",
         ["replay", "r.json", "--json", "r.json", "--overwrite"], {"r.json": "{}"}),
    Case("replay_other_json", "replay of a JSON of another kind", ["replay", "r.json"], {"r.json": '{"name": "x"}\n'}),
    Case("replay_missing_key", "replay of a vLLM result without input_lens", ["replay", "r.json"],
         {"r.json": '{"num_prompts": 2, "request_rate": "inf", "mean_ttft_ms": 1.0, "output_lens": [3, 4], '
                    '"ttfts": [0.1, 0.1], "itls": [[0.01, 0.01], [0.01, 0.01, 0.01]]}'}),
    Case("replay_summary_only", "replay of a summary-only vLLM result without its token totals", ["replay", "r.json"],
         {"r.json": '{"num_prompts": 2, "request_rate": 4.0, "mean_ttft_ms": 12.5, "duration": 1.0}'}),
    Case("replay_negative_length", "replay of a vLLM result with a negative output length", ["replay", "r.json"],
         {"r.json": '{"num_prompts": 2, "request_rate": "inf", "mean_ttft_ms": 1.0, "input_lens": [5, 6], '
                    '"output_lens": [3, -4], "ttfts": [0.1, 0.1], "itls": [[0.01, 0.01], [0.01]]}'}),
    Case("replay_guidellm_no_tokens", "replay of a GuideLLM report whose request lacks prompt_tokens",
         ["replay", "r.json"], {"r.json": '{"benchmarks": [{"requests": {"successful": [{"output_tokens": 3, '
                                          '"request_start_time": 1.0, "request_end_time": 2.0}]}}]}'}),
    Case("replay_genai_perf_truncated", "replay of a genai-perf export with a request lacking its responses",
         ["replay", "r.json"], {"r.json": '{"experiments": [{"experiment": {"mode": "concurrency", "value": 1}, '
                                          '"requests": [{"timestamp": 100}]}]}'}),
    Case("interval_tiny", "engine.timeseries_interval_s = 1e-10 (below 1 ns)",
         RUN + ["--set", "engine.timeseries_interval_s=1e-10"], {"s.toml": scenario()}),
    Case("class_key_typo", "ttft_slo (for ttft_slo_s) in a class table", RUN,
         {"s.toml": scenario().replace('priority = 0\n', 'priority = 0\nttft_slo = 1.0\n', 1)}),
    Case("set_class_key_typo", "--set classes.chat.ttft_slo=1", RUN + ["--set", "classes.chat.ttft_slo=1"],
         {"s.toml": scenario()}),
    Case("set_class_name_typo", "--set classes.caht.priority=1 (no class caht)",
         RUN + ["--set", "classes.caht.priority=1"], {"s.toml": scenario()}),
    Case("profile_name_typo", "a misspelt shipped profile name", RUN + ["--set", 'engine.profile="h200-lama-3-8b"'],
         {"s.toml": scenario()}),
    # hostile text: refused in one line, not a crash of the parser or of what reads its result
    Case("toml_deep_arrays", "a scenario file with arrays nested 500 deep", RUN,
         {"s.toml": scenario(top="a = " + "[" * 500 + "]" * 500 + "\n")}),
    Case("toml_deep_tables", "a scenario file with inline tables nested 500 deep", RUN,
         {"s.toml": scenario(top="a = " + "{ b = " * 500 + "1" + " }" * 500 + "\n")}),
    Case("set_deep_brackets", "a --set value of 5,000 nested brackets",
         RUN + ["--set", "horizon_s=" + "[" * 5000 + "]" * 5000], {"s.toml": scenario()}),
    Case("set_huge_integer", "a --set value of 10,000 digits", RUN + ["--set", "seed=" + "1" * 10_000],
         {"s.toml": scenario()}),
    # text that is not UTF-8 (a file saved as Latin-1): the first bad byte, not a traceback
    Case("scenario_not_utf8", "a scenario file that is not UTF-8", RUN,
         {"s.toml": scenario().replace('"bad"', '"b\u00e9"').encode("latin-1")}),
    Case("workload_not_utf8", "workload of a scenario file that is not UTF-8", ["workload", "s.toml"],
         {"s.toml": scenario().replace('"bad"', '"b\u00e9"').encode("latin-1")}),
    Case("sweep_not_utf8", "sweep of a scenario file that is not UTF-8", ["sweep", "s.toml", "--out", "out"],
         {"s.toml": scenario().replace('"bad"', '"b\u00e9"').encode("latin-1")}),
    Case("grid_not_utf8", "a sweep --grid file that is not UTF-8", ["sweep", "s.toml", "--grid", "g.toml", "--out", "out"],
         {"s.toml": scenario(), "g.toml": "# caf\u00e9\nseed = [1, 2]\n".encode("latin-1")}),
    Case("trace_csv_not_utf8", "a trace CSV that is not UTF-8", RUN,
         {"s.toml": trace_scenario("csv", "t.csv"), "t.csv": "t,p,o\n0.5,10,5\n0.7,3\u00e9,4\n".encode("latin-1")}),
    Case("trace_jsonl_not_utf8", "a JSONL trace that is not UTF-8", RUN,
         {"s.toml": trace_scenario("jsonl", "t.jsonl"),
          "t.jsonl": '{"t": 0.5, "p": 10, "o": 5, "u": "\u00e9"}\n'.encode("latin-1")}),
    Case("profile_not_utf8", "a profile file that is not UTF-8", RUN + ["--set", 'engine.profile="p.json"'],
         {"s.toml": scenario(), "p.json": _profile(lambda d: d["meta"].update(device="X")).replace('"X"', '"caf\u00e9"').encode("latin-1")}),
    Case("model_config_not_utf8", "a model config.json that is not UTF-8", RUN + ["--set", 'engine.model="m/config.json"',
         "--set", "engine.gpu=h200"], {"s.toml": scenario(), "m/config.json": '{"name": "\u00e9"}'.encode("latin-1")}),
    Case("replay_not_utf8", "replay of a result file that is not UTF-8", ["replay", "r.json"],
         {"r.json": '{"model": "caf\u00e9"}\n'.encode("latin-1")}),
    Case("scenario_json_not_object", "a .json scenario that is not one object", ["run", "s.json", "--out", "out"],
         {"s.json": "[1, 2]\n"}),
    Case("profile_deep_json", "a profile file of JSON nested 100,000 deep", RUN + ["--set", 'engine.profile="p.json"'],
         {"s.toml": scenario(), "p.json": "[" * 100_000 + "]" * 100_000}),
    Case("profile_row_nan", "a measured profile row's time_s = NaN", RUN + ["--set", 'engine.profile="p.json"'],
         {"s.toml": scenario(), "p.json": _profile(lambda d: d["rows"][0].update(time_s=float("nan")))}),
    Case("profile_term_huge", "an inline profile's base_s = 1e300 (beyond any step)",
         RUN + ["--set", 'engine.profile={kind="linear", base_s=1e300, prefill_token_s=0, decode_token_s=0, '
                         'context_token_s=0}'], {"s.toml": scenario()}),
    Case("overhead_term_huge", "engine.overhead = {frontend_s = 1e300}", RUN + ["--set", "engine.overhead={frontend_s=1e300}"],
         {"s.toml": scenario()}),
    Case("async_scheduling_v0", "--async-scheduling on vLLM 0.6.3",
         RUN + ["--engine-args", "--async-scheduling", "--set", 'engine.engine_version="0.6.3"'],
         {"s.toml": scenario()}),
    Case("tp_not_the_profiles", "--tensor-parallel-size 4 beside a TP-1 profile",
         RUN + ["--engine-args", "--tensor-parallel-size 4", "--set", 'engine.profile="h200-llama-3-8b"'],
         {"s.toml": scenario()}),
    Case("overlap_scheduling_no_engine", "engine.overlap_scheduling without engine.engine",
         RUN + ["--set", "engine.overlap_scheduling=false"], {"s.toml": scenario()}),
    Case("profile_layers_negative", "a profile's model.layers = -4", RUN + ["--set", 'engine.profile="p.json"'],
         {"s.toml": scenario(), "p.json": _profile(lambda d: d["model"].update(layers=-4))}),
    # click's usage errors: one line too
    Case("seed_not_integer", "run --seed abc", RUN + ["--seed", "abc"], {"s.toml": scenario()}),
    Case("sweep_out_is_file", "sweep --out naming an existing file", ["sweep", "s.toml", "--out", "f"],
         {"s.toml": scenario(), "f": "x"}),
    Case("workload_out_is_folder", "workload --out naming a folder", ["workload", "s.toml", "--out", "d"],
         {"s.toml": scenario(), "d/x": "x"}),
    Case("backend_unknown", "sweep --backend dask", ["sweep", "s.toml", "--backend", "dask", "--out", "out"],
         {"s.toml": scenario()}),
    Case("option_unknown", "run --bogus", RUN + ["--bogus"], {"s.toml": scenario()}),
    Case("capacity_load_negative", "capacity --load -1", ["capacity", "s.toml", "--load", "-1", "--out", "out"],
         {"s.toml": scenario()}),
    Case("capacity_load_huge", "capacity --load 1e12 (each rate times 10^12)",
         ["capacity", "s.toml", "--load", "1e12", "--out", "out"], {"s.toml": scenario()}),
    Case("capacity_trace_bad_row", "capacity on a trace with a bad row (no --lenient: nothing is written)",
         ["capacity", "s.toml", "--out", "out"],
         {"s.toml": trace_scenario("csv", "t.csv"), "t.csv": "t,p,o\n0.5,10,5\n0.7,x,4\n"}),
    Case("capacity_trace_bad_row_no_out", "capacity on a trace with a bad row, no --out (no results/capacity-*)",
         ["capacity", "s.toml"], {"s.toml": trace_scenario("csv", "t.csv"), "t.csv": "t,p,o\n0.5,10,5\n0.7,x,4\n"}),
    Case("capacity_figure_exists", "capacity --figure naming an existing file",
         ["capacity", "s.toml", "--figure", "fig.png", "--out", "out"], {"s.toml": scenario(), "fig.png": "old"}),
    Case("capacity_design_twice", "capacity --designs naming one design twice",
         ["capacity", "s.toml", "--designs", "shared,shared", "--out", "out"], {"s.toml": scenario()}),
    Case("capacity_figure_suffix", "capacity --figure naming a file whose suffix is no figure format",
         ["capacity", "s.toml", "--figure", "fig.txt", "--out", "out"], {"s.toml": scenario()}),
    Case("compare_csv_exists", "compare --csv naming an existing file", ["compare", "a", "b", "--csv", "c.csv"],
         {"a/x": "", "b/x": "", "c.csv": "old"}),
    # calibrate --from-runs
    Case("from_runs_not_json", "calibrate --from-runs of a file that is not JSON",
         ["calibrate", "--from-runs", "r.json", "--profile", "h100-sxm-llama-3-8b", "--out", "p.json"],
         {"r.json": "{\"ttfts\": [0.1, 0.2"}),
    Case("from_runs_no_profile", "calibrate --from-runs --profile naming no profile",
         ["calibrate", "--from-runs", "r.json", "--profile", "nosuch-gpu", "--out", "p.json"], {"r.json": "{}"}),
    Case("from_runs_out_exists", "calibrate --from-runs --out naming an existing file",
         ["calibrate", "--from-runs", "r.json", "--profile", "h100-sxm-llama-3-8b", "--out", "p.json"],
         {"r.json": "{}", "p.json": "{}"}),
    Case("from_runs_out_is_a_run", "calibrate --from-runs --out naming one of the runs, with --overwrite",
         ["calibrate", "--from-runs", "r.json", "--profile", "h100-sxm-llama-3-8b", "--out", "r.json", "--overwrite"],
         {"r.json": "{}"}),
    Case("from_runs_copy", "calibrate --from-runs of a run and its copy",
         ["calibrate", "--from-runs", "r.json", "copy.json", "--profile", "h100-sxm-llama-3-8b", "--out", "p.json"],
         {"r.json": "{}", "copy.json": "{}"}),
    Case("compare_summary_not_json", "compare of a run folder whose summary.json is not JSON",
         ["compare", "a", "b"], {"a/summary.json": "{not json", "b/summary.json": "{}"}),
    Case("compare_summary_no_classes", "compare of a run folder whose summary.json has no classes",
         ["compare", "a", "b"], {"a/summary.json": '{"classes": {}, "overall": {}}', "b/summary.json": "[]"}),
    # priosim report: a folder that is not a whole result, a report file that is not priosim's
    Case("report_not_a_result", "report of a folder that holds no priosim result", ["report", "d"],
         {"d/notes.txt": "x"}),
    Case("report_foreign_html", "report into a run folder whose report.html a person wrote", ["report", "d"],
         {"d/.priosim.json": RUN_MARKER, "d/manifest.json": "{}", "d/report.html": "<html>my notes</html>"}),
    Case("report_summary_damaged", "report of a run whose summary.json is not JSON", ["report", "d"],
         {"d/.priosim.json": RUN_MARKER, "d/manifest.json": "{}", "d/scenario.json": "{}",
          "d/summary.json": "{not json"}),
    Case("report_parquet_damaged", "report of a run whose requests.parquet is damaged", ["report", "d"],
         {"d/.priosim.json": RUN_MARKER, "d/manifest.json": "{}", "d/scenario.json": "{}", "d/summary.json": "{}",
          "d/requests.parquet": "PAR1 not a table"}),
    Case("report_out_exists", "report --out naming an existing file", ["report", "d", "--out", "r.html"],
         {"d/.priosim.json": RUN_MARKER, "r.html": "old"}),
    # a model's config.json and the device it runs on (docs/models.md)
    Case("model_and_profile", "engine.model and engine.profile both set", RUN,
         {"s.toml": scenario(engine='model = "qwen3-8b"\ngpu = "h200"')}),
    Case("model_without_gpu", "engine.model without engine.gpu", RUN + ["--set", "engine.model=qwen3-8b"],
         {"s.toml": scenario()}),
    Case("gpu_without_model", "engine.gpu without engine.model", RUN + ["--set", "engine.gpu=h200"],
         {"s.toml": scenario()}),
    Case("model_unknown_gpu", "engine.gpu naming no device", RUN + ["--set", "engine.model=qwen3-8b",
         "--set", "engine.gpu=h900"], {"s.toml": scenario()}),
    Case("model_unknown", "engine.model naming no bundled model", RUN + ["--set", "engine.model=qwen9-8b",
         "--set", "engine.gpu=h200"], {"s.toml": scenario()}),
    Case("model_tp_divisor", "engine.tp not dividing the heads", RUN + ["--set", "engine.model=qwen3-8b",
         "--set", "engine.gpu=h200", "--set", "engine.tp=3"], {"s.toml": scenario()}),
    Case("model_too_big", "a model whose weights leave no KV memory", RUN + ["--set", "engine.model=llama-3.1-70b",
         "--set", "engine.gpu=l4"], {"s.toml": scenario()}),
    Case("model_config_key", "a config.json missing hidden_size", RUN + ["--set", 'engine.model="m/config.json"',
         "--set", "engine.gpu=h200"], {"s.toml": scenario(), "m/config.json": '{"num_hidden_layers": 2}'}),
    Case("profiles_model_no_gpu", "profiles --model without --gpu", ["profiles", "--model", "qwen3-8b"]),
    Case("calibrate_cuda", "calibrate --device cuda without a GPU",
         ["calibrate", "--device", "cuda", "--shape", "tiny", "--out", "out/p.json"], {},
         skip="a CUDA device is present" if _cuda() else ""),
]


def _normal(text: str, tmp: Path) -> str:
    return text.replace(str(tmp) + os.sep, "").replace(str(tmp), ".").replace(str(ROOT), "<repo>")


def run_case(case: Case, tmp: Path) -> tuple[int, str, str, bool]:
    """(exit status, stderr, stdout, whether anything result-like was left behind)."""
    for name, text in case.files.items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            (tmp / name).write_bytes(text)
        elif name.endswith(".gz"):
            (tmp / name).write_bytes(text.encode("latin-1"))
        else:
            (tmp / name).write_text(text)
    cwd = os.getcwd()
    os.chdir(tmp)
    try:
        res = CliRunner().invoke(main, case.args)
    finally:
        os.chdir(cwd)
    left = (tmp / "out").exists() or (tmp / "results").exists()
    err = res.stderr
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        import traceback
        err += "".join(traceback.format_exception(res.exception))
    return res.exit_code, _normal(err, tmp), res.stdout, left


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, tuple]:
    out = {}
    for case in CASES:
        if not case.skip:
            out[case.id] = run_case(case, tmp_path_factory.mktemp(case.id))
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_and_exit_2(case, outcomes):
    if case.skip:
        pytest.skip(case.skip)
    code, err, _, left = outcomes[case.id]
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    assert not left, "a failed command left a results folder behind"


@pytest.mark.parametrize("case", ["capacity_load_negative", "capacity_load_huge"])
def test_capacity_checks_its_load_before_any_output(case, outcomes):
    # (the SLO lines used to come first, and the folder was left with its lock and marker)
    assert outcomes[case][2] == ""


def _doc(outcomes: dict) -> str:
    old = _doc_lines()
    rows = []
    for case in CASES:
        if case.id in outcomes:
            line = outcomes[case.id][1].strip()
        else:
            line = old.get(case.id, f"(not run here: {case.skip})")
        cmd = "priosim " + " ".join(_brief(a) for a in case.args)
        rows.append(f"| `{case.id}` | {case.what} | `{cmd}` | `{line.replace('|', '¦')}` |")
    return HEADER + "\n".join(rows) + "\n"


def _brief(arg: str, limit: int = 200) -> str:
    """An argument as the table shows it: a 10,000-character one cut to its start and length."""
    return arg if len(arg) <= limit else f"{arg[:30]}...({len(arg):,} characters)"


def _doc_lines() -> dict[str, str]:
    if not DOC.is_file():
        return {}
    out = {}
    for row in DOC.read_text().splitlines():
        parts = [p.strip() for p in row.split(" | ")]
        if row.startswith("| `") and len(parts) == 4:
            out[parts[0].strip("|` ")] = parts[3].strip("|` ").replace("¦", "|")
    return out


HEADER = """# Bad input: one line each

Every mistake in a scenario, a trace or a command line ends the command before any simulation
with **exit status 2** and **one line** on stderr naming the file (and the trace line), the key,
the value and what was expected; nothing is written to the results folder. A run that cannot
progress (a livelock) stops with one `engine.stalled:` line naming the requests involved and the
cause; `engine.max_events` is a safety stop of its own.

## Exit statuses

The same for every `priosim` command (and in `priosim --help`):

| status | meaning |
|---|---|
| 0 | done |
| 1 | a run failed inside a `sweep`, `tune` or `capacity` search (each failure is printed; a sweep's other runs go on, and its failures' tracebacks are in `DIR/failures/`) |
| 2 | bad input: one line `error: ...`, before any work (a bad option value or an unknown option too); also a user's policy that breaks its contract or whose own code raises during a run (one line naming the policy, the hook, the exception and the line of its file; in a `sweep`, that run's failure, status 1) |
| 130 | interrupted (Ctrl-C): one line `interrupted`; nothing partial is published (results are written under a hidden name and renamed when whole; a rerun of a sweep or `tune --resume` finishes the rest) |

## The bad inputs

This table is generated by `tests/test_bad_inputs.py` (each row is a test); regenerate it with
`PRIOSIM_WRITE_DOCS=1 python -m pytest tests/test_bad_inputs.py`. `s.toml` is a small valid
scenario with the one mistake named in the row; paths are relative to the folder it runs in.

| case | bad input | command | the line it gets |
|---|---|---|---|
"""


def test_errors_doc_is_current(outcomes):
    text = _doc(outcomes)
    if os.environ.get("PRIOSIM_WRITE_DOCS"):
        DOC.write_text(text)
    assert DOC.is_file() and DOC.read_text() == text, (
        "docs/errors.md is out of date: PRIOSIM_WRITE_DOCS=1 python -m pytest tests/test_bad_inputs.py")
