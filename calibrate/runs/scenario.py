"""A benchmark run as a priosim Scenario: the run's exact requests, sent as its client sent them.

The scenario has one class and one stream whose trace is the result file itself, read by the
trace format :data:`RUN_TRACE` (named by its dotted path, so ``workloads`` loads it without
importing this package). How the requests are sent (:func:`arrival_mode`):

* ``closed``: the run had ``max_concurrency`` C (GuideLLM ``concurrent``/``synchronous``,
  genai-perf ``concurrency``): C closed-loop users with zero think time share the request list
  in order (``closed_loop {order = "sequential"}``: a client's semaphore); with a finite
  ``request_rate`` each request is also not sent before its arrival from the process below.
  Recorded send times, when the file has them, give the list's order.
* ``recorded``: no concurrency limit and per-request send times in the file: each request is
  sent at its recorded time (seconds after the first).
* ``process``: no limit and no times: the client's own arrival process, vLLM's
  ``get_request``: the first request at 0, then gaps drawn from Gamma(shape = burstiness,
  scale = 1 / (rate * burstiness)) (burstiness 1: Poisson), seeded by the scenario seed; an
  infinite rate sends every request at 0; a ``--ramp-up-strategy`` run's rate moves from its
  start to its end value over the requests (settings ``ramp_up``).

The simulated request ``k`` is the run's row ``order[k]`` (:func:`row_order`).
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from calibrate.runs.table import Run, read_run, read_runs
from workloads.errors import WorkloadError
from workloads.traces import Trace, TraceFormat

#: the dotted name of the trace format below, as a scenario names it
RUN_TRACE_NAME = "calibrate.runs.scenario:RUN_TRACE"
MODES = ("closed", "recorded", "process")
#: the class every replayed request belongs to
CLASS = "bench"


def arrival_mode(run: Run) -> str:
    if run.settings.get("max_concurrency"):
        return "closed"
    return "recorded" if run.has_starts else "process"


def process_times(n: int, rate: float, burstiness: float | None, seed: int,
                  ramp: tuple[str, float, float] | None = None) -> np.ndarray:
    """vLLM's arrival times for ``n`` requests, seconds (see the module docstring). ``ramp``:
    ``vllm bench serve --ramp-up-strategy`` (``linear``/``exponential``, start and end
    requests/s): request ``i``'s gap is drawn at the rate reached after ``i / (n - 1)`` of the
    requests, as vLLM's ``_get_current_request_rate`` does."""
    k = float(burstiness or 1.0)
    if ramp is not None and n > 0:
        kind, lo, hi = ramp
        progress = np.arange(n) / max(n - 1, 1)
        rates = lo + (hi - lo) * progress if kind == "linear" else lo * (hi / lo) ** progress
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0, 0)))
        t = np.cumsum(rng.gamma(shape=k, scale=1.0 / (rates * k)))
        return t - t[0]  # seconds after the first send
    if not math.isfinite(rate):
        return np.zeros(n)
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0, 0)))
    gaps = rng.gamma(shape=k, scale=1.0 / (rate * k), size=max(n - 1, 0))
    return np.concatenate([[0.0], np.cumsum(gaps)])


def row_order(run: Run, mode: str) -> np.ndarray:
    """The run's rows in the order the simulation sends (and numbers) them."""
    n = len(run.requests)
    if mode in ("recorded", "closed") and run.has_starts:
        return np.argsort(run.requests["start_s"].to_numpy(), kind="stable")
    return np.arange(n)


def _spec_int(spec: dict, key: str, default: int) -> int:
    v = spec.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise WorkloadError(f"{key}: must be an integer >= 0 (got {v!r})")
    return v


def _check_spec(spec: dict) -> None:
    mode = spec.get("arrivals", "recorded")
    if mode not in MODES:
        raise WorkloadError(f"arrivals: must be one of {', '.join(MODES)} (got {mode!r})")
    _spec_int(spec, "seed", 0)
    if spec.get("result") is not None and _spec_int(spec, "result", 1) < 1:
        raise WorkloadError(f"result: must be an integer >= 1 (got {spec['result']!r})")


def _read_result(path: Path, part: int | None) -> Run:
    """The file's run (:func:`read_run`), or its ``part``-th result of several (``Run.part``),
    the others not read: every replay of a fit reads its run again."""
    return read_run(path) if part is None else read_runs(path, only=part)[0]


def load_run_trace(path: Path, spec: dict, lenient: bool) -> Trace:
    """The run's requests as a trace table: lengths in send order, ``arrival_s`` per mode
    (``closed``: the not-before times, 0 for an infinite rate)."""
    from calibrate.runs.table import RunError

    try:
        run = _read_result(path, spec.get("result"))
    except RunError as exc:
        raise WorkloadError(str(exc)) from None
    mode = spec.get("arrivals", "recorded")
    order = row_order(run, mode)
    req = run.requests.iloc[order].reset_index(drop=True)
    n = len(req)
    if mode == "recorded":
        if not run.has_starts:
            raise WorkloadError(f"{path.name}: arrivals = 'recorded' but the file has no send times "
                                f"(expected 'process' or 'closed')")
        t = req["start_s"].to_numpy(dtype=float)
    else:
        t = process_times(n, float(run.settings.get("request_rate") or math.inf), run.settings.get("burstiness"),
                          _spec_int(spec, "seed", 0), run.settings.get("ramp_up"))
    out = np.maximum(req["output_tokens"].to_numpy(), 1)
    # each request's max_tokens is its output length, as the benchmark clients send it (vLLM's
    # and SGLang's max_tokens / max_new_tokens = the dataset's output length): what a server's
    # --max-model-len checks, not the run's longest output
    df = pd.DataFrame({"arrival_s": t, "prompt_tokens": np.maximum(req["input_tokens"].to_numpy(), 1),
                       "output_tokens": out, "max_tokens": out})
    zeros = int((req["input_tokens"] == 0).sum() + (req["output_tokens"] == 0).sum())
    return Trace(df, path.name, n, 0, zeros)


RUN_TRACE = TraceFormat(load_run_trace, "a benchmark result file's requests (calibrate.runs)",
                        options={"arrivals": None, "seed": None, "result": None}, checker=_check_spec)


def possible_modes(run: Run) -> list[str]:
    """The arrival modes the file has what they need for: ``closed`` its max_concurrency,
    ``recorded`` its per-request send times, ``process`` only its rate (always)."""
    return ([m for m, ok in (("closed", bool(run.settings.get("max_concurrency"))), ("recorded", run.has_starts))
             if ok] + ["process"])


def what_it_records(run: Run) -> str:
    """How the file says the run was sent, in a few words (for a refused arrival mode)."""
    rate = run.settings.get("request_rate")
    mc = run.settings.get("max_concurrency")
    rate_s = "request_rate inf" if rate is None or not math.isfinite(rate) else f"request_rate {rate:g}/s"
    return ", ".join([rate_s, f"max_concurrency {mc}" if mc else "no concurrency limit",
                      "per-request send times" if run.has_starts else "no per-request send times"])


def check_mode(run: Run, mode: str) -> None:
    """Refuse (one line, :class:`~calibrate.runs.table.RunError`) an arrival mode the file
    lacks what for: ``closed`` without max_concurrency, ``recorded`` without send times."""
    from calibrate.runs.table import RunError

    if mode not in MODES:
        raise RunError(f"{_where(run)}: arrivals: must be one of {', '.join(MODES)} (got {mode!r})")
    need = {"closed": "the run's max_concurrency", "recorded": "per-request send times"}.get(mode)
    if need is None or mode in possible_modes(run):
        return
    raise RunError(f"{_where(run)}: --arrivals {mode} needs {need}, which the file does not have (it records "
                   f"{what_it_records(run)}; expected --arrivals {' or '.join(['auto'] + possible_modes(run))})")


def _where(run: Run) -> str:
    """The run's file as given, ``#N`` for one result of several."""
    return run.source + (f"#{run.part}" if run.part else "")


def scenario_dict(run: Run, profile: str, seed: int = 0, mode: str | None = None) -> dict:
    """The scenario table (before ``--set`` overrides) that replays ``run`` on ``profile``;
    a ``mode`` the file lacks what for is refused (:func:`check_mode`)."""
    mode = mode or arrival_mode(run)
    check_mode(run, mode)
    trace = {"format": RUN_TRACE_NAME, "path": str(Path(run.source).resolve()), "arrivals": mode, "seed": seed}
    if run.part is not None:  # (the file holds several results: this one)
        trace["result"] = run.part
    stream: dict[str, Any] = {"tenant": CLASS, "class": CLASS, "trace": trace}
    if mode == "closed":
        stream["arrival"] = {"process": "closed_loop", "users": int(run.settings["max_concurrency"]), "think": 0,
                             "order": "sequential"}
        # the users stop sending at the horizon: far beyond any replay (the list ends first)
        horizon = 1e8
    else:
        starts = (run.requests["start_s"].to_numpy() if mode == "recorded"
                  else process_times(len(run.requests), float(run.settings.get("request_rate") or math.inf),
                                     run.settings.get("burstiness"), seed, run.settings.get("ramp_up")))
        horizon = float(np.max(starts)) + 1.0
    name = re.sub(r"[^A-Za-z0-9._-]", "_", f"replay-{Path(run.source).stem}" + (f"-{run.part}" if run.part else ""))
    return {"name": name, "seed": seed, "horizon_s": horizon, "drain": True,
            # the time series is not compared: one sample per 100,000th of the horizon at most
            "engine": {"profile": profile, "engine": engine_of(run),
                       "timeseries_interval_s": max(1.0, horizon / 100_000)},
            "classes": [{"name": CLASS, "priority": 0}], "streams": [stream]}


def engine_of(run: Run) -> str:
    """The engine that served the run, as ``engine.engine`` names it: SGLang when the client
    says so (``backend = "sglang*"``), else vLLM (its defaults are the replay's; ``--set`` or
    ``--engine-args`` change them)."""
    return "sglang" if str(run.settings.get("backend") or "").lower().startswith("sglang") else "vllm"


def forced_engine(overrides: list[str]) -> str | None:
    """The engine ``--set engine.engine=...`` (or ``--engine-args`` / ``--sglang-args``) serves
    every run with, the last one given; None when the runs' own clients decide (:func:`engine_of`)."""
    return next((o.partition("=")[2].strip().strip('"') for o in reversed(overrides)
                 if o.partition("=")[0].strip() == "engine.engine"), None)


def profile_meta(profile: str) -> dict:
    """The ``meta`` of a profile (a shipped name or a file); {} when it has none or cannot be
    read (the replay itself says what is wrong with it)."""
    from sim.engines.gpu import document

    doc = document(profile, Path("."))
    meta = doc.get("meta") if doc is not None else None
    return meta if isinstance(meta, dict) else {}


def fitted_to_runs(profile: str) -> bool:
    """Whether ``profile`` was written by ``calibrate --from-runs`` (``meta.fitted_from_runs``):
    a replay against it prices the run as the fit did."""
    return bool(profile_meta(profile).get("fitted_from_runs"))


#: Per engine, for the note of a run priced without its release: the keys that silence it (a
#: release given, or pricing set by hand), why the release matters, and an example release.
_RELEASE_NOTES = {
    "vllm": ({"engine.engine_version", "engine.overhead", "engine.overlap_scheduling"}, "; ",
             "a vLLM from 0.14 schedules each step while the last one runs (docs/engines.md): ", "0.15.1"),
    "sglang": ({"engine.engine_version"}, ": ",
               "its chunked-prefill size, memory fraction and overlap scheduler (from 0.4) are that release's "
               "(docs/engines.md); ", "0.4.6"),
}


def _unversioned(engine: str, runs: list[Run], sets: list[str]) -> str:
    """A note when ``engine``'s runs are priced without ``engine.engine_version`` (a result file
    records none): as the default release, whose scheduling may not be the server's. Empty when
    the runs are another engine's or the release (or the pricing) is given."""
    from sim.engines import family

    silenced, sep, why, example = _RELEASE_NOTES[engine]
    keys = {s.partition("=")[0].strip() for s in sets}
    if (forced_engine(sets) or engine_of(runs[0])) != engine or keys & silenced:
        return ""
    fam = family(engine)
    what = "the run is" if len(runs) == 1 else "the runs are"
    return (f"{what} priced as {'vLLM' if engine == 'vllm' else 'SGLang'} {fam.latest} (no engine.engine_version "
            f"given: a result file records none){sep}{why}give your release, e.g. --set "
            f"engine.engine_version={example}, to calibrate and replay alike")


def unversioned_vllm(runs: list[Run], sets: list[str]) -> str:
    """:func:`_unversioned` for vLLM, which from 0.14 schedules asynchronously (moving TTFT)."""
    return _unversioned("vllm", runs, sets)


def unversioned_release(runs: list[Run], sets: list[str]) -> str:
    """The note of :func:`_unversioned` for whichever engine serves the runs; empty when the
    release is given."""
    return _unversioned("vllm", runs, sets) or _unversioned("sglang", runs, sets)


def arrival_law(run: Run) -> str:
    """The client's arrival process in words (vLLM's ``get_request``; :func:`process_times`)."""
    ramp = run.settings.get("ramp_up")
    if ramp is not None:
        return f"a {ramp[0]} ramp from {ramp[1]:g} to {ramp[2]:g} req/s"
    rate = float(run.settings.get("request_rate") or math.inf)
    k = float(run.settings.get("burstiness") or 1.0)
    return f"Poisson at {rate:g} req/s" if k == 1.0 else f"Gamma gaps of burstiness {k:g} at {rate:g} req/s"


def redrawn_arrivals(run: Run, mode: str, seed: int) -> str:
    """A note when the replay draws the run's send times again from its client's arrival
    process (``process``; ``closed`` with a finite rate, for the not-before times) instead of
    taking them from the file: measured and simulated are then two independent draws of one
    process, so throughput and tail errors include sampling noise. Empty when nothing is drawn
    (recorded times; an infinite rate sends every request at 0)."""
    drawn = run.settings.get("ramp_up") is not None or math.isfinite(float(run.settings.get("request_rate")
                                                                           or math.inf))
    if mode == "recorded" or not drawn:
        return ""
    why = ("the file has no per-request send times" if not run.has_starts
           else f"--arrivals {mode} does not use the file's send times")
    what = "each request's earliest send time is" if mode == "closed" else "the arrivals are"
    return (f"{why}: {what} drawn again from the client's arrival process ({arrival_law(run)}) with seed "
            f"{seed}, so measured and simulated are two independent draws: the throughput and tail errors "
            f"include sampling noise (another --seed draws again)")


def profile_model(profile: str) -> str | None:
    """The model a profile describes: its ``meta.shape``, else its name less the device
    (``h200-llama-3-8b`` -> ``llama-3-8b``); None when it cannot tell."""
    meta = profile_meta(profile)
    if isinstance(meta.get("shape"), str):
        return meta["shape"]
    name = str(meta.get("name") or Path(profile).stem)
    m = re.search(r"(llama|mistral|qwen|tiny|mixtral|gemma|phi|deepseek)", name.lower())
    return name[m.start():] if m else None


def _squash(s: str) -> str:
    return re.sub(r"[^a-z0-9]", "", s.lower())


def model_differs(run_model: str | None, profile: str) -> str | None:
    """A one-line warning when the run names a model the profile does not describe."""
    if not run_model:
        return None
    pm = profile_model(profile)
    if pm is None:
        return None
    if _squash(re.sub(r"-tp\d+$", "", pm)) in _squash(str(run_model).split("/")[-1]):
        return None
    return (f"the run's model is {run_model!r} but the profile {profile!r} describes {pm!r} (the simulated "
            f"times are that model's; pass --profile for the run's model and GPU)")


#: the GPU families a name is matched on (lower case); the longest match wins
_GPU = re.compile(r"gb200|gb300|b200|b300|b100|h200|h100|h800|h20|gh200|a100|a800|a10g|a10|a30|a40|l40s|l40|l4|"
                  r"v100|t4|mi355x|mi325x|mi300x|mi300a|mi250x|mi250|rtx ?\d{4}|a6000")
#: top-level keys a result file may name its GPU under: none of the four clients writes one,
#: but ``vllm bench serve --metadata gpu=H200`` (and SGLang's result dict, edited) add such keys
GPU_KEYS = ("gpu", "gpu_name", "gpu_type", "gpu_model", "device", "hardware", "accelerator")


def gpu_family(text: str | None) -> str | None:
    """The GPU family a name mentions (``"NVIDIA H200 (141 GB HBM3e)"`` -> ``h200``), else None."""
    found = _GPU.findall(str(text or "").lower())
    return max(found, key=len).replace(" ", "") if found else None


def run_gpu(run: Run) -> str | None:
    """The GPU the file says the run was made on (a top-level key of :data:`GPU_KEYS`), else None."""
    summary = {str(k).lower(): v for k, v in (run.summary or {}).items()}
    return next((summary[k] for k in GPU_KEYS if isinstance(summary.get(k), str) and summary[k].strip()), None)


def gpu_differs(run: Run, profile: str) -> str | None:
    """A one-line warning when the file names a GPU of another family than the profile's
    (``meta.device``, else its name); None when either does not say."""
    named = run_gpu(run)
    mine = gpu_family(named)
    meta = profile_meta(profile)
    theirs = gpu_family(meta.get("device")) or gpu_family(str(meta.get("name") or Path(profile).stem))
    if mine is None or theirs is None or mine == theirs:
        return None
    return (f"the run names GPU {named!r} but the profile {profile!r} is for {theirs.upper()} (the simulated "
            f"times are that GPU's; pass --profile for the run's model and GPU)")


__all__ = ["RUN_TRACE", "RUN_TRACE_NAME", "arrival_mode", "process_times", "row_order", "scenario_dict",
           "model_differs", "MODES", "CLASS"]
