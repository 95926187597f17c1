"""Result tables taken faster stay the same numbers: the quantiles every class's, tenant's and
the overall metrics take of one column together equal those taken one at a time (and pandas')."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pytest

from sim.results import GROUP_METRICS, PCTS, QUANTILES, RequestGroups, _cdf, _gap_quantile, _nanquantile

if TYPE_CHECKING:
    from sim.core.telemetry import Telemetry


@pytest.mark.parametrize("seed", range(8))
def test_gap_quantiles_equal_numpys_weighted_ones(seed):
    """The ITL percentiles of distinct gaps in ascending order (itl_arrays' form) read off their
    cumulative weights are numpy's weighted inverted-CDF quantiles, bit for bit."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 4000))
    vals = np.unique(rng.integers(1, 10**9 if seed % 2 else 50, n * 3))[:n]
    wts = rng.integers(1, [2, 10**6][seed % 2], len(vals))
    cdf = _cdf(wts)
    for q in (0.0, 0.5, 0.9, 0.99, 1.0, *rng.random(5).tolist()):
        want = np.quantile(vals, q, weights=wts, method="inverted_cdf")
        assert _gap_quantile(vals, cdf, q) == want and float(_gap_quantile(vals, cdf, q)) == float(want)


@pytest.mark.parametrize("seed", range(5))
def test_quantiles_taken_together_equal_each_alone_and_pandas(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    a = rng.lognormal(0.0, 2.0, n) * rng.choice([1e-3, 1.0, 7.0], n)
    a[rng.random(n) < 0.2] = np.nan
    together = np.quantile(a[~np.isnan(a)], list(PCTS.values())).tolist() if (~np.isnan(a)).any() else None
    for i, q in enumerate(PCTS.values()):
        alone = _nanquantile(a, q)
        assert (together is None and alone is None) or together[i] == alone
        s = pd.Series(a).dropna()
        assert alone is None if s.empty else alone == float(s.quantile(q))


def test_group_metrics_with_and_without_the_shared_quantiles_are_identical():
    rng = np.random.default_rng(1)
    n = 500
    arrival = np.sort(rng.random(n) * 100)
    first = np.where(rng.random(n) < 0.9, arrival + rng.exponential(0.5, n), np.nan)
    finish = np.where(np.isnan(first) | (rng.random(n) < 0.1), np.nan, first + rng.exponential(5, n))
    gen = rng.integers(1, 300, n)
    t = pd.DataFrame({
        "arrival_s": arrival, "admitted_s": first - 0.01, "first_token_s": first, "finish_s": finish,
        "generated_tokens": gen, "preemptions": rng.integers(0, 3, n), "prefix_hit_tokens": rng.integers(0, 50, n),
        "prompt_tokens": rng.integers(50, 500, n), "evicted_miss_tokens": rng.integers(0, 5, n),
        "max_itl_s": np.where(gen > 1, rng.random(n), np.nan),
        "status": np.where(np.isnan(finish), "unfinished", "finished"), "reject_reason": "",
    })
    t["queue_wait_s"] = t["admitted_s"] - t["arrival_s"]
    t["ttft_s"] = t["first_token_s"] - t["arrival_s"]
    t["e2e_s"] = t["finish_s"] - t["arrival_s"]
    t["tpot_s"] = (t["finish_s"] - t["first_token_s"]) / (t["generated_tokens"] - 1).where(t["generated_tokens"] > 1)
    g = RequestGroups(t)
    rows = rng.random(n) < 0.4
    for sel in (None, rows):
        shared = g.metrics(sel, 100.0, 0.5, 0.05)
        among = {"all": sel, "finished": g.among["finished"] if sel is None else g.among["finished"] & sel,
                 "started": g.among["started"] if sel is None else g.among["started"] & sel,
                 "admitted": g.among["admitted"] if sel is None else g.among["admitted"] & sel}
        from sim.core.columns import STATS
        alone = {st.key: g._stat(st, among[st.among], 100.0) for st in STATS}  # one quantile per call
        assert {k: shared[k] for k in alone} == alone
    assert set(QUANTILES) >= {("ttft_s", "started"), ("e2e_s", "finished")}


def test_the_same_rows_selected_again_get_the_same_metrics_as_a_fresh_table():
    """A group whose rows equal an earlier group's (a tenant that is exactly one class) gets its
    figures from the memo: equal, in the same key order, to those taken afresh, with its own SLO
    figures and its own dicts."""
    rng = np.random.default_rng(4)
    n = 400
    arrival = np.sort(rng.random(n) * 50)
    first = np.where(rng.random(n) < 0.9, arrival + rng.exponential(0.5, n), np.nan)
    finish = np.where(np.isnan(first), np.nan, first + rng.exponential(5, n))
    gen = rng.integers(1, 100, n)
    status = np.where(np.isnan(first), "rejected", np.where(np.isnan(finish), "unfinished", "finished"))
    t = pd.DataFrame({
        "arrival_s": arrival, "admitted_s": first - 0.01, "first_token_s": first, "finish_s": finish,
        "generated_tokens": gen, "preemptions": rng.integers(0, 3, n), "prefix_hit_tokens": rng.integers(0, 50, n),
        "prompt_tokens": rng.integers(50, 500, n), "evicted_miss_tokens": rng.integers(0, 5, n),
        "max_itl_s": np.where(gen > 1, rng.random(n), np.nan), "status": status,
        "reject_reason": np.where(status == "rejected", "queue_full", ""),
    })
    t["queue_wait_s"] = t["admitted_s"] - t["arrival_s"]
    t["ttft_s"] = t["first_token_s"] - t["arrival_s"]
    t["e2e_s"] = t["finish_s"] - t["arrival_s"]
    t["tpot_s"] = (t["finish_s"] - t["first_token_s"]) / (t["generated_tokens"] - 1).where(t["generated_tokens"] > 1)
    cls = rng.random(n) < 0.5
    g = RequestGroups(t)
    first_time = g.metrics(cls, 50.0, 0.5, 0.05)
    again = g.metrics(cls.copy(), 50.0, None, None)  # equal rows, another array: no SLO figures
    everyone = g.metrics(None, 50.0, None, None)
    other_span = g.metrics(cls.copy(), 60.0, None, None)
    for got, (rows, span, ttft, tpot) in ((first_time, (cls, 50.0, 0.5, 0.05)), (again, (cls, 50.0, None, None)),
                                          (everyone, (None, 50.0, None, None)), (other_span, (cls, 60.0, None, None))):
        want = RequestGroups(t).metrics(rows, span, ttft, tpot)
        assert list(got) == list(want) and got == want
    assert first_time["reject_reasons"] and first_time["reject_reasons"] is not again["reject_reasons"]


def test_declared_group_metrics_are_the_scalar_keys_a_group_gets_in_order():
    """GROUP_METRICS (what ``priosim tune`` accepts as a metric) lists every scalar a class's
    row of summary.json has, in its order, and nothing else."""
    from sim import load_scenario, simulate
    res = simulate(load_scenario("chat_vs_batch", overrides=["horizon_s=20"]))
    for row in res.summary_dict["classes"].values():
        scalars = [k for k, v in row.items() if not isinstance(v, dict)]
        assert [k for k in scalars if k in GROUP_METRICS] == [k for k in GROUP_METRICS if k in row]
    interactive = res.summary_dict["classes"]["interactive"]  # a class with SLOs has them all
    assert [k for k in interactive if k in GROUP_METRICS] == list(GROUP_METRICS)


def _request_table_rows(tel) -> pd.DataFrame:
    """The request table through pandas conversions: the reference the column-wise builder
    (``sim.results._request_table``) must equal exactly."""
    from sim.core.columns import DERIVED, FLOAT, INT, RECORDED
    req = pd.DataFrame(tel.columns())
    req = req.astype({c.name: INT for c in RECORDED if c.dtype == INT})
    for c in RECORDED:
        if c.dtype == FLOAT:
            req[c.name] = req[c.name].astype(FLOAT)
    req = req.sort_values("request_id", kind="stable").reset_index(drop=True)
    for c in DERIVED:
        req[c.name] = c.derive(req)
    return req


def _timeseries_rows(sc, tel) -> pd.DataFrame:
    """The time series row by row: the reference the column-wise builder
    (``sim.results._timeseries``) must equal exactly."""
    from sim.core.costs import NS
    iv_s = tel.interval_ns / NS
    rows = []
    preempt = tel.preempt_bin
    for t_ns, waiting, running, kv_used, swap_used in tel.samples:
        b = t_ns // tel.interval_ns  # tokens emitted in [t, t + interval)
        for i, c in enumerate(sc.classes):
            rows.append((t_ns / NS, c.name, waiting[i], running[i],
                         tel.tokens_bin.get((b, i), 0) / iv_s, kv_used, swap_used, preempt.get(b, 0)))
    df = pd.DataFrame(rows, columns=["t_s", "class", "waiting", "running", "tokens_per_s",
                                     "kv_blocks_used", "swap_blocks_used", "preemptions"])
    tenants = sorted({t for _, t in tel.tenant_tokens_bin})
    for t in tenants:
        bins = (df["t_s"] / iv_s).round().astype("int64")
        df[f"tenant_tokens_per_s[{t}]"] = [tel.tenant_tokens_bin.get((b, t), 0) / iv_s for b in bins]
    return df


@pytest.mark.parametrize("scenario,sets", [
    ("diurnal_two_class", ["horizon_s=30.0", "drain=false", "cluster={replicas=3}"]),  # replicas' ids out of order
    ("azure_two_tenants", ["horizon_s=30.0"]),  # tenants: their tokens-per-s columns
])
def test_tables_built_column_wise_equal_the_row_wise_reference(monkeypatch, scenario, sets):
    """The request table and the time series built as numpy columns are exactly the tables the
    pandas conversions and row-by-row construction give: values, dtypes, column order."""
    import sim.results as sr
    from sim import load_scenario, simulate

    seen = []
    fast_req, fast_ts = sr._request_table, sr._timeseries

    def req(tel):
        a, b = fast_req(tel), _request_table_rows(tel)
        pd.testing.assert_frame_equal(a, b, check_exact=True)
        assert list(a.dtypes) == list(b.dtypes)
        seen.append(("requests", len(a), bool((np.diff(tel.columns()["request_id"]) < 0).any())))
        return a

    def ts(sc, tel):
        a, b = fast_ts(sc, tel), _timeseries_rows(sc, tel)
        pd.testing.assert_frame_equal(a, b, check_exact=True)
        assert list(a.dtypes) == list(b.dtypes)
        seen.append(("timeseries", len(a), any(c.startswith("tenant_") for c in a.columns)))
        return a

    monkeypatch.setattr(sr, "_request_table", req)
    monkeypatch.setattr(sr, "_timeseries", ts)
    simulate(load_scenario(scenario, overrides=sets))
    assert seen and all(n > 0 for _, n, _ in seen)
    if "cluster" in sets[-1]:
        assert any(kind == "requests" and unsorted for kind, _, unsorted in seen)
    else:
        assert any(kind == "timeseries" and tenants for kind, _, tenants in seen)


def _recorded(ids: list[int], rng: np.random.Generator, strings: list) -> "Telemetry":
    """A Telemetry whose raw request columns hold random values for requests ``ids``, in that order."""
    from sim.core.columns import STATUS
    from sim.core.telemetry import Telemetry
    t = Telemetry(["a", "b"], 10**9)
    for k, col in t.raw.items():
        if k == "request_id":
            col.fromlist(ids)
        elif k == "state":  # (a request's state, as its int: one the table names)
            col.fromlist(rng.choice(sorted(int(v) for v in STATUS), len(ids)).tolist())
        elif isinstance(col, list):
            col.extend(rng.choice(np.array(strings, dtype=object), len(ids)).tolist())
        elif col.typecode == "d":
            col.fromlist(np.where(rng.random(len(ids)) < 0.2, np.nan, rng.random(len(ids))).tolist())
        else:
            col.fromlist(rng.integers(0, 5, len(ids)).tolist())
    return t


@pytest.mark.parametrize("ids", ["in order", "shuffled", "duplicates", "gaps", "negative", "none"])
@pytest.mark.parametrize("strings", [["x", "yy"], ["x", None]])
def test_request_table_of_parts_equals_the_row_wise_reference(ids, strings):
    """Rows written straight to their place (request ids 0..n-1 across the parts) or sorted
    (any other ids) give the table pandas' conversions and stable sort give."""
    from sim.core.telemetry import Telemetry
    from sim.results import _request_table

    rng = np.random.default_rng(len(ids) + len(strings))
    n = 0 if ids == "none" else 300
    every = {"in order": np.arange(n), "shuffled": rng.permutation(n),
             "duplicates": rng.integers(0, n // 2, n) if n else np.arange(0),
             "gaps": np.sort(rng.choice(3 * n, n, replace=False)) if n else np.arange(0),
             "negative": rng.permutation(n) - 1, "none": np.arange(0)}[ids].tolist()
    cuts = sorted(rng.integers(0, n + 1, 2).tolist())
    parts = [_recorded(every[a:b], rng, strings) for a, b in ((0, cuts[0]), (cuts[0], cuts[1]), (cuts[1], n))]
    for tel in (parts[1], Telemetry.merged(parts, ["a", "b"], 10**9)):
        got, want = _request_table(tel), _request_table_rows(tel)
        pd.testing.assert_frame_equal(got, want, check_exact=True)
        assert list(got.dtypes) == list(want.dtypes)


@pytest.mark.parametrize("rows", [0, 7, 50_000])
def test_write_parquet_writes_to_parquets_bytes(tmp_path, rows):
    """The results' parquet writer gives byte for byte the file ``to_parquet(index=False)`` gives
    (ints, floats with NaN, strings; a table large enough for pandas to convert it on threads)."""
    from sim.results import write_parquet

    rng = np.random.default_rng(rows)
    x = rng.random(rows)
    x[rng.random(rows) < 0.1] = np.nan
    df = pd.DataFrame({"request_id": np.arange(rows, dtype=np.int64), "class": ["a", "bb"] * (rows // 2) + ["a"] * (rows % 2),
                       "ttft_s": x, "tokens": rng.integers(0, 9, rows)})
    df = df.iloc[::-1].reset_index(drop=True)
    write_parquet(df, tmp_path / "ours.parquet")
    df.to_parquet(tmp_path / "pandas.parquet", index=False)
    assert (tmp_path / "ours.parquet").read_bytes() == (tmp_path / "pandas.parquet").read_bytes()
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "ours.parquet"), df)


@pytest.mark.parametrize("tenant_bins", [{}, {(0, "a"): 5, (1, "b"): 2}])
def test_empty_time_series_equals_the_row_wise_reference(tenant_bins):
    """A run without samples gets the table the row-wise builder gives: the same columns,
    untyped, and float tenant columns."""
    from types import SimpleNamespace

    import sim.results as sr
    sc = SimpleNamespace(classes=[SimpleNamespace(name="hi"), SimpleNamespace(name="lo")])
    tel = SimpleNamespace(interval_ns=10**9, samples=[], preempt_bin={}, tokens_bin={},
                          tenant_tokens_bin=tenant_bins)
    a, b = sr._timeseries(sc, tel), _timeseries_rows(sc, tel)
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert list(a.dtypes) == list(b.dtypes) and list(a.columns) == list(b.columns)
