"""Suspicious but valid input gets one line ``warning: ...`` on stderr and the run goes on
unchanged (plumbing/notices.py); the ``--set`` mistakes that used to be dropped silently are
errors (one line, exit 2); every run here is a few simulated seconds."""
from __future__ import annotations

import json
import warnings

import pytest
from click.testing import CliRunner

from plumbing.notices import InputWarning
from sim.cli import main
from sim.config import scenario_from_dict
from workloads import build_workload

SCENARIO = """name = "warn"
horizon_s = 5.0
[engine]
profile = { kind = "linear", base_s = 0.01, prefill_token_s = 1e-5, decode_token_s = 1e-4, context_token_s = 0.0 }
kv_blocks = 400
ENGINE
[[classes]]
name = "chat"
priority = 0
CHAT
[[classes]]
name = "batch"
priority = 1
[[streams]]
tenant = "a"
class = "chat"
arrival = { process = "poisson", rate = 2.0 }
prompt_tokens = 100
output_tokens = 20
[[streams]]
tenant = "b"
class = "batch"
STREAM2
"""
POISSON = 'arrival = { process = "poisson", rate = 1.0 }\nprompt_tokens = 100\noutput_tokens = 20'


def run(tmp_path, *, engine: str = "", chat: str = "", stream2: str = POISSON, args=()):
    (tmp_path / "s.toml").write_text(SCENARIO.replace("ENGINE", engine).replace("CHAT", chat)
                                     .replace("STREAM2", stream2))
    return CliRunner().invoke(main, ["run", str(tmp_path / "s.toml"), "--no-plots", "--out",
                                     str(tmp_path / "out"), "--overwrite", *args], catch_exceptions=False)


def warnings_of(res) -> list[str]:
    return [ln for ln in res.stderr.splitlines() if ln.startswith("warning:")]


def one_error(res) -> str:
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    return lines[0]


def test_a_clean_run_warns_nothing(tmp_path):
    res = run(tmp_path)
    assert res.exit_code == 0, res.output
    assert warnings_of(res) == []


def test_swap_without_host_space_warns_once_at_load(tmp_path):
    res = run(tmp_path, engine='preemption = "swap"')
    assert res.exit_code == 0, res.output
    (w,) = warnings_of(res)
    assert "engine.preemption = 'swap'" in w and "engine.swap_blocks = 0" in w and "recompute" in w
    res = run(tmp_path, engine='preemption = "swap"\nswap_blocks = 100')
    assert warnings_of(res) == []


def test_swap_space_that_nothing_uses_warns_once(tmp_path):
    res = run(tmp_path, engine="swap_blocks = 1000")  # (preemption: recompute, the default)
    assert res.exit_code == 0, res.output
    (w,) = warnings_of(res)
    assert "engine.swap_blocks = 1000 does nothing: engine.preemption = 'recompute' never copies to host" in w
    assert "'auto' or 'swap'" in w
    for mode in ("swap", "auto"):
        assert warnings_of(run(tmp_path, engine=f'preemption = "{mode}"\nswap_blocks = 1000')) == []


@pytest.mark.parametrize("cluster,words", [
    # groups that inherit [engine] add no line of their own
    ('{groups=[{replicas=1, engine={max_num_seqs=8}}, {replicas=1}]}', ["engine.swap_blocks = 1000 does nothing:"]),
    # a group of its own preemption is named; [engine] only for the group that runs it
    ('{groups=[{replicas=1, engine={preemption="swap"}}, {name="b", replicas=1}]}',
     ["engine.swap_blocks = 1000 does nothing on group b:"]),
    ('{groups=[{replicas=1, engine={preemption="swap"}}, {replicas=1, engine={preemption="swap"}}]}', []),
])
def test_swap_warnings_name_each_setting_once_in_a_cluster(tmp_path, cluster, words):
    res = run(tmp_path, engine="swap_blocks = 1000", args=["--set", f"cluster={cluster}"])
    assert res.exit_code == 0, res.output
    got = [w for w in warnings_of(res) if "swap" in w]
    assert len(got) == len(words) and all(x in w for x, w in zip(words, got)), got


def test_swap_preemption_without_space_in_a_cluster_warns_once(tmp_path):
    res = run(tmp_path, engine='preemption = "swap"',
              args=["--set", "cluster={groups=[{replicas=1, engine={max_num_seqs=8}}, {replicas=1}]}"])
    (w,) = warnings_of(res)
    assert "engine.preemption = 'swap' but there is no host swap space" in w


def test_swap_without_space_on_a_decode_group_says_what_still_acts(tmp_path):
    """A disaggregated decode group under swap evicts nobody for a waiting request, swap space or
    not: the warning that its preemptions recompute says that part still acts."""
    res = run(tmp_path, engine='preemption = "swap"',
              args=["--set", 'cluster={groups=[{name="p",role="prefill",replicas=1},{name="d",role="decode",replicas=1}], '
                             'link={bandwidth_bytes_per_s=1e11, latency_s=1e-5, kv_bytes_per_token=131072}}'])
    assert res.exit_code == 0, res.output
    (w,) = [w for w in warnings_of(res) if "swap" in w]
    assert "preemptions will recompute; on decode group d a request waiting for room still evicts nobody" in w, w


def test_capacity_says_the_autoscaler_is_not_used(tmp_path):
    (tmp_path / "s.toml").write_text(SCENARIO.replace("ENGINE", "").replace("CHAT", "").replace("STREAM2", POISSON))
    res = CliRunner().invoke(main, ["capacity", str(tmp_path / "s.toml"), "--designs", "shared", "--max-replicas",
                                    "1", "--no-uncertainty", "--no-plots", "--out", str(tmp_path / "out"), "--set",
                                    'cluster={replicas=1, autoscale={policy="queue_length", max=3}}'])
    assert res.exit_code in (0, 1), res.output
    (w,) = [w for w in warnings_of(res) if "autoscale" in w]
    assert "cluster.autoscale is not used by priosim capacity: it searches fixed fleets" in w


@pytest.mark.parametrize("price, warned", [("3.5", False), ("{ default = 3.5 }", True)])
def test_capacity_says_a_price_by_group_name_prices_no_design(tmp_path, price, warned):
    (tmp_path / "s.toml").write_text(SCENARIO.replace("ENGINE", "").replace("CHAT", "").replace("STREAM2", POISSON))
    res = CliRunner().invoke(main, ["capacity", str(tmp_path / "s.toml"), "--designs", "shared", "--max-replicas",
                                    "1", "--no-uncertainty", "--no-plots", "--out", str(tmp_path / "out"), "--set",
                                    f"cluster={{replicas=1, gpu_hour_usd={price}}}"])
    assert res.exit_code in (0, 1), res.output
    got = [w for w in warnings_of(res) if "gpu_hour_usd" in w]
    assert got == ([] if not warned else [got[0]]), got
    if warned:
        assert "cluster.gpu_hour_usd prices no design of priosim capacity" in got[0]


@pytest.mark.parametrize("chat,key", [("ttft_slo_s = 500", "ttft_slo_s = 500"),
                                      ("tpot_slo_s = 50", "tpot_slo_s = 50")])
def test_an_slo_in_milliseconds_warns(tmp_path, chat, key):
    res = run(tmp_path, chat=chat)
    assert res.exit_code == 0, res.output
    (w,) = warnings_of(res)
    assert f"classes.0.{key}" in w and "milliseconds" in w
    # seconds as meant: silent
    assert warnings_of(run(tmp_path, chat="ttft_slo_s = 0.5\ntpot_slo_s = 0.05")) == []


def test_a_thrashing_run_says_so(tmp_path):
    """The shipped thrash scenario thrashes within two minutes (ratio ~0.06 > its 0.05)."""
    res = CliRunner().invoke(main, ["run", "thrash", "--set", "horizon_s=120", "--no-plots", "--out",
                                    str(tmp_path / "o")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["run"]["thrashing"] is True
    (w,) = [w for w in warnings_of(res) if "thrashed" in w]  # (it is overloaded too: churn serves little)
    assert "engine.thrash_threshold = 0.05" in w


def test_an_overloaded_run_says_so(tmp_path):
    """A batch of 300 prompts at t = 0 on an engine that serves a few a second: most still wait
    for their first token at the 5 s horizon; summary.json says how many, per class."""
    res = run(tmp_path, stream2='arrival = { process = "batch", n = 300 }\nprompt_tokens = 2000\noutput_tokens = 20')
    assert res.exit_code == 0, res.output
    (w,) = warnings_of(res)
    b = json.loads((tmp_path / "out" / "summary.json").read_text())["run"]["backlog_at_horizon"]
    assert b["overloaded"] is True and b["by_class"]["batch"] > 200 and b["requests"] == sum(b["by_class"].values())
    assert w.startswith("warning: overloaded:") and f"{b['requests']:,} of the {b['arrived']:,} requests" in w and "batch" in w
    light = run(tmp_path)  # (the same engine at 3 requests a second: nothing queues)
    assert warnings_of(light) == []
    b = json.loads((tmp_path / "out" / "summary.json").read_text())["run"]["backlog_at_horizon"]
    assert b["overloaded"] is False and b["share"] < 0.1


def test_requests_refused_for_their_length_are_named_per_class(tmp_path):
    """engine.max_model_len = 150 (vLLM's --max-model-len): the batch class's 1000 + 20 tokens are
    refused at every arrival, the chat class's 100 + 20 served; one line names the class, the count
    and the setting. Without the limit, no line."""
    long = 'arrival = { process = "poisson", rate = 1.0 }\nprompt_tokens = 1000\noutput_tokens = 20'
    res = run(tmp_path, engine="max_model_len = 150", stream2=long)
    assert res.exit_code == 0, res.output
    batch = json.loads((tmp_path / "out" / "summary.json").read_text())["classes"]["batch"]
    assert batch["rejected"] == batch["arrived"] > 0 and batch["reject_reasons"] == {"too_long": batch["arrived"]}
    (w,) = warnings_of(res)
    assert f"batch {batch['arrived']:,} of {batch['arrived']:,}" in w and "engine.max_model_len = 150" in w
    assert "chat" not in w
    assert warnings_of(run(tmp_path, stream2=long)) == []



@pytest.mark.parametrize("preemption,step", [("recompute", "prompt + max_tokens"), ("off", "prompt")])
def test_requests_longer_than_a_step_without_chunked_prefill_name_the_budget(tmp_path, preemption, step):
    """Without chunked prefill a prompt must fit one step's budget (and, when preemption may make a
    request prefill again all it holds, its prompt + max_tokens): the line names the budget, not
    the KV cache (400 blocks x 16 tokens hold them)."""
    long = 'arrival = { process = "poisson", rate = 1.0 }\nprompt_tokens = 1000\noutput_tokens = 20'
    res = run(tmp_path, engine=f'chunked_prefill = false\nmax_batched_tokens = 900\npreemption = "{preemption}"',
              stream2=long)
    assert res.exit_code == 0, res.output
    batch = json.loads((tmp_path / "out" / "summary.json").read_text())["classes"]["batch"]
    assert batch["rejected"] == batch["arrived"] > 0
    assert batch["reject_reasons"] == {"too_long_for_step": batch["arrived"]}
    (w,) = [w for w in warnings_of(res) if "refused" in w]
    assert f"({step} more than one step's token budget, engine.max_batched_tokens = 900, without chunked prefill" in w
    assert "KV cache" not in w

def ms_trace(tmp_path, time_unit: str = "") -> str:
    (tmp_path / "t.csv").write_text("t,p,o,m\n" + "".join(f"{i * 500},100,10,x\n" for i in range(40)))
    unit = f', time_unit = "{time_unit}"' if time_unit else ""
    return ('trace = { format = "csv", path = "t.csv"' + unit +
            ', columns = { arrival_s = "t", prompt_tokens = "p", output_tokens = "o", f_m = "m" } }')


def test_a_millisecond_trace_read_as_seconds_warns_with_the_count(tmp_path):
    """40 rows 0.5 s apart written in ms: read as seconds, all but the first (500 s .. 19,500 s) fall after
    the 5 s horizon: 39 of 40 rows."""
    res = run(tmp_path, stream2=ms_trace(tmp_path))
    assert res.exit_code == 0, res.output
    (w,) = warnings_of(res)
    assert "streams[1].trace" in w and "39 of 40 rows" in w and "time_unit = 'ms'" in w
    res = run(tmp_path, stream2=ms_trace(tmp_path, "ms"))
    assert res.exit_code == 0 and warnings_of(res) == []


def test_a_trace_cut_short_on_purpose_is_not_warned_about(tmp_path):
    """Seconds: 40 rows over 20 s, horizon 5 s, the last row 4x past it: a short replay, not ms."""
    (tmp_path / "t.csv").write_text("t,p,o\n" + "".join(f"{i * 0.5},100,10\n" for i in range(40)))
    res = run(tmp_path, stream2='trace = { format = "csv", path = "t.csv", columns = '
                                '{ arrival_s = "t", prompt_tokens = "p", output_tokens = "o" } }')
    assert res.exit_code == 0 and warnings_of(res) == []


def test_an_assign_rule_that_matches_nothing_is_named(tmp_path):
    (tmp_path / "t.csv").write_text("t,p,o,m\n0,100,10,x\n1,100,10,y\n")
    stream = {"tenant": "all", "class": "c", "trace": {
        "format": "csv", "path": "t.csv",
        "columns": {"arrival_s": "t", "prompt_tokens": "p", "output_tokens": "o", "f_m": "m"}},
        "assign": [{"column": "f_m", "equals": "x", "tenant": "X"},
                   {"column": "f_m", "equals": "z", "tenant": "Z"},
                   {"column": "f_m", "equals": "x", "tenant": "X2"}]}
    with pytest.warns(InputWarning) as got:
        w = build_workload([stream], horizon_s=10.0, seed=0, base_dir=tmp_path)
    assert w.open["tenant"].tolist() == ["X", "all"]  # the rows are assigned as before
    msgs = [str(m.message) for m in got]
    assert len(msgs) == 2
    assert "streams[0].assign[1] {column = 'f_m', equals = 'z', tenant = 'Z'}" in msgs[0]
    assert "no row matches it" in msgs[0] and "tenant 'all'" in msgs[0]
    assert "streams[0].assign[2]" in msgs[1] and "an earlier rule took" in msgs[1]
    with warnings.catch_warnings():  # every rule matching: silent
        warnings.simplefilter("error", InputWarning)
        build_workload([{**stream, "assign": stream["assign"][:1]}], horizon_s=10.0, seed=0, base_dir=tmp_path)


def test_an_assign_rule_that_matches_nothing_warns_on_the_command_line(tmp_path):
    stream2 = ms_trace(tmp_path, "ms") + '\nassign = [ { column = "f_m", equals = "nope", tenant = "n" } ]'
    res = run(tmp_path, stream2=stream2)
    assert res.exit_code == 0, res.output
    (w,) = warnings_of(res)
    assert "streams[1].assign[0]" in w and "'nope'" in w


# ---- --set -------------------------------------------------------------------------------------
def test_a_set_value_holding_two_keys_is_an_error(tmp_path):
    err = one_error(run(tmp_path, args=["--set", 'name="x"\nseed=5']))
    assert "--set name" in err and "seed" in err and "one value" in err


@pytest.mark.parametrize("key", ["source", "base_dir"])
def test_loader_keys_cannot_be_set(tmp_path, key):
    err = one_error(run(tmp_path, args=["--set", f'{key}="elsewhere"']))
    assert f"--set {key}" in err and "not a scenario key" in err


def test_a_negative_index_is_refused(tmp_path):
    err = one_error(run(tmp_path, args=["--set", "classes.-1.priority=5"]))
    assert "classes.-1.priority" in err and "negative index" in err


def test_a_list_item_may_be_named():
    data = {"horizon_s": 5.0, "classes": [{"name": "chat", "priority": 0}, {"name": "batch", "priority": 1}],
            "streams": [{"tenant": "t", "class": c, "arrival": {"process": "poisson", "rate": 1.0},
                         "prompt_tokens": 10, "output_tokens": 5} for c in ("chat", "batch")]}
    sc = scenario_from_dict(data, overrides=["classes.batch.priority=5"])
    assert [c.priority for c in sc.classes] == [0, 5]
    assert scenario_from_dict(data, overrides=["classes.1.priority=5"]) == sc  # the same as by index
    from sim.core.errors import ScenarioError
    with pytest.raises(ScenarioError, match="'nope' is not an index or a name of classes.*names: chat, batch"):
        scenario_from_dict(data, overrides=["classes.nope.priority=5"])


@pytest.mark.parametrize("body,expr,call", [
    ("import random\n", "random.random()", "random.random"),
    ("import numpy as np\n", "np.random.random()", "numpy.random.random"),
    ("from random import random\n", "random()", "random.random"),
])
def test_a_policy_drawing_from_the_shared_random_generator_warns_once(tmp_path, body, expr, call):
    (tmp_path / "p.py").write_text(f"{body}from policies import BasePolicy\n\n\nclass P(BasePolicy):\n"
                                   f"    def key(self, req, now):\n"
                                   f"        return ({expr}, req.arrival_s, req.request_id)\n")
    res = run(tmp_path, args=["--policy", f"{tmp_path / 'p.py'}:P"])
    assert res.exit_code == 0, res.output
    ws = warnings_of(res)
    assert len(ws) == 1 and f"p.py:7 calls {call}()" in ws[0] and "runs will not repeat" in ws[0]


def test_a_policy_with_its_own_seeded_generator_is_not_warned_about(tmp_path):
    (tmp_path / "p.py").write_text("import random\n\nfrom policies import BasePolicy\n\n\nclass P(BasePolicy):\n"
                                   "    def bind(self, classes, seed):\n        self.rng = random.Random(seed)\n\n"
                                   "    def key(self, req, now):\n"
                                   "        return (self.rng.random(), req.arrival_s, req.request_id)\n")
    res = run(tmp_path, args=["--policy", f"{tmp_path / 'p.py'}:P"])
    assert res.exit_code == 0, res.output
    assert warnings_of(res) == []


def load_warnings(*overrides: str) -> list[str]:
    """The warnings loading the test scenario with ``overrides`` gives (no run)."""
    import tomllib

    data = tomllib.loads(SCENARIO.replace("ENGINE", "").replace("CHAT", "").replace("STREAM2", POISSON))
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always", InputWarning)
        scenario_from_dict(data, source="s.toml", overrides=list(overrides))
    return [str(w.message) for w in got if issubclass(w.category, InputWarning)]


SPEC = "engine.speculative={k=2}"
PREFIX = "streams.0.prefix={system_tokens=64, block_tokens=32}"  # (a shared system prompt: the cache has work)
MODEL = ("engine.model=MODEL", "engine.gpu=h200")


@pytest.mark.parametrize("inert,used,words", [
    (["engine.preempt_threshold=5"], ["engine.preempt_threshold=5", 'engine.preempt_for_waiting="threshold"'],
     "engine.preempt_threshold = 5 does nothing: engine.preempt_for_waiting = 'strict' does not read it"),
    (["engine.prefix_block_tokens=64"], ["engine.prefix_block_tokens=64", "engine.prefix_caching=true", PREFIX],
     "engine.prefix_block_tokens = 64 does nothing: engine.prefix_caching is off"),
    (["engine.swap_overlap=true"], ["engine.swap_overlap=true", 'engine.preemption="swap"', "engine.swap_blocks=100"],
     "engine.swap_overlap = true does nothing: engine.preemption = 'recompute' never swaps"),
    (["classes.1.speculate=false"], ["classes.1.speculate=false", SPEC],
     "classes.1.speculate = false (batch) does nothing: there is no [engine.speculative]"),
    ([SPEC, "classes.0.speculate=false", "classes.1.speculate=false"], [SPEC, "classes.0.speculate=false"],
     "engine.speculative does nothing: every class has speculate = false"),
    (["policy.name=lpm"], ["policy.name=lpm", "engine.prefix_caching=true", PREFIX],
     "policy.name = 'lpm' ranks by cached prefix, but engine.prefix_caching is off"),
    # priosim shares cached blocks by declared prefix hashes only: none declared, nothing is hit
    (["engine.prefix_caching=true"], ["engine.prefix_caching=true", PREFIX],
     "engine.prefix_caching = true does nothing: no stream shares a prompt prefix"),
    ([*MODEL, "engine.typical_context=8192"], [*MODEL, "engine.typical_context=8192"],
     "engine.typical_context = 8192 does nothing: model 'qwen3-8b' has no sliding-window layers"),
])
def test_a_setting_that_does_nothing_beside_the_rest_warns(inert, used, words):
    """Each of these left the results byte-identical without a word; used, it is silent."""
    def fill(sets):  # (the model keys replace the inline profile; qwen3-8b has no windows, gpt-oss does)
        extra = ['engine.profile={kind="linear", base_s=0.01, prefill_token_s=1e-5, decode_token_s=1e-4, '
                 'context_token_s=0.0}'] if not any("model" in s for s in sets) else []
        return extra + sets

    (w,) = load_warnings(*[s.replace("MODEL", "qwen3-8b") for s in fill(inert)])
    assert words in w and w.startswith("s.toml: "), w
    assert load_warnings(*[s.replace("MODEL", "gpt-oss-20b") for s in fill(used)]) == []


@pytest.mark.parametrize("sets", [
    ['engine.engine="sglang"'],  # its defaults set preempt_threshold and prefix_block_tokens
    ['engine.engine="sglang"', 'engine.preempt_for_waiting="strict"', "engine.prefix_caching=false"],
    ['engine.engine="vllm"', "engine.prefix_caching=false"],
])
def test_a_named_engines_own_defaults_are_not_warned_about(sets):
    assert load_warnings('engine.profile="h200-llama-3-8b"', "engine.kv_blocks=0", *sets) == []


def test_a_runs_scenario_json_warns_about_nothing_it_did_not_already():
    """A run's scenario.json writes every key at its default: none of them is news."""
    import tomllib

    data = tomllib.loads(SCENARIO.replace("ENGINE", "").replace("CHAT", "").replace("STREAM2", POISSON))
    sc = scenario_from_dict(data, source="s.toml", overrides=[SPEC])
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always", InputWarning)
        scenario_from_dict(sc.to_dict(where=True), source="scenario.json")
    assert [str(w.message) for w in got] == []


@pytest.mark.parametrize("sets,words", [
    (['streams.1.arrival={process="batch", n=10, at_s=4000}'],  # (4 s typed in ms; the horizon is 5 s)
     "streams[1].arrival.at_s = 4000 (tenant b, class batch) is at or after the stream's end (5 s after its start, "
     "the horizon): its 10 requests are never sent (the unit is seconds: 4 for 4000 ms)"),
    (["streams.1.start_s=30"], "streams[1].start_s = 30 (tenant b, class batch) is at or after the horizon "
                               "(horizon_s = 5): the stream sends nothing"),
    (["streams.1.arrival.rate=0.1"], "streams[1].arrival.rate = 0.1 (tenant b, class batch) expects 0.5 requests over "
                                     "its 5 s before the horizon"),
    (["streams.1.start_s=4.5"], "streams[1].arrival.rate = 1 (tenant b, class batch) expects 0.5 requests over its "
                                "0.5 s before the horizon"),
])
def test_a_stream_that_sends_nothing_before_the_horizon_warns(sets, words):
    (w,) = load_warnings(*sets)
    assert w.startswith("s.toml: " + words), w


@pytest.mark.parametrize("sets", [['streams.1.arrival={process="batch", n=10, at_s=4.9}'], ["streams.1.start_s=4"],
                                  ["streams.1.arrival.rate=0.2"],
                                  ['streams.1.arrival={process="closed_loop", users=1, think=100}']])
def test_a_stream_that_sends_something_before_the_horizon_is_quiet(sets):
    assert load_warnings(*sets) == []


def test_a_sweep_says_a_scenarios_warning_once_not_once_per_run(tmp_path):
    # the scenario is checked when loaded, each run's when the grid is checked and again when it
    # runs: one warning for the scenario, not 1 + 2 x runs
    (tmp_path / "s.toml").write_text(SCENARIO.replace("ENGINE", "").replace("CHAT", "ttft_slo_s = 500")
                                     .replace("STREAM2", POISSON))
    res = CliRunner().invoke(main, ["sweep", str(tmp_path / "s.toml"), "--policies", "fcfs,priority",
                                    "--loads", "0.5,1", "--seeds", "1", "--no-plots", "--workers", "1",
                                    "--out", str(tmp_path / "sw")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    said = warnings_of(res)
    assert len(said) == 1 and "ttft_slo_s = 500" in said[0] and "[" not in said[0].split(":")[1], said


@pytest.mark.parametrize("stream2, warned", [
    (POISSON, True),  # declares nothing: each request declares the output model's longest
    (POISSON + "\nmax_tokens = 64", False),
])
def test_sglangs_admission_with_a_stream_that_declares_no_max_tokens_warns(tmp_path, stream2, warned):
    (tmp_path / "s.toml").write_text(SCENARIO.replace("ENGINE", 'engine = "sglang"').replace("CHAT", "")
                                     .replace("output_tokens = 20\n[[streams]]", "output_tokens = 20\nmax_tokens = 64\n[[streams]]")
                                     .replace("STREAM2", stream2))
    res = CliRunner().invoke(main, ["run", str(tmp_path / "s.toml"), "--no-plots", "--out", str(tmp_path / "out")],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    said = [w for w in warnings_of(res) if "declares no max_tokens" in w]
    assert len(said) == (1 if warned else 0), warnings_of(res)
    if warned:
        assert "streams[1]" in said[0] and "(engine.admission_estimate = 'sglang')" in said[0]
