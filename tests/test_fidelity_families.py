"""Fidelity rows that name a bundled model (MoE / FP8 families) and their own summary line."""
from __future__ import annotations

import pandas as pd

from calibrate.fidelity.suite import FAMILY_KEY, load_table, run_table, scenario_for, summary


def _row(table, rid):
    return table[table.id == rid].iloc[0].to_dict()


def test_model_row_derives_its_profile(tmp_path):
    # an empty profile: the model keys of engine_settings go to the engine, no engine.profile
    # (the checkpoint served, Qwen3-235B-A22B-Instruct-2507-FP8, is block-scaled FP8)
    row = _row(load_table(), "gs-q3-235b-fp8-h100-vllm-tp4ep4-sharegpt")
    eng = scenario_for(row, tmp_path)["engine"]
    assert "profile" not in eng
    assert (eng["model"], eng["gpu"], eng["tp"], eng["ep"], eng["dtype"]) == ("qwen3-235b-a22b", "h100-pcie", 4, 4, "fp8-block")


def test_model_row_averages_windowed_layers_at_its_own_requests_length(tmp_path):
    # docs/models.md: set engine.typical_context to the typical prompt + output length
    row = _row(load_table(), "gs-oss20b-h100-vllm-rand2k")
    eng = scenario_for(row, tmp_path)["engine"]
    assert eng["typical_context"] == int(row["prompt_tokens"]) + int(row["output_tokens"])


def test_model_row_runs():
    table = load_table()
    res = run_table(table[table.id == "gs-oss120b-h100-vllm-c4-tpot-med"])
    assert len(res) == 1 and res.family.iloc[0] == "moe"
    assert res.simulated.iloc[0] > 0


def test_family_rows_are_held_out_and_reported_apart():
    table = load_table()
    fam = table[table.family != ""]
    assert len(fam) >= 12 and set(fam.split) == {"held-out"}
    assert set(fam.family) <= {"moe", "fp8", "moe-fp8"}
    assert (table[table.family == ""].profile != "").all()  # dense rows keep their shipped profiles
    res = pd.DataFrame({"id": list("abc"), "split": ["fit", "held-out", "held-out"],
                        "family": ["", "moe", "moe-fp8"], "error": [0.0, 0.2, -0.4]})
    s = summary(res)
    assert s[FAMILY_KEY]["rows"] == 2 and abs(s[FAMILY_KEY]["median"] - 0.3) < 1e-12
    assert s["all"]["rows"] == 3
