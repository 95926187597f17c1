"""Fit a profile to a user's own benchmark runs: ``priosim calibrate --from-runs`` (no torch).

Every run (:func:`calibrate.runs.read_run`) is replayed (:func:`calibrate.runs.replay`) on the
base profile with trial values of the terms of :mod:`calibrate.runs.terms`: the engine overhead
(per step, per sequence, per admitted request, front end; per all-reduce for a tensor-parallel
profile), the achieved HBM-bandwidth and FLOPs fractions (the profile's step terms rescaled by
:mod:`calibrate.runs.rescale`) and, where the runs show its limit (:func:`kv_shown`), the KV
capacity. ``scipy.optimize.least_squares`` (trust region, bounds, soft-L1 loss with f_scale 0.1)
minimises the relative errors ``simulated / measured - 1`` of :data:`METRICS` over every run.
Each metric kind (TTFT, TPOT/ITL, E2E, throughput) weighs the same in total: a residual is
weighted by 1/sqrt(the metrics of its kind), so TTFT's two count as much as TPOT/ITL's four. A
summary-only run (no per-request lists) replayed at its mean lengths counts with its means and
throughputs only (they keep a length mix's means, not its percentiles); one whose lengths its
dataset settings give (SGLang's random dataset) counts whole.

The optimiser works on each term mapped onto [0, 1] over its bounds, so one finite-difference
step (:data:`DIFF_STEP`, 1 % of a term's range) suits terms of any unit: the simulator is
deterministic but piecewise (integer-nanosecond steps, discrete batches), and a step much
smaller than a batch's worth of change would read the staircase instead of the slope.

Identification: before the fit the Jacobian at the starting values is taken once. A term whose
slope there, times its whole range, moves no metric by 1 % is *not identified* (e.g. the KV
capacity of runs that never fill it); a slope is local, so such a term is also replayed at both
ends of its range and the report says what it does there (:func:`_at_bounds`); nor is one whose
effect the others can mimic but for under 1 % (the part of its
Jacobian column orthogonal to the others', by pivoted QR: e.g. per step and per sequence when
every run has one concurrency). Those are held where the Jacobian was taken (the base value, or
the start a grid before the fit chose: :func:`_grid_start`) and reported. For a
tensor-parallel profile ``step_s`` is held too: it and ``allreduce_latency_s`` are both a step's
fixed time, which no run can split, and the all-reduces' range (2 x layers x 0-100 us) covers
the fixed time's whole span, down to a floor that ``step_s`` alone (at least 0) cannot reach.
Uncertainty: sqrt of the diagonal of (J^T J)^-1 times the residual variance sum(r^2) / (m - n),
with J taken again at the solution; a term whose 1-sigma is wider than its whole range is
reported "fitted, not determined" (:attr:`FittedTerm.determined`). A fitted term at a bound of
its physical range is warned about (:func:`bound_warnings`): a sign of the wrong base profile.
With three runs or more, each run is also left out in turn: the terms are refitted on the others
(from the full fit) and the left-out run replayed.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
from scipy.optimize import least_squares

from calibrate.fidelity.fit import soft_l1
from calibrate.runs.compare import Comparison, measured_metrics, replay
from calibrate.runs.rescale import base_efficiencies, rescale_profile
from calibrate.runs.scenario import engine_of, forced_engine, scenario_dict
from calibrate.runs.table import Run, RunError, run_label
from calibrate.runs.terms import ALLREDUCE_TERM, OVERHEAD_TERMS, OVERLAP_TERM, Term, efficiency_terms, kv_term

#: metric kind -> the metric names fitted (each kind weighs the same in total)
METRICS = {"ttft": ("ttft_mean_ms", "ttft_p50_ms"),
           "tpot": ("tpot_mean_ms", "tpot_p50_ms", "itl_mean_ms", "itl_p50_ms"),
           "e2e": ("e2e_mean_ms", "e2e_p50_ms"),
           "throughput": ("request_throughput", "output_throughput")}
FIT_METRICS = tuple(m for names in METRICS.values() for m in names)
#: a metric the simulation could not compute (no request finished) counts as 100 % off
PENALTY = 1.0
#: finite-difference step, in units of a term's range
DIFF_STEP = 0.01
#: a term whose full range moves the weighted residuals by less than this is not identified
INSENSITIVE = 0.01
#: the KV capacity is fitted when a run reaches this fraction of the base's KV memory
KV_SHOWN = 0.5
F_SCALE = 0.1
#: least-squares rounds, each from the last one's solution, while the loss still falls
RESTARTS = 3
#: the solution's precision, in units of a term's range
XTOL = 1e-4
#: the fit stops once every weighted relative error is below this (a synthetic run reproduced)
DONE = 2e-5
#: Values (s) of ``frontend_busy_s`` tried before the fit when no start is given: its loss is
#: flat from 0 until the server's rate (1 / frontend_busy_s) drops under the rate a run sends at,
#: then steep, so a fit started at a preset's ~0 stays there on a host whose API server caps a
#: burst. The best point starts the fit if it lowers the loss by BUSY_GAIN or more.
BUSY_GRID_S = (2e-3, 5e-3, 10e-3, 20e-3, 40e-3)
BUSY_GAIN = 0.1
#: Per-sequence CPU times (s) tried with ``cpu_overlap`` at 1 before the fit of an engine with an
#: overlap scheduler (the only engines it is fitted for). With a preset's small CPU terms, hiding
#: them changes nothing, so at the base the Jacobian holds cpu_overlap as insensitive, and a
#: per-sequence term alone (added) slows the small batches too: a host whose steps are the GPU's
#: at small batches and the CPU's at large ones needs both moved at once. The best point starts
#: the fit if it lowers the loss by BUSY_GAIN or more.
OVERLAP_SEQ_GRID_S = (50e-6, 100e-6, 200e-6)
#: why ``step_s`` is held for a tensor-parallel profile
TIED_STEP = "a tensor-parallel step's fixed time is fitted as allreduce_latency_s: no run can split the two"


@dataclass
class FittedTerm:
    """One term: base and fitted value (its own unit), bounds, 1-sigma uncertainty (None when
    not fitted), identified or held at the base, and why."""

    term: Term
    base: float
    value: float
    sigma: float | None
    identified: bool
    note: str = ""

    @property
    def determined(self) -> bool:
        """A fitted term whose 1-sigma uncertainty is no wider than its whole allowed range:
        wider, the runs do not pin it down (any value of the range fits about as well)."""
        return (self.identified and self.sigma is not None and math.isfinite(self.sigma)
                and self.sigma <= self.term.hi - self.term.lo)

    @property
    def status(self) -> str:
        """How the report and the profile's meta describe the term: fitted, fitted but not
        determined (:attr:`determined`), or held and why."""
        if not self.identified:
            return f"held at base: not identified ({self.note})"
        if self.determined:
            return "fitted"
        s, span = self.term.scale, self.term.hi - self.term.lo
        width = f"+/-{self.sigma / s:.3g} {self.term.unit}".rstrip() if self.sigma is not None and math.isfinite(
            self.sigma) else "its uncertainty unknown"
        return f"fitted, not determined ({width} wider than its range of {span / s:.3g} {self.term.unit})".replace(
            " )", ")")


def _kept_in_means(name: str) -> bool:
    """The metrics a summary-only run is fitted on: its requests are replayed at their mean
    lengths (:func:`calibrate.runs.vllm.mean_lengths`), which keeps a length mix's means and
    throughput, not its percentiles."""
    return "_mean_" in name or name.endswith("_throughput")


@dataclass
class RunResult:
    path: str
    format: str
    sha256: str
    requests: int
    before: dict[str, float]
    after: dict[str, float]
    loro: dict[str, float] | None = None
    part: int | None = None  # its place in a file of several results (Run.part)

    @property
    def label(self) -> str:
        return run_label(self.path, self.part)


@dataclass
class FitResult:
    terms: list[FittedTerm]
    runs: list[RunResult]
    profile: dict
    overhead: dict
    base_profile: str
    engine: str
    notes: list[str] = field(default_factory=list)
    cost: float = math.nan
    evaluations: int = 0


def sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def base_document(profile: str) -> tuple[dict, Path]:
    """The base profile's JSON and its file (a shipped name or a path); checked by the cost
    model's loader (a bad profile raises :class:`sim.core.costs.ProfileError`, one line)."""
    from sim.core.costs import ProfileError, find_profile, load_profile

    load_profile(profile, where="--profile")
    path = find_profile(profile) if not profile.endswith(".json") else Path(profile)
    doc = json.loads(Path(path).read_text())
    if doc.get("schema") is None:
        raise ProfileError(f"--profile {profile}: an inline linear profile cannot be rescaled "
                           f"(expected a priosim.profile/1 file)")
    return doc, Path(path)


def _toml_table(terms: dict) -> str:
    return "{" + ", ".join(f"{k} = {v!r}" for k, v in terms.items()) + "}"


class Problem:
    """The replays of ``runs`` on ``profile`` as a function of the fitted terms."""

    def __init__(self, runs: list[Run], profile: str, overrides: Iterable[str] = (), seed: int = 0,
                 workdir: str | Path | None = None, workers: int = 1):
        from sim.config import scenario_from_dict
        from sim.core.overhead import resolve_overhead

        overrides = list(overrides)
        self.overrides = overrides
        # the runs of one trial replay side by side in worker processes (each replay is its own
        # deterministic simulation: the same fit whatever the count); made at the first trial
        self.workers = max(1, min(workers, len(runs)))
        self._pool: Any = None
        if not runs:
            raise RunError("--from-runs: no run files (expected at least one benchmark result file)")
        engines = {engine_of(r) for r in runs}
        forced = forced_engine(overrides)
        if forced:  # (--set engine.engine or --engine-args serve every run with that engine)
            engines = {forced}
        if len(engines) > 1:
            raise RunError("--from-runs: the runs were served by different engines ("
                           + ", ".join(f"{r.label}: {engine_of(r)}" for r in runs)
                           + "; expected one engine's runs: fit each engine on its own)")
        self.engine = engines.pop()
        self.runs, self.profile, self.seed = runs, profile, seed
        self.doc, self.path = base_document(profile)
        self._tmp = tempfile.TemporaryDirectory(prefix="priosim-fit-") if workdir is None else None
        self.workdir = Path(workdir if workdir is not None else self._tmp.name)
        sc = scenario_from_dict(scenario_dict(runs[0], str(self.path.resolve()), seed), source=runs[0].source,
                                overrides=self.overrides)
        spec = sc.engine.overhead if sc.engine.overhead is not None else self.doc.get("overhead")
        self.base_overhead = resolve_overhead(spec).terms()
        self.block_bytes_per_token = self._kv_bytes_per_token()
        h0, f0, datasheet = base_efficiencies(self.doc)
        eff = efficiency_terms(datasheet)
        self.tp = int((self.doc.get("model") or {}).get("tp") or 1)
        #: the engine-overhead terms fitted (the all-reduce's only for a tensor-parallel profile,
        #: the hidden CPU share only for an engine with an overlap scheduler)
        self.overlapped = bool(self.base_overhead.get("overlap_schedule"))
        self.overhead_terms = (list(OVERHEAD_TERMS) + ([ALLREDUCE_TERM] if self.tp > 1 else [])
                               + ([OVERLAP_TERM] if self.overlapped else []))
        self.candidates: list[Term] = list(self.overhead_terms) + list(eff)
        self.base = {t.name: float(self.base_overhead[t.name]) for t in self.overhead_terms}
        self.base.update(hbm_efficiency=h0, flops_efficiency=f0)
        self.base["kv_capacity_bytes"] = float((self.doc.get("memory") or {}).get("kv_capacity_bytes", 0.0))
        self.measured = [measured_metrics(r) for r in runs]
        self.evaluations = 0
        self._cache: dict[tuple, list[Comparison]] = {}
        self._n = 0

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
        if self._tmp is not None:
            self._tmp.cleanup()

    def _kv_bytes_per_token(self) -> float:
        m = self.doc.get("model") or {}
        if isinstance(m.get("kv_bytes_per_token"), (int, float)):  # (a derived profile says it)
            return float(m["kv_bytes_per_token"])
        try:
            dtype_bytes = int(m.get("dtype_bytes") or 2)
            return 2.0 * int(m["layers"]) * int(m["kv_heads"]) * int(m["head_dim"]) * dtype_bytes
        except (KeyError, TypeError, ValueError):
            return 0.0

    def add_kv(self, reasons: list[str]) -> Term | None:
        """Add the KV capacity to the candidates (bounds from the runs and the GPU)."""
        from sim.engines.gpu import from_profile_json

        kvb = self.block_bytes_per_token
        if kvb <= 0 or self.base["kv_capacity_bytes"] <= 0:
            return None
        biggest = max(int((r.requests["input_tokens"] + r.requests["output_tokens"]).max()) for r in self.runs)
        gpu = from_profile_json(self.doc)
        hi = gpu.memory_bytes - gpu.weights_bytes if gpu.memory_bytes > gpu.weights_bytes > 0 else 0.0
        hi = max(hi, 2.0 * self.base["kv_capacity_bytes"]) if hi <= 0 else hi
        t = kv_term(float(biggest * kvb), float(hi))
        self.candidates.append(t)
        return t

    # -- evaluation ------------------------------------------------------------------------
    def values(self, fitted: dict[str, float]) -> dict[str, float]:
        v = dict(self.base)
        v.update(fitted)
        return v

    def document(self, v: dict[str, float]) -> dict:
        """The profile document at values ``v`` (every term; :meth:`values`)."""
        doc = rescale_profile(self.doc, v["hbm_efficiency"], v["flops_efficiency"])
        if v["kv_capacity_bytes"] != self.base["kv_capacity_bytes"]:
            doc.setdefault("memory", {})["kv_capacity_bytes"] = float(v["kv_capacity_bytes"])
        doc["overhead"] = self.overhead(v)
        return doc

    def overhead(self, v: dict[str, float]) -> dict:
        table = dict(self.base_overhead)
        for t in self.overhead_terms:
            table[t.name] = float(v[t.name])
        return table

    def replays(self, v: dict[str, float], idx: Iterable[int]) -> list[Comparison]:
        idx = tuple(idx)
        key = (tuple(sorted(v.items())), idx)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        self._n += 1
        path = self.workdir / f"trial-{self._n % 2}.json"  # (a file per trial; the previous one kept)
        path.write_text(json.dumps(self.document(v), allow_nan=False))
        sets = self.overrides + [f"engine.overhead={_toml_table(self.overhead(v))}"]
        if self.workers > 1 and len(idx) > 1:
            if self._pool is None:
                from concurrent.futures import ProcessPoolExecutor
                self._pool = ProcessPoolExecutor(self.workers)
            out = list(self._pool.map(_replay_one, [(self.runs[i], sets, str(path), self.seed) for i in idx]))
        else:
            out = [replay(self.runs[i], sets, profile=str(path), seed=self.seed) for i in idx]
        self.evaluations += len(idx)
        if len(self._cache) > 4096:
            self._cache.clear()
        self._cache[key] = out
        return out

    def residuals(self, v: dict[str, float], idx: Iterable[int]) -> np.ndarray:
        idx = tuple(idx)
        res = []
        for i, cmp in zip(idx, self.replays(v, idx)):
            for kind, names in METRICS.items():
                w = 1.0 / math.sqrt(len(names))
                for name in names:
                    if not math.isfinite(self.measured[i].get(name, math.nan)) or self.measured[i][name] == 0:
                        continue
                    if self.runs[i].lengths == "means" and not _kept_in_means(name):
                        continue  # (replayed at its mean lengths: a mix's percentiles are not reproduced)
                    e = cmp.metrics[name]["error"]
                    res.append(w * (e if e is not None and math.isfinite(e) else PENALTY))
        return np.asarray(res, dtype=float)


def errors(cmp: Comparison) -> dict[str, float]:
    return {m: cmp.metrics[m]["error"] for m in FIT_METRICS if m in cmp.metrics}


def kv_shown(run: Run, cmp: Comparison, capacity_bytes: float, bytes_per_token: float) -> str | None:
    """Why the runs show the KV limit (None when they do not): the replay on the base preempted
    or filled 90 % of its KV blocks, or the measured requests held at once (their prompts and
    the tokens they had generated, from the file's times) reached :data:`KV_SHOWN` of it."""
    name = run.label
    info = cmp.results.summary_dict["run"]
    if sum((info.get("preemptions_by_mode") or {}).values()):
        return f"{name}: the replay on the base profile preempted"
    ts = cmp.results.timeseries
    if len(ts) and info.get("kv_blocks") and ts["kv_blocks_used"].max() >= 0.9 * info["kv_blocks"]:
        return f"{name}: the replay on the base profile filled 90 % of its KV blocks"
    r = run.requests
    if run.has_starts and capacity_bytes > 0 and bytes_per_token > 0 and len(r) <= 20000:
        s = r["start_s"].to_numpy()
        first, end = s + r["ttft_s"].to_numpy(), s + r["e2e_s"].to_numpy()
        span = np.maximum(end - first, 1e-12)
        t = end[:, None]  # the moments of most tokens held: just before each request ends
        held = (first[None, :] <= t) & (t <= end[None, :])
        tokens = r["input_tokens"].to_numpy()[None, :] + r["output_tokens"].to_numpy()[None, :] * \
            np.clip((t - first[None, :]) / span[None, :], 0, 1)
        peak = float((tokens * held).sum(axis=1).max())
        if peak * bytes_per_token >= KV_SHOWN * capacity_bytes:
            return (f"{name}: the measured requests held {peak:.0f} tokens at once, "
                    f"{peak * bytes_per_token / capacity_bytes:.0%} of the base's KV memory")
    return None


def _to_u(t: Term, x: float) -> float:
    return float(np.clip((x - t.lo) / (t.hi - t.lo), 0.0, 1.0))


def _from_u(t: Term, u: float) -> float:
    return t.lo + float(u) * (t.hi - t.lo)


def _jacobian(fun: Callable[[np.ndarray], np.ndarray], u: np.ndarray, r0: np.ndarray,
              skip: Iterable[int] = ()) -> np.ndarray:
    """Forward differences of ``DIFF_STEP`` in [0, 1] (backward at the upper bound); the
    columns ``skip`` are left 0 (terms held whatever the runs show)."""
    J = np.zeros((r0.size, u.size))
    for j in range(u.size):
        if j in skip:
            continue
        h = DIFF_STEP if u[j] + DIFF_STEP <= 1.0 else -DIFF_STEP
        du = u.copy()
        du[j] += h
        J[:, j] = (fun(du) - r0) / h
    return J


def identify(J: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Which columns of ``J`` (in [0, 1] units) the residuals identify, and why not the others.

    A term is identified when what it does that no other term can mimic (its column's part
    orthogonal to the others', by pivoted QR) moves the weighted residuals by
    :data:`INSENSITIVE` over its range, at the slope ``J`` has where it was taken (a local
    measure: :func:`_at_bounds` says what the term does at the ends of its range)."""
    from scipy.linalg import qr

    n = J.shape[1]
    norms = np.linalg.norm(J, axis=0)
    ok = norms >= INSENSITIVE
    # (a slope taken at one point: the term may still matter far from it, which _at_bounds checks)
    why = ["" if ok[j] else "insensitive near its base value: its slope there, times its whole range, moves "
           "the metrics by under 1 %" for j in range(n)]
    cols = np.flatnonzero(ok)
    if cols.size > 1:
        _, R, piv = qr(J[:, cols] / norms[cols], mode="economic", pivoting=True)
        for k, p in enumerate(piv):
            # (fewer residuals than terms: the columns past the rank have no diagonal, nothing
            # left to tell them from the others)
            if k >= R.shape[0] or abs(R[k, k]) * norms[cols[p]] < INSENSITIVE:
                ok[cols[p]] = False
                why[cols[p]] = "confounded with the other terms (the runs cannot tell them apart)"
    return ok, why


def _at_bounds(problem: Problem, term: Term, x0: dict[str, float], every: tuple[int, ...]) -> str:
    """What ``term`` does at each end of its range, the others at ``x0``: the simulated metric
    (of :data:`FIT_METRICS`, any run) that moves most from its value at ``x0``, as text to
    follow the "insensitive near its base value" of :func:`identify` (the Jacobian's slope is
    local: a term flat near its base, such as ``frontend_busy_s`` below the runs' rate, may move
    TTFT several-fold at its top). Two replays of every run per term."""
    here = problem.replays(problem.values(x0), every)
    parts = []
    for end, side in ((term.lo, "lower"), (term.hi, "upper")):
        if end == x0[term.name]:
            continue
        there = problem.replays(problem.values({**x0, term.name: end}), every)
        moves = [(abs(b - a) / abs(a), (b - a) / abs(a), name, run.label)
                 for run, c0, c1 in zip(problem.runs, here, there) for name in FIT_METRICS
                 if name in c0.metrics and name in c1.metrics
                 and math.isfinite(a := c0.metrics[name]["simulated"]) and a != 0
                 and math.isfinite(b := c1.metrics[name]["simulated"])]
        if not moves:
            continue
        _, rel, name, label = max(moves)
        at = f"{end / term.scale:g} {term.unit}".rstrip()
        parts.append(f"at its {side} bound ({at}) {name} moves by {rel:+.1%}" + (f" ({label})" if len(problem.runs) > 1
                                                                                else ""))
    return "; " + ", ".join(parts) if parts else ""


def _solve(problem: Problem, active: list[Term], u0: np.ndarray, idx: tuple[int, ...], fixed: dict,
           max_nfev: int):
    def fun(u):
        v = problem.values({**fixed, **{t.name: _from_u(t, x) for t, x in zip(active, u)}})
        r = problem.residuals(v, idx)
        if r.size and np.abs(r).max() < DONE:
            raise _Reproduced(u.copy())
        return r

    if not active:
        return u0, _plain(problem, active, idx, fixed)
    # start inside the bounds: a trust region that starts on a bound takes timid steps off it
    u = np.clip(u0, 0.02, 0.98)
    best = None
    for _ in range(RESTARTS):  # (a fresh trust region after each stop: the staircase stops one early)
        try:
            sol = least_squares(fun, u, bounds=(0.0, 1.0), diff_step=DIFF_STEP, loss="soft_l1", f_scale=F_SCALE,
                                max_nfev=max_nfev, xtol=XTOL, ftol=1e-6, gtol=1e-8)
        except _Reproduced as done:
            return done.u, _plain(problem, active, idx, fixed)
        if best is not None and sol.cost >= best.cost * (1 - 1e-2):
            best = sol if sol.cost < best.cost else best
            break
        best, u = sol, sol.x
    return best.x, _plain(problem, active, idx, fixed)


class _Reproduced(Exception):
    """Every metric is reproduced within :data:`DONE`: the fit stops there (the point in ``u``)."""

    def __init__(self, u: np.ndarray):
        super().__init__("reproduced")
        self.u = u


def _plain(problem: Problem, active: list[Term], idx: tuple[int, ...], fixed: dict):
    """The residual function of :func:`_solve` without its stop (for the Jacobian after)."""
    def fun(u):
        return problem.residuals(problem.values({**fixed, **{t.name: _from_u(t, x) for t, x in zip(active, u)}}), idx)
    return fun


def _replay_one(args: tuple) -> Comparison:
    """One replay of a trial, in a worker process: (run, overrides, trial profile path, seed)."""
    run, sets, path, seed = args
    return replay(run, sets, profile=path, seed=seed)


def fit_runs(runs: list[Run], profile: str, overrides: Iterable[str] = (), *, seed: int = 0,
             loro: bool = True, max_nfev: int = 40, start: dict[str, float] | None = None,
             echo: Callable[[str], None] | None = None, workers: int = 1) -> FitResult:
    """Fit the terms to ``runs`` on base ``profile`` (see the module docstring). ``start``:
    starting values other than the base's (by term name); ``echo``: progress lines;
    ``workers``: processes replaying a trial's runs side by side (the same fit for any count)."""
    say = echo or (lambda _msg: None)
    problem = Problem(runs, profile, overrides, seed, workers=workers)
    try:
        return _fit(problem, loro, max_nfev, start or {}, say)
    finally:
        problem.close()


def _grid_start(problem: Problem, x0: dict[str, float], every: tuple[int, ...],
                points: Iterable[dict[str, float]], centre: bool = False) -> tuple[dict[str, float], float, float]:
    """``(start, its loss, x0's loss)``: the point of ``x0`` updated by each of ``points`` with
    the lowest loss if it is at least :data:`BUSY_GAIN` lower than ``x0``'s, else ``x0``.
    ``centre``: each point, ``x0`` too, is compared with its ``frontend_s`` moved by the runs'
    median TTFT gap (:func:`_centred`), so that a term which adds time before the first token
    is not taken for the constant the front end's latency alone would add."""
    def at(x):
        if centre:
            x = _centred(problem, x, every)
        return x, soft_l1(problem.residuals(problem.values(x), every), F_SCALE)

    x0, base = at(x0)
    pick, best = x0, base
    for p in points:
        x, loss = at({**x0, **p})
        if loss < best:
            pick, best = x, loss
    if best > (1 - BUSY_GAIN) * base:
        return x0, base, base
    return pick, best, base


def _centred(problem: Problem, x: dict[str, float], every: tuple[int, ...]) -> dict[str, float]:
    """``x`` with ``frontend_s`` (a delay before the engine sees a request: every TTFT and E2E
    moves with it) moved by the median over the runs of measured - simulated median TTFT (not
    the mean: an overloaded run's queueing does not set it), within its bounds; ``x`` itself
    where ``frontend_s`` is not fitted or no run has a median TTFT."""
    term = next((t for t in problem.candidates if t.name == "frontend_s"), None)
    if term is None:
        return x
    pairs = [(m.get("measured"), m.get("simulated")) for cmp in problem.replays(problem.values(x), every)
             if (m := cmp.metrics.get("ttft_p50_ms"))]
    gaps = [a - b for a, b in pairs if a is not None and b is not None and math.isfinite(a - b)]
    if not gaps:
        return x
    fe = min(max(x["frontend_s"] + float(np.median(gaps)) / 1e3, term.lo), term.hi)
    return {**x, "frontend_s": fe}


def _busy_start(problem: Problem, x0: dict[str, float], every: tuple[int, ...], say) -> float:
    """Where ``frontend_busy_s`` starts: ``x0``'s value, or the point of :data:`BUSY_GRID_S` with
    the lowest loss (the other terms at ``x0``, ``frontend_s`` set to the runs' TTFT for the
    comparison only: :func:`_grid_start`) if it is at least :data:`BUSY_GAIN` lower."""
    pick, best, base = _grid_start(problem, x0, every, ({"frontend_busy_s": b} for b in BUSY_GRID_S), centre=True)
    if pick["frontend_busy_s"] != x0["frontend_busy_s"]:
        say(f"frontend_busy_s starts at {pick['frontend_busy_s'] * 1e3:g} ms (loss {best:.4g} against {base:.4g} "
            f"at {x0['frontend_busy_s'] * 1e3:.3g} ms, each with frontend_s set to the runs' TTFT)")
    return pick["frontend_busy_s"]


def _overlap_start(problem: Problem, x0: dict[str, float], every: tuple[int, ...], say) -> dict[str, float]:
    """``x0``, or ``x0`` with ``cpu_overlap`` 1 and ``seq_s`` from :data:`OVERLAP_SEQ_GRID_S`
    where that lowers the loss by :data:`BUSY_GAIN` or more (the best such point)."""
    pick, best, base = _grid_start(problem, x0, every,
                                   ({"cpu_overlap": 1.0, "seq_s": seq} for seq in OVERLAP_SEQ_GRID_S))
    if pick is not x0:
        say(f"cpu_overlap starts at 1 with seq_s {pick['seq_s'] * 1e6:g} us (loss {best:.4g} against {base:.4g})")
    return pick


def _fit(problem: Problem, loro: bool, max_nfev: int, start: dict, say) -> FitResult:
    n = len(problem.runs)
    every = tuple(range(n))
    before = problem.replays(problem.base, every)
    notes = []
    reasons = [msg for run, cmp in zip(problem.runs, before)
               if (msg := kv_shown(run, cmp, problem.base["kv_capacity_bytes"], problem.block_bytes_per_token))]
    if reasons and problem.add_kv(reasons) is not None:
        notes.append("KV capacity fitted: " + "; ".join(reasons))
    else:
        notes.append("KV capacity kept at the base's: no run shows its limit (no preemption, "
                     f"under {KV_SHOWN:.0%} of it held at once)")
    cand = problem.candidates
    x0 = {t.name: start.get(t.name, problem.base[t.name]) for t in cand}
    if "frontend_busy_s" not in start:
        x0["frontend_busy_s"] = _busy_start(problem, x0, every, say)
    if problem.overlapped and "cpu_overlap" not in start and "seq_s" not in start:
        x0 = _overlap_start(problem, x0, every, say)
    u0 = np.array([_to_u(t, x0[t.name]) for t in cand])
    say(f"sensitivity of {len(cand)} terms over {n} runs")

    def fun_c(u):
        return problem.residuals(problem.values({t.name: _from_u(t, x) for t, x in zip(cand, u)}), every)

    r0 = fun_c(u0)
    # (tensor parallel: a step's fixed time is fitted as its all-reduces, the module docstring)
    tied = [cand.index(t) for t in cand if t.name == "step_s"] if problem.tp > 1 else []
    ok, why = identify(_jacobian(fun_c, u0, r0, skip=tied))
    for j in tied:
        why[j] = TIED_STEP
    for j, t in enumerate(cand):
        if not ok[j] and why[j].startswith("insensitive"):
            why[j] += _at_bounds(problem, t, x0, every)
    active = [t for t, k in zip(cand, ok) if k]
    # (held where the Jacobian was taken: a start a grid chose stays, identified or not)
    held = {t.name: x0[t.name] for t, k in zip(cand, ok) if not k}
    say(f"fitting {', '.join(t.name for t in active) or 'nothing'}")
    ua, fun = _solve(problem, active, np.array([u0[cand.index(t)] for t in active]), every, held, max_nfev)
    r = fun(ua)
    sig = np.full(len(active), np.nan)
    if active:
        J = _jacobian(fun, ua, r)
        dof = max(r.size - len(active), 1)
        cov = np.linalg.pinv(J.T @ J) * float(r @ r) / dof
        sig = np.sqrt(np.clip(np.diag(cov), 0, None)) * np.array([t.hi - t.lo for t in active])
    fitted = {t.name: _from_u(t, x) for t, x in zip(active, ua)}
    v = problem.values({**held, **fitted})
    after = problem.replays(v, every)
    terms = []
    for t, k, w in zip(cand, ok, why):
        s = float(sig[active.index(t)]) if k else None
        terms.append(FittedTerm(t, problem.base[t.name], v[t.name], s, bool(k), w))
    loro_err: list[dict | None] = [None] * n
    if loro and n >= 3:
        for i in every:
            say(f"leaving out {problem.runs[i].label}")
            rest = tuple(j for j in every if j != i)
            ui, _ = _solve(problem, active, ua, rest, held, max(max_nfev // 2, 5))
            vi = problem.values({**held, **{t.name: _from_u(t, x) for t, x in zip(active, ui)}})
            loro_err[i] = errors(problem.replays(vi, (i,))[0])
    out_runs = [RunResult(run.source, run.format, sha256(run.source), len(run.requests), errors(b), errors(a),
                          loro_err[i], run.part) for i, (run, b, a) in enumerate(zip(problem.runs, before, after))]
    busy = _busy_note(terms, after)
    if busy:
        notes.append(busy)
    cost = soft_l1(r, F_SCALE)
    return FitResult(terms, out_runs, problem.document(v), problem.overhead(v), problem.profile, problem.engine,
                     notes, cost, problem.evaluations)


#: a fitted term this close to a bound of its range (a share of the bound's value) is "at" it:
#: 2 %, so that 0.983 of the datasheet bandwidth (H200 runs fitted on an H100 profile) counts
AT_BOUND = 0.02


def bound_warnings(fit: FitResult) -> list[str]:
    """One warning per fitted term at a bound of its physical range (within :data:`AT_BOUND`
    of the bound's value): a GPU efficiency at either end (runs of a faster GPU than the base
    profile's push ``hbm_efficiency`` to 1.0, a slower one's to 0.3), an engine-overhead term at
    its upper bound (no shipped engine comes near). An overhead term at 0 is not warned about:
    "no such cost" is a physical value. The KV capacity's bounds come from the runs themselves;
    a term the runs do not determine (:attr:`FittedTerm.determined`) says nothing where it ends."""
    out = []
    for t in fit.terms:
        if not t.determined or t.term.kind == "kv":
            continue
        ends = [("upper", t.term.hi)] if t.value >= t.term.hi * (1 - AT_BOUND) else []
        if t.term.kind == "efficiency" and t.value <= t.term.lo * (1 + AT_BOUND):
            ends.append(("lower", t.term.lo))
        for side, bound in ends:
            s, unit = t.term.scale, f" {t.term.unit}" if t.term.unit else ""
            out.append(f"{t.term.name} fitted to {t.value / s:.4g}{unit}, at its {side} bound {bound / s:g}{unit}: "
                       f"the base profile {fit.base_profile} may not match the GPU (or engine) the runs were made "
                       f"on (expected --profile for the runs' own GPU and model)")
    return out


#: A fitted API-server rate (1 / frontend_busy_s) this many times the runs' highest request
#: rate or more is an extrapolation: noted (:func:`_busy_note`), where frontend_busy_s is at
#: least BUSY_NOTED_S (a server of 1000 requests a second or more caps no replica)
BUSY_EXTRAPOLATED = 2.0
BUSY_NOTED_S = 1e-3


def _busy_note(terms: list[FittedTerm], after: list[Comparison]) -> str:
    """A note when a fitted ``frontend_busy_s`` caps the API server at a rate no run came near:
    the runs only saw the start of its queueing (with an engine model that lacks something
    else that grows with load, such as async scheduling's wait for the step after next, the fit
    may take it for this), so at higher rates the answer extrapolates."""
    t = next((t for t in terms if t.term.name == "frontend_busy_s" and t.identified), None)
    rates = [m.get("measured") for c in after if (m := c.metrics.get("request_throughput"))]
    rates = [x for x in rates if x is not None and math.isfinite(x) and x > 0]
    if t is None or t.value < BUSY_NOTED_S or not rates:
        return ""
    cap, top = 1.0 / t.value, max(rates)
    if cap < BUSY_EXTRAPOLATED * top:
        return ""
    return (f"frontend_busy_s {t.value * 1e3:.3g} ms caps one replica's API server at {cap:.3g} req/s, "
            f"{cap / top:.1f} times the runs' highest rate ({top:.3g} req/s): above their rates its queueing is "
            "extrapolated (a run nearer that rate would settle it; give calibrate the engine's release and "
            "flags, e.g. --set engine.engine_version=..., so that it is not standing in for their scheduling)")


def profile_document(fit: FitResult, name: str, overrides: Iterable[str] = (),
                     input_notes: Iterable[str] = ()) -> dict:
    """The fitted profile to write: the base's schema with the rescaled step terms, ``overhead``
    the fitted table and ``meta.fitted_from_runs`` recording how it was obtained (``input_notes``:
    what the command said about its inputs before the fit, kept beside the fit's own notes)."""
    doc = json.loads(json.dumps(fit.profile))
    meta = doc.setdefault("meta", {})
    base_name = meta.get("name", fit.base_profile)
    meta["name"] = name
    meta["source"] = f"priosim calibrate --from-runs on base profile {fit.base_profile}"
    meta["date"] = _dt.date.today().isoformat()
    meta["fitted_from_runs"] = {
        "base_profile": fit.base_profile, "base_name": base_name, "engine": fit.engine,
        "overrides": list(overrides),
        "method": "scipy.optimize.least_squares on simulated/measured - 1, bounds, soft-L1 (f_scale 0.1), "
                  "metric kinds weighted alike, finite differences of 1 % of each term's range",
        "metrics": dict(METRICS),
        "runs": [{"path": str(Path(r.path).resolve()), **({"result": r.part} if r.part is not None else {}),
                  "format": r.format, "sha256": r.sha256, "requests": r.requests} for r in fit.runs],
        "terms": {t.term.name: {"base": t.base, "value": t.value, "lo": t.term.lo, "hi": t.term.hi,
                                "sigma": t.sigma, "identified": t.identified, "determined": t.determined,
                                "status": t.status, "bounds_why": t.term.why,
                                **({"not_identified": t.note} if t.note else {})} for t in fit.terms},
        "residuals": {r.label: {m: {"before": r.before.get(m), "after": r.after.get(m)} for m in r.after}
                      for r in fit.runs},
        "leave_one_run_out": {r.label: r.loro for r in fit.runs if r.loro is not None},
        "loss": fit.cost, "notes": fit.notes, "input_notes": list(input_notes), "warnings": bound_warnings(fit),
    }
    return doc


__all__ = ["fit_runs", "profile_document", "bound_warnings", "FitResult", "FittedTerm", "RunResult", "METRICS", "kv_shown",
           "identify", "Problem"]
