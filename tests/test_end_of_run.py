"""The end of a run, done faster, gives the same tables: a merged Telemetry (a cluster's replicas)
reads its parts' records in place; the inter-token gaps tallied by hashing (``pandas.factorize``)
equal those tallied by sorting and the plain reference; string columns converted by Arrow equal
pandas' conversion (and keep its dtypes where Arrow is not used); each request's replica is
looked up as ``Series.map`` did."""
from __future__ import annotations

from array import array

import gc

import numpy as np
import pandas as pd
import pytest

from sim import load_scenario
from sim.cluster import simulate_cluster
from sim.cluster.results import _replica_of
from sim.core.columns import FLOAT, RECORDED, STR
from sim.core.states import State
from sim.core.telemetry import Telemetry
from sim.results import _strings

CLASSES = ["a", "b", "c"]


def _telemetry(rng: np.random.Generator, rows: int, steps: int) -> Telemetry:
    """A replica's Telemetry with random records: request columns, single gaps, per-step gaps
    and cohort steps (few distinct durations, some weights zero)."""
    t = Telemetry(CLASSES, 10**9)
    for k, col in t.raw.items():
        if isinstance(col, list):
            col.extend(rng.choice(["x", "y", "z"], rows).tolist())
        elif col.typecode == "d":
            col.fromlist(rng.random(rows).tolist())
        elif k == "state":  # (an ended request's)
            col.fromlist(rng.choice([State.FINISHED, State.REJECTED, State.UNFINISHED], rows).tolist())
        else:
            col.fromlist(rng.integers(-1, 10**6, rows).tolist())
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
    own = [t.columns() for t in tels]
    for got in (m.columns(), nested.columns()):
        for c in RECORDED:
            whole = [x for cols in own for x in list(cols[c.name])]
            if c.dtype == STR:
                assert got[c.name] == whole
            else:
                assert got[c.name].dtype == (np.float64 if c.dtype == FLOAT else np.int64)
                np.testing.assert_array_equal(got[c.name], whole)
    assert m.rows_recorded() == sum(t.rows_recorded() for t in tels)
    for ci in range(len(CLASSES)):
        ref = _reference_gaps(tels, ci)
        for tel in (m, nested):
            for factorize in (None, pd.factorize):
                vals, counts = tel.itl_arrays(ci, factorize)
                assert vals.dtype == counts.dtype == np.int64
                assert vals.tolist() == ref[0].tolist() and counts.tolist() == ref[1].tolist()


@pytest.mark.parametrize("factorize", [None, pd.factorize])
def test_replicas_without_gaps_count_as_none(factorize):
    """Parts are tallied one by one, then merged: a replica with no gaps (or no replica with
    any) adds nothing, and the arrays keep their dtypes."""
    rng = np.random.default_rng(5)
    empty = Telemetry(CLASSES, 10**9)
    tels = [empty, _telemetry(rng, 3, 50), Telemetry(CLASSES, 10**9)]
    m = Telemetry.merged(tels, CLASSES, 10**9)
    none = Telemetry.merged([empty, Telemetry(CLASSES, 10**9)], CLASSES, 10**9)
    for ci in range(len(CLASSES)):
        ref = _reference_gaps(tels, ci)
        vals, counts = m.itl_arrays(ci, factorize)
        assert vals.tolist() == ref[0].tolist() and counts.tolist() == ref[1].tolist()
        for t in (empty, none):
            vals, counts = t.itl_arrays(ci, factorize)
            assert vals.dtype == counts.dtype == np.int64 and len(vals) == len(counts) == 0


@pytest.mark.parametrize("scale", [10**6, 10**8])  # (gaps up to 0.05 s hash as 32-bit ints; up to 5 s cannot)
def test_long_gaps_are_tallied_the_same(scale):
    rng = np.random.default_rng(11)
    tels = [_telemetry(rng, 2, 300) for _ in range(2)]
    for t in tels:
        for a in [t.coh_itl_vals, *t.itl_scalars, *t.itl_step_vals]:
            a[:] = array("q", [v * scale + 7 for v in a])
    assert max(max(t.coh_itl_vals) for t in tels) >= (2**31 if scale > 10**6 else 0)
    m = Telemetry.merged(tels, CLASSES, 10**9)
    for ci in range(len(CLASSES)):
        ref = _reference_gaps(tels, ci)
        for factorize in (None, pd.factorize):
            m._gap_codes = None
            vals, counts = m.itl_arrays(ci, factorize)
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


@pytest.mark.parametrize("rows", [0, 1, 500])
def test_group_column_equals_the_list_of_names(rows):
    """Each request's group name, taken by Arrow from the replicas' names, is the column a list
    of the names gives: values and dtype."""
    names = ["prefill-pool", "decode", "decode", "small"]
    replica = np.random.default_rng(rows).integers(0, len(names), rows)
    want, got = pd.DataFrame({"a": np.arange(rows)}), pd.DataFrame({"a": np.arange(rows)})
    want.insert(1, "group", [names[i] for i in replica.tolist()])
    got.insert(1, "group", _strings(names, replica) if len(replica) else [])
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    assert list(got.dtypes) == list(want.dtypes)


def _reference_add_cohort(tel: Telemetry, coh) -> None:
    """add_cohort as first written (a search per step, np.unique of intervals and pairs)."""
    as64 = lambda a: np.frombuffer(a, dtype=np.int64)  # noqa: E731
    durs = as64(coh.log_durs)
    n = len(durs)
    at, t0 = as64(coh.log_run_at), as64(coh.log_run_ns)
    cs = np.cumsum(durs)
    run = np.searchsorted(at, np.arange(n), side="right") - 1
    bins = (t0[run] + cs - (cs[at] - durs[at])[run]) // tel.interval_ns
    j0, j1, cls, ten = as64(coh.log_j0), as64(coh.log_j1), as64(coh.log_cls), as64(coh.log_tenant)
    gaps = durs.copy()
    for at_, pause in zip(coh.log_pause_at, coh.log_pause_ns):  # (the step after steps sat out)
        gaps[at_] += pause
    tel.coh_itl_vals.frombytes(gaps.tobytes())
    uniq_bins, step_bin = np.unique(bins, return_inverse=True)
    for ci in range(len(tel.class_names)):
        mine = cls == ci
        members = np.cumsum(np.bincount(j0[mine], minlength=n + 1) - np.bincount(j1[mine], minlength=n + 1))[:n]
        tel.coh_itl_wts[ci].frombytes(members.tobytes())
        tokens = np.bincount(step_bin, weights=members, minlength=len(uniq_bins))
        for b, m in zip(uniq_bins.tolist(), tokens.tolist()):
            if m:
                tel.tokens_bin[(b, ci)] += int(m)
    names = list(coh.tenant_ids)
    spans = j1 > j0
    j0, j1, ten = j0[spans], j1[spans], ten[spans]
    first = np.searchsorted(step_bin, np.arange(len(uniq_bins) + 1))
    k0 = step_bin[j0]
    reps = step_bin[j1 - 1] - k0 + 1
    span = np.repeat(np.arange(len(j0)), reps)
    k = k0[span] + np.arange(len(span)) - np.repeat(np.cumsum(reps) - reps, reps)
    steps = np.minimum(j1[span], first[k + 1]) - np.maximum(j0[span], first[k])
    nt = max(len(names), 1)
    keys, inverse = np.unique(k * nt + ten[span], return_inverse=True)
    sums = np.bincount(inverse.ravel(), weights=steps, minlength=len(keys))
    interval = uniq_bins.tolist()
    for kb, t, m in zip((keys // nt).tolist(), (keys % nt).tolist(), sums.tolist()):
        tel.tenant_tokens_bin[(interval[kb], names[t])] += int(m)


class _CohortLog:
    """A decode cohort's log (the attributes add_cohort reads): runs of steps one after another
    in time, some after steps the members sat out, and members' spans of steps with a class and
    a tenant."""

    def __init__(self, rng: np.random.Generator, tenants: int) -> None:
        self.log_durs, self.log_run_at, self.log_run_ns = array("q"), array("q"), array("q")
        self.log_pause_at, self.log_pause_ns = array("q"), array("q")  # (steps sat out before a run)
        t = int(rng.integers(0, 10**9))
        for _ in range(int(rng.integers(1, 60))):
            k = int(rng.integers(1, 30))  # (a cohort's run has a step at least: Cohort.advance)
            if self.log_durs and rng.random() < 0.3:
                self.log_pause_at.append(len(self.log_durs))
                self.log_pause_ns.append(int(rng.integers(1, 10**8)))
            self.log_run_at.append(len(self.log_durs))
            self.log_run_ns.append(t)
            d = rng.integers(10**6, 4 * 10**8, k).tolist()
            self.log_durs.extend(d)
            t += sum(d) + int(rng.integers(0, 2 * 10**9))
        n, m = len(self.log_durs), int(rng.integers(1, 300))
        j0 = rng.integers(0, n + 1, m)
        self.log_j0 = array("q", j0.tolist())
        self.log_j1 = array("q", (j0 + rng.integers(0, 40, m)).clip(0, n).tolist())
        self.log_cls = array("q", rng.integers(0, len(CLASSES), m).tolist())
        self.log_tenant = array("q", rng.integers(0, tenants, m).tolist())
        self.tenant_ids = {f"t{i}": i for i in range(tenants)}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("tenants", [1, 3, 50_000])  # (50k: more (interval, tenant) pairs than are counted in bins)
def test_cohort_log_folds_into_the_same_counts_as_first_written(seed, tenants):
    coh = _CohortLog(np.random.default_rng(seed), tenants)
    got, want = Telemetry(CLASSES, 10**9), Telemetry(CLASSES, 10**9)
    got.add_cohort(coh)
    _reference_add_cohort(want, coh)
    assert list(got.tokens_bin.items()) == list(want.tokens_bin.items())
    assert list(got.tenant_tokens_bin.items()) == list(want.tenant_tokens_bin.items())
    assert got.coh_itl_vals == want.coh_itl_vals and got.coh_itl_wts == want.coh_itl_wts


def test_a_cluster_run_leaves_the_collector_as_it_found_it():
    """The setup and the end of a run keep the collector quiet too: its settings come back."""
    before = gc.get_threshold()
    sc = load_scenario("diurnal_two_class", overrides=["horizon_s=30", "cluster={replicas=2}"])
    res = simulate_cluster(sc)
    assert len(res.requests) and gc.isenabled()
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


@pytest.mark.parametrize("top", [2**20, 2**40, 2**62 + 5])  # (the last: beyond the table's differences)
def test_crowded_and_scattered_gaps_are_tallied_the_same(top):
    """Gaps near the smallest are counted in a table by value, the rest hashed: a run whose
    gaps crowd near the smallest with a long tail (up to ``top`` ns) tallies as the reference."""
    rng = np.random.default_rng(13)
    tels = [_telemetry(rng, 2, 400) for _ in range(2)]
    for t in tels:
        for a in [t.coh_itl_vals, *t.itl_scalars, *t.itl_step_vals]:
            tail = rng.random(len(a)) < 0.2
            a[:] = array("q", [int(rng.integers(top // 2, top)) if far else 10**6 + v
                               for v, far in zip(a, tail)])
    m = Telemetry.merged(tels, CLASSES, 10**9)
    for tel in (m, tels[0]):
        for ci in range(len(CLASSES)):
            ref = _reference_gaps(tels if tel is m else tels[:1], ci)
            for factorize in (None, pd.factorize):
                tel._gap_codes = None
                vals, counts = tel.itl_arrays(ci, factorize)
                assert vals.dtype == counts.dtype == np.int64
                assert vals.tolist() == ref[0].tolist() and counts.tolist() == ref[1].tolist()
