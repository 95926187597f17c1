"""The fidelity suite's ShareGPT requests (calibrate/fidelity/workload.py): the benchmarks' filters,
the median draw of the turns table, the published means."""
from __future__ import annotations

import numpy as np

from calibrate.fidelity.workload import sharegpt_lengths, sharegpt_table


def test_turns_table_is_the_first_two_turns_as_token_counts():
    t = sharegpt_table()
    assert list(t.columns) == ["prompt", "output"] and len(t) == 17_400
    assert (t >= 0).all().all()


def test_pairs_pass_the_benchmark_filters_and_keep_the_heavy_output_tail():
    """vLLM's filters (>= 4 tokens each, prompt <= 1024, prompt + output <= 2048); the outputs
    keep ShareGPT's shape: a median well under the mean and a long tail."""
    p, o = sharegpt_lengths(1000, seed=0)
    assert len(p) == len(o) == 1000
    assert p.min() >= 4 and o.min() >= 4 and p.max() <= 1024 and (p + o).max() <= 2048
    assert np.median(o) < 0.8 * o.mean()
    assert np.quantile(o, 0.99) > 3 * np.median(o)


def test_the_seed_orders_the_median_draw_but_does_not_change_it():
    a = sharegpt_lengths(200, seed=0)
    b = sharegpt_lengths(200, seed=1)
    assert sorted(zip(*a)) == sorted(zip(*b))
    assert not np.array_equal(a[1], b[1])
    assert np.array_equal(a[1], sharegpt_lengths(200, seed=0)[1])


def test_lengths_are_scaled_to_the_published_means():
    p, o = sharegpt_lengths(1000, seed=0, prompt_mean=215.2, output_mean=198.0)
    assert abs(p.mean() - 215.2) < 1.0 and abs(o.mean() - 198.0) < 1.0


def test_each_request_asks_for_its_own_output_length(tmp_path):
    """Both benchmark clients send max_tokens = the request's output length (``vllm bench serve``
    max_tokens, ``sglang.bench_serving`` max_new_tokens); SGLang's admission reserves it, so the
    run's longest output as every request's max_tokens would hold its batch back. An open row
    (200 requests at 16/s) and a closed-loop one (4 clients) alike."""
    from calibrate.fidelity.suite import load_table, scenario_for
    from sim import scenario_from_dict, simulate

    table = load_table()
    for rid in ("sgl6168-8b-h200-fa3-1k1k-otput", "gs-q3-8b-h100-sglang-c4-tpot-med"):
        row = table[table.id == rid].iloc[0].to_dict()
        r = simulate(scenario_from_dict(scenario_for(row, tmp_path), base_dir=tmp_path)).requests
        assert len(r) >= int(row["n"]) and (r.max_tokens == r.output_tokens).all(), rid
        assert r.output_tokens.nunique() > 10, rid  # (lengths differ: a per-request max_tokens)


def test_sglang_rows_run_as_sglang_with_its_admission(tmp_path):
    """Every SGLang row names its engine and release, so it runs with what ``engine.engine =
    "sglang"`` gives a scenario (its admission, retraction and KV pool), not the suite's base keys."""
    from pathlib import Path

    from calibrate.fidelity.suite import engine_settings, load_table, scenario_for
    from sim import scenario_from_dict

    table = load_table()
    rows = table[table.engine == "sglang"]
    assert len(rows) >= 20
    for row in rows.to_dict("records"):
        s = engine_settings(row["engine_settings"])
        assert s["engine"] == "sglang" and row["engine_version"].split()[0].startswith(("0.", "main")), row["id"]
        assert "max_num_seqs" not in s, row["id"]  # (SGLang's own cap, not the suite's)
    row = rows[rows.id == "gs-q3-14b-h100-sglang-sharegpt"].iloc[0].to_dict()
    eng = scenario_from_dict(scenario_for(row, tmp_path), base_dir=Path(tmp_path)).engine
    assert (eng.admission_estimate, eng.victim, eng.block_size) == ("sglang", "sglang", 1)
    assert eng.mem_fraction_static is not None and eng.kv_blocks > 0
