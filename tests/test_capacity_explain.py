"""``priosim capacity`` says why: the margin at the answer, the binding limit (queueing or the
per-step time, with the step-time component) and a warning when the answer rests on a knife
edge (tests/data/capacity_knife_edge.toml: chat's TPOT flat in the replica count)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from click.testing import CliRunner

from sim.cli import main
from sim.experiments.capacity_explain import _judge, summarise_steps

KNIFE = str(Path(__file__).parent / "data" / "capacity_knife_edge.toml")


def _capacity(tmp_path, *extra):
    out = tmp_path / "cap"
    res = CliRunner().invoke(main, ["capacity", KNIFE, "--designs", "shared", "--max-replicas", "16",
                                    "--workers", "1", "--no-plots", "--out", str(out), *extra])
    assert res.exit_code == 0, res.output + res.stderr
    doc = json.loads((out / "capacity.json").read_text())
    return res, doc["explain"]["designs"]["shared"][0], doc


def test_knife_edge_warns_and_binds_on_the_step_time(tmp_path):
    res, info, doc = _capacity(tmp_path)
    assert info["binding"] == "per-step time"
    assert info["flat"]
    assert info["at_answer"]["class"] == "chat" and info["at_answer"]["metric"] == "tpot"
    assert info["below"]["ratio"] > 1 >= info["at_answer"]["ratio"]
    # the step-time component: decode steps stretched by the batch's prefill
    st = info["steps"]
    assert st["mean_step_ms_with_prefill"] > 2 * st["mean_step_ms_decode_only"]
    assert 0 < st["class_decode_tokens_in_prefill_steps"] < 1
    assert "why shared: worst p99/SLO at 5" in res.stdout
    assert "binding limit: per-step time" in res.stdout
    assert "decode steps stretched by co-scheduled prefill tokens" in res.stdout
    warn = [line for line in res.stderr.splitlines() if line.startswith("warning: capacity shared")]
    assert len(warn) == 1 and "knife edge" in warn[0]
    assert "classes.*.max_prefill_tokens_per_step (priosim-only)" in warn[0]
    assert "engine.max_batched_tokens," in warn[0]
    assert doc["explain"]["warnings"] == [warn[0][len("warning: "):]]


def test_queueing_case_binds_on_queueing_without_a_warning(tmp_path):
    res, info, _ = _capacity(tmp_path, "--set", "classes.chat.tpot_slo_s=0.2")
    assert info["binding"] == "queueing"
    assert not info["flat"] and "warning" not in info and "steps" not in info
    assert info["at_answer"]["class"] == "batch" and info["at_answer"]["metric"] == "ttft"
    assert "binding limit: queueing" in res.stdout
    assert "warning: capacity" not in res.stderr


def test_the_answers_say_which_metric_binds_as_the_explanation_does():
    """The searches at the cost model's error bounds start while the explanation simulates: the
    metric that binds each answer, read from the answers themselves, is the explanation's."""
    from sim.config import load_scenario
    from sim.experiments.capacity import capacity_search
    from sim.experiments.capacity_explain import answer_kinds, explain_capacity
    from sim.experiments.slos import parse_slos

    for path, designs in [(KNIFE, ["shared"]), ("diurnal_two_class", ["shared", "partitioned"])]:
        sc = load_scenario(path, overrides=["horizon_s=60.0"])
        slos = parse_slos(sc)
        rep = capacity_search(sc, designs, slos, workers=1, max_replicas=16)
        doc = explain_capacity(rep, sc, slos, workers=1, max_replicas=16, trace=False)
        said = {info["at_answer"]["metric"] for infos in doc["designs"].values() for info in infos}
        assert answer_kinds(rep, slos, sc.class_names) == said
    rep.designs["shared"] = {"ok": False, "replicas": None, "split": None}  # (no answer: the explanation says)
    assert answer_kinds(rep, slos, sc.class_names) is None


def _w(r):
    return {"ratio": r, "class": "c", "metric": "tpot"}


def test_judge_classifies_curves():
    flat = _judge("shared", "shared", 10, {2: _w(0.99), 9: _w(1.02), 10: _w(0.98), 16: _w(0.97), 20: _w(0.965)}, 64)
    assert flat["binding"] == "per-step time" and flat["flat"] and "knife edge" in flat["warning"]
    falls = _judge("shared", "shared", 4, {3: _w(1.4), 4: _w(0.8), 8: _w(0.4)}, 64)
    assert falls["binding"] == "queueing" and not falls["flat"] and "warning" not in falls
    # no answer: the ratio stays above 1 at the limit and half of it
    stuck = _judge("partitioned", "chat", None, {8: _w(1.5), 16: _w(1.48)}, 16)
    assert stuck["binding"] == "per-step time" and "more do not help" in stuck["warning"]
    assert "partitioned chat" in stuck["warning"]


def test_summarise_steps_splits_prefill_from_decode_only_steps():
    # replica 0: step 0 prefills request 1 (100 ms) while 2 decodes; step 1 decodes both (10 ms)
    it = pd.DataFrame({"replica": [0, 0, 0, 0], "iteration": [0, 0, 1, 1],
                       "start_s": [0.0, 0.0, 0.1, 0.1], "end_s": [0.1, 0.1, 0.11, 0.11],
                       "request_id": [1, 2, 1, 2], "kind": ["prefill", "decode", "decode", "decode"],
                       "tokens": [500, 1, 1, 1]})
    req = pd.DataFrame({"request_id": [1, 2], "class": ["batch", "chat"]})
    st = summarise_steps(it, req, "chat")
    assert st["steps"] == 2 and st["steps_with_prefill"] == 1
    assert abs(st["mean_step_ms_with_prefill"] - 100) < 1e-9 and abs(st["mean_step_ms_decode_only"] - 10) < 1e-9
    assert abs(st["prefill_time_share"] - 0.09 / 0.11) < 1e-9
    assert st["class_decode_tokens_in_prefill_steps"] == 0.5
    assert abs(st["class_mean_decode_step_ms"] - 55) < 1e-9


def test_a_deadline_binds_not_the_step_time_and_a_passing_partition_is_not_blamed(tmp_path):
    """A deadline that more replicas cannot meet (the last request's own length) is named as
    the binding limit, with what moves it, not the step-time knobs; a partition that meets its
    SLOs beside one that does not is explained at its own answer, without a warning."""
    import tomli_w

    from tests.test_cluster import late_toy

    f = tmp_path / "late.toml"
    f.write_text(tomli_w.dumps(late_toy()))
    out = tmp_path / "cap"
    res = CliRunner().invoke(main, ["capacity", str(f), "--slo", "lo:done=11", "--max-replicas", "4",
                                    "--workers", "1", "--no-plots", "--no-uncertainty", "--out", str(out)])
    assert res.exit_code == 0, res.output + res.stderr
    doc = json.loads((out / "capacity.json").read_text())
    hi, lo = doc["explain"]["designs"]["partitioned"]
    assert lo["binding"] == "deadline" and lo["deadline"]["class"] == "lo" and not lo["deadline"]["implicit"]
    assert lo["deadline"]["last_arrival_s"] == 9.9
    assert hi["replicas"] == 1 and "warning" not in hi
    assert doc["designs"]["partitioned"]["found"] == {"hi": 1, "lo": None}
    assert "per-step time" not in res.stdout and "max_batched_tokens" not in res.stderr
    assert "lo's deadline (done <= 11.0 s) binds: its last request (arriving 9.9 s)" in res.stdout
    assert "--slo lo:done=S moves it" in res.stdout
    warns = [line for line in res.stderr.splitlines() if line.startswith("warning: capacity")]
    assert warns and all("lo's SLOs" in w for w in warns) and not [w for w in warns if "partitioned hi" in w]
    # the implicit deadline, when it binds, names --grace too
    res = CliRunner().invoke(main, ["capacity", str(f), "--max-replicas", "4", "--workers", "1", "--no-plots",
                                    "--no-uncertainty", "--out", str(tmp_path / "cap2")])
    assert res.exit_code == 0, res.output + res.stderr
    assert "SLO lo: done<=21s (implicit: horizon 10 s x 1.1 + 10.0 s" in res.stdout
    assert "lo's implicit deadline" in res.stdout and "--grace or --slo lo:done=S" in res.stdout
    # more replicas probed: the line says how many; none above the one tried: it says none were
    assert "even with 2 replicas, so its own length decides" in res.stdout or "even with 4 replicas" in res.stdout
    res = CliRunner().invoke(main, ["capacity", str(f), "--slo", "lo:done=11", "--designs", "shared",
                                    "--max-replicas", "1", "--workers", "1", "--no-plots", "--no-uncertainty",
                                    "--out", str(tmp_path / "cap3")])
    assert res.exit_code == 0, res.output + res.stderr
    assert "even with" not in res.output + res.stderr
    assert "and no more replicas were tried (--max-replicas), so whether more would move it is not known" in (
        res.output + res.stderr), res.output + res.stderr
