"""The per-request column table (sim/core/columns.py) is the one description of requests.parquet:
every recorded column reads a Request attribute, the table a run writes has exactly these
columns with these dtypes, and the summary and compare take their statistics from it."""
from __future__ import annotations

import numpy as np
import pandas as pd

from sim import load_scenario, simulate
from sim.core.columns import COLUMNS, CONVERSIONS, DERIVED, RECORDED, STATS, STR
from sim.core.request import FIELDS
from sim.experiments.compare import METRICS


def test_every_recorded_column_reads_request_slots_and_a_known_conversion():
    slots = set(FIELDS)
    for c in RECORDED:
        assert c.source and set(c.source) <= slots, c.name
        assert c.convert == "" and len(c.source) == 1 or c.convert in CONVERSIONS, c.name
        assert c.derive is None
    assert all(c.derive is not None and not c.source for c in DERIVED)
    assert len({c.name for c in COLUMNS}) == len(COLUMNS)


def test_a_run_writes_exactly_the_table_with_its_dtypes():
    res = simulate(load_scenario("chat_vs_batch", overrides=["horizon_s=20"]))
    req = res.requests
    assert list(req.columns) == [c.name for c in COLUMNS]
    for c in COLUMNS:
        if c.dtype == STR:
            assert pd.api.types.is_string_dtype(req[c.name]), c.name
        else:
            assert req[c.name].dtype == np.dtype(c.dtype), c.name
    for cls in res.summary_dict["classes"].values():
        assert {s.key for s in STATS} <= set(cls)
    columns = {c.name for c in COLUMNS}
    assert all(s.column in columns and (not s.per or s.per in columns) for s in STATS)


def test_compare_lists_the_statistics_the_table_marks():
    keys = [m for m, _ in METRICS]
    assert [s.key for s in STATS if s.compare] == [k for k in keys if k in {s.key for s in STATS}]
    assert len(keys) == len(set(keys))
