"""``priosim sensitivity``: knobs ranked by how much they move the metric (one at a time, or
Sobol' indices), a tornado chart, priosim-only knobs marked, the same bytes for the same seed."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.experiments.sensitivity import parse_range, split_ranges

KNOBS = "engine.max_batched_tokens,classes.batch.max_prefill_tokens_per_step"
SHORT = ["--set", "horizon_s=10", "--set", "drain=false"]  # (a short day: fast runs)


def _run(out, *extra):
    res = CliRunner().invoke(main, ["sensitivity", "chat_vs_batch", "--knobs", KNOBS, *SHORT, "--out", str(out),
                                    *extra])
    assert res.exit_code == 0, res.output + res.stderr
    return res


def test_oat_ranks_knobs_draws_the_tornado_and_marks_priosim_only(tmp_path):
    res = _run(tmp_path / "a", "--workers", "2")
    doc = json.loads((tmp_path / "a" / "sensitivity.json").read_text())
    assert doc["method"] == "oat" and doc["metric"] == "worst p99/SLO"
    assert doc["simulations"] == 8  # the base, 3 levels of one knob, OFF + 3 of the other
    rows = doc["knobs"]
    assert {r["knob"] for r in rows} == set(KNOBS.split(","))
    assert [r["rank"] for r in rows] == [1, 2]
    assert rows[0]["swing"] >= rows[1]["swing"] > 0
    cap = next(r for r in rows if r["knob"].startswith("classes."))
    assert cap["priosim_only"] and [p["value"] for p in cap["points"]] == [0, 256, 1024, 4096]
    assert not next(r for r in rows if r["knob"] == "engine.max_batched_tokens")["priosim_only"]
    assert "sensitivity chat_vs_batch: 2 knobs, metric worst p99/SLO, oat: 8 simulations" in res.stdout
    assert "low -> metric" in res.stdout and "priosim-only" in res.stdout
    assert "priosim-only: classes.batch.max_prefill_tokens_per_step has no vLLM or SGLang flag" in res.stdout
    png = (tmp_path / "a" / "tornado.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert "sensitivity.csv" in {p.name for p in (tmp_path / "a").iterdir()}
    # the same seed gives the same bytes (one worker or two)
    _run(tmp_path / "b", "--workers", "1")
    for name in ("sensitivity.json", "sensitivity.csv", "tornado.png"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_sobol_indices(tmp_path):
    pytest.importorskip("SALib")
    res = _run(tmp_path / "s", "--method", "sobol", "--samples", "2", "--no-plots")
    doc = json.loads((tmp_path / "s" / "sensitivity.json").read_text())
    assert doc["method"] == "sobol" and doc["simulations"] == 2 * (2 + 2)
    assert "8 simulations (2 samples x (2 knobs + 2))" in res.stdout
    rows = doc["knobs"]
    assert rows[0]["ST"] >= rows[1]["ST"]
    assert all({"S1", "ST", "S1_conf", "ST_conf"} <= set(r) for r in rows)
    assert not (tmp_path / "s" / "tornado.png").exists()


def test_ranges():
    k = parse_range("engine.max_prefill_chunk", "0/256..8192:log")
    assert k.integer and k.log and k.off == 0
    assert k.levels(3) == [0, 256, 1448, 8192]
    f = parse_range("load", "0.5..1.5")
    assert not f.integer and f.levels(3) == [0.5, 1.0, 1.5]
    assert split_ranges("policy.name=fcfs,priority,load=0.8..1.2") == {"policy.name": "fcfs,priority",
                                                                       "load": "0.8..1.2"}
    assert parse_range("policy.name", "fcfs,priority").choices == ("fcfs", "priority")


def test_a_class_with_no_tpot_sample_misses_its_slo_as_tune_judges_it(tmp_path):
    # with no cap, none of chat's requests finishes in the 10 s (no TPOT at all): that misses
    # the TPOT SLO, it does not leave the ratio to TTFT alone (which would read 0.95, met)
    from sim.experiments.sensitivity import Metric
    from sim.experiments.slos import MISSED
    from sim.experiments.tune import SLO

    res = _run(tmp_path / "a", "--workers", "2")
    doc = json.loads((tmp_path / "a" / "sensitivity.json").read_text())
    cap = next(r for r in doc["knobs"] if r["knob"].startswith("classes."))
    by_value = {p["value"]: p["metric"] for p in cap["points"]}
    assert by_value[0] == MISSED == doc["base_metric"]
    assert 1.0 < by_value[4096] < MISSED and by_value[256] < 1.0
    assert "0 -> missed" in res.stdout and "of the scenario as it is: missed" in res.stdout
    # the same judgement as tune's: a missing measure violates the constraint
    summary = {"classes": {"chat": {"ttft_p99_s": 0.25, "tpot_p99_s": None}}}
    assert Metric().read(summary, {"chat": (0.5, 0.1)}) == MISSED
    assert SLO("chat", "tpot", 0.1).violation(SLO("chat", "tpot", 0.1).measure(summary, None)) > 0
    assert Metric().read({"classes": {"chat": {"ttft_p99_s": 0.25, "tpot_p99_s": 0.05}}},
                         {"chat": (0.5, 0.1)}) == pytest.approx(0.5)


@pytest.mark.parametrize("extra, needle", [
    (["--knobs", "load", "--ranges", "load=0..2"], "--ranges load: expected arrival-rate multipliers > 0 (got 0)"),
    (["--knobs", "load", "--method", "sobol", "--samples", "6"], "--samples: expected a power of 2 (got 6)"),
])
def test_bad_input_is_one_line_before_any_run(tmp_path, extra, needle):
    res = CliRunner().invoke(main, ["sensitivity", "chat_vs_batch", *SHORT, "--out", str(tmp_path / "o"), *extra])
    assert res.exit_code == 2 and res.output.strip() == f"error: {needle}", res.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("extra, line", [
    (["--samples", "16"], "warning: --samples 16: read by --method sobol only, so this oat study ignores it"),
    (["--method", "sobol", "--samples", "2", "--levels", "5"],
     "warning: --levels 5: read by --method oat only, so this sobol study ignores it"),
])
def test_a_flag_the_method_does_not_read_is_warned_of(tmp_path, extra, line):
    if "sobol" in extra:
        pytest.importorskip("SALib")
    res = CliRunner().invoke(main, ["sensitivity", "chat_vs_batch", "--knobs", "load", *SHORT, "--no-plots",
                                    "--out", str(tmp_path / "o"), *extra])
    assert res.exit_code == 0, res.output
    assert [ln for ln in res.output.splitlines() if ln.startswith("warning: --")] == [line], res.output
