"""priosim tune: a known optimum is found, a killed tune resumes without redoing finished trials,
bad input is one line (exit 2) before any trial, and best.toml runs as it is."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")
from click.testing import CliRunner  # noqa: E402

from sim import scenario_from_dict  # noqa: E402
from sim.cli import main  # noqa: E402
from sim.experiments.tune import TuneSpec, parse_knob, parse_objective, parse_slo, run_tune, validate  # noqa: E402
from sim.experiments.tune_report import write_report  # noqa: E402
from tests.conftest import small_scenario  # noqa: E402


def waves() -> dict:
    """20 identical jobs (100-token prompt, 50 output tokens) at t = 0 on a linear profile with
    no prefill or context cost: a decode step of a batch of m costs 0.01 + 0.001 m s, so a
    request's TPOT is exactly 0.01 + 0.001 m while jobs run in waves of m.

    With TPOT <= 0.0155 s, m <= 5. Throughput = 1000 tokens / (waves x 50 x step):
    m=4: 5 waves x 0.014 = 0.070; m=5: 4 waves x 0.015 = 0.060 (best feasible);
    m=6: 4 waves (6, 6, 6, 2) x 0.016 ... = 0.060 but TPOT 0.016 breaks the SLO."""
    return {"name": "waves", "seed": 0, "horizon_s": 1.0, "drain": True,
            "engine": {"profile": {"kind": "linear", "base_s": 0.01, "prefill_token_s": 0.0,
                                   "decode_token_s": 0.001, "context_token_s": 0.0},
                       "max_num_seqs": 1, "max_batched_tokens": 4096, "kv_blocks": 10000},
            "classes": [{"name": "jobs", "priority": 0}],
            "streams": [{"tenant": "t", "class": "jobs", "arrival": {"process": "batch", "n": 20, "at_s": 0.0},
                         "prompt_tokens": {"dist": "constant", "value": 100},
                         "output_tokens": {"dist": "constant", "value": 50}, "max_tokens": 50}]}


def _spec(sc: dict, space: list[str], maximize: str, slos: list[str], seeds=(0,)) -> TuneSpec:
    s = scenario_from_dict(sc)
    spec = TuneSpec(s.to_dict(), s.base_dir, s.source, [parse_knob(k) for k in space],
                    [parse_objective(maximize, s.class_names, True)],
                    [x for t in slos for x in parse_slo(t, s.class_names)], list(seeds))
    validate(spec)
    return spec


def test_finds_the_analytic_optimum(tmp_path):
    spec = _spec(waves(), ["engine.max_num_seqs=1..10"], "output_tokens_per_s", ["jobs:tpot=0.0155"])
    rep = run_tune(spec, tmp_path, trials=20, log=lambda *_: None)
    assert rep.trials == 20 and not rep.failed
    info = write_report(spec, tmp_path, plots=False)
    assert info["best"]["params"] == {"engine.max_num_seqs": 5}
    m = info["best"]["measure"]
    assert m["slo"]["jobs.tpot"] == pytest.approx(0.015)
    assert m["objectives"]["output_tokens_per_s"]["mean"] == pytest.approx(1000 / (4 * 50 * 0.015), rel=0.02)
    assert info["default"]["objectives"]["output_tokens_per_s"]["mean"] < m["objectives"]["output_tokens_per_s"]["mean"]


def test_killed_tune_resumes_without_redoing_finished_trials(tmp_path):
    spec = _spec(small_scenario(horizon_s=5.0), ["engine.max_num_seqs=1..8", "engine.watermark=0.0..0.2"],
                 "output_tokens_per_s", ["hi:ttft=2.0"], seeds=(3, 4))
    first = run_tune(spec, tmp_path, trials=3, log=lambda *_: None)
    assert first.evaluated_now == 3
    study = optuna.load_study(study_name="tune", storage=f"sqlite:///{tmp_path / 'study.db'}")
    before = {t.number: (t.params, t.values) for t in study.trials}
    # a kill in the middle of a trial leaves it RUNNING in the study
    killed = study.ask({k.key: k.distribution() for k in spec.knobs})
    runs_before = set(p.name for p in (tmp_path / "evals" / "runs").iterdir())
    second = run_tune(spec, tmp_path, trials=5, resume=True, log=lambda *_: None)
    assert second.resumed_stale == 1
    assert second.evaluated_now == 2 and second.trials == 5
    study = optuna.load_study(study_name="tune", storage=f"sqlite:///{tmp_path / 'study.db'}")
    after = {t.number: (t.params, t.values) for t in study.trials}
    assert all(after[n] == before[n] for n in before)  # finished trials untouched
    assert study.trials[killed.number].state.name == "FAIL"
    assert study.trials[killed.number + 1].params == killed.params  # its parameters asked again
    runs_after = set(p.name for p in (tmp_path / "evals" / "runs").iterdir())
    assert runs_before <= runs_after
    # at most 2 new configurations x 2 seeds were simulated; the defaults were not re-run
    assert second.simulations_now <= 4 and len(runs_after - runs_before) == second.simulations_now
    # a third call with the same target runs nothing
    assert run_tune(spec, tmp_path, trials=5, resume=True, log=lambda *_: None).simulations_now == 0


def test_resume_after_the_policy_file_changed_is_refused_naming_it(tmp_path):
    # the study's trials were measured with the old policy: resuming would mix two policies
    from sim.experiments.tune import TuneError

    pol = tmp_path / "p.py"
    pol.write_text("from policies.fcfs import FCFS as P\n")
    spec = _spec(small_scenario(horizon_s=3.0, policy={"name": f"{pol}:P"}), ["engine.max_num_seqs=1..8"],
                 "output_tokens_per_s", [])
    run_tune(spec, tmp_path / "t", trials=1, log=lambda *_: None)
    assert run_tune(spec, tmp_path / "t", trials=2, resume=True, log=lambda *_: None).trials == 2
    pol.write_text("from policies.priority import Priority as P\n")
    with pytest.raises(TuneError, match=f"--resume: {pol.resolve()} changed since the tune"):
        run_tune(spec, tmp_path / "t", trials=3, resume=True, log=lambda *_: None)


def _cli(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.mark.parametrize("args, needle", [
    (["--space", "engine.max_num_sequences=1..8"], "engine.max_num_sequences"),
    (["--space", "engine.max_num_seqs=8..1"], "empty range"),
    (["--space", "engine.max_num_seqs=1..8", "--maximize", "tokens_per_hour"], "unknown metric"),
    (["--space", "engine.max_num_seqs=1..8", "--maximize", "output_tokens_per_s:nobody"], "no class"),
    (["--space", "engine.max_num_seqs=1..8", "--slo", "nobody:ttft=1"], "CLASS one of"),
    (["--space", "engine.preemption=recompute,teleport"], "engine.preemption"),
    (["--space", "engine.max_num_seqs=1..8", "--workers", "0"], "--workers: must be at least 1"),
])
def test_bad_input_is_one_line_before_any_trial(tmp_path, args, needle):
    out = tmp_path / "t"
    p = tmp_path / "s.toml"
    import tomli_w
    p.write_text(tomli_w.dumps(small_scenario(horizon_s=2.0)))
    base = ["tune", str(p), "--out", str(out), "--trials", "1"]
    if "--maximize" not in args:
        args = [*args, "--maximize", "output_tokens_per_s"]
    r = _cli(*base, *args)
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], r.output
    assert not out.exists()  # nothing ran


def test_set_on_a_searched_key_warns_that_only_the_defaults_take_it(tmp_path):
    import tomli_w
    p = tmp_path / "s.toml"
    p.write_text(tomli_w.dumps(small_scenario(horizon_s=1.0)))
    r = _cli("tune", str(p), "--out", str(tmp_path / "t"), "--trials", "1", "--space", "engine.max_num_seqs=2..8",
             "--maximize", "output_tokens_per_s", "--set", "engine.max_num_seqs=4", "--no-plots")
    assert r.exit_code == 0, r.output
    warned = [ln for ln in r.output.splitlines() if ln.startswith("warning: --set engine.max_num_seqs=4")]
    assert len(warned) == 1 and "only in the defaults" in warned[0], r.output


def test_a_second_tune_into_the_same_out_is_one_line_without_resume(tmp_path):
    import tomli_w
    p = tmp_path / "s.toml"
    p.write_text(tomli_w.dumps(small_scenario(horizon_s=1.0)))
    args = ["tune", str(p), "--out", str(tmp_path / "t"), "--trials", "1", "--space", "engine.max_num_seqs=2..8",
            "--maximize", "output_tokens_per_s", "--no-plots"]
    assert _cli(*args).exit_code == 0
    r = _cli(*args)
    assert r.exit_code == 2 and r.output.strip().splitlines() == [
        f"error: --out {tmp_path / 't'}: already holds a tune (pass --resume to continue it, or another --out)"]


def test_an_slo_that_looks_like_milliseconds_is_warned(tmp_path):
    with pytest.warns(UserWarning, match=r"--slo 'hi:ttft=500': ttft = 500 looks like milliseconds"):
        slos = parse_slo("hi:ttft=500", ["hi", "lo"])
    assert [s.limit for s in slos] == [500.0]


def test_cli_writes_a_runnable_best_toml_and_a_tune_table(tmp_path):
    import tomli_w
    sc = small_scenario(horizon_s=3.0)
    sc["tune"] = {"space": ["engine.max_num_seqs=2..8"], "maximize": "output_tokens_per_s",
                  "slo": ["hi:ttft=5"], "trials": 3, "seeds": 2}
    p = tmp_path / "s.toml"
    p.write_text(tomli_w.dumps(sc))
    out = tmp_path / "t"
    r = _cli("tune", str(p), "--out", str(out))
    assert r.exit_code == 0, r.output
    assert "defaults" in r.output and "engine.max_num_seqs" in r.output and "noise:" in r.output
    for f in ("best.toml", "trials.parquet", "pareto.png", "pareto.csv", "importance.json", "tune.json"):
        assert (out / f).is_file(), f
    import pandas as pd
    df = pd.read_parquet(out / "trials.parquet")
    assert {"engine.max_num_seqs", "output_tokens_per_s", "output_tokens_per_s_std", "slo:hi.ttft", "feasible",
            "m:lo.output_tokens_per_s", "m:hi.ttft_p99_s", "m:thrash_ratio"} <= set(df.columns)
    info = json.loads((out / "tune.json").read_text())
    assert info["trials"] == 3 and info["seeds"] == [3, 4]
    r2 = _cli("run", str(out / "best.toml"), "--out", str(tmp_path / "run"), "--no-plots")
    assert r2.exit_code == 0, r2.output
    scen = json.loads((Path(tmp_path) / "run" / "scenario.json").read_text())
    assert scen["engine"]["max_num_seqs"] == info["best"]["params"]["engine.max_num_seqs"]


def test_multi_objective_pareto_front(tmp_path):
    s = scenario_from_dict(small_scenario(horizon_s=3.0))
    spec = TuneSpec(s.to_dict(), s.base_dir, s.source, [parse_knob("engine.max_num_seqs=1..8")],
                    [parse_objective("output_tokens_per_s:lo", s.class_names, True),
                     parse_objective("ttft_p99_s:hi", s.class_names, False)], [], [3])
    run_tune(spec, tmp_path, trials=6, log=lambda *_: None)
    info = write_report(spec, tmp_path, plots=True)
    import pandas as pd
    front = pd.read_csv(tmp_path / "pareto.csv")
    assert len(front) >= 1 and (tmp_path / "pareto.png").is_file()
    # nothing on the front is dominated by another trial
    df = pd.read_parquet(tmp_path / "trials.parquet")
    a, b = "output_tokens_per_s:lo", "ttft_p99_s:hi"
    for _, f in front.iterrows():
        assert not ((df[a] >= f[a]) & (df[b] <= f[b]) & ((df[a] > f[a]) | (df[b] < f[b]))).any()
    assert info["best"]["trial"] in set(front["trial"])
