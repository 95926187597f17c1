"""Results of one run: the requests table, per-class/per-tenant summary, time series, files.

Files written by :meth:`Results.save` (the directory is filled under a temporary name and
renamed when complete, so a folder that exists is a finished run):
    requests.parquet    one row per request: the columns of ``sim.core.columns.COLUMNS`` (recorded
                        by telemetry, then the derived ``queue_wait_s, ttft_s, e2e_s, tpot_s``)
    summary.json        per class, per tenant and overall metrics, plus run facts and provenance;
                        every rate is over the group's ``rate_window_s`` (``rate_window``, ``RATES_NOTE``)
    timeseries.parquet  per interval and class: waiting, running, tokens/s, preemptions; KV use
    iterations.parquet  only with ``trace_iterations``: one row per request per iteration
    scenario.json       the resolved scenario; manifest.json: version, seed, profile hash
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata
from itertools import chain
from pathlib import Path

import numpy as np
import pandas as pd

from sim.core.columns import DERIVED, FLOAT, INT, RECORDED, STAT_COLUMNS, STATS, STR, Stat
from sim.core.costs import NS
from sim import jsonout

PCTS = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
_STRING_COLUMNS = {c.name for c in RECORDED if c.dtype == STR}


def _nanquantile(a: np.ndarray, q: float) -> float | None:
    """The ``q`` quantile of the float array ``a`` without its NaNs (None when none are left):
    what Series.quantile computes (linear), without its overhead."""
    a = a[~np.isnan(a)]  # (a new array: quantile may partition it in place rather than copy it)
    return None if not len(a) else float(np.quantile(a, [q], overwrite_input=True)[0])


def _cdf(wts: np.ndarray) -> np.ndarray:
    """The weights' empirical distribution function, as ``np.quantile(..., weights=wts)`` forms it
    (cumulative float64 sums over their total)."""
    cdf = wts.cumsum(dtype=np.float64)
    cdf /= cdf[-1]
    return cdf


def _gap_quantile(vals: np.ndarray, cdf: np.ndarray, q: float) -> int:
    """``np.quantile(vals, q, weights=wts, method="inverted_cdf")`` of distinct gaps ``vals`` in
    ascending order (:meth:`~sim.core.telemetry.Telemetry.itl_arrays`) with positive weights whose
    :func:`_cdf` is ``cdf``: the same value, the first gap whose cumulative weight reaches ``q``,
    without numpy's sort of the gaps (already in order: 2 sorts of up to millions a class)."""
    i = int(np.searchsorted(cdf, q, side="left"))
    return int(vals[i if i < len(vals) else len(vals) - 1])


def _q(s: pd.Series, q: float) -> float | None:
    if s.dtype == np.float64:
        return _nanquantile(s.to_numpy(), q)
    s = s.dropna()
    return None if s.empty else float(s.quantile(q))


@cache  # (reading the installed distribution's metadata takes 2 ms, once per Results)
def _version() -> str:
    try:
        return metadata.version("priosim")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0+unknown"


#: the scalar metrics of a group of requests (a class, a tenant, all), in summary.json's order:
#: counts, the ``STATS``, the SLO figures (when the class has an SLO) and throughput
COUNTS = ("arrived", "finished", "rejected", "unfinished")
SLO_METRICS = ("slo_attainment", "goodput_rps")
GROUP_METRICS: tuple[str, ...] = COUNTS + tuple(st.key for st in STATS) + SLO_METRICS + ("throughput_rps",)
#: the keys naming the window a group's rates are taken over (summary.json only: a list and a
#: word, not metrics, so they stay out of the summary table's columns)
WINDOW_KEYS = ("rate_window_s", "rate_window_basis")
#: summary.json's ``rates_note``: what every rate counts and the window it is divided by
RATES_NOTE = ("throughput_rps (finished requests), goodput_rps (requests that met every SLO of their "
              "class) and output_tokens_per_s (tokens generated, finished or not) of a class count its "
              "requests that arrived in its rate_window_s and divide by that window's length, s. The "
              "window is from its first to its last arrival (basis 'arrivals'): the drain after the "
              "last arrival is not in it, so two runs that serve the same offered requests the same "
              "tokens have the same rates. A class offered all at one instant (a backlog) has no "
              "such window: its rates are over its service, from that instant to its last request's "
              "end (basis 'backlog'). A tenant within one class is measured the same way over its "
              "own requests; overall and a tenant in several classes have the sums of their "
              "per-class parts' rates (basis 'sum of classes'). See docs/metrics.md.")
# the quantiles STATS takes of each column over each selection of rows
QUANTILES: dict[tuple[str, str], list[float]] = {}
for _st in STATS:
    if _st.how in PCTS:
        QUANTILES.setdefault((_st.column, _st.among), []).append(PCTS[_st.how])


class RequestGroups:
    """A request table's metric columns as numpy arrays, so that the metrics of many groups of its
    rows (each class, each tenant, all) are taken without a DataFrame per group. Every figure is
    computed as pandas computes it on the group's rows (the same values, bit for bit)."""

    def __init__(self, t: pd.DataFrame) -> None:
        self.t = t
        self.n = len(t)
        # the columns statistics are taken of (the status and reject reason are read as strings
        # where needed: as numpy they would be arrays of a million Python objects)
        self.cols = {c: t[c].to_numpy() for c in STAT_COLUMNS if c in t.columns and c not in _STRING_COLUMNS}
        status = t["status"]
        self.among = {"finished": (status == "finished").to_numpy(),
                      "started": t["first_token_s"].notna().to_numpy(),
                      "admitted": t["admitted_s"].notna().to_numpy()}
        self.rejected = (status == "rejected").to_numpy()
        self.unfinished = (status == "unfinished").to_numpy()
        # the clocks that place a group's rate window (absent from tables built only for STATS)
        self.clocks = {c: t[c].to_numpy() for c in ("arrival_s", "end_s") if c in t.columns}
        # (rows selected, span s, their counts and STATS): see _stats
        self._memo: list[tuple[np.ndarray | None, float, dict]] = []

    def metrics(self, rows: np.ndarray | None, span_s: float, ttft_slo: float | None,
                tpot_slo: float | None) -> dict:
        """The metrics of the rows selected by the boolean array ``rows`` (None: all rows);
        ``span_s``: the length of their rate window, s (:meth:`window`), which every rate is
        divided by (a rate over an empty window is 0.0)."""
        n = self.n if rows is None else int(rows.sum())
        out = self._stats(rows, n, span_s)
        good = self.slo_met(rows, ttft_slo, tpot_slo)
        if good is not None:
            out["slo_attainment"] = float(good / n) if n else None
            out["goodput_rps"] = float(good / span_s) if span_s > 0 else 0.0
        out["throughput_rps"] = float(out["finished"] / span_s) if span_s > 0 else 0.0
        return out

    def slo_met(self, rows: np.ndarray | None, ttft_slo: float | None, tpot_slo: float | None) -> int | None:
        """How many selected requests finished within both SLOs (a request with one token has no
        TPOT, so meets any TPOT SLO); None when neither SLO is set."""
        if ttft_slo is None and tpot_slo is None:
            return None
        ok = self.among["finished"] if rows is None else self.among["finished"] & rows
        if ttft_slo is not None:
            ok = ok & (self.cols["ttft_s"] <= ttft_slo)
        if tpot_slo is not None:
            tpot = self.cols["tpot_s"]
            ok = ok & ((tpot <= tpot_slo) | np.isnan(tpot))
        return int(ok.sum())

    def window(self, rows: np.ndarray | None) -> tuple[dict, float]:
        """The rate window of the selected rows: summary.json's ``rate_window_s`` ([start, end],
        s; None without requests) and ``rate_window_basis``, and its length, s (see
        :func:`rate_window`)."""
        arrival, end = self.clocks["arrival_s"], self.clocks["end_s"]
        if rows is not None:
            arrival, end = arrival[rows], end[rows]
        win, basis = rate_window(arrival, end)
        return {"rate_window_s": win, "rate_window_basis": basis}, (win[1] - win[0]) if win else 0.0

    def rates(self, rows: np.ndarray) -> dict:
        """The rates of the selected rows (all of one class) over their own rate window, as
        :meth:`metrics` computes them, with the window: what :func:`_sum_rates` adds up."""
        window, span = self.window(rows)
        tokens = self.cols["generated_tokens"][rows]
        finished = int((self.among["finished"] & rows).sum())
        return {**window, "output_tokens_per_s": float(tokens.sum() / span) if span > 0 else 0.0,
                "throughput_rps": float(finished / span) if span > 0 else 0.0}

    def _stats(self, rows: np.ndarray | None, n: int, span_s: float) -> dict:
        """The counts, reject reasons and ``STATS`` of the selected rows (``n`` of them), a new
        dict each call. Memoised by the rows selected: a tenant whose requests are exactly a
        class's (one tenant per class, as a multi-tenant trace often has) gets the class's
        figures again without taking them again (1 h ServeGen x16: 3 of the 7 groups)."""
        for seen, span, got in self._memo:
            if span == span_s and (seen is rows or (seen is not None and rows is not None
                                                    and got["arrived"] == n and np.array_equal(seen, rows))):
                return {**got, "reject_reasons": dict(got["reject_reasons"])}

        def sel(m: np.ndarray) -> np.ndarray:
            return m if rows is None else m & rows

        fin = sel(self.among["finished"])
        rej = sel(self.rejected)
        out: dict = {
            "arrived": n,
            "finished": int(fin.sum()),
            "rejected": int(rej.sum()),
            "unfinished": int(sel(self.unfinished).sum()),
            "reject_reasons": {},
        }
        if out["rejected"]:
            vc = self.t.loc[rej, "reject_reason"].value_counts().sort_index()
            out["reject_reasons"] = {str(k): int(v) for k, v in vc.items()}
        among = {"all": rows, "finished": fin, "started": sel(self.among["started"]),
                 "admitted": sel(self.among["admitted"])}
        pcts: dict[tuple[str, str], dict | None] = {}  # (column, among) -> quantile -> value, taken together
        picked: dict[tuple[str, str], np.ndarray] = {}  # (column, among) -> the column's selected values
        for st in STATS:
            out[st.key] = self._stat(st, among[st.among], span_s, pcts, picked)
        self._memo.append((rows, span_s, out))
        return {**out, "reject_reasons": dict(out["reject_reasons"])}

    def _stat(self, st: Stat, rows: np.ndarray | None, span_s: float,
              pcts: dict | None = None, picked: dict | None = None) -> float | int | None:
        """One statistic (:class:`sim.core.columns.Stat`) of the selected rows: on the arrays
        where pandas' result is plain arithmetic (quantiles and means of floats, sums of ints),
        else by pandas on the rows. ``pcts``: the quantiles of float columns already taken (every
        quantile ``STATS`` asks of a column over the same rows comes from one ``np.quantile``
        call, each the value a call of its own gives). ``picked``: a column's values over the
        same rows, selected once for its quantiles and its mean."""
        a = self.cols[st.column]
        key = (st.column, st.among)
        if rows is not None:
            if picked is None:
                a = a[rows]
            elif key in picked:
                a = picked[key]
            else:
                a = picked[key] = a[rows]
        if a.dtype == np.float64 and st.how in PCTS and pcts is not None:
            if key not in pcts:
                v = a[~np.isnan(a)]  # (a new array: partitioned in place, not copied again)
                qs = QUANTILES[key]
                pcts[key] = dict(zip(qs, np.quantile(v, qs, overwrite_input=True).tolist())) if len(v) else None
            got = pcts[key]
            return None if got is None else got[PCTS[st.how]]
        if a.dtype == np.float64 and st.how in PCTS:
            return _nanquantile(a, PCTS[st.how])
        if a.dtype == np.float64 and st.how == "mean":  # pandas' nanmean: NaN as 0, over the count
            nan = np.isnan(a)
            if nan.all():
                return None
            v = np.where(nan, 0.0, a) if nan.any() else a
            return float(v.sum(dtype=np.float64) / np.float64(len(a) - int(nan.sum())))
        if a.dtype == np.int64 and st.how in ("sum", "per_s", "share"):
            if st.how == "sum":
                return int(a.sum())
            if st.how == "per_s":
                return float(a.sum() / span_s) if span_s > 0 else 0.0
            per = self.cols[st.per] if rows is None else self.cols[st.per][rows]
            if per.dtype == np.int64:
                whole = int(per.sum())
                return float(a.sum() / whole) if whole else 0.0
        g = self.t if rows is None else self.t[rows]
        return _stat(st, g, span_s)


def rate_window(arrival_s: np.ndarray, end_s: np.ndarray) -> tuple[list[float] | None, str | None]:
    """The window a group's rates are taken over, ``[start, end]`` in s, and its basis.

    ``arrivals``: from the group's first to its last arrival, the window it was offered in (the
    drain after the last arrival is outside it, so serving the same requests faster or slower
    does not change a rate). ``backlog``: a group whose requests all arrived at one instant was
    offered no duration; its rates are over its service, from that instant to its last
    request's end (``end_s``: finished, rejected, or the horizon). ``(None, None)`` without
    requests."""
    if not len(arrival_s):
        return None, None
    t0, t1 = float(arrival_s.min()), float(arrival_s.max())
    if t1 > t0:
        return [t0, t1], "arrivals"
    ends = end_s[~np.isnan(end_s)]
    return [t0, max(t0, float(ends.max())) if len(ends) else t0], "backlog"


def _stat(st: Stat, g: pd.DataFrame, span_s: float) -> float | int | None:
    """One statistic (:class:`sim.core.columns.Stat`) of the requests ``g``."""
    col = g[st.column]
    if st.how in PCTS:
        return _q(col, PCTS[st.how])
    if st.how == "mean":
        return None if col.dropna().empty else float(col.mean())
    if st.how == "sum":
        return int(col.sum())
    if st.how == "per_s":
        return float(col.sum() / span_s) if span_s > 0 else 0.0
    if st.how == "share":
        whole = int(g[st.per].sum())
        return float(col.sum() / whole) if whole else 0.0
    raise ValueError(f"{st.key}: unknown statistic {st.how!r}")


def write_parquet(df: pd.DataFrame, path: Path) -> None:
    """``df.to_parquet(path, index=False)``'s bytes (the same Arrow table, pandas metadata and
    snappy compression), with the columns converted on this thread: pyarrow's pool of converter
    threads, which ``to_parquet`` starts for a large table, costs more than it saves here."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if df.attrs:  # pandas stores them in the file's metadata: its own writer does that
        df.to_parquet(path, index=False)
        return
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False, nthreads=1), str(path), compression="snappy")


#: a run whose requests still awaiting their first token at the horizon are more than this share
#: of those that arrived by then is *overloaded*: its queues grew for the whole run
OVERLOADED_SHARE = 0.1


def backlog_at(req: pd.DataFrame, horizon_s: float) -> dict:
    """The requests that arrived by ``horizon_s`` (s) and had no first token by then (neither
    refused nor started: still queued), overall and per class, and whether they are more than
    :data:`OVERLOADED_SHARE` of the arrivals (``overloaded``). In a steady state they are the
    arrival rate times the time to first token, a small share; a larger one means the offered
    load outran what was served and latencies grew with the run's length."""
    arrival = req["arrival_s"].to_numpy()
    first = req["first_token_s"].to_numpy(dtype=float)
    arrived = arrival <= horizon_s
    # (compared as Arrow strings: to_numpy made a million Python strings first)
    queued = arrived & (req["status"] != "rejected").to_numpy() & ~(first <= horizon_s)
    n, k = int(arrived.sum()), int(queued.sum())
    by_class = req.loc[queued, "class"].value_counts()
    return {"requests": k, "arrived": n, "share": k / n if n else 0.0,
            "by_class": {str(c): int(v) for c, v in by_class.items()},
            "overloaded": bool(n and k / n > OVERLOADED_SHARE)}


_SPEED_ONLY = ("fast_forward", "lazy_batch", "max_events")


def engine_record(eng) -> dict:
    """What summary.json says of the engine settings the run used: every key, defaults included
    (scenario.json keeps the scenario as written, without the named engine's defaults), the keys
    that came from those defaults, and the engine release assumed when none was given. A
    cluster's groups may set their own ([cluster] in scenario.json). The keys that change only how
    fast the engine computes the same results (fast-forward, the decode cohort, the event guard)
    are left out: a stepped run's summary equals a fast-forwarded one's."""
    settings = {k: v for k, v in eng.model_dump(mode="json").items() if k not in _SPEED_ONLY}
    out = {"settings": settings, "from_engine_defaults": sorted(eng.defaults_applied)}
    if eng.engine is not None and eng.engine_version is None:
        from sim.engines import family

        out["engine_version_assumed"] = family(eng.engine).latest
    return out


@dataclass
class Results:
    """What ``simulate`` returns. ``requests``, ``summary`` and ``timeseries`` are DataFrames;
    ``summary_dict`` is the full nested summary written to summary.json."""

    requests: pd.DataFrame
    summary: pd.DataFrame
    timeseries: pd.DataFrame
    summary_dict: dict
    scenario: dict
    iterations: pd.DataFrame | None = None
    manifest: dict = field(default_factory=dict)
    # every inter-token gap of the run, all classes pooled: (distinct gaps in ns, ascending; how
    # many there were of each), as a streaming client sees one gap per chunk (in memory only:
    # replay compares them with vLLM's and SGLang's pooled ITL)
    itl_gaps: tuple[np.ndarray, np.ndarray] | None = None

    @classmethod
    def build(cls, sc, costs, tel, run_info: dict, trace) -> "Results":
        req = _request_table(tel)
        run_info["thrash_ratio"] = run_info["thrash_s"] / run_info["busy_s"] if run_info["busy_s"] else 0.0
        run_info["thrashing"] = bool(run_info["thrash_ratio"] > sc.engine.thrash_threshold)
        run_info["backlog_at_horizon"] = backlog_at(req, sc.horizon_s)
        run_info["timeseries_interval_s"] = tel.interval_ns / NS  # (as used: sim.assembly.sample_interval_ns)

        # (a million-row run copies little; the clocks place each group's rate window)
        narrow = req[list(STAT_COLUMNS) + ["class", "tenant", "arrival_s", "end_s"]]
        groups = RequestGroups(narrow)
        classes, rows, masks = _class_metrics(sc, costs, tel, groups, narrow)
        overall = groups.metrics(None, 0.0, None, None)
        _sum_rates(overall, classes)
        rows.append({"class": "overall", **_row(overall)})
        tenants = _tenant_metrics(req, narrow, groups, masks, run_info)
        attribution = run_info.get("prefix_attribution")
        if attribution is not None:  # prefix caching on: whose evictions, and who paid for them
            _add_prefix_attribution(attribution, sc, costs, classes, tenants, overall, rows)
        summary = {
            "scenario": sc.name,
            "seed": sc.seed,
            "policy": sc.policy.name,
            "profile": {"name": costs.name, "kind": costs.meta.get("kind"), "digest": costs.digest,
                        "overhead": costs.overhead.name, "overhead_terms": costs.overhead.terms()},
            "engine": engine_record(sc.engine),
            "classes": classes,
            "overall": overall,
            "tenants": tenants,
            "run": run_info,
            "rates_note": RATES_NOTE,
        }
        ts = _timeseries(sc, tel)
        it = _iteration_table(trace) if trace is not None else None
        manifest = {"priosim_version": _version(), "seed": sc.seed, "scenario": sc.name,
                    "profile": costs.name, "profile_sha256": costs.digest, "overhead": costs.overhead.name,
                    "policy": sc.policy.name}
        return cls(req, pd.DataFrame(rows), ts, summary, sc.to_dict(where=True), it, manifest,
                   tel.itl_arrays(-1, pd.factorize))

    # ---- output --------------------------------------------------------------------------
    def save(self, out_dir: str | Path, overwrite: bool = False) -> Path:
        """Write all files into ``out_dir``, whole or not at all (filled under a hidden name, then
        published in one rename). ``out_dir`` must be new or empty, or, with ``overwrite``, hold a
        run's result, whose own files alone are replaced (:mod:`sim.outdir`); returns its real path."""
        from sim.outdir import claim, staged

        out = claim(out_dir, "run", flag="out_dir", overwrite=overwrite)
        with staged(out, "run") as tmp:
            self.write_into(tmp)
        return out

    def write_into(self, tmp: Path) -> None:
        """Everything :meth:`save` writes, into the existing folder ``tmp``."""
        self.write_files(tmp)

    def write_files(self, tmp: Path) -> None:
        """The run's files, into the existing folder ``tmp``."""
        write_parquet(self.requests, tmp / "requests.parquet")
        write_parquet(self.timeseries, tmp / "timeseries.parquet")
        if self.iterations is not None:
            write_parquet(self.iterations, tmp / "iterations.parquet")
        stable = {k: v for k, v in self.summary_dict.items()}
        stable["run"] = {k: v for k, v in stable["run"].items() if k not in ("wall_s", "cpu_s")}
        (tmp / "summary.json").write_text(jsonout.dumps(stable, indent=1, sort_keys=True, default=_json_default))
        (tmp / "perf.json").write_text(jsonout.dumps({k: self.summary_dict["run"][k] for k in ("wall_s", "cpu_s")}))
        (tmp / "scenario.json").write_text(jsonout.dumps(self.scenario, indent=1, sort_keys=True))
        (tmp / "manifest.json").write_text(jsonout.dumps(self.manifest, indent=1, sort_keys=True))

    def table(self) -> str:
        """The compact per-class table the CLI prints."""
        cols = ["class", "arrived", "finished", "rejected", "unfinished", "ttft_p50_s", "ttft_p99_s",
                "tpot_p50_s", "e2e_p99_s", "output_tokens_per_s", "preemptions", "slo_attainment"]
        df = numeric_columns(self.summary.reindex(columns=cols))
        return df.to_string(index=False, float_format=lambda v: f"{v:.4g}", na_rep="-")


def numeric_columns(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with each column of numbers and None (a metric some rows lack) as floats, so that
    a missing value prints as ``na_rep`` in every row (as an object column it prints ``None``)."""
    out = df.copy()
    for c in out.columns:
        col = out[c]
        if col.dtype == object and col.map(lambda v: v is None or (isinstance(v, (int, float))
                                                                   and not isinstance(v, bool))).all():
            out[c] = col.astype("float64")
    return out


def _attributed(rows: list[dict], per_token_s: float) -> dict:
    """Prefix evictions of a class's (or tenant's) cached groups by cause, and the re-prefill they
    pushed onto other requests (tokens, and seconds at a full-budget prefill's per-token cost)."""
    out = {f"prefix_evictions_by_{c}": sum(r["evictions"] for r in rows if r["cause"] == c)
           for c in ("preemption", "pressure")}
    pushed = sum(r["pushed_refill_tokens"] for r in rows)
    out["refill_pushed_tokens"] = pushed
    out["refill_pushed_s"] = pushed * per_token_s
    out["refill_own_tokens"] = sum(r["own_refill_tokens"] for r in rows)
    return out


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    raise TypeError(f"not JSON serialisable: {type(o)}")


TIMESERIES_COLUMNS = ["t_s", "class", "waiting", "running", "tokens_per_s", "kv_blocks_used",
                      "swap_blocks_used", "preemptions"]


def _timeseries(sc, tel) -> pd.DataFrame:
    """One row per sample and class (sample order, then class order): the waiting and running
    requests, the tokens emitted per s in the sample's interval, the KV blocks in use and the
    preemptions in the interval; then one tokens-per-s column per tenant. Built column by column
    (numpy), not row by row: the same values and dtypes, a fraction of the time."""
    iv_s = tel.interval_ns / NS
    names = [c.name for c in sc.classes]
    nc, samples = len(names), tel.samples
    got = tel.tenant_tokens_bin
    tenants = sorted({t for _, t in got})
    if not samples or not nc:  # an empty table: untyped columns, the tenants' as float
        df = pd.DataFrame([], columns=TIMESERIES_COLUMNS)
        for t in tenants:
            df[f"tenant_tokens_per_s[{t}]"] = np.zeros(0)
        return df
    n = len(samples)
    t_ns = np.fromiter((s[0] for s in samples), np.int64, n)
    bins = (t_ns // tel.interval_ns).tolist()  # tokens emitted in [t, t + interval)
    tok, pre = tel.tokens_bin, tel.preempt_bin
    tokens = np.array([tok.get((b, i), 0) for b in bins for i in range(nc)], dtype=np.int64)
    df = pd.DataFrame({
        "t_s": np.repeat(t_ns / NS, nc),
        "class": names * n,
        "waiting": np.array([w for s in samples for w in s[1]], dtype=np.int64),
        "running": np.array([r for s in samples for r in s[2]], dtype=np.int64),
        "tokens_per_s": tokens / iv_s,
        "kv_blocks_used": np.repeat(np.array([s[3] for s in samples], dtype=np.int64), nc),
        "swap_blocks_used": np.repeat(np.array([s[4] for s in samples], dtype=np.int64), nc),
        "preemptions": np.repeat(np.array([pre.get(b, 0) for b in bins], dtype=np.int64), nc),
    })
    if tenants:
        near = np.round(t_ns / NS / iv_s).astype(np.int64).tolist()  # the nearest bin, as the rows' t_s give
        for t in tenants:
            df[f"tenant_tokens_per_s[{t}]"] = np.repeat(
                np.array([got.get((b, t), 0) for b in near], dtype=np.int64) / iv_s, nc)
    return df


def _request_table(tel) -> pd.DataFrame:
    """The per-request table: recorded columns at their declared dtypes, sorted by request id,
    then the derived columns. Each column is converted and put in order as one numpy array
    before the table is built (a stable sort, as ``sort_values(kind="stable")``)."""
    parts = tel.part_columns()
    ids = [p["request_id"] for p in parts]
    cols = _columns_by_id(parts, ids) if _ids_are_positions(ids) else _sorted_columns(tel)
    # each column stays its own array: gathering them into 2-D blocks copied them all again
    # (1 h ServeGen cluster, 815k rows: 0.7 -> 0.3 s)
    req = pd.DataFrame(cols, copy=False)
    for c in DERIVED:
        req[c.name] = c.derive(req)
    return req


def _ids_are_positions(ids: list[np.ndarray]) -> bool:
    """Whether the parts' request ids together are 0..n-1, each once (as every request a run
    made ends with a row): then a row's place in the sorted table is its id."""
    n = sum(len(a) for a in ids)
    seen = np.zeros(n, dtype=bool)
    for a in ids:
        if len(a) and (a.min() < 0 or a.max() >= n):
            return False
        seen[a] = True
    return bool(seen.all())


def _columns_by_id(parts: list[dict], ids: list[np.ndarray]) -> dict:
    """The recorded columns in request-id order when the ids are 0..n-1 (each once): each
    part's values written straight to their rows, not joined and then sorted (the order a stable
    sort gives, as the ids are distinct; no sort, no joined copy of each column)."""
    n = sum(len(a) for a in ids)
    joined = np.concatenate(ids) if len(ids) > 1 else ids[0]
    moved = bool((joined != np.arange(n)).any())
    order = None
    if moved:  # (where each row of the table comes from in the parts' joined rows)
        order = np.empty(n, dtype=np.int64)
        order[joined] = np.arange(n)
    dtypes = {c.name: c.dtype for c in RECORDED if c.dtype in (INT, FLOAT)}
    cols: dict = {}
    for k, v in parts[0].items():
        if k in dtypes:
            col = np.empty(n, dtype=dtypes[k])
            for p, at in zip(parts, ids):
                col[at] = p[k]
            cols[k] = col
        else:
            values = v if len(parts) == 1 else list(chain.from_iterable(p[k] for p in parts))
            cols[k] = _strings(values, order)
    return cols


def _sorted_columns(tel) -> dict:
    """The recorded columns at their dtypes, joined and put in order by a stable sort of the
    request ids (any ids)."""
    cols = tel.columns()
    dtypes = {c.name: c.dtype for c in RECORDED if c.dtype in (INT, FLOAT)}
    for k, dt in dtypes.items():
        cols[k] = np.asarray(cols[k], dtype=dt)
    order = np.argsort(cols["request_id"], kind="stable")
    moved = bool((order != np.arange(order.size)).any())
    for k, v in cols.items():
        if isinstance(v, np.ndarray):
            # (a view of the telemetry's buffers is copied: the table owns its arrays)
            cols[k] = v[order] if moved else v if v.flags.owndata else v.copy()
        else:
            cols[k] = _strings(v, order if moved else None)
    return cols


def _strings(values: list, order: np.ndarray | None):
    """A recorded string column (a list, in ``order`` when given) as the table's column: pandas'
    ``str`` array, converted by Arrow and put in order there (pandas checks and converts an
    object array's every value first: 1 h ServeGen cluster, 4 columns of 815k rows, 0.6 -> 0.3 s).
    What Arrow cannot take as it is (an empty column, missing or non-string values) goes the
    way it went before, so the table's dtypes stay pandas' inference."""
    import pyarrow as pa

    if values:
        try:
            arr = pa.array(values, type=pa.large_string())
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            arr = None
        if arr is not None and not arr.null_count:
            return pd.array(arr if order is None else arr.take(order), dtype="str")
    return values if order is None else np.array(values, dtype=object)[order]


def _row(m: dict) -> dict:
    """A group's metrics as a row of the summary table: its scalars, not its window."""
    return {k: v for k, v in m.items() if not isinstance(v, dict) and k not in WINDOW_KEYS}


RATE_KEYS = ("output_tokens_per_s", "throughput_rps", "goodput_rps")


def _sum_rates(m: dict, parts: dict[str, dict], keys: tuple[str, ...] = RATE_KEYS) -> None:
    """Give ``m``, the metrics of a group whose requests are in several classes (all requests, a
    tenant of several classes), the sums of its per-class ``parts``' rates ``keys``, each part's
    over its own rate window: a backlog's tokens counted over a stream's arrival window, or a
    stream's over a backlog's service, would be neither's rate. A part without a rate (a
    class without SLOs has no goodput) adds 0.0."""
    for k in keys:
        m[k] = float(sum(p.get(k) or 0.0 for p in parts.values()))
    m["rate_window_s"] = {c: p["rate_window_s"] for c, p in parts.items() if p["rate_window_s"] is not None}
    m["rate_window_basis"] = "sum of classes"


def _class_metrics(sc, costs, tel, groups, narrow: pd.DataFrame) -> tuple[dict, list, dict]:
    """Per-class metrics (``summary["classes"]``), the summary table's class rows, and each
    class's rows (name -> boolean array)."""
    classes = {}
    rows = []
    masks = {}
    for i, c in enumerate(sc.classes):
        mine = masks[c.name] = (narrow["class"] == c.name).to_numpy()
        window, span = groups.window(mine)
        m = groups.metrics(mine, span, c.ttft_slo_s, c.tpot_slo_s)
        m.update(window)
        m["priority"] = c.priority
        vals, wts = tel.itl_arrays(i, pd.factorize)  # (hashing, not sorting, millions of gaps)
        if wts.sum() > 0:
            cdf = _cdf(wts)
            for p in ("p50", "p99"):
                m[f"itl_{p}_s"] = float(_gap_quantile(vals, cdf, PCTS[p])) / NS
            mean = np.average(vals.astype(np.float64), weights=wts)
            m["itl_std_s"] = float(np.sqrt(np.average((vals - mean) ** 2, weights=wts))) / NS
        else:
            m["itl_p50_s"] = m["itl_p99_s"] = m["itl_std_s"] = None
        # prefill seconds that evicted prefix blocks pushed onto this class's requests,
        # priced at the profile's per-token cost of a full-budget prefill step
        budget = sc.engine.max_batched_tokens
        m["evicted_miss_prefill_s"] = m["evicted_miss_tokens"] * costs.prefill_s(budget) / budget
        m["swap_s"] = tel.swap_ns_class[i] / NS
        m["recompute_s"] = tel.recompute_ns_class[i] / NS
        classes[c.name] = m
        rows.append({"class": c.name, **_row(m)})
    return classes, rows, masks


def _tenant_metrics(req: pd.DataFrame, narrow: pd.DataFrame, groups, masks: dict, run_info: dict) -> dict:
    """Per-tenant metrics (``summary["tenants"]``), with token shares and the fairness books.
    A tenant within one class has its rates over its own rate window; one in several classes,
    the sums of its per-class parts' (:func:`_sum_rates`)."""
    tenants = {}
    tot_tokens = max(int(req["generated_tokens"].sum()), 1)
    gen = groups.cols["generated_tokens"]
    for t, idx in narrow.groupby("tenant", sort=True).indices.items():
        mine = np.zeros(len(narrow), dtype=bool)
        mine[idx] = True
        parts = {c: mine & cm for c, cm in masks.items()}
        parts = {c: p for c, p in parts.items() if p.any()}
        if len(parts) == 1:
            window, span = groups.window(mine)
            m = groups.metrics(mine, span, None, None)
            m.update(window)
        else:
            m = groups.metrics(mine, 0.0, None, None)
            _sum_rates(m, {c: groups.rates(p) for c, p in parts.items()}, ("output_tokens_per_s", "throughput_rps"))
        tenants[str(t)] = {k: m[k] for k in ("arrived", "finished", "rejected", "unfinished", "reject_reasons",
                                             "ttft_p50_s", "ttft_p99_s", "output_tokens_per_s",
                                             "prefix_hit_rate", "evicted_miss_tokens", *WINDOW_KEYS)}
        tenants[str(t)]["token_share"] = float(gen[mine].sum() / tot_tokens)
    # GPU-seconds (each step split by tokens processed) and priced tokens (VTC prices) come
    # from the fairness accountant's books, kept whenever [[tenants]] or [fairness] exist
    books = (run_info.get("policy") or {}).get("fairness", {}).get("tenants", {})
    for t in tenants:
        b = books.get(t)
        tenants[t]["gpu_s"] = b["gpu_s"] if b else None
        tenants[t]["gpu_s_share"] = b["gpu_share"] if b else None
        tenants[t]["priced_token_share"] = b["token_share"] if b else None
    return tenants


def _add_prefix_attribution(attribution: list, sc, costs, classes: dict, tenants: dict, overall: dict,
                            rows: list) -> None:
    """Add whose prefix evictions cost whom (tokens and prefill s) to the class, tenant,
    overall metrics and the summary table's rows."""
    per_token_s = costs.prefill_s(sc.engine.max_batched_tokens) / sc.engine.max_batched_tokens
    for key, groups in (("class", classes), ("tenant", tenants)):
        for name, m in groups.items():
            m.update(_attributed([r for r in attribution if r[key] == name], per_token_s))
    overall.update(_attributed(attribution, per_token_s))
    for row in rows:  # the summary table's rows (classes and overall)
        sel = [r for r in attribution if row["class"] in ("overall", r["class"])]
        row.update(_attributed(sel, per_token_s))


def _iteration_table(trace: list) -> pd.DataFrame:
    """The per-iteration trace as a table, times in s, ordered by iteration."""
    it = pd.DataFrame(trace, columns=["iteration", "start_ns", "end_ns", "request_id", "kind", "tokens"])
    it["start_s"] = it.pop("start_ns") / NS
    it["end_s"] = it.pop("end_ns") / NS
    it = it[["iteration", "start_s", "end_s", "request_id", "kind", "tokens"]]
    # fast-forwarded runs were expanded request by request: order rows by iteration
    # (within one, rows keep the order the scheduler took the requests in)
    return it.sort_values("iteration", kind="stable").reset_index(drop=True)
