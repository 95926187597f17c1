"""Sweeps: many runs of one scenario over a grid of policies, loads, seeds and settings.

A sweep is three steps, each usable alone:

1. :func:`expand_grid` (pure) turns a base scenario dict and named axes into :class:`RunSpec` s,
   one per cell of the Cartesian product, in a fixed order with a stable folder name each.
2. :func:`run_sweep` executes the specs that are not already complete, on local processes
   (``backend="local"``) or a Ray cluster (``backend="ray"``), writing each run's results folder
   atomically under ``DIR/runs/<run_id>/``. A folder that exists is a finished run whose spec
   matches (its ``sweep_run.json`` holds the spec's digest, which covers the contents of every
   file the scenario reads: a policy file, a trace, a profile; :mod:`sim.inputs`), so a rerun
   after a crash or Ctrl-C does only what is missing, and a run whose files changed runs again. A run that raises is recorded in ``DIR/failures/<run_id>.json``
   (error and traceback) and does not stop the others; a later successful rerun removes it.
3. :func:`collect` gathers ``DIR/sweep.parquet``: one row per run and class (plus an
   ``overall`` row per run) with the axes as columns and the class's summary metrics.

Axes: ``policy`` (a registered name or ``pkg.mod:Class``; a new name drops the base policy's
parameters), ``load`` (multiplies every stream's arrival rate; a replayed trace is compressed in
time by the same factor), ``seed`` (the scenario seed), and any dotted scenario key such as
``engine.max_num_seqs`` (the same keys as ``--set``).

Ray is imported only inside the Ray executor.
"""
from __future__ import annotations

import copy
import errno
import hashlib
import itertools
import json
import os
import re
import shutil
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from plumbing.numbers import in_range
from sim.config import apply_override
from sim.outdir import write_file
from sim.progress import progress_bar
from sim.rayenv import ray_runtime_env  # (re-exported: the tests and users start Ray with it)
from sim import jsonout

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SPECIAL_AXES = ("policy", "load", "seed")
RUN_FILE = "sweep_run.json"  # written into each run folder; its presence marks a sweep run
# a write that fails with these stops the sweep (every other run's write would fail the same way)
# rather than counting as the run's failure
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` is the file system refusing a write for want of space (or quota)."""
    return isinstance(exc, OSError) and exc.errno in DISK_FULL


@dataclass(frozen=True)
class RunSpec:
    """One cell of a sweep.

    Attributes:
        run_id: folder name under ``DIR/runs/`` (stable: derived from the axes' values).
        axes: axis name -> value for this cell, in the grid's axis order.
        scenario: the scenario dict with this cell's values applied (not yet validated).
        load_scale: arrival-rate multiplier passed to ``simulate``.
        bracket: for a run ``--uncertainty`` adds, ``(central run_id, factor, by_kind)``: the
            cell it brackets, its ``engine.cost_scale`` factor and the cell's time factors
            (``((kind, lo, hi), ...)``); None for a cell's own run
            (:mod:`sim.experiments.sweep_uncertainty`).
        inputs: ``(path, sha256)`` of each file the scenario reads (:func:`with_inputs` fills
            them in when the sweep starts; empty: none, or not looked up).
    """

    run_id: str
    axes: dict
    scenario: dict
    load_scale: float = 1.0
    bracket: tuple | None = None
    inputs: tuple = ()

    @property
    def digest(self) -> str:
        """sha256 of the scenario, the load and the contents of the files the scenario reads: a
        folder made from another spec, or from files since edited, is not reused."""
        doc = {"scenario": self.scenario, "load_scale": self.load_scale}
        if self.inputs:  # (absent when there are none: such a spec's digest is as it always was)
            doc["inputs"] = dict(self.inputs)
        return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def with_inputs(specs: Sequence[RunSpec], base_dir: str | Path) -> list[RunSpec]:
    """``specs`` with the files each scenario reads, by content (:func:`sim.inputs.input_files`;
    a file several specs read is read once)."""
    from dataclasses import replace

    from sim.inputs import input_files

    memo: dict = {}
    return [replace(s, inputs=tuple(input_files(s.scenario, base_dir, memo).items())) for s in specs]


def _fmt(v: Any) -> str:
    if isinstance(v, float) and v.is_integer():
        return f"{v:g}"
    return str(v)


def _run_id(axes: Mapping[str, Any]) -> str:
    raw = "__".join(f"{k}={_fmt(v)}" for k, v in axes.items()) or "base"
    safe = re.sub(r"[^A-Za-z0-9._=+-]", "_", raw)
    if len(safe) > 120:
        safe = safe[:100] + "-" + hashlib.sha1(raw.encode()).hexdigest()[:10]
    return safe


def _check_axis(name: str, values: Any) -> list:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) == 0:
        raise ValueError(f"axis '{name}' must be a non-empty list of values (got {values!r})")
    values = list(values)
    for v in values:
        if name == "load" and not in_range(v, gt=0):
            raise ValueError(f"axis 'load' must hold positive numbers (got {v!r})")
        if name == "seed" and not in_range(v, ge=0, integer=True):
            raise ValueError(f"axis 'seed' must hold non-negative integers (got {v!r})")
        if name == "policy" and not (isinstance(v, str) and v):
            raise ValueError(f"axis 'policy' must hold policy names (got {v!r})")
    if len({json.dumps(v, sort_keys=True, default=str) for v in values}) != len(values):
        raise ValueError(f"axis '{name}' repeats a value (got {values!r})")
    return values


def expand_grid(base: Mapping[str, Any], axes: Mapping[str, Sequence[Any]]) -> list[RunSpec]:
    """The Cartesian product of ``axes`` applied to ``base`` (a scenario dict), as run specs.

    Pure: ``base`` is not modified, nothing is validated beyond the axes' own types (each
    scenario is validated when its run starts), and the order is the product's order with the
    last axis varying fastest. Raises ``ValueError`` for a malformed axis and
    ``sim.core.errors.ScenarioError`` for a dotted key that does not fit the scenario's structure.
    """
    names = list(axes)
    lists = [_check_axis(n, axes[n]) for n in names]
    specs: list[RunSpec] = []
    seen: set[str] = set()
    for combo in itertools.product(*lists):
        cell = dict(zip(names, combo))
        sc = copy.deepcopy(dict(base))
        load = 1.0
        for k, v in cell.items():
            if k == "policy":
                if (sc.get("policy") or {}).get("name") != v:
                    sc["policy"] = {"name": v}  # another policy's parameters would not fit
            elif k == "seed":
                sc["seed"] = v
            elif k == "load":
                load = float(v)
            else:
                apply_override(sc, k, copy.deepcopy(v), "grid")
        rid = _run_id(cell)
        if rid in seen:
            rid = f"{rid}-{hashlib.sha1(json.dumps(cell, sort_keys=True, default=str).encode()).hexdigest()[:8]}"
        seen.add(rid)
        specs.append(RunSpec(rid, cell, sc, load))
    return specs


def read_grid(path: str | Path) -> dict[str, list]:
    """Read a ``--grid`` TOML file: ``key = [values]`` pairs, nested tables flattened to dots.

    ``[engine]\\nmax_num_seqs = [64, 256]`` and ``"engine.max_num_seqs" = [64, 256]`` are the
    same axis. Keys ``policy``, ``load`` and ``seed`` are the special axes.
    """
    import tomllib

    from plumbing.documents import DocumentError, loads_toml, read_text

    p = Path(path)
    try:
        text = read_text(p)
    except FileNotFoundError:
        raise ValueError(f"{p}: no such grid file") from None
    except (DocumentError, OSError) as exc:
        raise ValueError(f"{p}: {exc}") from None
    try:
        data = loads_toml(text)
    except (tomllib.TOMLDecodeError, DocumentError) as exc:
        raise ValueError(f"{p}: not valid TOML: {exc}") from None
    out: dict[str, list] = {}

    def walk(node: Mapping, prefix: str) -> None:
        for k, v in node.items():
            key = f"{prefix}{k}"
            if isinstance(v, Mapping):
                walk(v, key + ".")
            elif isinstance(v, list):
                out[key] = v
            else:
                raise ValueError(f"{p}: {key}: an axis must be a list of values (got {v!r})")

    walk(data, "")
    if not out:
        raise ValueError(f"{p}: the grid has no axes (expected lines like \"engine.max_num_seqs\" = [64, 256])")
    return out


# ---- one run ------------------------------------------------------------------------------
def _portable(base_dir: str | Path) -> str:
    """``base_dir`` relative to the project (``@project/...``) when inside it, so that Ray
    workers, which receive the project under another path, resolve shipped scenarios."""
    p = Path(base_dir).resolve()
    try:
        return "@project/" + p.relative_to(PROJECT_ROOT).as_posix()
    except ValueError:
        return str(p)


def _resolve(base_dir: str) -> Path:
    if base_dir.startswith("@project/"):
        return PROJECT_ROOT / base_dir.removeprefix("@project/")
    return Path(base_dir)


def execute(spec: RunSpec, base_dir: str, source: str, trace_iterations: bool = False):
    """Validate and simulate one spec; returns ``("ok", Results)`` or ``("failed", error, tb)``.

    Never raises for a bad run, so that a pool or a cluster keeps going; the traceback travels
    back as text."""
    try:
        from sim.config import scenario_from_dict
        from sim.run import simulate

        sc = scenario_from_dict(spec.scenario, source=f"{source} [{spec.run_id}]", base_dir=_resolve(base_dir))
        res = simulate(sc, trace_iterations=trace_iterations, load_scale=spec.load_scale)
        return ("ok", res)
    except Exception as exc:  # noqa: BLE001 - recorded, not swallowed
        return ("failed", f"{type(exc).__name__}: {exc}", traceback.format_exc())


def write_run(spec: RunSpec, res, runs_dir: Path) -> Path:
    """Save ``res`` as ``runs_dir/<run_id>`` atomically, with the sweep's ``sweep_run.json``."""
    from sim.outdir import staged

    final = runs_dir / spec.run_id
    # replaces an earlier spec's run there in one exchange; the sweep cleaned stale parts at its start
    with staged(final, "run", clean=False) as tmp:
        res.write_into(tmp)
        (tmp / RUN_FILE).write_text(jsonout.dumps({"run_id": spec.run_id, "axes": spec.axes,
                                                   "load_scale": spec.load_scale, "digest": spec.digest,
                                                   "inputs": dict(spec.inputs)},
                                                  indent=1, sort_keys=True, default=str))
    return final


def _local_task(spec: RunSpec, runs_dir: str, base_dir: str, source: str, trace_iterations: bool) -> dict:
    """One run on a local worker: its outcome, with where its wall time went (``wall_s``; for a
    finished run also ``simulate_s``: the workload and the engine loop, ``tables_s``: validating the
    scenario and building the result tables, ``save_s``: writing the folder)."""
    t0 = time.perf_counter()
    out = execute(spec, base_dir, source, trace_iterations)
    t1 = time.perf_counter()
    if out[0] == "ok":
        try:
            write_run(spec, out[1], Path(runs_dir))
        except Exception as exc:  # noqa: BLE001
            if disk_full(exc):
                return {"status": "disk_full", "errno": exc.errno, "error": exc.strerror or str(exc),
                        "file": exc.filename, "wall_s": time.perf_counter() - t0}
            return {"status": "failed", "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(),
                    "wall_s": time.perf_counter() - t0}
        t2 = time.perf_counter()
        sim_s = out[1].summary_dict["run"].get("wall_s", 0.0)
        return {"status": "ok", "wall_s": t2 - t0, "simulate_s": sim_s, "tables_s": max(t1 - t0 - sim_s, 0.0),
                "save_s": t2 - t1}
    return {"status": "failed", "error": out[1], "traceback": out[2], "wall_s": time.perf_counter() - t0}


def longest_first(specs: Sequence[RunSpec]) -> list[RunSpec]:
    """``specs`` in the order a pool of workers should start them: the most expected work first
    (a run's requests grow with its load and its horizon), so that the runs left at the end, when
    workers fall idle one by one, are the shortest. Equal ones keep their order. Only the order
    the runs execute in changes: their folders and the sweep's table do not depend on it."""
    def work(s: RunSpec) -> float:
        h = s.scenario.get("horizon_s")
        return s.load_scale * (float(h) if isinstance(h, (int, float)) and h > 0 else 1.0)

    return sorted(specs, key=work, reverse=True)  # (sorted is stable, also reversed)


def is_complete(spec: RunSpec, runs_dir: Path) -> bool:
    """A run is complete when its folder exists and was made from this very spec."""
    f = runs_dir / spec.run_id / RUN_FILE
    try:
        return json.loads(f.read_text()).get("digest") == spec.digest
    except (OSError, ValueError):
        return False


def stale_inputs(spec: RunSpec, runs_dir: Path) -> list[str]:
    """The files whose contents changed since the run in ``spec``'s folder read them (so it
    runs again); empty when there is no such run or it recorded no files."""
    from sim.inputs import changed_files

    try:
        old = json.loads((runs_dir / spec.run_id / RUN_FILE).read_text()).get("inputs")
    except (OSError, ValueError):
        return []
    return changed_files(old if isinstance(old, dict) else None, dict(spec.inputs))


# ---- the sweep -----------------------------------------------------------------------------
@dataclass
class SweepReport:
    """What :func:`run_sweep` did. ``failed`` maps run_id to the error's one-line message."""

    out_dir: Path
    total: int
    done: int = 0
    skipped: int = 0
    failed: dict = field(default_factory=dict)
    wall_s: float = 0.0
    interrupted: bool = False
    changed: dict = field(default_factory=dict)  # file -> finished runs that read it before it changed

    @property
    def runs_per_minute(self) -> float:
        return 60.0 * self.done / self.wall_s if self.wall_s > 0 else 0.0


def run_sweep(specs: Sequence[RunSpec], out_dir: str | Path, *, base_dir: str | Path = ".",
              source: str = "<sweep>", backend: str = "local", workers: int | None = None,
              address: str | None = None, progress: bool | None = None, trace_iterations: bool = False,
              meta: Mapping[str, Any] | None = None,
              on_result: Callable[[str, dict], None] | None = None,
              log: Callable[[str], None] | None = None) -> SweepReport:
    """Run every spec not yet complete under ``out_dir/runs``; write ``out_dir/sweep.parquet``.

    Args:
        specs: from :func:`expand_grid`.
        out_dir: the sweep folder (created).
        base_dir: the scenario's folder (relative stream and profile paths resolve against it).
        source: the scenario's name for messages.
        backend: ``"local"`` (processes; ``workers`` of them, default the CPU count; 1 runs in
            this process) or ``"ray"`` (``address`` of a cluster, or None to start a local one).
        progress: a tqdm bar on stderr (True), nothing (False), or (None, the default) the bar
            on a terminal and a line every 10 s elsewhere (:mod:`sim.progress`).
        meta: extra facts to record in ``out_dir/sweep.json`` (e.g. the axes and overrides).
        on_result: called with ``(run_id, outcome)`` after each run (``outcome["status"]``).
        log: told, in one line per file, of each file that changed since finished runs read it
            (those runs run again), before any run starts.
    Returns:
        a :class:`SweepReport`; ``KeyboardInterrupt`` is caught, finished runs are kept and
        ``report.interrupted`` is set. A full disk (a run's folder that cannot be written for
        want of space) raises ``OSError``: the runs finished before it are kept, and the
        tables are not rewritten.
    """
    if backend not in ("local", "ray"):
        raise ValueError(f"'backend' must be 'local' or 'ray' (got {backend!r})")
    from sim.outdir import claim, locked

    out = claim(out_dir, "sweep", resume=True)  # a sweep adds to its own folder only
    ids = [s.run_id for s in specs]
    if len(set(ids)) != len(ids):
        raise ValueError("specs: run ids must be unique")
    specs = with_inputs(specs, base_dir)
    with locked(out, "sweep"):
        return _run_sweep_locked(specs, out, base_dir, source, backend, workers, address, progress,
                                 trace_iterations, meta, on_result, log)


def _run_sweep_locked(specs, out: Path, base_dir, source, backend, workers, address, progress,
                      trace_iterations, meta, on_result, log) -> SweepReport:
    runs_dir = out / "runs"
    fail_dir = out / "failures"
    runs_dir.mkdir(parents=True, exist_ok=True)
    # a killed sweep leaves parts of runs (older versions: .*.part-*); no other sweep is writing
    # here (the lock), so every one is stale
    for leftover in itertools.chain(runs_dir.glob(".*.part-*"), runs_dir.glob(".*.tmp-*")):
        shutil.rmtree(leftover, ignore_errors=True)
    todo = [s for s in specs if not is_complete(s, runs_dir)]
    report = SweepReport(out, len(specs), skipped=len(specs) - len(todo))
    for s in todo:
        for f in stale_inputs(s, runs_dir):
            report.changed[f] = report.changed.get(f, 0) + 1
    for f, n in report.changed.items():
        if log is not None:
            log(f"rerun: {f} changed since {n} finished run{'s' if n > 1 else ''} read it: "
                f"{'they run' if n > 1 else 'it runs'} again")
    bar = progress_bar(progress, total=len(specs), initial=report.skipped, unit="runs", desc="sweep", leave=True)
    bd = _portable(base_dir)

    rows: dict[str, list[dict]] = {}  # each finished run's table rows, read as it finishes
    times: dict[str, float] = {}

    def record(spec: RunSpec, outcome: dict) -> None:
        if outcome["status"] == "disk_full":  # the sweep stops; what it wrote so far is kept
            raise OSError(outcome["errno"], outcome["error"], outcome.get("file"))
        ff = fail_dir / f"{spec.run_id}.json"
        if outcome["status"] == "ok":
            report.done += 1
            ff.unlink(missing_ok=True)
            # (while the other workers still run, rather than all at the end)
            rows[spec.run_id] = run_rows(runs_dir / spec.run_id, spec.axes)
            for k in ("wall_s", "simulate_s", "tables_s", "save_s"):
                if outcome.get(k) is not None:
                    times[k] = times.get(k, 0.0) + outcome[k]
        else:
            report.failed[spec.run_id] = outcome["error"]
            fail_dir.mkdir(exist_ok=True)
            write_file(ff, jsonout.dumps({"run_id": spec.run_id, "axes": spec.axes, **outcome}, indent=1,
                                     default=str))
        if bar is not None:
            bar.update(1)
            bar.set_postfix(done=report.done, failed=len(report.failed), skipped=report.skipped)
        if on_result is not None:
            on_result(spec.run_id, outcome)

    t0 = time.perf_counter()
    try:
        if todo and backend == "local":
            _run_local(todo, runs_dir, bd, source, trace_iterations, workers, record)
        elif todo:
            _run_ray(todo, runs_dir, bd, source, trace_iterations, address, record)
    except KeyboardInterrupt:
        report.interrupted = True
    finally:
        report.wall_s = time.perf_counter() - t0
        if bar is not None:
            bar.close()
    t1 = time.perf_counter()
    collect(specs, out, rows)
    info = {"source": source, "base_dir": str(base_dir), "backend": backend, "runs": report.total,
            "done_now": report.done, "skipped": report.skipped, "failed": report.failed,
            "interrupted": report.interrupted, "wall_s": round(report.wall_s, 3),
            **({"rerun_changed_files": report.changed} if report.changed else {}),
            "runs_per_minute": round(report.runs_per_minute, 2),
            "time_s": _time_report(times, report, _n_workers(backend, workers, len(todo)),
                                   time.perf_counter() - t1),
            **(meta or {})}
    write_file(out / "sweep.json", jsonout.dumps(info, indent=1, default=str))
    return report


def _n_workers(backend: str, workers: int | None, n_runs: int) -> int | None:
    """The local pool's size (None for Ray: the cluster decides)."""
    return max(1, min(workers or os.cpu_count() or 1, n_runs)) if backend == "local" else None


def _time_report(times: dict, report: SweepReport, workers: int | None, collect_s: float) -> dict:
    """``sweep.json``'s ``time_s``: the runs' wall seconds summed over the runs done now, by phase
    (``simulate``: workload and engine loop, ``tables``: validation and result tables, ``save``:
    writing), the sweep's ``wall_s`` (first run started to last run recorded), ``collect_s``
    (sweep.parquet), and with local workers ``busy_share``: the runs' share of the workers'
    time (1.0: no worker ever waited; what is missing went to start-up, handing runs out and
    workers idle at the end)."""
    out = {k.removesuffix("_s"): round(v, 3) for k, v in times.items()}
    out.update(sweep=round(report.wall_s, 3), collect=round(collect_s, 3))
    if workers and report.wall_s > 0 and "wall_s" in times:
        out.update(workers=workers, busy_share=round(times["wall_s"] / (workers * report.wall_s), 3))
    return out


def _run_local(todo, runs_dir, bd, source, trace_iterations, workers, record) -> None:
    workers = _n_workers("local", workers, len(todo))
    if workers == 1:
        for s in todo:
            record(s, _local_task(s, str(runs_dir), bd, source, trace_iterations))
        return
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    # imported once here, inherited by forked workers (scipy.special: the length laws and arrival
    # processes import it on first use)
    import gc

    import scipy.special  # noqa: F401
    import sim.run  # noqa: F401
    # what the workers inherit is left out of their garbage collections (which would walk it, and
    # copy its memory pages, in every worker)
    gc.freeze()
    pool = ProcessPoolExecutor(max_workers=workers)
    try:
        pending = {pool.submit(_local_task, s, str(runs_dir), bd, source, trace_iterations): s
                   for s in longest_first(todo)}
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for f in finished:
                s = pending.pop(f)
                try:
                    outcome = f.result()
                except Exception as exc:  # noqa: BLE001 - a worker died (e.g. killed, out of memory)
                    outcome = {"status": "failed", "error": f"{type(exc).__name__}: {exc}",
                               "traceback": traceback.format_exc()}
                record(s, outcome)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        gc.unfreeze()




def _run_ray(todo, runs_dir, bd, source, trace_iterations, address, record) -> None:
    try:
        import ray
    except ImportError:
        raise RuntimeError("the ray backend needs Ray: pip install 'priosim[distributed]' "
                           "(or pip install 'ray[default]')") from None
    started = False
    if not ray.is_initialized():
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(address=address, runtime_env=ray_runtime_env(), include_dashboard=False,
                 log_to_driver=False)
        started = True
    # A lost worker (node died, process killed) is retried by Ray; a run that raises is not
    # retried: ``execute`` returns its error, the simulation being deterministic.
    # (When the caller initialised Ray, shipping the code is its job: Ray accepts a local
    # working_dir only at ray.init, e.g. ray.init(runtime_env=sim.experiments.sweep.ray_runtime_env()).)
    task = ray.remote(num_cpus=1, max_retries=3, retry_exceptions=False)(execute)
    try:
        refs = {task.remote(s, bd, source, trace_iterations): s for s in longest_first(todo)}
        while refs:
            ready, _ = ray.wait(list(refs), num_returns=1)
            for r in ready:
                s = refs.pop(r)
                t0 = time.perf_counter()
                try:
                    out = ray.get(r)
                except Exception as exc:  # noqa: BLE001 - retries exhausted
                    out = ("failed", f"{type(exc).__name__}: {exc}", traceback.format_exc())
                if out[0] == "ok":
                    try:
                        write_run(s, out[1], runs_dir)
                        outcome = {"status": "ok", "wall_s": out[1].summary_dict["run"].get("wall_s")}
                    except Exception as exc:  # noqa: BLE001
                        if disk_full(exc):
                            raise
                        outcome = {"status": "failed", "error": f"{type(exc).__name__}: {exc}",
                                   "traceback": traceback.format_exc()}
                else:
                    outcome = {"status": "failed", "error": out[1], "traceback": out[2]}
                outcome.setdefault("driver_write_s", time.perf_counter() - t0)
                record(s, outcome)
    finally:
        if started:
            ray.shutdown()


# ---- the table -----------------------------------------------------------------------------
def run_rows(run_dir: str | Path, axes: Mapping[str, Any] | None = None) -> list[dict]:
    """One row per class plus ``overall`` for one results folder: axes, class, scalar metrics,
    the class's SLOs (for plots) and run-level facts."""
    d = Path(run_dir)
    summ = json.loads((d / "summary.json").read_text())
    scen = json.loads((d / "scenario.json").read_text())
    if axes is None:
        rf = d / RUN_FILE
        axes = json.loads(rf.read_text())["axes"] if rf.exists() else {}
    slos = {c["name"]: (c.get("ttft_slo_s"), c.get("tpot_slo_s")) for c in scen.get("classes", [])}
    run = summ.get("run", {})
    lead = {"run_id": d.name, **dict(axes)}
    lead.setdefault("policy", summ.get("policy"))
    lead.setdefault("seed", summ.get("seed"))
    lead.setdefault("load", (run.get("workload") or {}).get("load_scale", 1.0))
    facts = {"thrash_ratio": run.get("thrash_ratio"), "end_s": run.get("end_s"),
             "kv_blocks": run.get("kv_blocks"), "engine_events": run.get("engine_events")}
    rows = []
    order = [c["name"] for c in scen.get("classes", [])]
    order += [c for c in summ["classes"] if c not in order]
    for name, m in [*((c, summ["classes"][c]) for c in order if c in summ["classes"]),
                    ("overall", summ["overall"])]:
        ttft_slo, tpot_slo = slos.get(name, (None, None))
        row = {**lead, "class": name}
        row.update({k: v for k, v in m.items() if not isinstance(v, (dict, list))})
        row.update(ttft_slo_s=ttft_slo, tpot_slo_s=tpot_slo, **facts)
        rows.append(row)
    return rows


def collect(specs: Sequence[RunSpec], out_dir: str | Path,
            known: Mapping[str, list[dict]] | None = None) -> pd.DataFrame:
    """Write ``out_dir/sweep.parquet`` from the complete runs among ``specs`` (atomically) and
    return it, in the order of ``specs``. Axis columns come first; grid keys keep their dotted
    names. ``known``: run id -> :func:`run_rows` of runs known complete (read as they finished)."""
    out = Path(out_dir)
    known = known or {}
    rows: list[dict] = []
    brackets: dict[str, list[RunSpec]] = {}  # (--uncertainty: a cell's runs at other cost scales)
    for s in specs:
        if s.bracket is not None:
            brackets.setdefault(s.bracket[0], []).append(s)
    for s in specs:
        if s.bracket is not None:  # not rows of their own: the interval columns of their cell
            continue
        if s.run_id in known:
            got = known[s.run_id]
        elif is_complete(s, out / "runs"):
            got = run_rows(out / "runs" / s.run_id, s.axes)
        else:
            continue
        if s.run_id in brackets:
            from sim.experiments.sweep_uncertainty import with_intervals

            got = with_intervals(got, s, brackets[s.run_id], out / "runs")
        rows.extend(got)
    df = pd.DataFrame(rows)
    if len(df):
        for c in df.columns:  # metrics absent from some classes are None: make them float
            if df[c].dtype == object and c not in ("run_id", "class", "policy") and \
                    df[c].map(lambda v: v is None or isinstance(v, (int, float))).all():
                df[c] = df[c].astype("float64")
        for c in df.columns:  # mixed-type axes (e.g. ints and strings) would not write
            if df[c].dtype == object and len({type(v) for v in df[c] if v is not None}) > 1:
                df[c] = df[c].astype(str)
    write_file(out / "sweep.parquet", lambda p: df.to_parquet(p, index=False))
    return df


def summary_table(df: pd.DataFrame, axes: Sequence[str]) -> str:
    """A compact text table of a sweep (mean over seeds) for the terminal."""
    if df.empty:
        return "(no finished runs)"
    keys = [a for a in axes if a != "seed" and a in df.columns] + ["class"]
    cols = [c for c in ("ttft_p50_s", "ttft_p99_s", "e2e_p99_s", "output_tokens_per_s", "goodput_rps",
                        "slo_attainment", "preemptions") if c in df.columns]
    t = df.groupby(keys, sort=False)[cols].mean().reset_index()
    return t.to_string(index=False, float_format=lambda v: f"{v:.4g}", na_rep="-")
