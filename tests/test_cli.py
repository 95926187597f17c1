"""The priosim command: the main job works, and bad input fails with one clear line."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from sim.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _run(args, **kw):
    return CliRunner().invoke(main, args, catch_exceptions=False, **kw)


def test_run_default_prints_table_and_writes_files(tmp_path):
    out = tmp_path / "run"
    res = _run(["run", "--set", "horizon_s=5.0", "--out", str(out), "--no-plots"])
    assert res.exit_code == 0, res.output
    assert "interactive" in res.output and "batch" in res.output and "ttft_p99_s" in res.output
    for f in ("requests.parquet", "summary.json", "timeseries.parquet", "scenario.json", "manifest.json"):
        assert (out / f).is_file(), f
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["classes"]) == {"interactive", "batch"}


def _bad(tmp_path, text: str, *args) -> str:
    p = tmp_path / "bad.toml"
    p.write_text(text)
    res = _run(["run", str(p), "--no-plots", "--out", str(tmp_path / "o"), *args])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1, res.output
    assert not (tmp_path / "o").exists()
    return lines[0]


GOOD = """
name = "t"
horizon_s = 5.0
[engine]
profile = "h200-llama-3-8b"
[policy]
name = "priority"
[[classes]]
name = "hi"
priority = 0
[[streams]]
tenant = "a"
class = "hi"
arrival = { process = "poisson", rate = 1.0 }
prompt_tokens = { dist = "constant", value = 100 }
output_tokens = { dist = "constant", value = 10 }
"""


def test_good_file_runs(tmp_path):
    p = tmp_path / "good.toml"
    p.write_text(GOOD)
    res = _run(["run", str(p), "--no-plots", "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output


def test_set_with_wrong_type(tmp_path):
    p = tmp_path / "good.toml"
    p.write_text(GOOD)
    res = _run(["run", str(p), "--set", "engine.max_num_seqs=abc", "--no-plots"])
    assert res.exit_code == 2
    assert "engine.max_num_seqs" in res.output and "'abc'" in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_default_scenario_set_with_wrong_type_via_console_script():
    """The installed console script exits non-zero with one line."""
    proc = subprocess.run([sys.executable, "-m", "sim.cli", "run", "--set", "engine.max_num_seqs=abc"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "engine.max_num_seqs" in proc.stderr


def test_missing_file(tmp_path):
    res = _run(["run", str(tmp_path / "missing.toml")])
    assert res.exit_code == 2
    assert "missing.toml" in res.output and "no such scenario file" in res.output


def test_a_shipped_scenarios_path_outside_the_repository_names_the_shipped_one(tmp_path, monkeypatch):
    """The README's `priosim run workloads/scenarios/azure_two_tenants.toml`, typed in another
    folder: the line says the shipped scenario runs by its name."""
    monkeypatch.chdir(tmp_path)
    res = _run(["run", "workloads/scenarios/azure_two_tenants.toml"])
    assert res.exit_code == 2
    assert "the shipped scenario 'azure_two_tenants' runs by its name alone" in res.output, res.output


def test_unknown_key(tmp_path):
    line = _bad(tmp_path, GOOD.replace("[engine]\n", "[engine]\nmax_num_seq = 4\n"))
    assert "bad.toml" in line and "engine.max_num_seq" in line and "unknown key" in line


def test_wrong_type(tmp_path):
    line = _bad(tmp_path, GOOD.replace("[engine]\n", "[engine]\nmax_num_seqs = \"many\"\n"))
    assert "engine.max_num_seqs" in line and "integer" in line and "'many'" in line


def test_negative_rate(tmp_path):
    line = _bad(tmp_path, GOOD.replace("rate = 1.0", "rate = -2.0"))
    assert "bad.toml" in line and "rate" in line and "-2" in line


def test_class_named_by_no_stream(tmp_path):
    line = _bad(tmp_path, GOOD + '\n[[classes]]\nname = "ghost"\npriority = 1\n')
    assert "ghost" in line and "no stream" in line


def test_unknown_policy(tmp_path):
    line = _bad(tmp_path, GOOD.replace('name = "priority"', 'name = "priorty"'))
    assert "priorty" in line and "did you mean 'priority'" in line


def test_unknown_profile(tmp_path):
    line = _bad(tmp_path, GOOD.replace('profile = "h200-llama-3-8b"', 'profile = "h900-nope"'))
    assert "engine.profile" in line and "h900-nope" in line


def test_user_policy_by_dotted_path(tmp_path):
    p = tmp_path / "good.toml"
    p.write_text(GOOD)
    res = _run(["run", str(p), "--policy", "policies.fcfs:FCFS", "--no-plots", "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output


def test_policies_and_profiles_listings():
    res = _run(["policies"])
    assert res.exit_code == 0 and "fcfs" in res.output and "priority" in res.output
    res = _run(["profiles"])
    assert res.exit_code == 0 and "h200-llama-3-8b" in res.output and "analytic" in res.output


def test_bad_trace_row_names_the_line_and_lenient_skips_it(tmp_path):
    (tmp_path / "t.csv").write_text("t,p,o\n0.0,100,10\n0.5,abc,10\n1.0,50,5\n")
    (tmp_path / "s.toml").write_text(GOOD.split("[[streams]]")[0] + """
[[streams]]
tenant = "a"
class = "hi"
trace = { format = "csv", path = "t.csv", columns = { arrival_s = "t", prompt_tokens = "p", output_tokens = "o" } }
""")
    res = _run(["run", str(tmp_path / "s.toml"), "--no-plots", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2
    assert "t.csv" in res.output and "line 3" in res.output and "abc" in res.output
    res = _run(["run", str(tmp_path / "s.toml"), "--lenient", "--no-plots", "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert "skipped 1 bad trace row\n" in res.output
    res = _run(["workload", str(tmp_path / "s.toml"), "--lenient"])
    assert res.exit_code == 0 and "offered load" in res.output
    # a cluster reads its stream the same way (one setup for one replica or many)
    res = _run(["run", str(tmp_path / "s.toml"), "--lenient", "--no-plots", "--set", "cluster={replicas=2}",
                "--out", str(tmp_path / "c")])
    assert res.exit_code == 0, res.output
    assert "skipped 1 bad trace row\n" in res.output


@pytest.mark.parametrize("pure_forced", [False, True])
def test_a_long_pure_python_run_ends_with_a_hint_about_the_compiled_build(tmp_path, monkeypatch, pure_forced):
    """A run that took long in pure Python says once, on stderr, that the compiled engine exists;
    not when the user chose pure Python, nor after a short run."""
    from sim import native
    from sim.cli import group

    monkeypatch.setattr(native, "BUILD", "python")
    if pure_forced:
        monkeypatch.setenv(native.PURE_ENV, "1")
    else:
        monkeypatch.delenv(native.PURE_ENV, raising=False)
    args = ["run", "--set", "horizon_s=2.0", "--no-plots"]
    res = _run([*args, "--out", str(tmp_path / "short")])
    assert res.exit_code == 0 and "hint:" not in res.stderr
    monkeypatch.setattr(group, "NATIVE_HINT_S", 0.0)
    res = _run([*args, "--out", str(tmp_path / "long")])
    assert res.exit_code == 0, res.output
    hints = [ln for ln in res.stderr.splitlines() if ln.startswith("hint:")]
    if pure_forced:
        assert hints == []
    else:
        assert len(hints) == 1 and "priosim native build" in hints[0]
    assert "hint:" not in res.stdout


def _offered(output: str) -> float:
    line = next(x for x in output.splitlines() if x.startswith("offered load, all streams:"))
    return float(line.split()[4])


def _first_row(output: str, column: str) -> str:
    """``column`` of the first row of the stream table ``priosim workload`` prints."""
    lines = output.splitlines()
    i = next(i for i, x in enumerate(lines) if "offered_load" in x.split())
    return lines[i + 1].split()[lines[i].split().index(column) + 1]  # (+1: the row's index)


def test_workload_offered_load_prices_no_decode_step_for_the_first_token(tmp_path):
    # M/D/1: one-token prompts and outputs, a constant 5 ms step: the prefill gives the only
    # token, so a request is one step and the utilisation is rate x 5 ms (not twice that)
    import tomli_w

    from tests.theory_cases import STEP_S, single_server

    sc = single_server(policy={"name": "fcfs"}, classes=[("a", 0, 99.5)], horizon_s=400.0, seed=1, output=1)
    (tmp_path / "s.toml").write_text(tomli_w.dumps(sc))
    res = _run(["workload", str(tmp_path / "s.toml")])
    assert res.exit_code == 0, res.output
    rate = float(_first_row(res.output, "rate"))
    assert _offered(res.output) == pytest.approx(rate * STEP_S, rel=2e-3)
    assert 0.45 < _offered(res.output) < 0.55


def test_workload_offered_load_batch_is_what_the_kv_pool_holds(tmp_path):
    # 16k-token prompts, 1k outputs: a sequence holds ceil(16,500 / 16) = 1,032 blocks, so a
    # pool of 18 x 1,032 + 5 blocks holds 18 of them, not max_num_seqs = 256
    import tomli_w

    from tests.conftest import small_scenario

    sc = small_scenario(engine__max_num_seqs=256, engine__kv_blocks=18 * 1032 + 5)
    sc["streams"] = [{"tenant": "a", "class": "hi", "arrival": {"process": "poisson", "rate": 1.0},
                      "prompt_tokens": 16000, "output_tokens": 1000, "max_tokens": 1000}]
    sc["classes"] = sc["classes"][:1]
    (tmp_path / "s.toml").write_text(tomli_w.dumps(sc))
    res = _run(["workload", str(tmp_path / "s.toml")])
    assert res.exit_code == 0, res.output
    assert _first_row(res.output, "batch") == "18"
    sc["engine"]["kv_blocks"] = 1_000_000  # (a pool that holds a full batch: the batch is max_num_seqs)
    (tmp_path / "s.toml").write_text(tomli_w.dumps(sc))
    full = _run(["workload", str(tmp_path / "s.toml")])
    assert _first_row(full.output, "batch") == "256"
    assert _offered(res.output) > 1.2 * _offered(full.output)  # (fewer sequences share each step)


def test_run_table_shows_a_missing_value_as_a_dash_in_every_row(tmp_path):
    # (a metric column holding numbers and None printed None in a row with data, - in an empty one)
    res = _run(["run", "chat_vs_batch", "--set", "horizon_s=10", "--set", "drain=false", "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    table = res.output.split("events=")[0]
    assert "None" not in table
    chat = next(ln for ln in table.splitlines() if ln.split()[:1] == ["interactive"]).split()
    assert chat[7] == "-"  # tpot_p50_s: no chat request finished


def test_a_runs_scenario_json_runs_again_from_its_results_folder(tmp_path, monkeypatch):
    """``priosim run scenario.json`` (docs/reading-output.md) repeats the run: the relative paths
    in it (a profile, a trace) are read from the original scenario's folder, which it records."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "t.csv").write_text("t,p,o\n0.0,100,10\n0.5,300,20\n1.0,50,5\n")
    (src / "p.json").write_text((ROOT / "sim" / "core" / "profiles" / "cpu-tiny.json").read_text())
    (src / "s.toml").write_text(GOOD.split("[[streams]]")[0].replace('"h200-llama-3-8b"', '"p.json"') + """
[[streams]]
tenant = "a"
class = "hi"
trace = { format = "csv", path = "t.csv", columns = { arrival_s = "t", prompt_tokens = "p", output_tokens = "o" } }
""")
    res = _run(["run", str(src / "s.toml"), "--no-plots", "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    written = json.loads((tmp_path / "a" / "scenario.json").read_text())
    assert written["engine"]["profile"] == "p.json" and written["streams"][0]["trace"]["path"] == "t.csv"
    assert written["base_dir"] == str(src.resolve())
    monkeypatch.chdir(tmp_path / "a")  # (the results folder: no t.csv nor p.json here)
    res = _run(["run", "scenario.json", "--no-plots", "--out", str(tmp_path / "b")])
    assert res.exit_code == 0, res.output
    for f in ("requests.parquet", "scenario.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f


def test_workload_offered_load_prices_steps_as_the_engine_does(tmp_path):
    # engine.cost_scale multiplies every step the engine prices, so the offered load it reports
    # must scale with it (it once loaded the profile without the scale)
    import tomli_w

    from tests.theory_cases import single_server

    sc = single_server(policy={"name": "fcfs"}, classes=[("a", 0, 99.5)], horizon_s=400.0, seed=1, output=1)
    (tmp_path / "s.toml").write_text(tomli_w.dumps(sc))
    base = _run(["workload", str(tmp_path / "s.toml")])
    scaled = _run(["workload", str(tmp_path / "s.toml"), "--set", "engine.cost_scale=2"])
    assert base.exit_code == 0 and scaled.exit_code == 0, scaled.output
    assert _offered(scaled.output) == pytest.approx(2 * _offered(base.output), rel=2e-3)
