"""Tuning: search a scenario's knobs for the configuration that meets the SLOs best (Optuna).

A tune is a search space (any dotted key that ``--set`` accepts), SLO constraints and one
metric to maximise (or minimise), or several metrics (a Pareto front). Pieces, each usable
alone:

* :func:`parse_knob` / :func:`parse_objective` / :func:`parse_slo` turn the command line's
  strings into :class:`Knob`, :class:`Objective` and :class:`SLO` values, and
  :func:`validate` checks them against the scenario before any trial runs (an unknown key, an
  empty range, an unknown metric or an SLO naming no class is one :class:`TuneError` line).
* :func:`run_tune` runs the search: Optuna asks for ``workers`` trials at a time (TPE with
  ``constraints_func`` for one objective, NSGA-II for several); each trial is simulated on ``K``
  seeds through :func:`sim.experiments.sweep.run_sweep` (local processes or Ray), and told the mean of each
  objective over the seeds and, as constraints, the worst SLO value over the seeds (an SLO must
  hold on every seed). The study lives in ``DIR/study.db`` (SQLite) and every simulation in
  ``DIR/evals/runs/<config>-s<seed>/`` keyed by the configuration, so a killed tune resumed with
  the same ``DIR`` keeps its finished trials and re-runs only the simulations that were missing.
* :func:`sim.experiments.tune_report.write_report` writes ``best.toml`` (a complete scenario),
  ``trials.parquet``, ``pareto.png`` / ``pareto.csv``, ``importance.json`` and ``tune.json``.

Noise: each objective's standard deviation across the seeds is kept per trial; the report gives
its median over trials and the best trial's, so a difference smaller than that is not a finding.

Optuna is imported inside the functions that use it (the ``tune`` extra).
"""
from __future__ import annotations

import copy
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from plumbing.numbers import is_number
from sim.experiments.slos import MISSED, parse_slo_text
from sim.config import apply_override, parse_value, scenario_from_dict
from sim.core.errors import ScenarioError
from sim.outdir import claim, locked, write_file

STUDY = "tune"
VIOLATION = MISSED  # constraint value of an SLO whose metric is missing (no request finished)
SLO_KEYS = {"ttft": "ttft_p99_s", "tpot": "tpot_p99_s", "done_by": None}
CLASS_EXTRA = ("itl_p50_s", "itl_p99_s", "itl_std_s", "evicted_miss_prefill_s", "swap_s", "recompute_s",
               "slo_attainment", "goodput_rps")
# per class and overall, kept for every trial (mean over the seeds) besides its objectives
SHOWN = ("ttft_p99_s", "tpot_p99_s", "output_tokens_per_s", "goodput_rps", "slo_attainment", "preemptions",
         "rejected")
RUN_METRICS = ("thrash_ratio", "thrash_s", "busy_s", "idle_with_work_s", "end_s", "prefix_evictions")


class TuneError(ValueError):
    """Bad tune input: one line naming the option, the value and what was expected."""


# ---- the search space -------------------------------------------------------------------------
@dataclass(frozen=True)
class Knob:
    """One searched scenario key: an int or float range (``log``: sampled on a log scale) or a
    list of choices (``labels`` as written, ``choices`` parsed as TOML values)."""

    key: str
    kind: str  # "int" | "float" | "choice"
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    labels: tuple = ()
    choices: tuple = ()

    def distribution(self):
        import optuna

        if self.kind == "int":
            return optuna.distributions.IntDistribution(int(self.low), int(self.high), log=self.log)
        if self.kind == "float":
            return optuna.distributions.FloatDistribution(self.low, self.high, log=self.log)
        return optuna.distributions.CategoricalDistribution(list(self.labels))

    def value(self, param: Any) -> Any:
        """The scenario value of an Optuna parameter (a choice's label -> its parsed value)."""
        if self.kind == "choice":
            return copy.deepcopy(self.choices[self.labels.index(param)])
        return int(param) if self.kind == "int" else float(param)

    def text(self) -> str:
        if self.kind == "choice":
            return f"{self.key}={','.join(self.labels)}"
        return f"{self.key}={self.low:g}..{self.high:g}{':log' if self.log else ''}"


def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside brackets, braces and quotes (choices may be TOML tables)."""
    out, depth, quote, cur = [], 0, "", ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == sep and depth == 0:
            out.append(cur)
            cur = ""
            continue
        cur += ch
    out.append(cur)
    return [p.strip() for p in out]


def parse_knob(item: str) -> Knob:
    """``KEY=LOW..HIGH`` (ints if both ends are; ``:log`` for a log scale) or ``KEY=a,b,c``."""
    key, sep, spec = item.partition("=")
    key, spec = key.strip(), spec.strip()
    if not sep or not key or not spec:
        raise TuneError(f"--space {item!r}: expected KEY=LOW..HIGH[:log] or KEY=a,b,c")
    body, log = spec, False
    if body.endswith(":log"):
        body, log = body[:-4], True
    if ".." in body and not body.startswith(("{", "[", '"', "'")):
        lo_t, _, hi_t = body.partition("..")
        lo, hi = parse_value(lo_t.strip()), parse_value(hi_t.strip())
        if not (is_number(lo) and is_number(hi)):
            raise TuneError(f"--space {key}: range ends must be numbers (got {lo_t.strip()!r}..{hi_t.strip()!r})")
        if not lo < hi:
            raise TuneError(f"--space {key}: empty range {lo_t.strip()}..{hi_t.strip()} (expected LOW < HIGH)")
        if log and lo <= 0:
            raise TuneError(f"--space {key}: a log range needs LOW > 0 (got {lo_t.strip()})")
        kind = "int" if isinstance(lo, int) and isinstance(hi, int) else "float"
        return Knob(key, kind, lo, hi, log)
    if log:
        raise TuneError(f"--space {key}: ':log' applies to a range LOW..HIGH (got {spec!r})")
    labels = tuple(_split_top(body))
    if any(not lab for lab in labels):
        raise TuneError(f"--space {key}: empty choice in {spec!r} (expected a,b,c)")
    if len(set(labels)) != len(labels):
        raise TuneError(f"--space {key}: repeated choice in {spec!r}")
    return Knob(key, "choice", labels=labels, choices=tuple(parse_value(lab) for lab in labels))


# ---- objectives and SLOs ------------------------------------------------------------------------
@dataclass(frozen=True)
class Objective:
    """A summary metric of one class (``cls``), of all requests (``cls`` None, the ``overall``
    row) or of the run (``thrash_ratio``...), maximised or minimised (mean over the seeds)."""

    metric: str
    cls: str | None
    maximize: bool = True

    @property
    def name(self) -> str:
        return f"{self.metric}:{self.cls}" if self.cls else self.metric

    def read(self, summary: dict) -> float | None:
        if self.cls is not None:
            v = summary["classes"][self.cls].get(self.metric)
        elif self.metric in summary["overall"]:
            v = summary["overall"][self.metric]
        else:
            v = summary["run"].get(self.metric)
        return None if v is None else float(v)


def known_metrics() -> set[str]:
    """Scalar metric names of a class or overall row of summary.json (see ``sim.results``)."""
    from sim.results import GROUP_METRICS

    return set(GROUP_METRICS) | set(CLASS_EXTRA)


def parse_objective(text: str, classes: list[str], maximize: bool) -> Objective:
    metric, _, cls_text = text.strip().partition(":")
    cls = cls_text.strip() or None
    flag = "--maximize" if maximize else "--minimize"
    metrics = known_metrics()
    if metric not in metrics and not (cls is None and metric in RUN_METRICS):
        raise TuneError(f"{flag} {text!r}: unknown metric {metric!r} (expected one of "
                        f"{', '.join(sorted(metrics | set(RUN_METRICS)))})")
    if cls is not None and cls not in classes:
        raise TuneError(f"{flag} {text!r}: no class {cls!r} (expected one of {', '.join(classes)})")
    return Objective(metric, cls, maximize)


@dataclass(frozen=True)
class SLO:
    """One constraint: class ``cls``'s ``key`` (ttft / tpot: p99 seconds; done_by: the last of
    its requests finished, every one of them, by this simulated time) at most ``limit``."""

    cls: str
    key: str
    limit: float

    @property
    def name(self) -> str:
        return f"{self.cls}.{self.key}"

    def measure(self, summary: dict, requests: pd.DataFrame | None) -> float | None:
        if self.key == "done_by":
            assert requests is not None
            g = requests[requests["class"] == self.cls]
            if len(g) == 0:
                return 0.0
            if (g["status"] != "finished").any():
                return None
            return float(g["finish_s"].max())
        return summary["classes"][self.cls].get(SLO_KEYS[self.key])

    def violation(self, value: float | None) -> float:
        """<= 0 when met (Optuna's convention for constraints)."""
        return VIOLATION if value is None else float(value) - self.limit


def parse_slo(text: str, classes: list[str]) -> list[SLO]:
    """``CLASS:ttft=S,tpot=S,done_by=S`` -> one :class:`SLO` per key."""
    try:
        cls, pairs = parse_slo_text(text, classes, list(SLO_KEYS))
    except ValueError as exc:
        raise TuneError(str(exc)) from None
    from sim.experiments.slos import warn_ms

    warn_ms(text, pairs)  # (600 meant as ms: as capacity's --slo and the scenario's keys are warned)
    return [SLO(cls, k, val) for k, val in pairs]


# ---- the whole tune -----------------------------------------------------------------------------
@dataclass
class TuneSpec:
    """What to search: the base scenario (a resolved dict), knobs, objectives, SLOs, seeds."""

    base: dict
    base_dir: str
    source: str
    knobs: list[Knob]
    objectives: list[Objective]
    slos: list[SLO] = field(default_factory=list)
    seeds: list[int] = field(default_factory=lambda: [0])

    def fingerprint(self) -> str:
        """Identifies the question (not the trial count): a resumed tune must ask the same."""
        doc = {"base": self.base, "knobs": [k.text() for k in self.knobs],
               "objectives": [(o.name, o.maximize) for o in self.objectives],
               "slos": [(s.name, s.limit) for s in self.slos], "seeds": self.seeds}
        return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()

    def inputs(self) -> dict[str, str]:
        """The files the tune's scenarios read (the base's and any a choice names: a policy
        file, a trace), path -> sha256 (:func:`sim.inputs.input_files`): a resumed tune must
        read them as they were."""
        from sim.inputs import input_files

        return input_files({"base": self.base, "choices": [list(k.choices) for k in self.knobs]}, self.base_dir)

    def scenario_for(self, params: dict, seed: int) -> dict:
        sc = copy.deepcopy(self.base)
        for k in self.knobs:
            if k.key in params:
                apply_override(sc, k.key, k.value(params[k.key]), "tune")
        sc["seed"] = seed
        return sc


def tune_table(sc) -> dict:
    """The scenario's ``[tune]`` table (may hold space, slo, maximize, minimize, trials, seeds)."""
    t = dict(getattr(sc, "tune", None) or {})
    allowed = {"space", "slo", "maximize", "minimize", "trials", "seeds"}
    bad = sorted(set(t) - allowed)
    if bad:
        raise TuneError(f"{sc.source}: tune.{bad[0]}: unknown key (expected one of {', '.join(sorted(allowed))})")
    for k in ("space", "slo", "maximize", "minimize"):
        v = t.get(k, [])
        t[k] = [v] if isinstance(v, str) else v
        if not isinstance(t[k], list) or not all(isinstance(x, str) for x in t[k]):
            raise TuneError(f"{sc.source}: tune.{k}: expected a list of strings (got {v!r})")
    return t


def validate(spec: TuneSpec) -> None:
    """Every knob's ends and choices give a valid scenario (unknown keys, wrong types); raises
    :class:`TuneError` with one line before any trial runs."""
    if not spec.knobs:
        raise TuneError("--space: nothing to search (expected at least one KEY=LOW..HIGH or KEY=a,b,c)")
    keys = [k.key for k in spec.knobs]
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup:
        raise TuneError(f"--space {dup[0]}: given twice")
    if not spec.objectives:
        raise TuneError("--maximize/--minimize: expected at least one metric")
    for k in spec.knobs:
        values = [k.low, k.high] if k.kind != "choice" else list(k.choices)
        if k.kind == "int":
            values = [int(v) for v in values]
        for v in values:
            data = copy.deepcopy(spec.base)
            try:
                apply_override(data, k.key, copy.deepcopy(v), "tune")
                scenario_from_dict(data, source=spec.source, base_dir=spec.base_dir)
            except ScenarioError as exc:
                raise TuneError(f"--space {k.key}={v!r}: {exc}") from None


# ---- running ------------------------------------------------------------------------------------
#: A trial's failure when its runs finished but measured no request (a poor configuration, not
#: a failed run: the tune's exit status stays 0).
NO_OBJECTIVE = "objective undefined (no requests measured)"


@dataclass
class TuneReport:
    """What :func:`run_tune` did (``evaluated_now``: trials simulated in this call)."""

    out_dir: Path
    trials: int = 0
    evaluated_now: int = 0
    simulations_now: int = 0
    resumed_stale: int = 0
    failed: dict = field(default_factory=dict)
    interrupted: bool = False
    info: dict | None = None  # tune.json's dict, when the report was written


def config_id(params: dict) -> str:
    """A configuration's folder prefix: equal parameters share their simulations."""
    doc = json.dumps(params, sort_keys=True, default=str)
    return "c" + hashlib.sha1(doc.encode()).hexdigest()[:12]


def _sampler(spec: TuneSpec, trials: int, seed: int):
    """TPE for one objective, NSGA-II for several; both read the SLO constraints each trial sets
    (``Trial.set_constraint``: <= 0 met) and prefer feasible trials."""
    import optuna

    if len(spec.objectives) > 1:
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, min(50, trials // 3)))
    return optuna.samplers.TPESampler(seed=seed, constant_liar=True, n_startup_trials=min(10, max(3, trials // 3)))


def open_study(spec: TuneSpec, out_dir: Path, trials: int, resume: bool, seed: int = 0):
    """Create (or, with ``resume``, load) the study in ``out_dir/study.db``.

    A new study is made under a hidden name and renamed into place once it exists whole (with
    its fingerprint), so a kill or a full disk while it is made leaves no ``study.db`` that a
    rerun would take for a tune. A resumed study's sampler is seeded from ``seed`` and the
    trials already in the study: the same state resumes the same way, and the resumed tune does
    not draw again the parameters its first trials drew."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    db = out_dir / "study.db"
    if db.exists() and db.stat().st_size == 0:  # a tune of an older version killed as it made the file
        db.unlink()
    if db.exists() and not resume:
        raise TuneError(f"--out {out_dir}: already holds a tune (pass --resume to continue it, or another --out)")
    if resume and not db.exists():
        raise TuneError(f"--resume: {out_dir} holds no tune (no study.db)")
    out_dir.mkdir(parents=True, exist_ok=True)
    directions = ["maximize" if o.maximize else "minimize" for o in spec.objectives]
    fp = spec.fingerprint()
    inputs = spec.inputs()
    if not db.exists():
        def make(path: Path) -> None:
            storage = optuna.storages.RDBStorage(f"sqlite:///{path.resolve()}")
            try:
                study = optuna.create_study(storage=storage, study_name=STUDY, directions=directions)
                study.set_user_attr("fingerprint", fp)
                study.set_user_attr("knobs", [k.text() for k in spec.knobs])
                study.set_user_attr("inputs", inputs)
            finally:
                storage.remove_session()
                storage.engine.dispose()

        write_file(db, make)
    study = optuna.load_study(storage=f"sqlite:///{db.resolve()}", study_name=STUDY,
                              sampler=_sampler(spec, trials, seed))
    if study.user_attrs.get("fingerprint") != fp:
        raise TuneError(f"--resume: {out_dir} holds a tune of another scenario, space, objective, SLOs or "
                        "seeds (the same options are needed to resume)")
    from sim.inputs import changed_files

    changed = changed_files(study.user_attrs.get("inputs"), inputs)
    if changed:  # (its trials were measured with what the file held then)
        raise TuneError(f"--resume: {changed[0]} changed since the tune in {out_dir} read it (its trials were "
                        f"measured with the old contents; expected the file as it was, or another --out)")
    n = len(study.get_trials(deepcopy=False))
    if n:  # (a fresh sampler seeded as at the start would repeat the first trials' draws)
        study.sampler = _sampler(spec, trials, (seed + 7919 * n) % 2**31)
    return study


def _requeue_stale(study) -> int:
    """Trials left running by a killed tune: fail them and ask their parameters again (their
    finished simulations are on disk and are not re-run); one whose runs had failed (its
    ``error`` recorded) is failed as it was, counted as evaluated."""
    from optuna.trial import TrialState

    stale = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.RUNNING]
    for t in stale:
        if "error" not in t.user_attrs:
            study.enqueue_trial(dict(t.params), skip_if_exists=False)
        study.tell(t.number, state=TrialState.FAIL)
    return len(stale)


def evaluated(study) -> list:
    """Trials that were simulated: complete, or failed because a run failed (``error``); not
    one a killed tune left running, which is asked again."""
    from optuna.trial import TrialState

    return [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("evaluated")
            and (t.state == TrialState.COMPLETE or (t.state == TrialState.FAIL and "error" in t.user_attrs))]


def _read_run(run_dir: Path, need_requests: bool) -> tuple[dict, pd.DataFrame | None]:
    summ = json.loads((run_dir / "summary.json").read_text())
    req = pd.read_parquet(run_dir / "requests.parquet", columns=["class", "status", "finish_s"]) \
        if need_requests else None
    return summ, req


def measure(spec: TuneSpec, run_dirs: list[Path]) -> dict:
    """Objectives (mean and std over the seeds, and per seed), SLO values (worst over the
    seeds), constraint values, and the :data:`SHOWN` metrics (mean) of one configuration."""
    need_req = any(s.key == "done_by" for s in spec.slos)
    per_obj: dict[str, list] = {o.name: [] for o in spec.objectives}
    worst: dict[str, float | None] = {}
    shown: dict[str, list] = {}
    for d in run_dirs:
        summ, req = _read_run(d, need_req)
        for group, m in [*summ["classes"].items(), ("overall", summ["overall"])]:
            for k in SHOWN:
                if m.get(k) is not None:
                    shown.setdefault(f"{group}.{k}", []).append(float(m[k]))
        shown.setdefault("thrash_ratio", []).append(float(summ["run"].get("thrash_ratio") or 0.0))
        for o in spec.objectives:
            per_obj[o.name].append(o.read(summ))
        for s in spec.slos:
            v = s.measure(summ, req)
            prev = worst.get(s.name, -math.inf)
            worst[s.name] = None if v is None or prev is None else max(prev, v)
    out: dict = {"objectives": {}, "slo": worst,
                 "constraints": [s.violation(worst[s.name]) for s in spec.slos],
                 "metrics": {k: float(np.mean(v)) for k, v in shown.items()}}
    for name, vals in per_obj.items():
        arr = np.array([np.nan if v is None else v for v in vals], dtype=float)
        out["objectives"][name] = {"mean": float(np.nanmean(arr)) if np.isfinite(arr).any() else None,
                                   "std": float(np.nanstd(arr)) if np.isfinite(arr).sum() > 1 else 0.0,
                                   "seeds": [None if not np.isfinite(v) else float(v) for v in arr]}
    out["feasible"] = all(c <= 0 for c in out["constraints"])
    return out


def _start_ray(address: str | None) -> bool:
    """Start (or join) Ray once for the whole tune, not once per batch of trials; True when this
    call started it (and must shut it down)."""
    import os

    try:
        import ray
    except ImportError:
        raise TuneError("--backend ray needs Ray: pip install 'priosim[distributed]'") from None
    if ray.is_initialized():
        return False
    from sim.experiments.sweep import ray_runtime_env

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(address=address, runtime_env=ray_runtime_env(), include_dashboard=False, log_to_driver=False)
    return True


def run_tune(spec: TuneSpec, out_dir: str | Path, *, trials: int, workers: int = 1, backend: str = "local",
             address: str | None = None, resume: bool = False, seed: int = 0, log=print, report: bool = False,
             plots: bool = True, uncertainty: bool = False, header: str | None = None) -> TuneReport:
    """Run trials until ``trials`` of them are evaluated in ``out_dir``'s study (see module
    docstring). ``workers`` trials are asked at a time; their seeds' simulations run together.
    ``report``: also write the report files (:func:`sim.experiments.tune_report.write_report`,
    ``plots``: with ``pareto.png``) before the folder's lock is let go, so that they show the
    study as this tune left it, never as a tune that was waiting on the lock is changing it.
    ``uncertainty`` (with ``report``; not after an interruption): the report first re-evaluates
    the best configuration and the defaults at the cost model's time factors
    (:mod:`sim.experiments.tune_uncertainty`). ``header`` is logged once the study is open, so a
    refused ``--out`` or ``--resume`` is the only line."""
    out = claim(out_dir, "tune", resume=True)  # a tune adds to its own folder only
    with locked(out, "tune"):  # (marked as a tune's; a second tune into it waits for the first)
        rep = _run_tune_locked(spec, out, trials, workers, backend, address, resume, seed, log, header)
        if report:
            from sim.experiments.tune_report import write_report

            again = None
            if uncertainty and not rep.interrupted:
                again = {"backend": backend, "workers": workers, "address": address, "log": log}
            try:
                rep.info = write_report(spec, out, plots=plots, uncertainty=again)
            except KeyboardInterrupt:  # (during the runs at the time factors: the report without them)
                rep.interrupted = True
                rep.info = write_report(spec, out, plots=plots)
        return rep


def _run_tune_locked(spec: TuneSpec, out: Path, trials: int, workers: int, backend: str, address: str | None,
                     resume: bool, seed: int, log, header: str | None = None) -> TuneReport:
    from sim.experiments.sweep import RunSpec, run_sweep

    study = open_study(spec, out, trials, resume, seed)
    if header:
        log(header)
    rep = TuneReport(out)
    rep.resumed_stale = _requeue_stale(study) if resume else 0
    dists = {k.key: k.distribution() for k in spec.knobs}
    evals = out / "evals"
    runs_dir = evals / "runs"
    width = len(str(max(trials, 1)))

    def specs_for(tag: str, params: dict) -> list[RunSpec]:
        return [RunSpec(f"{tag}-s{s}", {"config": tag, "seed": s}, spec.scenario_for(params, s))
                for s in spec.seeds]

    baseline = specs_for("default", {})
    done = len(evaluated(study))
    first = True
    ray_started = _start_ray(address) if backend == "ray" and done < trials else False
    try:
        while done < trials:
            batch = [study.ask(dists) for _ in range(min(max(1, workers), trials - done))]
            todo = {t.number: specs_for(config_id(t.params), t.params) for t in batch}
            run = [s for ss in todo.values() for s in ss]
            if first:
                run = baseline + run
                first = False
            unique = list({s.run_id: s for s in run}.values())
            sw = run_sweep(unique, evals, base_dir=spec.base_dir, source=spec.source, backend=backend,
                           workers=workers, address=address, progress=False)
            rep.simulations_now += sw.done
            if sw.interrupted:
                raise KeyboardInterrupt
            for t in batch:
                ids = [s.run_id for s in todo[t.number]]
                _tell_trial(study, spec, t, ids, sw, runs_dir, rep, dists, width, log)
            done = len(evaluated(study))
    except KeyboardInterrupt:
        rep.interrupted = True
    finally:
        if ray_started:
            import ray
            ray.shutdown()
    rep.trials = len(evaluated(study))
    return rep


def _tell_trial(study, spec: TuneSpec, t, ids: list[str], sw, runs_dir: Path, rep: TuneReport, dists: dict,
                width: int, log) -> None:
    """Measure trial ``t`` from its seeds' runs ``ids`` and tell the study its objectives and SLO
    constraints (or that it failed: a run failed or missing, or no request measured); logs one line."""
    from optuna.trial import TrialState

    bad = [r for r in ids if r in sw.failed or not (runs_dir / r / "summary.json").exists()]
    t.set_user_attr("evaluated", True)
    t.set_user_attr("config", config_id(t.params))
    if bad:
        err = sw.failed.get(bad[0], "run missing")
        rep.failed[t.number] = err
        t.set_user_attr("error", err)
        study.tell(t, state=TrialState.FAIL)
        log(f"trial {t.number:>{width}}: FAILED {err}")
        return
    m = measure(spec, [runs_dir / r for r in ids])
    t.set_user_attr("measure", m)
    for slo, c in zip(spec.slos, m["constraints"]):
        t.set_constraint(slo.name, c)
    vals = [m["objectives"][o.name]["mean"] for o in spec.objectives]
    if any(v is None for v in vals):
        rep.failed[t.number] = NO_OBJECTIVE
        t.set_user_attr("error", rep.failed[t.number])
        study.tell(t, state=TrialState.FAIL)
        return
    study.tell(t, vals)
    rep.evaluated_now += 1
    shown = ", ".join(f"{k}={fmt_value(t.params[k])}" for k in dists)
    objs = ", ".join(f"{o.name}={m['objectives'][o.name]['mean']:.4g}"
                     f"±{m['objectives'][o.name]['std']:.2g}" for o in spec.objectives)
    log(f"trial {t.number:>{width}}: {shown} -> {objs}{'' if m['feasible'] else '  (violates SLO)'}")


def fmt_value(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)
