"""``priosim calibrate --from-runs``: a profile fitted to benchmark result files.

The runs are simulated with known terms (a rescaled H100 profile and an overhead table), written
in each client's schema (calibrate.runs.export), read back and fitted: every term comes back.
The runs send all their requests at once or one at a time, so that a run's step composition
does not depend on the terms (the objective is then smooth, not a staircase)."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from calibrate.runs.compare import replay
from calibrate.runs.export import export_text, simulated_table
from calibrate.runs.fit import TIED_STEP, Problem, _toml_table, fit_runs, identify
from calibrate.runs.rescale import rescale_profile
from calibrate.runs.table import frame, read_run, settings
from sim.core.costs import find_profile, load_profile
from sim.core.overhead import resolve_overhead

BASE = "h100-sxm-llama-3-8b"
#: every run is served as vLLM with a small token budget (many prefill steps: the per-step
#: term shows in TTFT as well as in TPOT); the fit is told the same
SETS = ['engine.engine="vllm"', "engine.max_batched_tokens=2048"]
TRUE = {"step_s": 0.8e-3, "seq_s": 60e-6, "admit_s": 1.5e-3, "frontend_s": 12e-3,
        "hbm_efficiency": 0.7, "flops_efficiency": 0.45}
#: format, max_concurrency (None: every request at once), requests, seed of the lengths
RUNS = [("vllm", 1, 8, 1), ("sglang", None, 10, 3), ("guidellm", None, 16, 2), ("genai-perf", None, 20, 4)]


def _true_sets(tmp: Path, preset: str = "vllm-v1") -> tuple[list[str], Path]:
    doc = json.loads(find_profile(BASE).read_text())
    path = tmp / "true.json"
    path.write_text(json.dumps(rescale_profile(doc, TRUE["hbm_efficiency"], TRUE["flops_efficiency"])))
    ov = resolve_overhead(preset).terms()
    ov.update({k: TRUE[k] for k in ("step_s", "seq_s", "admit_s", "frontend_s")})
    return SETS + [f"engine.overhead={_toml_table(ov)}"], path


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[Path]:
    """The four runs, simulated with :data:`TRUE`, one file per format."""
    return _simulated_runs(tmp_path_factory.mktemp("runs"))


def _simulated_runs(tmp: Path, preset: str = "vllm-v1") -> list[Path]:
    """The runs of :data:`RUNS`, simulated with :data:`TRUE`'s terms on ``preset``."""
    sets, profile = _true_sets(tmp, preset)
    out = []
    for fmt, mc, n, seed in RUNS:
        rng = np.random.default_rng(seed)
        inp = np.clip(rng.lognormal(7.3, 0.9, n).round(), 16, 8000).astype(int)
        gen = np.clip(rng.lognormal(4.0, 0.5, n).round(), 4, 200).astype(int)
        st = settings(request_rate=math.inf, burstiness=1.0, max_concurrency=mc, num_prompts=n,
                      model="meta-llama/Meta-Llama-3-8B-Instruct", backend="vllm")
        seedfile = tmp / f"lengths-{fmt}.json"
        seedfile.write_text(export_text("vllm", frame(inp, gen, None, np.zeros(n), None, np.zeros(n)).assign(start_s=0.0), st))
        run = read_run(seedfile)
        run.requests["start_s"] = np.nan  # (every request at once, or one user: the client sends)
        cmp = replay(run, sets, profile=str(profile), trace=True)
        path = tmp / f"run-{fmt}.json"
        path.write_text(export_text(fmt, simulated_table(cmp), st))
        out.append(path)
    return out


def test_rescale_is_the_roofline_at_other_efficiencies():
    from calibrate.roofline import roofline_profile

    for name, dev, shape, tp in (("h100-sxm-llama-3-8b", "h100-sxm", "llama-3-8b", 1),
                                 ("h100-sxm-llama-3-70b-tp4", "h100-sxm", "llama-3-70b", 4)):
        doc = json.loads(find_profile(name).read_text())
        got = rescale_profile(doc, 0.7, 0.45)["step"]
        want = roofline_profile(dev, shape, tp=tp, hbm_efficiency=0.7, flops_efficiency=0.45)["step"]
        for k, v in want.items():
            assert np.allclose(got[k], v, rtol=1e-12, atol=0), k
        own = {k: doc["meta"]["constants"][k]["value"] for k in ("hbm_efficiency", "flops_efficiency")}
        assert rescale_profile(doc, own["hbm_efficiency"], own["flops_efficiency"])["step"] == doc["step"]


def test_an_async_scheduled_vllm_is_fitted_with_its_cpu_work_hidden(tmp_path):
    """Runs of a vLLM that schedules ahead (0.14 and later; the same host CPU terms as
    :data:`TRUE`, hidden under the GPU's at every batch these runs have), fitted as that release:
    the CPU terms move nothing and are held, the GPU's efficiencies and the front end recovered
    within 2 %, every metric reached (the README's path for today's vLLM)."""
    paths = _simulated_runs(tmp_path, "vllm-v1-async")
    fit = fit_runs([read_run(p) for p in paths], BASE, SETS + ['engine.engine_version="0.15.1"'], loro=False)
    got = {t.term.name: t for t in fit.terms}
    assert all(not got[k].identified for k in ("step_s", "seq_s", "admit_s")), got
    for k in ("frontend_s", "hbm_efficiency", "flops_efficiency"):
        assert got[k].value == pytest.approx(TRUE[k], rel=0.02), k
    for r in fit.runs:
        assert all(abs(e) < 0.01 for e in r.after.values() if e is not None), (r.path, r.after)


def test_identify_holds_insensitive_and_confounded_terms():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=40), rng.normal(size=40)
    J = np.column_stack([a, b, a * 2 + 1e-4 * b, np.zeros(40)])
    ok, why = identify(J)
    assert ok[:2].all() and not ok[2] and not ok[3]
    assert "confounded" in why[2] and "insensitive" in why[3]


def test_parameter_recovery(runs):
    """Fitted from a start 20-25 % off in each term: every term within 5 %, every metric 2 %."""
    start = {k: v * (1.25 if i % 2 else 0.8) for i, (k, v) in enumerate(TRUE.items())}
    fit = fit_runs([read_run(p) for p in runs], BASE, SETS, loro=False, start=start)
    got = {t.term.name: t for t in fit.terms}
    for name, want in TRUE.items():
        assert got[name].identified, (name, got[name].note)
        assert got[name].value == pytest.approx(want, rel=0.05), name
    assert not any(t.term.name == "kv_capacity_bytes" for t in fit.terms)  # (no run fills the KV cache)
    for r in fit.runs:
        assert {r.format for r in fit.runs} == {"vllm", "sglang", "guidellm", "genai-perf"}
        for m, e in r.after.items():
            assert abs(e) < 0.02, (r.path, m, e)


def test_cli_writes_a_profile_that_loads_and_replays(runs, tmp_path, monkeypatch):
    from sim.cli import main

    monkeypatch.setitem(sys.modules, "torch", None)  # (--from-runs needs no torch: importing it fails)
    out = tmp_path / "mine.json"
    args = ["calibrate", "--from-runs", *map(str, runs[:3]), "--profile", BASE, "--out", str(out)]
    for s in SETS:
        args += ["--set", s]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "leave one run out" in res.stdout and "errors after the fit" in res.stdout
    doc = json.loads(out.read_text())
    fit = doc["meta"]["fitted_from_runs"]
    assert fit["base_profile"] == BASE and fit["engine"] == "vllm"
    assert [r["sha256"] for r in fit["runs"]] == [__import__("hashlib").sha256(p.read_bytes()).hexdigest()
                                                  for p in runs[:3]]
    assert set(fit["leave_one_run_out"]) == {p.name for p in runs[:3]}
    assert set(fit["terms"]["step_s"]) >= {"base", "value", "lo", "hi", "sigma", "identified"}
    assert isinstance(doc["overhead"], dict) and doc["schema"] == "priosim.profile/1"
    load_profile(str(out))
    # the user's check: the run left out of the fit, replayed on the fitted profile
    res = CliRunner().invoke(main, ["replay", str(runs[3]), "--profile", str(out), "--json", str(tmp_path / "c.json"),
                                    "--set", SETS[1]])
    assert res.exit_code == 0, res.output
    metrics = json.loads((tmp_path / "c.json").read_text())["metrics"]
    for m in ("ttft_mean_ms", "tpot_mean_ms", "e2e_mean_ms", "output_throughput"):
        assert abs(metrics[m]["error"]) < 0.02, (m, metrics[m])
    again = CliRunner().invoke(main, args)  # (never over an existing file without --overwrite)
    assert again.exit_code == 2 and again.stderr.startswith("error: ")


def test_engine_defaults_keep_a_fitted_overhead(tmp_path):
    from sim.config import scenario_from_dict

    doc = json.loads(find_profile(BASE).read_text())
    doc["overhead"] = {"step_s": 1e-3}
    doc["meta"]["fitted_from_runs"] = {"engine": "vllm"}
    (tmp_path / "p.json").write_text(json.dumps(doc))
    base = {"classes": [{"name": "a", "priority": 0}],
            "streams": [{"tenant": "t", "class": "a", "arrival": {"process": "batch", "n": 1}, "prompt_tokens": 10,
                         "output_tokens": 2}]}
    own = scenario_from_dict({**base, "engine": {"profile": str(tmp_path / "p.json"), "engine": "vllm"}})
    assert own.engine.overhead is None  # (the profile's own table prices it)
    other = scenario_from_dict({**base, "engine": {"profile": str(tmp_path / "p.json"), "engine": "sglang"}})
    assert other.engine.overhead == "sglang-0.5"
    plain = scenario_from_dict({**base, "engine": {"profile": BASE, "engine": "vllm"}})
    assert plain.engine.overhead == "vllm-v1"


def test_identify_with_fewer_residuals_than_terms():
    """One summary-only run may give fewer metrics than there are terms: the terms past the
    residuals' rank are confounded, not an error."""
    rng = np.random.default_rng(1)
    J = rng.normal(size=(3, 5))
    ok, why = identify(J)
    assert ok.sum() <= 3 and all("confounded" in why[j] for j in range(5) if not ok[j])


def test_the_fit_is_the_same_on_several_workers(runs):
    """The runs of a trial replay in worker processes: every value and error as on one."""
    one = fit_runs([read_run(p) for p in runs[:2]], BASE, SETS, loro=False, max_nfev=3)
    two = fit_runs([read_run(p) for p in runs[:2]], BASE, SETS, loro=False, max_nfev=3, workers=2)
    assert [(t.term.name, t.value, t.identified) for t in one.terms] == [(t.term.name, t.value, t.identified)
                                                                        for t in two.terms]
    assert [r.after for r in one.runs] == [r.after for r in two.runs]


def _same_lengths_run(tmp_path: Path, n: int, prompt: int, output: int, max_concurrency: int | None,
                      overhead: dict, profile: str, model: str, sets: list[str] = SETS,
                      preset: str = "vllm-v1", name: str = "run.json") -> Path:
    """A vLLM result file of ``n`` requests of ``prompt`` / ``output`` tokens sent at once (or
    ``max_concurrency`` at a time), simulated on ``profile`` with ``sets`` and the ``preset``'s
    terms changed by ``overhead``."""
    sets = sets + [f"engine.overhead={_toml_table(resolve_overhead(preset).terms() | overhead)}"]
    st = settings(request_rate=math.inf, burstiness=1.0, max_concurrency=max_concurrency, num_prompts=n,
                  model=model, backend="vllm")
    seedfile = tmp_path / f"lengths-{name}"
    seedfile.write_text(export_text("vllm", frame(np.full(n, prompt), np.full(n, output), None, np.zeros(n), None,
                                                  np.zeros(n)).assign(start_s=0.0), st))
    run = read_run(seedfile)
    run.requests["start_s"] = np.nan
    path = tmp_path / name
    path.write_text(export_text("vllm", simulated_table(replay(run, sets, profile=profile, trace=True)), st))
    return path


def test_a_slow_api_server_is_fitted_from_a_burst_of_short_requests(tmp_path):
    """300 requests of 128 prompt / 4 output tokens sent at once to a host whose API server
    spends 13 ms on each: the run's rate is the front end's (about 77 requests a second), far
    under the GPU's, and the fit finds those 13 ms within 5 % from the preset's ~0 (a value off
    the starting grid), where a per-admission term would also slow the GPU's steps."""
    path = _same_lengths_run(tmp_path, 300, 128, 4, None, {"frontend_busy_s": 13e-3}, BASE,
                             "meta-llama/Meta-Llama-3-8B-Instruct")
    fit = fit_runs([read_run(path)], BASE, SETS, loro=False)
    got = {t.term.name: t for t in fit.terms}
    assert got["frontend_busy_s"].identified, got["frontend_busy_s"].note
    assert got["frontend_busy_s"].value == pytest.approx(13e-3, rel=0.05)
    assert abs(fit.runs[0].after["request_throughput"]) < 0.02


def test_a_tensor_parallel_floor_below_the_presets_all_reduce_is_reached(tmp_path):
    """A TP-4 host whose all-reduces cost nothing beyond the profile's own (custom all-reduce
    over NVLink): its inter-token gaps are under what the preset's 160 all-reduces a step allow,
    which step_s (bounded below by 0) cannot take away. A TP step's fixed time is fitted as
    allreduce_latency_s (a term only a tensor-parallel profile has), step_s held, and the fit
    reaches the run. (One run at one concurrency cannot split the all-reduces from the HBM
    efficiency, so the all-reduce is only asked to come down, not to reach 0.)"""
    base = "h100-sxm-llama-3-70b-tp4"
    path = _same_lengths_run(tmp_path, 8, 512, 64, 1, {"allreduce_latency_s": 0.0, "step_s": 0.0}, base,
                             "meta-llama/Meta-Llama-3-70B-Instruct")
    fit = fit_runs([read_run(path)], base, SETS, loro=False)
    got = {t.term.name: t for t in fit.terms}
    ar = got["allreduce_latency_s"]
    assert ar.identified and ar.value < ar.base
    assert not got["step_s"].identified and got["step_s"].note == TIED_STEP
    assert fit.runs[0].before["itl_mean_ms"] > 0.05  # (the preset's floor is well above the host's)
    for m in ("itl_mean_ms", "tpot_mean_ms", "e2e_mean_ms"):
        assert abs(fit.runs[0].after[m]) < 0.02, (m, fit.runs[0].after)
    one_gpu = Problem([read_run(path)], BASE, SETS)
    one_gpu.close()
    assert "allreduce_latency_s" not in {t.name for t in one_gpu.candidates}  # (a 1-GPU step has none)


def test_an_overlap_schedulers_cpu_bound_large_batches_are_fitted(tmp_path):
    """An SGLang host whose scheduler's CPU work (150 us per running request) hides under the
    GPU's: one request at a time is the GPU's step, 400 at once the CPU's. From the preset
    (nothing hidden, no per-request CPU) the fit starts at cpu_overlap 1 (a per-request term
    alone, added, would slow the single request too) and recovers both within 5 %."""
    sg = ['engine.engine="sglang"']
    true = {"seq_s": 150e-6, "cpu_overlap": 1.0}
    paths = [_same_lengths_run(tmp_path, n, 256, 64, mc, true, BASE, "meta-llama/Meta-Llama-3-8B-Instruct",
                               sets=sg, preset="sglang-0.5", name=f"run{n}.json")
             for n, mc in ((6, 1), (400, None))]
    fit = fit_runs([read_run(p) for p in paths], BASE, sg, loro=False)
    got = {t.term.name: t for t in fit.terms}
    assert got["cpu_overlap"].value == pytest.approx(1.0, abs=0.05)
    assert got["seq_s"].value == pytest.approx(150e-6, rel=0.05)
    for r in fit.runs:
        for m in ("itl_mean_ms", "e2e_mean_ms", "output_throughput"):
            assert abs(r.after[m]) < 0.02, (r.label, m, r.after)
    vllm = Problem([read_run(paths[0])], BASE, SETS)
    vllm.close()
    assert "cpu_overlap" not in {t.name for t in vllm.candidates}  # (no overlap scheduler: not fitted)


def test_a_slower_front_end_is_not_taken_for_a_serial_one(tmp_path):
    """Two Poisson runs (3 and 10 requests a second) of an async-scheduled vLLM whose front end
    takes 25 ms (the preset's 9.74 ms) and serves requests side by side: its TTFT is the
    preset's plus a constant. The grid that starts frontend_busy_s compares its points with
    frontend_s set to the runs' TTFT, so a serial server (which would cap the replica's rate
    where no run went) is not started from; the fit leaves frontend_busy_s where it was and
    recovers the 25 ms within 10 % (TTFT's mean and percentiles let the front end trade a
    little with the prefill's FLOPs fraction)."""
    sets = ['engine.engine="vllm"', 'engine.engine_version="0.15.1"']
    true = {"frontend_s": 25e-3}
    paths = []
    for rate, seed in ((3.0, 1), (10.0, 2)):
        rng = np.random.default_rng(seed)
        n = 150
        inp = np.clip(rng.lognormal(6.0, 0.8, n).round(), 16, 4000).astype(int)
        gen = np.clip(rng.lognormal(4.5, 0.6, n).round(), 4, 400).astype(int)
        st = settings(request_rate=rate, burstiness=1.0, max_concurrency=None, num_prompts=n,
                      model="meta-llama/Meta-Llama-3-8B-Instruct", backend="vllm")
        seedfile = tmp_path / f"lengths-{rate:g}.json"
        seedfile.write_text(export_text("vllm", frame(inp, gen, None, np.zeros(n), None, np.zeros(n))
                                        .assign(start_s=0.0), st))
        run = read_run(seedfile)
        run.requests["start_s"] = np.nan  # (sent by the client's own Poisson process)
        ov = resolve_overhead("vllm-v1-async").terms() | true
        cmp = replay(run, sets + [f"engine.overhead={_toml_table(ov)}"], profile=BASE, trace=True)
        paths.append(tmp_path / f"run-{rate:g}.json")
        paths[-1].write_text(export_text("vllm", simulated_table(cmp), st))
    fit = fit_runs([read_run(p) for p in paths], BASE, sets, loro=False)
    got = {t.term.name: t for t in fit.terms}
    assert got["frontend_s"].value == pytest.approx(25e-3, rel=0.1)
    assert got["frontend_busy_s"].value < 1e-3, got["frontend_busy_s"]
    assert not any("caps one replica" in n for n in fit.notes)
    for r in fit.runs:
        assert abs(r.after["ttft_p50_ms"]) < 0.02, r.after


def test_a_fitted_serial_front_end_far_above_the_runs_rate_is_noted():
    """A fitted frontend_busy_s of 20 ms caps a replica at 50 req/s: with runs up to 12 req/s
    (4x under it) the fit says its queueing is extrapolated there; with a run at 30 req/s, not."""
    from calibrate.runs.compare import Comparison
    from calibrate.runs.fit import FittedTerm, _busy_note
    from calibrate.runs.terms import OVERHEAD_TERMS

    busy = next(t for t in OVERHEAD_TERMS if t.name == "frontend_busy_s")
    terms = [FittedTerm(busy, 0.0, 20e-3, 1e-3, True)]

    def at(rate):
        return Comparison({"request_throughput": {"measured": rate, "simulated": rate, "error": 0.0}}, None, "poisson")

    note = _busy_note(terms, [at(2.0), at(12.0)])
    assert "caps one replica's API server at 50 req/s" in note and "4.2 times" in note
    assert _busy_note(terms, [at(30.0)]) == ""
    assert _busy_note([FittedTerm(busy, 0.0, 20e-3, None, False)], [at(2.0)]) == ""


def test_vllm_runs_fitted_without_a_release_are_told_which_one_prices_them(runs):
    """A result file records no engine release: vLLM runs fitted without engine.engine_version
    (or an explicit overhead, or --[no-]async-scheduling) get one note naming the release that
    prices them and how to give theirs; SGLang runs and versioned ones none."""
    from calibrate.runs.scenario import unversioned_vllm
    from sim.engines.vllm import LATEST

    vllm_run = [read_run(runs[0])]
    note = unversioned_vllm(vllm_run, SETS)
    assert f"priced as vLLM {LATEST}" in note and "engine.engine_version" in note
    for given in ('engine.engine_version="0.15.1"', "engine.overlap_scheduling=true", 'engine.overhead="vllm-v1"'):
        assert unversioned_vllm(vllm_run, SETS + [given]) == ""
    assert unversioned_vllm(vllm_run, ['engine.engine="sglang"']) == ""


# -- the command's inputs and outputs, checked before the fit ---------------------------------

DATA = Path(__file__).resolve().parent / "data" / "runs"


def _calibrate(*args):
    from sim.cli import main

    return CliRunner().invoke(main, ["calibrate", "--from-runs", *map(str, args)])


def test_the_profile_goes_into_a_missing_folder(tmp_path):
    out = tmp_path / "new" / "deeper" / "p.json"
    res = _calibrate(DATA / "vllm_concurrency8.json", "--profile", "h200-llama-3-8b", "--out", out, "--workers", 1)
    assert res.exit_code == 0, res.output
    load_profile(str(out))


def test_an_out_on_a_run_file_is_refused_even_with_overwrite(tmp_path):
    run = tmp_path / "X.json"
    run.write_bytes((DATA / "vllm_concurrency8.json").read_bytes())
    res = _calibrate(run, "--profile", "h200-llama-3-8b", "--out", run, "--overwrite")
    assert res.exit_code == 2 and len(res.stderr.splitlines()) == 1
    assert f"--out {run}: is the input file" in res.stderr and "fitted on" not in res.stdout
    assert run.read_bytes() == (DATA / "vllm_concurrency8.json").read_bytes()


def test_a_run_given_twice_or_copied_is_refused(tmp_path):
    copy = tmp_path / "copy.json"
    copy.write_bytes((DATA / "vllm_concurrency8.json").read_bytes())
    res = _calibrate(DATA / "vllm_concurrency8.json", copy, "--profile", "h200-llama-3-8b", "--out", tmp_path / "p.json")
    assert res.exit_code == 2 and len(res.stderr.splitlines()) == 1
    assert str(copy) in res.stderr and "vllm_concurrency8.json" in res.stderr and "sha256" in res.stderr
    res = _calibrate(copy, copy, "--profile", "h200-llama-3-8b", "--out", tmp_path / "p.json")
    assert res.exit_code == 2 and "given twice" in res.stderr
    assert not (tmp_path / "p.json").exists()


def test_runs_without_send_times_are_noted_for_the_fit():
    """SGLang's file has no send times: the fit's note names it and the seed; a run with its
    own send times (or sent all at once) is not named."""
    from calibrate.runs.inputs import redrawn_runs

    sg, vl = read_run(DATA / "sglang_rate8.jsonl"), read_run(DATA / "vllm_concurrency8.json")
    note = redrawn_runs([sg, vl], 4)
    assert note.startswith("1 of 2 runs have no per-request send times (sglang_rate8.jsonl)") and "seed 4" in note
    assert redrawn_runs([vl], 0) == ""


def test_a_term_wider_than_its_range_is_fitted_not_determined():
    from calibrate.runs.fit import FittedTerm
    from calibrate.runs.terms import efficiency_terms

    flops = efficiency_terms(True)[1]
    assert FittedTerm(flops, 0.6, 0.7, 0.05, True).status == "fitted"
    loose = FittedTerm(flops, 0.6, 0.98, 1.317, True)
    assert not loose.determined and loose.status == "fitted, not determined (+/-1.32 wider than its range of 0.7)"
    assert FittedTerm(flops, 0.6, 0.6, None, False, "why").status == "held at base: not identified (why)"


def test_a_fitted_value_at_a_bound_is_warned_about():
    """An efficiency within 2 % of either bound, an overhead term at its upper one: a sign of the
    wrong base profile; an overhead term at 0 ("no such cost") and mid-range values are not."""
    from calibrate.runs.fit import FitResult, FittedTerm, bound_warnings
    from calibrate.runs.terms import OVERHEAD_TERMS, efficiency_terms

    hbm, flops = efficiency_terms(True)
    step = OVERHEAD_TERMS[0]
    fit = FitResult([FittedTerm(hbm, 0.8, 0.983, 0.01, True), FittedTerm(flops, 0.6, 0.301, 0.01, True),
                     FittedTerm(step, 1e-3, 4.95e-3, 1e-4, True), FittedTerm(OVERHEAD_TERMS[1], 1e-5, 0.0, 1e-6, True),
                     FittedTerm(OVERHEAD_TERMS[2], 0.0, 1e-3, 1e-4, True)], [], {}, {}, BASE, "vllm")
    said = bound_warnings(fit)
    assert len(said) == 3
    assert said[0].startswith("hbm_efficiency fitted to 0.983, at its upper bound 1: the base profile "
                              f"{BASE} may not match the GPU")
    assert "flops_efficiency fitted to 0.301, at its lower bound 0.3" in said[1]
    assert "step_s fitted to 4.95 ms, at its upper bound 5 ms" in said[2]


def test_h200_runs_on_an_h100_profile_are_warned_and_flat_terms_measured_at_their_ends(tmp_path):
    """The generated H200 run fitted on the H100 profile: hbm_efficiency ends at its upper
    bound, warned about and kept in the profile's meta; a term held as insensitive says it was
    measured near its base value and what it does at its bounds."""
    out = tmp_path / "p.json"
    res = _calibrate(DATA / "vllm_concurrency8.json", "--profile", BASE, "--out", out, "--workers", 1)
    assert res.exit_code == 0, res.output
    warned = [ln for ln in res.stderr.splitlines() if ln.startswith("warning: hbm_efficiency fitted to")]
    assert len(warned) == 1 and "at its upper bound 1" in warned[0] and BASE in warned[0]
    meta = json.loads(out.read_text())["meta"]["fitted_from_runs"]
    assert meta["warnings"] == [warned[0].removeprefix("warning: ")]
    held = [t for t in meta["terms"].values() if "insensitive" in t.get("not_identified", "")]
    assert held and all("near its base value" in t["status"] and "bound (" in t["status"] for t in held)
    assert "whole range moves" not in res.stdout
    assert all(t["status"] in ("fitted",) or not t["determined"] for t in meta["terms"].values())


def test_a_summary_only_run_is_warned_about_before_the_fit(tmp_path):
    """The generated vLLM run without its per-request lists (as vLLM writes it without
    --save-detailed): one warning that its lengths are not in the file and that calibrating on
    it is unreliable; the fit goes on."""
    doc = json.loads((DATA / "vllm_concurrency8.json").read_text())
    for k in ("input_lens", "output_lens", "ttfts", "itls", "errors", "start_times"):
        doc.pop(k)
    (tmp_path / "summary.json").write_text(json.dumps(doc))
    res = _calibrate(tmp_path / "summary.json", "--profile", "h200-llama-3-8b", "--out", tmp_path / "p.json",
                     "--workers", 1)
    assert res.exit_code == 0, res.output
    said = [ln for ln in res.stderr.splitlines() if "per-request lengths are not in the file" in ln]
    assert len(said) == 1 and said[0].startswith(f"warning: {tmp_path / 'summary.json'}: summary-only result")
    assert "calibrating on it is unreliable" in said[0] and "lockstep" in said[0]
