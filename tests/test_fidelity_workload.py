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
