"""The cost model's error, propagated (docs/uncertainty.md): the time factors and their coverage
on the fidelity table, ``engine.cost_scale``, ``run --uncertainty``, ``capacity``'s "N (lo-hi)",
``compare`` on intervals, and the same bytes twice."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from calibrate.fidelity.fit import LOSO_PATH
from calibrate.fidelity.uncertainty import OUT_CSV, OUT_JSON, implied_factor, simulate_rows
from sim.cli import main
from sim.config import load_scenario
from sim.core.costs import load_profile
from sim.experiments import uncertainty as unc
from sim.experiments.compare import WITHIN_MODEL, compare_runs

KNIFE = str(Path(__file__).parent / "data" / "capacity_knife_edge.toml")
PROFILE = Path(__file__).resolve().parents[1] / "sim" / "core" / "profiles" / "h200-llama-3-8b.json"


# ---- the distribution and its coverage ----------------------------------------------------------
def test_factors_are_the_loso_rows_quantiles():
    """sim/core/uncertainty.json's factors are the 10th and 90th percentiles, per kind, of the
    factors the evaluated leave-one-source-out rows imply (a rate's inverted)."""
    loso = pd.read_csv(LOSO_PATH)
    ev = loso[loso.evaluated.astype(bool)]
    doc = json.loads(OUT_JSON.read_text())
    assert doc["level"] == 0.8 and doc["quantiles"] == [0.1, 0.9]
    for kind in ("TTFT", "TPOT/ITL", "E2E/latency", "throughput"):
        sub = ev[ev.kind == kind]
        f = [implied_factor(m, p, s) for m, p, s in zip(sub.metric, sub.published, sub.simulated)]
        lo, hi = np.quantile(f, [0.1, 0.9])
        assert doc["by_kind"][kind]["lo"] == pytest.approx(lo, abs=1e-4)
        assert doc["by_kind"][kind]["hi"] == pytest.approx(hi, abs=1e-4)
        assert doc["by_kind"][kind]["rows"] == len(sub)


def test_eighty_percent_intervals_cover_70_to_90_percent_of_the_loso_rows():
    """Coverage recomputed from the stored per-row values (calibrate/fidelity/uncertainty.csv):
    each row's interval is its LOSO value times the shipped preset's response at its kind's low
    and high factors; the published value is inside it for 70-90 % of the rows."""
    d = pd.read_csv(OUT_CSV)
    loso = pd.read_csv(LOSO_PATH)
    assert set(d.id) == set(loso[loso.evaluated.astype(bool)].id)
    a = d.simulated * d.shipped_lo / d.shipped
    b = d.simulated * d.shipped_hi / d.shipped
    lo = np.minimum(np.minimum(a, b), d.simulated)
    hi = np.maximum(np.maximum(a, b), d.simulated)
    inside = (lo <= d.published * (1 + 1e-9)) & (d.published <= hi * (1 + 1e-9))
    assert (inside == d.inside).all()
    share = inside.mean()
    assert 0.7 <= share <= 0.9, share
    assert json.loads(OUT_JSON.read_text())["coverage"]["all"]["coverage"] == pytest.approx(share, abs=1e-4)


def test_stored_responses_are_what_the_simulator_gives_now():
    """Two rows re-simulated at their stored factors give the stored values (the CSV is current)."""
    from calibrate.fidelity.suite import load_table

    d = pd.read_csv(OUT_CSV).set_index("id")
    table = load_table().set_index("id")
    for rid in ("ci9515-lat-8b", "qwen25-7b-in1"):
        rows = table.loc[[rid]].reset_index()
        got = simulate_rows(rows, lambda r: d.loc[rid, "factor_hi"])[0]
        assert got == pytest.approx(d.loc[rid, "shipped_hi"], rel=1e-4)


def test_calibrated_profile_uses_its_leave_one_run_out_errors(tmp_path):
    """A profile fitted to runs (meta.fitted_from_runs.leave_one_run_out) narrows the factors
    of the kinds it measured; the others keep the fidelity table's."""
    doc = json.loads(PROFILE.read_text())
    doc["meta"]["fitted_from_runs"] = {"leave_one_run_out": {
        "a.csv": {"ttft_p50_ms": 0.05, "tpot_p50_ms": -0.02, "output_throughput": 0.03},
        "b.csv": {"ttft_p50_ms": -0.04, "tpot_p50_ms": 0.01, "output_throughput": -0.01},
        "c.csv": {"ttft_p50_ms": 0.02, "tpot_p50_ms": 0.03, "output_throughput": 0.02}}}
    p = tmp_path / "mine.json"
    p.write_text(json.dumps(doc))
    d = unc.distribution_of(load_profile(str(p)))
    shipped = unc.shipped()
    lo, hi = d.by_kind["TTFT"]
    assert 0.9 < lo <= 1.0 <= hi < 1.1 and (hi - lo) < (shipped.by_kind["TTFT"][1] - shipped.by_kind["TTFT"][0])
    assert d.by_kind["E2E/latency"] == shipped.by_kind["E2E/latency"]
    assert "leave-one-run-out" in d.source


def test_declared_distribution_is_checked(tmp_path):
    doc = json.loads(PROFILE.read_text())
    doc["meta"]["uncertainty"] = {"by_kind": {"TTFT": {"lo": 1.2, "hi": 1.5}}}
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(unc.UncertaintyError, match=r"meta.uncertainty.by_kind.TTFT: expected 0 < lo <= 1 <= hi"):
        unc.distribution_of(load_profile(str(p)))
    doc["meta"]["uncertainty"] = {"by_kind": {"TTFT": {"lo": 0.9, "hi": 1.1}}, "source": "by hand"}
    p.write_text(json.dumps(doc))
    assert unc.distribution_of(load_profile(str(p))).by_kind["TTFT"] == (0.9, 1.1)


# ---- engine.cost_scale ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["h200-llama-3-8b", "h200-llama-3-8b-measured", "h200-llama-3-70b-tp4"])
def test_cost_scale_multiplies_every_step_and_one_is_identity(name):
    one, two = load_profile(name), load_profile(name, scale=2.0)
    assert load_profile(name, scale=1.0).step == one.step
    for args in [(512, 0, 512 * 512, 0, 0, 1, 1), (0, 64, 0, 0, 64 * 1000), (0, 8, 0, 0, 8 * 300)]:
        assert two.step_ns(*args) == pytest.approx(2 * one.step_ns(*args), rel=1e-6)
    assert two.overhead.frontend_s == 2 * one.overhead.frontend_s
    line = two.decode_line(8)
    if line is not None:  # the fast-forward line stays the step function's, bit for bit
        assert two.step_ns(0, 8, 0, 0, 8 * 300) == round((line[0] + line[1] * 8 * 300) * 1e9)


def test_cost_scale_one_is_not_written_into_the_scenario():
    sc = load_scenario(None)
    assert "cost_scale" not in sc.to_dict()["engine"]
    assert unc.at_scale(sc, 1.5).to_dict()["engine"]["cost_scale"] == 1.5


# ---- the CLI -------------------------------------------------------------------------------------
def _run(tmp_path, name, *extra):
    out = tmp_path / name
    res = CliRunner().invoke(main, ["run", "--set", "horizon_s=3.0", "--no-progress", "--out", str(out), *extra])
    assert res.exit_code == 0, res.output + res.stderr
    return res, out


def test_run_uncertainty_prints_intervals_and_writes_lo_hi_and_keeps_the_central_run(tmp_path):
    res, out = _run(tmp_path, "u", "--uncertainty")
    plain_res, plain = _run(tmp_path, "p")
    assert "80% interval from the cost model's error" in res.stdout
    row = next(line for line in res.stdout.splitlines() if line.strip().startswith("interactive"))
    assert row.count("(") >= 4 and "-" in row  # ttft_p50 (lo-hi) ...
    s = json.loads((out / "summary.json").read_text())
    m = s["classes"]["interactive"]
    for k in ("ttft_p99_s", "tpot_p50_s", "e2e_p99_s", "output_tokens_per_s"):
        assert m[f"{k}_lo"] <= m[k] <= m[f"{k}_hi"]
    assert m["ttft_p99_s_lo"] < m["ttft_p99_s_hi"]
    u = s["run"]["uncertainty"]
    assert u["level"] == 0.8 and "not seed noise" in u["spans"] and set(u["factors"]) >= {"TTFT", "throughput"}
    # the central run is the run without --uncertainty: same requests, same summary but the intervals
    assert (out / "requests.parquet").read_bytes() == (plain / "requests.parquet").read_bytes()
    p = json.loads((plain / "summary.json").read_text())
    for g in [*s["classes"].values(), s["overall"]]:
        for k in [k for k in g if k.endswith(("_lo", "_hi"))]:
            del g[k]
    del s["run"]["uncertainty"]
    assert s == p


def test_run_uncertainty_gives_the_same_bytes_twice(tmp_path):
    _, a = _run(tmp_path, "a", "--uncertainty")
    _, b = _run(tmp_path, "b", "--uncertainty")
    for f in ("summary.json", "requests.parquet", "timeseries.parquet"):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f


def test_compare_calls_overlapping_intervals_same_within_the_model(tmp_path):
    def write(name, v, lo, hi):
        d = tmp_path / name
        d.mkdir()
        g = {"ttft_p99_s": v, "ttft_p99_s_lo": lo, "ttft_p99_s_hi": hi}
        d.joinpath("summary.json").write_text(json.dumps({"seed": 1, "classes": {"c": g}, "overall": g}))
        return d

    a, b, far = write("a", 1.0, 0.8, 1.3), write("b", 1.2, 0.9, 1.5), write("far", 2.0, 1.6, 2.5)
    df = compare_runs(a, b, ["ttft_p99_s"])
    assert set(df.better) == {WITHIN_MODEL}
    assert set(compare_runs(a, far, ["ttft_p99_s"]).better) == {"a"}


def test_capacity_reports_gpus_with_an_interval(tmp_path):
    out = tmp_path / "cap"
    res = CliRunner().invoke(main, ["capacity", KNIFE, "--designs", "shared", "--max-replicas", "16",
                                    "--workers", "1", "--no-plots", "--out", str(out)])
    assert res.exit_code == 0, res.output + res.stderr
    a = json.loads((out / "capacity.json").read_text())["designs"]["shared"]
    u = a["uncertainty"]
    span = (f"{u['gpus_lo']} to more than --max-replicas=16 replicas" if u["gpus_hi"] is None
            else f"{u['gpus_lo']}-{u['gpus_hi']}")
    assert f"shared: {a['gpus']} GPUs ({span};" in res.stdout
    assert u["gpus_lo"] <= a["gpus"] and u["kinds"] == ["TPOT/ITL"]
    off = CliRunner().invoke(main, ["capacity", KNIFE, "--designs", "shared", "--max-replicas", "16", "--workers",
                                    "1", "--no-plots", "--no-uncertainty", "--out", str(tmp_path / "off")])
    assert off.exit_code == 0 and "GPUs (" not in off.stdout


# ---- sweep, tune and the report ---------------------------------------------------------------
def _sweep(tmp_path, name, *extra):
    out = tmp_path / name
    res = CliRunner().invoke(main, ["sweep", "--set", "horizon_s=3.0", "--loads", "0.5,1", "--workers", "1",
                                    "--no-progress", "--no-plots", "--out", str(out), *extra])
    assert res.exit_code == 0, res.output + res.stderr
    return res, out


def test_sweep_uncertainty_adds_interval_columns_and_keeps_each_cells_run(tmp_path):
    res, out = _sweep(tmp_path, "u", "--uncertainty")
    _, plain = _sweep(tmp_path, "p")
    df, p = pd.read_parquet(out / "sweep.parquet"), pd.read_parquet(plain / "sweep.parquet")
    # the runs at the time factors are runs of the sweep, not rows of its table
    assert len(df) == len(p) and set(df.run_id) == set(p.run_id)
    extra = sorted(d.name for d in (out / "runs").iterdir() if "__cost_scale=x" in d.name)
    n = len(unc.shipped().factors())
    assert len(extra) == 2 * n
    axes = json.loads((out / "runs" / extra[0] / "sweep_run.json").read_text())["axes"]
    assert axes["cost_scale"] in unc.shipped().factors()
    for m in ("ttft_p99_s", "e2e_p99_s", "output_tokens_per_s"):
        ok = df[m].notna()
        assert (df[f"{m}_lo"][ok] <= df[m][ok]).all() and (df[m][ok] <= df[f"{m}_hi"][ok]).all()
        assert (df[f"{m}_lo"][ok] < df[f"{m}_hi"][ok]).any()
    # central values are the sweep without --uncertainty, byte for byte in each cell's folder
    pd.testing.assert_frame_equal(df[p.columns], p)
    for rid in p.run_id.unique():
        for f in ("summary.json", "requests.parquet"):
            assert (out / "runs" / rid / f).read_bytes() == (plain / "runs" / rid / f).read_bytes()
    assert "(" in res.stdout and "80% interval from the cost model's error" in res.stdout
    meta = json.loads((out / "sweep.json").read_text())["uncertainty"]
    assert meta["runs_added"] == 2 * n and meta["level"] == 0.8


def test_sweep_uncertainty_resumes_its_extra_runs_and_gives_the_same_bytes(tmp_path):
    import shutil

    _, a = _sweep(tmp_path, "a", "--uncertainty")
    _, b = _sweep(tmp_path, "b", "--uncertainty")
    assert (a / "sweep.parquet").read_bytes() == (b / "sweep.parquet").read_bytes()
    gone = next(d for d in sorted((b / "runs").iterdir()) if "__cost_scale=x" in d.name)
    shutil.rmtree(gone)
    res, _ = _sweep(tmp_path, "b", "--uncertainty")
    assert "runs: 1 done," in res.stdout
    assert (a / "sweep.parquet").read_bytes() == (b / "sweep.parquet").read_bytes()


def test_sweep_figures_draw_the_interval_as_a_hatched_band(tmp_path):
    from sim.experiments.plots import sweep_figures

    _, out = _sweep(tmp_path, "u", "--uncertainty")
    fig = sweep_figures(out)["throughput_vs_load"]
    hatched = [c for ax in fig.axes for c in ax.collections if c.get_hatch()]
    assert hatched and "hatched: the cost model's 80 % interval" in fig._suptitle.get_text()


def _tune(tmp_path, name, *extra):
    import tomli_w

    from tests.conftest import small_scenario

    p = tmp_path / "s.toml"
    if not p.exists():
        p.write_text(tomli_w.dumps(small_scenario(horizon_s=2.0)))
    out = tmp_path / name
    res = CliRunner().invoke(main, ["tune", str(p), "--out", str(out), "--trials", "2", "--no-plots",
                                    "--space", "engine.max_num_seqs=2..8", "--maximize", "output_tokens_per_s",
                                    "--slo", "hi:ttft=5", *extra])
    assert res.exit_code == 0, res.output + res.stderr
    return res, json.loads((out / "tune.json").read_text())


def test_tune_uncertainty_reevaluates_the_best_and_the_defaults_only(tmp_path):
    pytest.importorskip("optuna")
    res, info = _tune(tmp_path, "u", "--uncertainty")
    _, plain = _tune(tmp_path, "p")
    u = info["uncertainty"]
    assert u["level"] == 0.8 and "not every trial" in u["evaluated"] and "not every trial" in res.stdout
    for which, m in (("default", info["default"]), ("best", info["best"]["measure"])):
        lo, hi = u[which]["objectives"]["output_tokens_per_s"]
        v = m["objectives"]["output_tokens_per_s"]["mean"]
        assert lo <= v <= hi  # (an arrival-bound throughput barely moves)
        assert f"{v:.4g} ({lo:.3g}-{hi:.3g})" in res.stdout
        slo_lo, slo_hi = u[which]["slo"]["hi.ttft"]
        assert slo_lo <= m["slo"]["hi.ttft"] <= slo_hi and slo_lo < slo_hi
    # the search and its central values are the tune without --uncertainty
    assert info["best"] == plain["best"] and info["default"] == plain["default"]
    # determinism: the same intervals again
    _, again = _tune(tmp_path, "u2", "--uncertainty")
    assert again["uncertainty"] == u


def test_report_shows_the_intervals_of_a_run_a_sweep_and_a_capacity_search(tmp_path):
    pytest.importorskip("plotly")
    from sim.experiments.report import write_report

    _, run = _run(tmp_path, "r", "--uncertainty")
    _, plain = _run(tmp_path, "p")
    s = json.loads((run / "summary.json").read_text())["classes"]["interactive"]
    html = write_report(run).read_text()
    assert unc.fmt(s["ttft_p99_s"], s["ttft_p99_s_lo"], s["ttft_p99_s_hi"]).split(" ")[1] in html  # "(lo-hi)"
    assert '"error_y"' in html and "80 % interval from the cost model" in html
    assert '"error_y"' not in write_report(plain).read_text()  # without intervals: as before
    _, sw = _sweep(tmp_path, "s", "--uncertainty")
    html = write_report(sw).read_text()
    assert '"fillpattern"' in html and "Hatched band" in html
    cap = tmp_path / "cap"
    res = CliRunner().invoke(main, ["capacity", KNIFE, "--designs", "shared", "--max-replicas", "16",
                                    "--workers", "1", "--no-plots", "--out", str(cap)])
    assert res.exit_code == 0, res.output + res.stderr
    a = json.loads((cap / "capacity.json").read_text())["designs"]["shared"]
    html = write_report(cap).read_text()
    assert f"{a['gpus']} ({a['uncertainty']['gpus_lo']}-" in html and '"error_y"' in html


def test_factors_that_print_alike_are_one_run():
    """Runs at the time factors are named by 4 significant digits (``x1.169``): two kinds'
    factors that print alike (1.1685 and 1.169) are one factor, so a sweep's run ids stay
    unique (they collided when the shipped distribution moved to those values)."""
    from sim.experiments.uncertainty import Distribution

    d = Distribution({"TPOT/ITL": (0.8416, 1.1685), "throughput": (0.7789, 1.169)}, "test")
    assert d.factors() == [0.7789, 0.8416, 1.169]
    assert d.by_kind["TPOT/ITL"] == (0.8416, 1.169)
    assert len({f"x{f:.4g}" for f in d.factors()}) == len(d.factors())
