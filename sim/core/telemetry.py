"""Telemetry: per-request records, per-class counters and the time series.

Per-request rows are kept columnar (typed arrays, one per column; rows are buffered flat and
moved in blocks), written when a request *ends* (finished, rejected or unfinished), so live
state stays small however long the run. Inter-token gaps are kept per class as weighted
samples — a fast-forwarded run of k steps adds its k-1 step durations once, weighted by how
many of the class's requests decoded in it — so percentiles are exact without one entry per
token. Each run of explicitly scheduled steps is logged raw (:meth:`Telemetry.log_run`) and
folded into the gaps and the tokens per interval a block of runs at a time; the engine's decode
cohort logs its steps and members' spans instead, folded in once at the end
(:meth:`Telemetry.add_cohort`).
"""
from __future__ import annotations

from array import array
from collections import defaultdict
from itertools import chain
from typing import Callable

import numpy as np

from sim.core.columns import CONVERSIONS, FLOAT, INT, RECORDED, SOURCES, STR
from sim.core.request import Request, State

REJECTED = State.REJECTED  # (a module global: read once per request taken in, Telemetry.taken_in)

# finds distinct values: (codes, distinct values) of an array, as pandas.factorize returns them
Factorize = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]

# a request's raw row: every attribute the table reads (SOURCES), read while the request is
# still in the CPU's caches (it just ended; :meth:`Telemetry.on_end` names them one by one, in
# SOURCES' order, which the tests check: about half the time of an attrgetter of SOURCES, whose
# every read is a generic attribute lookup, in both builds). Blocks of rows are then moved into
# one typed array per attribute, raw (the ns clocks, the state as its int): the columns are
# converted (:data:`sim.core.columns.CONVERSIONS`) once, by numpy, when the table is read (a
# Python loop per value at every block cost about 0.6 % of a 16-replica ServeGen run). Reading
# 512 ended requests one attribute at a time later fetched each request from memory again (A/B
# on a 16-replica ServeGen run: rows + flushes 0.65 s -> 0.60 s of CPU). The rows are kept as one
# flat list (source j of every row: a slice with step _WIDTH), not a tuple each: a tuple kept
# until the flush is an object the cyclic GC walks at every collection until then, and the
# flat list's columns are slices rather than a transposition.
_WIDTH = len(SOURCES)
# how a source is kept: as the column that takes it unconverted is (a string list, floats), else
# as int64 (the ns clocks and the state, which only conversions read)
_RAW_TYPE = {s: next((c.dtype for c in RECORDED if c.source == (s,) and not c.convert), INT) for s in SOURCES}
# raw rows moved into the typed columns per block (a few hundred stay in the CPU's caches)
ROW_BLOCK = 512
# explicit runs logged (Telemetry.log_run) before they are folded into the counters: the log and
# a block's numpy temporaries (a few per step of the block's runs) stay a few MB
RUN_BLOCK = 4096


class Telemetry:
    def __init__(self, class_names: list[str], interval_ns: int, costs=None, block_size: int = 16) -> None:
        self.class_names = class_names
        self.interval_ns = interval_ns
        self.costs = costs
        self.block_size = block_size
        # the ended requests' raw values per source attribute (SOURCES), in the order they
        # ended: numbers in typed arrays (8 bytes a value), strings as references to shared objects
        self.raw: dict[str, list | array] = {
            s: ([] if t == STR else array("d" if t == FLOAT else "q")) for s, t in _RAW_TYPE.items()}
        self._raw_cols = list(self.raw.values())  # (in SOURCES order, as a row holds them)
        nc = len(class_names)
        self.preempt_by_mode: dict[str, int] = defaultdict(int)
        self.swap_ns_class = [0] * nc
        self.recompute_ns_class = [0] * nc
        # Inter-token gaps per class, as compact typed arrays (ns): single irregular gaps
        # (weight 1), and per-step gaps with a weight (how many requests had that gap: one entry
        # per step, not per token).
        self.itl_scalars: list[array] = [array("q") for _ in range(nc)]
        self._itl_step_vals: list[array] = [array("q") for _ in range(nc)]
        self._itl_step_wts: list[array] = [array("q") for _ in range(nc)]
        # the decode cohort's steps (see add_cohort): every duration once, and per class how
        # many members had that gap
        self.coh_itl_vals = array("q")
        self.coh_itl_wts: list[array] = [array("q") for _ in range(nc)]
        self._tokens_bin: dict[tuple[int, int], int] = defaultdict(int)
        self._tenant_tokens_bin: dict[tuple[int, str], int] = defaultdict(int)
        # the explicit runs' raw log (see log_run), folded into the counters above and the
        # per-step gaps RUN_BLOCK runs at a time (or when one of them is read)
        self._run_start = array("q")  # each run's start, ns
        self._run_k = array("q")  # its steps
        self._run_durs = array("q")  # every step's duration, ns, run after run
        self._run_emitted = array("q")  # per run, per class: requests that emitted each step
        self._run_steady = array("q")  # ... of which emitted at the previous step's end too
        self._run_extra = array("q")  # per run, per class: tokens beyond those (speculation only)
        self._run_tenants: list[str] = []  # per run, its tenants ...
        self._run_tenant_tokens: list[int] = []  # ... their tokens per step ...
        self._run_tenant_n = array("q")  # ... and how many of them
        self.preempt_bin: dict[int, int] = defaultdict(int)
        self.samples: list[tuple] = []
        # the state of the stretch the replica waits out now (:meth:`hold`), for its samples
        self._held: tuple[list[int], list[int], int, int] | None = None
        self.idle_with_work_ns = 0
        self._rows: list = []  # raw rows (SOURCES) of ended requests not yet in ``raw``, one after another
        self._gap_codes: tuple | None = None  # itl_arrays' memo: sizes, distinct gaps, counts per class
        # a merged Telemetry's replicas: their records (the request columns, the gaps) are read
        # from them at the end (:meth:`columns`, :meth:`itl_arrays`), not copied into this one
        self.parts: list[Telemetry] = []
        # False: nothing will read this telemetry's request rows and step logs (a disaggregated
        # prefill replica's, where no per-replica results are asked for): the engine does not
        # hand it its steps, and an ended request is only counted (``unkept``)
        self.keeps = True
        self.unkept = 0
        # each preemption's (request id, how: "recompute", "swap" or "fallback"), in order, when
        # a caller asks for it by setting a list here (the engine's tests read it)
        self.preempt_log: list[tuple[int, str]] | None = None

    def __reduce__(self) -> tuple:
        # (a windowed run's workers send theirs back pickled, sim.cluster.executors: the compiled
        # build's class is made only with its __init__'s arguments. It travels as a record,
        # without the cost model, which only prices swaps while it records; __getstate__ gives
        # a dict of its attributes in both builds)
        attrs: dict = self.__getstate__()  # type: ignore[assignment]
        state = {k: v for k, v in attrs.items() if k != "costs"}
        return _telemetry_from, (self.class_names, self.interval_ns, self.block_size, state)

    @classmethod
    def merged(cls, tels: list["Telemetry"], class_names: list[str], interval_ns: int, costs=None,
               block_size: int = 16) -> "Telemetry":
        """One Telemetry holding several replicas' records and counters (a cluster's total), to
        be read, not recorded into; time-series samples at the same instant are summed. The
        records stay in the replicas' Telemetry (``parts``) and are joined by numpy when read:
        copying them here, array by array, cost more than the reading (1 h ServeGen cluster,
        16 replicas: 1.9 s of growing typed arrays)."""
        m = cls(class_names, interval_ns, costs, block_size)
        nc = len(class_names)
        samples: dict[int, list] = {}
        m.parts = [p for t in tels for p in (t.parts or [t])]
        for t in tels:
            for ci in range(nc):
                m.swap_ns_class[ci] += t.swap_ns_class[ci]
                m.recompute_ns_class[ci] += t.recompute_ns_class[ci]
            _add_counts(m.preempt_by_mode, t.preempt_by_mode)
            _add_counts(m.tokens_bin, t.tokens_bin)
            _add_counts(m.tenant_tokens_bin, t.tenant_tokens_bin)
            _add_counts(m.preempt_bin, t.preempt_bin)
            m.idle_with_work_ns += t.idle_with_work_ns
            for ts, w, r, kv, sw in t.samples:
                s = samples.get(ts)
                if s is None:
                    samples[ts] = [ts, list(w), list(r), kv, sw]
                else:
                    for ci in range(nc):
                        s[1][ci] += w[ci]
                        s[2][ci] += r[ci]
                    s[3] += kv
                    s[4] += sw
        m.samples = [tuple(samples[k]) for k in sorted(samples)]
        return m

    # ---- request lifecycle ---------------------------------------------------------------
    def on_preempt(self, req: Request, mode: str, now_ns: int) -> None:
        self.preempt_by_mode[mode] += 1
        self.preempt_bin[now_ns // self.interval_ns] += 1
        if self.preempt_log is not None:
            self.preempt_log.append((req.request_id, mode))

    def on_swap(self, req: Request, blocks: int) -> None:
        if self.costs is not None and blocks:
            self.swap_ns_class[req.cls_idx] += self.costs.swap_ns(blocks, self.block_size)

    def on_end(self, req: Request) -> None:
        """Record the request's row (it finished, was rejected, or the run ended): the attributes
        the table (:mod:`sim.core.columns`) names, read now (an ended request is not changed
        again) and moved into the raw typed columns ROW_BLOCK rows at a time."""
        if not self.keeps:
            self.unkept += 1
            return
        rows = self._rows
        r = req  # (SOURCES, in order)
        rows.extend((r.request_id, r.tenant, r.cls, r.priority, r.stream, r.user, r.arrival_ns, r.first_admit_ns,
                     r.first_token_ns, r.finish_ns, r.state, r.prompt_tokens, r.hidden_output_tokens, r.max_tokens,
                     r.generated, r.reject_reason, r.preemptions, r.swapped_blocks, r.recomputed_tokens,
                     r.swap_fallbacks, r.max_itl_ns, r.deadline_s, r.prefix_hit_tokens, r.evicted_miss_tokens))
        if len(rows) >= ROW_BLOCK * _WIDTH:
            self._flush_rows()

    def on_token(self, t_ns: int, cls_idx: int, tenant: str) -> None:
        """One token emitted at ``t_ns`` outside a step (a disaggregated decode replica emits
        the token a prefill replica sampled when the request's KV lands)."""
        b = t_ns // self.interval_ns
        self._tokens_bin[(b, cls_idx)] += 1
        self._tenant_tokens_bin[(b, tenant)] += 1

    def rows_recorded(self) -> int:
        """Requests whose row has been recorded (finished, rejected or ended by the horizon; with
        ``keeps`` False, counted)."""
        return sum(len(t._rows) // _WIDTH + len(t.raw["request_id"]) + t.unkept for t in self.parts or [self])

    def _flush_rows(self) -> None:
        rows = self._rows
        if not rows:
            return
        for j, col in enumerate(self._raw_cols):
            if isinstance(col, array):
                col.fromlist(rows[j::_WIDTH])  # (about twice as fast as extend from a tuple)
            else:
                col.extend(rows[j::_WIDTH])
        rows.clear()

    # ---- steps ---------------------------------------------------------------------------
    def log_run(self, start_ns: int, durations: list[int], emitted: list[int], steady: list[int],
                by_tenant: dict[str, int], extra: list[int] | None = None) -> None:
        """Log a run of ``len(durations)`` explicit steps (ns) from ``start_ns``: per class, the
        requests that emitted a token at the end of each step (``emitted``) and those of them
        that emitted at the end of the step before it too (``steady``); tokens per step per
        tenant (``by_tenant``); with speculation, tokens per step per class beyond one per
        emitting request (``extra``, given at every run or none). Kept raw in typed arrays and
        folded a block of runs at a time (:meth:`_fold_runs`): a few C calls a run instead of
        Python loops over its classes, tenants and steps. (``fromlist``: the values are
        converted while they are in the CPU's caches; converting a block's Python lists later
        cost more than the whole log.)"""
        self._run_start.append(start_ns)
        self._run_k.append(len(durations))
        self._run_durs.fromlist(durations)
        self._run_emitted.fromlist(emitted)
        self._run_steady.fromlist(steady)
        self._run_tenants.extend(by_tenant)  # (no pairs: a new tuple each is work for the GC)
        self._run_tenant_tokens.extend(by_tenant.values())
        self._run_tenant_n.append(len(by_tenant))
        if extra is not None:
            self._run_extra.fromlist(extra)
        if len(self._run_k) >= RUN_BLOCK:
            self._fold_runs()

    def _fold_runs(self) -> None:
        """Fold the logged runs (:meth:`log_run`) into tokens per interval per class and per
        tenant (each step's tokens counted in the interval its end falls in) and the per-class
        step gaps (a run's first step: a gap for each steady request; every later step: a gap
        for each request that emitted), then clear the log. The gaps keep the order in which
        they were logged (the order of the runs, then of their steps)."""
        n = len(self._run_k)
        if n == 0:
            return
        self._fold_log(n)  # (the numpy views of the log it takes are gone when it returns)
        for a in (self._run_start, self._run_k, self._run_durs, self._run_emitted, self._run_steady,
                  self._run_extra, self._run_tenant_n):
            del a[:]
        self._run_tenants.clear()
        self._run_tenant_tokens.clear()

    def _fold_log(self, n: int) -> None:
        nc = len(self.class_names)
        k, durs = _int64(self._run_k), _int64(self._run_durs)
        emitted = _int64(self._run_emitted).reshape(n, nc)
        steady = _int64(self._run_steady).reshape(n, nc)
        tokens = emitted + _int64(self._run_extra).reshape(n, nc) if len(self._run_extra) else emitted
        first = np.cumsum(k) - k  # each run's first step
        for ci in range(nc):
            w = np.repeat(emitted[:, ci], k)
            w[first] = steady[:, ci]
            keep = w > 0
            self._itl_step_vals[ci].frombytes(durs[keep].tobytes())
            self._itl_step_wts[ci].frombytes(w[keep].tobytes())
        step_bin = _step_ends(durs, first, _int64(self._run_start)) // self.interval_ns
        b0 = int(step_bin.min())
        rel = step_bin - b0
        nb = int(rel.max()) + 1
        # segments: a run's steps in one interval (one per run unless the run crosses one)
        new = np.empty(len(rel), dtype=bool)
        new[0] = True
        np.not_equal(rel[1:], rel[:-1], out=new[1:])
        new[first] = True
        seg = np.flatnonzero(new)
        seg_steps = np.diff(seg, append=len(rel))
        seg_run = np.searchsorted(first, seg, side="right") - 1
        seg_bin = rel[seg]
        tokens_bin = self._tokens_bin
        for ci in range(nc):
            keys, sums = _sums_by_key(seg_bin, tokens[seg_run, ci] * seg_steps, nb)
            for b, m in zip(keys.tolist(), sums.tolist()):
                if m:
                    tokens_bin[(b0 + b, ci)] += int(m)
        # per tenant: each logged (run, tenant, tokens per step) counts in every segment of its run
        names = self._run_tenants
        if names:
            ids = {t: i for i, t in enumerate(dict.fromkeys(names))}
            nt = len(ids)
            entry_run = np.repeat(np.arange(n), _int64(self._run_tenant_n))
            segs_of_run = np.bincount(seg_run, minlength=n)
            reps = segs_of_run[entry_run]  # segments of each entry's run
            seg_lo = np.cumsum(segs_of_run) - segs_of_run
            pair = np.repeat(seg_lo[entry_run] - (np.cumsum(reps) - reps), reps) + np.arange(int(reps.sum()))
            tid = np.array([ids[t] for t in names], dtype=np.int64)
            per_step = np.array(self._run_tenant_tokens, dtype=np.int64)
            keys, sums = _sums_by_key(seg_bin[pair] * nt + np.repeat(tid, reps),
                                      np.repeat(per_step, reps) * seg_steps[pair], nb * nt)
            tenant_bin, tenants = self._tenant_tokens_bin, list(ids)
            for x, m in zip(keys.tolist(), sums.tolist()):
                if m:
                    tenant_bin[(b0 + x // nt, tenants[x % nt])] += int(m)

    # the counters a run adds to, read (by results, merging, the progress guard) with the log folded in
    @property
    def tokens_bin(self) -> dict[tuple[int, int], int]:
        """Tokens emitted per (interval, class index)."""
        self._fold_runs()
        return self._tokens_bin

    @property
    def tenant_tokens_bin(self) -> dict[tuple[int, str], int]:
        """Tokens emitted per (interval, tenant)."""
        self._fold_runs()
        return self._tenant_tokens_bin

    @property
    def itl_step_vals(self) -> list[array]:
        """Per class: gaps of steady steps (ns), one entry per step (weights: ``itl_step_wts``)."""
        self._fold_runs()
        return self._itl_step_vals

    @property
    def itl_step_wts(self) -> list[array]:
        """Per class: how many requests had each gap of ``itl_step_vals``."""
        self._fold_runs()
        return self._itl_step_wts

    def add_cohort(self, coh) -> None:
        """Fold the decode cohort's log (:mod:`sim.core.cohort`) into tokens per interval and
        inter-token gaps, once, at the end of the run: a member emitted one token at the end of
        every cohort step of its span, each a steady gap of that step's duration."""
        durs = _int64(coh.log_durs)
        n = len(durs)
        if n == 0:
            return
        at, t0 = _int64(coh.log_run_at), _int64(coh.log_run_ns)
        bins = _step_ends(durs, at, t0)
        bins //= self.interval_ns  # (in place: a cohort's log is millions of steps, each array fresh memory)
        j0, j1, cls, ten = _int64(coh.log_j0), _int64(coh.log_j1), _int64(coh.log_cls), _int64(coh.log_tenant)
        if len(coh.log_pause_at):
            # the first step after steps the members sat out: its gap is that much longer
            gaps = durs.copy()
            np.add.at(gaps, _int64(coh.log_pause_at), _int64(coh.log_pause_ns))
            self.coh_itl_vals.frombytes(_raw(gaps))
        else:
            self.coh_itl_vals.frombytes(_raw(durs))
        # Step end times ascend, so each interval's steps are a contiguous range: first[k] <=
        # step < first[k + 1] (found where the interval changes: np.unique sorted them again)
        first = np.flatnonzero(bins[1:] != bins[:-1])
        first += 1
        first = np.concatenate(([0], first, [n]))
        uniq_bins = bins[first[:-1]]
        step_bin = np.repeat(np.arange(len(uniq_bins)), np.diff(first))
        # the counters, read once (each read of the public names folds the run log first)
        tokens_bin, tenant_tokens_bin = self.tokens_bin, self.tenant_tokens_bin
        for ci in range(len(self.class_names)):
            # members of the class in each step: +1 at a span's first step, -1 after its last
            # (summed in place: three fewer arrays of every step a class)
            mine = cls == ci
            members = np.bincount(j0[mine], minlength=n + 1)
            members -= np.bincount(j1[mine], minlength=n + 1)
            np.cumsum(members, out=members)
            members = members[:n]
            self.coh_itl_wts[ci].frombytes(_raw(members))
            tokens = np.add.reduceat(members, first[:-1])  # (an interval's steps are contiguous)
            for b, m in zip(uniq_bins.tolist(), tokens.tolist()):
                if m:
                    tokens_bin[(b, ci)] += m  # (a Python int: tolist of int64)
        # per tenant: a span's steps in each interval it touches
        names = list(coh.tenant_ids)
        spans = j1 > j0
        j0, j1, ten = j0[spans], j1[spans], ten[spans]
        k0 = step_bin[j0]
        reps = step_bin[j1 - 1] - k0 + 1  # intervals each span touches
        span = np.repeat(np.arange(len(j0)), reps)
        k = k0[span] + np.arange(len(span)) - np.repeat(np.cumsum(reps) - reps, reps)
        steps = np.minimum(j1[span], first[k + 1]) - np.maximum(j0[span], first[k])
        # the distinct (interval, tenant) pairs in (interval, tenant) order, as one integer each
        # (np.unique(axis=0) sorts rows as raw bytes: 30 times slower)
        nt = max(len(names), 1)
        keys, sums = _sums_by_key(k * nt + ten[span], steps, len(uniq_bins) * nt)
        interval = uniq_bins.tolist()
        for kb, t, m in zip((keys // nt).tolist(), (keys % nt).tolist(), sums.tolist()):
            tenant_tokens_bin[(interval[kb], names[t])] += int(m)

    def itl_arrays(self, cls_idx: int, factorize: Factorize | None = None) -> tuple[np.ndarray, np.ndarray]:
        """All inter-token gaps of a class (every class's, pooled, for ``cls_idx`` -1): distinct
        gaps (ns, ascending) and how many there were of each. Canonical, so statistics do not
        depend on how the engine batched its records. Gaps near the shortest (most of them) are
        counted in a table by value; ``factorize`` finds the distinct ones among the rest, as
        ``pandas.factorize`` does (codes, distinct values in any order); the default,
        ``np.unique``, sorts them, which the results layer avoids by passing pandas' hashing one
        (the core does not import pandas)."""
        parts = self.parts or [self]
        nc = len(self.class_names)
        sizes = [len(t.coh_itl_vals) for t in parts] + [len(t.itl_scalars[c]) + len(t.itl_step_vals[c])
                                                        for t in parts for c in range(nc)]
        if self._gap_codes is None or self._gap_codes[0] != sizes:
            self._gap_codes = (sizes, *_gap_counts(parts, nc, factorize or _np_factorize))
        _, distinct, counts = self._gap_codes
        if cls_idx < 0:  # (every class's gaps pooled)
            pooled = counts.sum(axis=0)
            seen = pooled > 0
            return distinct[seen], pooled[seen].astype(np.int64)
        seen = counts[cls_idx] > 0
        return distinct[seen], counts[cls_idx][seen].astype(np.int64)

    # ---- time series ---------------------------------------------------------------------
    # A sample at instant t is the replica's state at t, after everything that happens at t:
    # ``waiting``: requests that arrived by t (arrival <= t), were not rejected and had not been
    # admitted by t (or were preempted back into the queue); ``running``: those admitted by t and
    # not finished by t (admitted <= t < finish), that is the running set of the step in progress
    # at t (or starting at t); ``kv_blocks_used`` / ``swap_blocks_used``: the device / host
    # blocks held then (during that step), cached prefix groups included. An idle replica's
    # sample is its idle state. The engine only sees an instant between steps, so the loop
    # (:func:`sim.core.loop.replica_loop`) keeps the state of each stretch it waits out (a run
    # of steps: its last step's, where any sample inside the run falls; an idle wait: the state
    # it waits in: :meth:`hold`) and records the stretch's samples at its end (:meth:`settle`);
    # the requests it takes in there (it sees an arrival only at a boundary, a front end's delay
    # later) are then counted as waiting in the samples since their arrival (:meth:`taken_in`).
    def sample(self, t_ns: int, engine) -> None:
        """Record the waiting and running requests per class and the KV use at ``t_ns`` (ns): the
        engine's counts now (kept as requests enter and leave each set), read at a boundary
        where the step starting at ``t_ns`` was planned, or where the run ends."""
        pool = engine.pool
        self.samples.append((t_ns, list(engine.queues.waiting_count), list(engine.queues.running_count),
                             pool.total - pool.free, pool.host_used))

    def hold(self, engine) -> None:
        """Keep the engine's state now as that of the stretch the replica is about to wait out, or
        of the last step of the run being applied (before the requests whose last token ends it
        leave): per-class waiting and running counts, device and host blocks in use."""
        pool = engine.pool
        q = engine.queues
        self._held = (list(q.waiting_count), list(q.running_count), pool.total - pool.free, pool.host_used)

    def settle(self, t_ns: int, until_ns: int, engine) -> int:
        """Record the samples at ``t_ns``, ``t_ns + interval``, ... before ``until_ns`` (ns: the
        boundary ending the stretch they fall in) with the state held for that stretch
        (:meth:`hold`; the requests that arrived inside it are added by :meth:`taken_in`);
        returns the next sample instant. (With none held, the replica's loop only started at
        ``until_ns``: it was empty before, its blocks as they are now.)"""
        held = self._held
        if held is None:
            pool = engine.pool
            held = ([0] * len(self.class_names), [0] * len(self.class_names), pool.total - pool.free,
                    pool.host_used)
        self._held = None
        waiting, running, kv, host = held
        iv = self.interval_ns
        samples = self.samples
        while t_ns < until_ns:
            samples.append((t_ns, waiting, running, kv, host))  # (the lists shared: never changed in place)
            t_ns += iv
        return t_ns

    def taken_in(self, reqs: list) -> None:
        """``reqs`` were taken in by the engine (at a boundary, or joining a run in flight), after
        the samples recorded so far: each one not rejected was waiting from its arrival, so it
        counts in those at or after its arrival (inside the stretch that just ended, or before
        it when a front end held it back: ``frontend_s``), as the queue it was in then."""
        samples = self.samples
        if not samples:
            return
        iv = self.interval_ns
        last = samples[-1][0]
        for r in reqs:
            a = r.arrival_ns
            if a <= last and r.state != REJECTED:
                ci = r.cls_idx
                for j in range(1, (last - a) // iv + 2):  # the samples at last - (j - 1) * iv >= a
                    t, w, run, kv, host = samples[-j]
                    w = list(w)  # (a new list: others may share it)
                    w[ci] += 1
                    samples[-j] = (t, w, run, kv, host)

    def columns(self) -> dict[str, object]:
        """The recorded request columns (:data:`sim.core.columns.RECORDED`): numbers as numpy
        arrays (float64 or int64), strings as lists; a merged Telemetry's are its parts' joined,
        in part order."""
        parts = self.parts or [self]
        for t in parts:
            t._flush_rows()
        raw: dict[str, object] = {}
        for s, v in self.raw.items():
            if isinstance(v, array):
                raw[s] = _joined([t.raw[s] for t in parts], np.float64 if v.typecode == "d" else np.int64)
            else:
                raw[s] = v if len(parts) == 1 and parts[0] is self else list(chain.from_iterable(t.raw[s] for t in parts))
        return _converted(raw)

    def part_columns(self) -> list[dict[str, object]]:
        """Each part's recorded request columns (a merged Telemetry's replicas, in order; else
        this one's), as :meth:`columns` gives them for one part: raw numbers read as numpy views
        of the typed arrays (a converted column is a new array), strings as the lists themselves."""
        parts = self.parts or [self]
        out: list[dict[str, object]] = []
        for t in parts:
            t._flush_rows()
            out.append(_converted({s: np.frombuffer(v, dtype=np.float64 if v.typecode == "d" else np.int64)
                                   if isinstance(v, array) else v for s, v in t.raw.items()}))
        return out


def _converted(raw: dict[str, object]) -> dict[str, object]:
    """The recorded request columns (:data:`sim.core.columns.RECORDED`, in order) from the raw
    values of their sources (SOURCES: a numpy array, or a list of strings, each)."""
    return {c.name: CONVERSIONS[c.convert](*(raw[s] for s in c.source)) if c.convert else raw[c.source[0]]
            for c in RECORDED}


def _int64(a: array) -> np.ndarray:
    """A typed array of ints ("q") as a numpy view, no copy."""
    return np.frombuffer(a, dtype=np.int64)


def _raw(a: np.ndarray) -> memoryview:
    """A contiguous numpy array's bytes, not copied, for ``array.frombytes`` (which takes only
    a byte buffer: ``tobytes`` copied every cohort log once more, 4.5 MB per class per replica
    at 1 h ServeGen)."""
    return np.ascontiguousarray(a).data.cast("B")


def _joined(arrays: list, dtype: type = np.int64) -> np.ndarray:
    """Typed arrays (or numpy arrays of ``dtype``) as one numpy array: a view of a single one, else
    a copy of them all in order."""
    if len(arrays) == 1:
        return np.frombuffer(arrays[0], dtype=dtype)
    return np.concatenate([np.frombuffer(a, dtype=dtype) for a in arrays])


def _step_ends(durs: np.ndarray, first: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Each step's end (ns) in a log of runs, one after another: run r's steps are
    ``durs[first[r]:first[r + 1]]`` (every run has at least one) and it started at ``start[r]``.
    A step ends at its run's start plus the run's steps so far: the cumulative sum, shifted per
    run (repeated per run, not searched for per step)."""
    cs = np.cumsum(durs)
    cs += np.repeat(start - (cs[first] - durs[first]), np.diff(first, append=len(durs)))
    return cs


def _sums_by_key(key: np.ndarray, weights: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of ``key`` (ints in [0, size)), ascending, and the sum of ``weights``
    over each (float64, added in ``key``'s order). Counted into ``size`` bins when that is not
    much more than ``key`` is long (no sort: 1 h ServeGen cluster, 16 cohorts' logs, 0.18 ->
    0.03 s), else by np.unique."""
    if size <= 4 * len(key) + 4096:
        keys = np.flatnonzero(np.bincount(key, minlength=size))
        return keys, np.bincount(key, weights=weights, minlength=size)[keys]
    keys, inverse = np.unique(key, return_inverse=True)
    return keys, np.bincount(inverse.ravel(), weights=weights, minlength=len(keys))


def _gap_counts(parts: list[Telemetry], nc: int, factorize: Factorize) -> tuple[np.ndarray, np.ndarray]:
    """Every inter-token gap of ``parts`` (a merged Telemetry's replicas, or one Telemetry):
    the distinct gaps (ns, ascending) and, per class, how many there were of each (float64 rows,
    whole numbers, zero for a gap the class never had). Each part's gaps are found distinct on
    their own (its cohort's step durations, shared by the classes, and its single and per-step
    gaps), then the parts' distinct gaps are merged: one replica's hash table stays in the CPU's
    caches, and no array of every gap (1 h ServeGen cluster: 16 M) or of its codes is made (cold,
    as at the end of a run: 1.4 -> 0.7 s). Weights are whole numbers: their float sums are exact
    in any order."""
    uniq: list[np.ndarray] = []
    counts: list[list[np.ndarray]] = [[] for _ in range(nc)]
    for t in parts:
        pieces = [t.coh_itl_vals] + [t.itl_scalars[c] for c in range(nc)] + [t.itl_step_vals[c] for c in range(nc)]
        sizes = [len(a) for a in pieces]
        if not sum(sizes):
            continue
        codes, distinct = _sorted_codes([_int64(a) for a in pieces], factorize)
        d = len(distinct)
        uniq.append(distinct)
        ends = np.cumsum(sizes).tolist()
        coh = codes[:ends[0]]
        for c in range(nc):
            single, step = codes[ends[c]:ends[c + 1]], codes[ends[nc + c]:ends[nc + c + 1]]
            counts[c].append(np.bincount(coh, weights=_int64(t.coh_itl_wts[c]), minlength=d)
                             + np.bincount(single, minlength=d)
                             + np.bincount(step, weights=_int64(t.itl_step_wts[c]), minlength=d))
    if not uniq:
        return np.zeros(0, dtype=np.int64), np.zeros((nc, 0))
    if len(uniq) == 1:  # (one part: its distinct gaps and counts as they are)
        return uniq[0], np.array([cs[0] for cs in counts]).reshape(nc, len(uniq[0]))
    codes, distinct = _sorted_codes(uniq, factorize)
    d = len(distinct)
    return distinct, np.array([np.bincount(codes, weights=np.concatenate(cs), minlength=d)
                               for cs in counts]).reshape(nc, d)


# the widest range of gaps (ns) counted directly (_sorted_codes): a table of 5 bytes a value
DENSE_GAPS = 1 << 22


def _sorted_codes(pieces: list[np.ndarray], factorize: Factorize) -> tuple[np.ndarray, np.ndarray]:
    """The int64 arrays ``pieces``, joined in order, as codes into their distinct values
    (ascending): (codes, distinct values). The values within DENSE_GAPS of the smallest (at
    most 4 per value; most of a run's gaps: its shortest steps crowd near the smallest) are
    marked in a table by value, their codes the marks' running count; only the others are
    hashed (``factorize``) and sorted. Hashing every gap spent a cache miss on most of them
    (1M-request run, 8.5 M gaps, 1.8 M distinct: 0.78 -> 0.35 s). Those others are all larger
    than every marked one, so the distinct values come out in order."""
    n = sum(len(v) for v in pieces)
    views = [v for v in pieces if len(v)]
    if not views:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    lo = min(int(v.min()) for v in views)
    hi = max(int(v.max()) for v in views)
    if not (-(2 ** 62) < lo and hi < 2 ** 62):  # (a difference would not fit)
        return _hashed_sorted(_joined(views), factorize)
    width = min(hi - lo + 1, DENSE_GAPS, max(1024, 4 * n))
    codes = np.empty(n, dtype=np.int64)  # (each value less the smallest first, its code after)
    at = 0
    for v in views:
        np.subtract(v, lo, out=codes[at:at + len(v)])
        at += len(v)
    dense = codes < width
    rel = codes[dense]
    mark = np.zeros(width, dtype=bool)
    mark[rel] = True
    rank: np.ndarray = np.cumsum(mark, dtype=np.int32)  # (width <= DENSE_GAPS)
    rank -= 1
    codes[dense] = rank[rel]
    distinct = np.flatnonzero(mark)
    distinct += lo
    if len(rel) < n:  # the larger gaps: hashed, sorted, coded after the marked ones
        sparse = ~dense
        vals = codes[sparse]
        vals += lo
        scodes, sdistinct = _hashed_sorted(vals, factorize)
        scodes += len(distinct)
        codes[sparse] = scodes
        distinct = np.concatenate([distinct, sdistinct])
    return codes, distinct


def _hashed_sorted(vals: np.ndarray, factorize: Factorize) -> tuple[np.ndarray, np.ndarray]:
    """``vals`` as codes into their distinct values, ascending: hashed (``factorize``), then the
    distinct values sorted and the codes renumbered to match."""
    codes, distinct = _factorized(vals, factorize)
    distinct, order = _sorted_distinct(distinct)
    inv = np.empty(len(order), dtype=np.int64)  # (where each distinct value went)
    inv[order] = np.arange(len(order))
    return inv[codes], distinct


def _sorted_distinct(distinct: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct int64 values in ascending order, and the order that puts them so (``argsort``'s,
    as the values are distinct). Values in [0, 2**31) are sorted with their positions packed
    below them into one int64 each: a sort, not an argsort (1.8 M gaps: 0.15 -> 0.10 s)."""
    d = len(distinct)
    if d and 0 <= int(distinct.min()) and int(distinct.max()) < 2 ** 31:
        key = distinct << 32
        key |= np.arange(d, dtype=np.int64)
        key.sort()
        order = key & 0xFFFFFFFF
        key >>= 32
        return key, order
    order = np.argsort(distinct)
    return distinct[order], order


def _factorized(vals: np.ndarray, factorize: Factorize) -> tuple[np.ndarray, np.ndarray]:
    """``factorize(vals)`` of int64 gaps, the distinct values int64; hashed as 32-bit integers
    when they all fit (gaps under 2.1 s: a 1 M-gap replica's table in half the memory, 0.43 ->
    0.29 s for 16 of them), the same values and codes."""
    if len(vals) and -(2 ** 31) <= int(vals.min()) and int(vals.max()) < 2 ** 31:
        codes, distinct = factorize(vals.astype(np.int32))
        return codes, distinct.astype(np.int64)
    return factorize(vals)


def _np_factorize(vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``vals``' codes and distinct values (ascending), by sorting (``np.unique``)."""
    distinct, codes = np.unique(vals, return_inverse=True)
    return codes, distinct


def _add_counts(mine: dict, theirs: dict) -> None:
    """Add one replica's counters (a defaultdict(int)) into the merged one."""
    for key, n in theirs.items():
        mine[key] += n


def _telemetry_from(class_names: list[str], interval_ns: int, block_size: int, state: dict) -> Telemetry:
    """A telemetry record with these attribute values (``state``): unpickled."""
    t = Telemetry(class_names, interval_ns, None, block_size)
    for k, v in state.items():
        setattr(t, k, v)
    return t
