"""The end of a run, done faster, gives the same tables: a merged Telemetry (a cluster's replicas)
reads its parts' records in place; the inter-token gaps tallied by hashing (``pandas.factorize``)
equal those tallied by sorting and the plain reference; string columns converted by Arrow equal
pandas' conversion (and keep its dtypes where Arrow is not used); each request's replica is
looked up as ``Series.map`` did."""
from __future__ import annotations

from array import array

import numpy as np
import pandas as pd
import pytest

from sim.cluster.results import _replica_of
from sim.core.telemetry import Telemetry
from sim.results import _strings

CLASSES = ["a", "b", "c"]


def _telemetry(rng: np.random.Generator, rows: int, steps: int) -> Telemetry:
    """A replica's Telemetry with random records: request columns, single gaps, per-step gaps
    and cohort steps (few distinct durations, some weights zero)."""
    t = Telemetry(CLASSES, 10**9)
    for k, col in t.cols.items():
        if isinstance(col, list):
            col.extend(rng.choice(["x", "y", "z"], rows).tolist())
        elif col.typecode == "d":
            col.fromlist(rng.random(rows).tolist())
        else:
            col.fromlist(rng.integers(0, 10**6, rows).tolist())
    for ci in range(len(CLASSES)):
        t.itl_scalars[ci].fromlist(rng.integers(1, 50, int(rng.integers(0, 20))).tolist())
        k = int(rng.integers(0, steps))
        t.itl_step_vals[ci].fromlist(rng.integers(1, 50, k).tolist())
        t.itl_step_wts[ci].fromlist(rng.integers(0, 4, k).tolist())
    t.coh_itl_vals.fromlist(rng.integers(1, 50, steps).tolist())
    for ci in range(len(CLASSES)):
        t.coh_itl_wts[ci].fromlist(rng.integers(0, 3, steps).tolist())
    return t


def _reference_gaps(tels: list[Telemetry], ci: int) -> tuple[np.ndarray, np.ndarray]:
    """Every (gap, weight) of class ``ci`` in all ``tels``, tallied plainly."""
    vals, wts = [], []
    for t in tels:
        vals += list(t.itl_scalars[ci]) + list(t.itl_step_vals[ci]) + list(t.coh_itl_vals)
        wts += [1] * len(t.itl_scalars[ci]) + list(t.itl_step_wts[ci]) + list(t.coh_itl_wts[ci])
    v, w = np.array(vals, dtype=np.int64), np.array(wts, dtype=np.int64)
    uniq = np.unique(v[w > 0])
    return uniq, np.array([w[v == u].sum() for u in uniq], dtype=np.int64)


@pytest.mark.parametrize("seed", range(4))
def test_merged_telemetry_reads_its_parts_records_as_one(seed):
    rng = np.random.default_rng(seed)
    tels = [_telemetry(rng, int(rng.integers(0, 40)), int(rng.integers(1, 200))) for _ in range(3)]
    m = Telemetry.merged(tels, CLASSES, 10**9)
    nested = Telemetry.merged([Telemetry.merged(tels[:2], CLASSES, 10**9), tels[2]], CLASSES, 10**9)
    for got in (m.columns(), nested.columns()):
        for k, col in tels[0].cols.items():
            whole = [x for t in tels for x in t.cols[k]]
            if isinstance(col, array):
                assert got[k].dtype == (np.float64 if col.typecode == "d" else np.int64)
                assert got[k].tolist() == whole
            else:
                assert got[k] == whole
    assert m.rows_recorded() == sum(t.rows_recorded() for t in tels)
    for ci in range(len(CLASSES)):
        ref = _reference_gaps(tels, ci)
        for tel in (m, nested):
            for factorize in (None, pd.factorize):
                vals, counts = tel.itl_arrays(ci, factorize)
                assert vals.dtype == counts.dtype == np.int64
                assert vals.tolist() == ref[0].tolist() and counts.tolist() == ref[1].tolist()


def test_one_replicas_gaps_are_the_same_by_hashing_and_sorting():
    t = _telemetry(np.random.default_rng(9), 5, 500)
    for ci in range(len(CLASSES)):
        ref = _reference_gaps([t], ci)
        for factorize in (None, pd.factorize):
            vals, counts = t.itl_arrays(ci, factorize)
            assert vals.tolist() == ref[0].tolist() and counts.tolist() == ref[1].tolist()


@pytest.mark.parametrize("values", [["x", "y", "x", "z"], ["x", None, "y", "y"], [None, None], [1, "a", 2.5, "b"], []])
@pytest.mark.parametrize("moved", [False, True])
def test_string_columns_equal_pandas_conversion_of_the_values(values, moved):
    order = np.arange(len(values))[::-1].copy() if moved else None
    plain = values if order is None else np.array(values, dtype=object)[order]
    want = pd.DataFrame({"s": plain})["s"]
    got = pd.DataFrame({"s": _strings(values, order)}, copy=False)["s"]
    assert got.dtype == want.dtype
    pd.testing.assert_series_equal(got, want)


def test_replica_lookup_equals_series_map_and_refuses_an_unrouted_request():
    rng = np.random.default_rng(3)
    ids = rng.permutation(1000)[:700]
    assign = {int(i): int(rng.integers(0, 16)) for i in ids}
    table = np.sort(rng.choice(ids, 300, replace=False))
    want = pd.Series(table).map(assign).astype("int64").to_numpy()
    got = _replica_of(table, assign)
    assert got.dtype == np.int64 and got.tolist() == want.tolist()
    assert _replica_of(np.zeros(0, dtype=np.int64), {}).tolist() == []
    for bad in (np.array([1000]), np.array([-1]), np.sort(np.append(table, 5000))):
        with pytest.raises(ValueError):
            _replica_of(bad, assign)
    with pytest.raises(ValueError):
        _replica_of(np.array([0]), {})
