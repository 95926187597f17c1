"""Service-level objectives of a capacity search: parsing ``CLASS:key=SECONDS`` text, judging a
simulated point against the SLOs, and stopping a probe as soon as its verdict is certain.

A point *meets the SLOs* when, for every class: every request finished (none rejected or left
unfinished), ``ttft_p99_s <= ttft`` and ``tpot_p99_s <= tpot`` where the class has those SLOs, and
the class's last request finished by ``done`` (simulated seconds) where given.

A class with neither a TTFT nor a TPOT SLO (batch) gets an *implicit* deadline unless ``--slo
CLASS:done=S`` gives one (which is then taken literally)::

    done = horizon_s * (1 + grace) + the longest unloaded service time among the class's requests

A request cannot be asked to finish before it could on an idle replica: its *unloaded service
time* is the front end's latency, the prefill of its prompt (in the engine's chunks) and its
decode steps at batch 1 (:func:`unloaded_service_s`, the scenario's cost model). Without that
term, the last request of a day, arriving just before the horizon with a long answer, could not
finish by ``horizon_s * (1 + grace)`` on any number of replicas, and which seed happens to put a
long request last would decide the count. Requests refused at any count for their length
(:func:`refused_requests`) count towards no deadline. Closed-loop users' requests are not known
before a run: a class fed only by them keeps ``horizon_s * (1 + grace)``. The deadline is taken
from the scenario's own cost model, also when the uncertainty searches scale every step time.
"""
from __future__ import annotations

import heapq
import json
import math

import numpy as np
import pandas as pd

from sim.core.costs import NS
from sim.core.errors import ScenarioError
from sim.core.request import State

SLO_KEYS = ("ttft", "tpot", "done")
#: the reasons an engine refuses a request for its length at any load (Engine.size_refusal)
REFUSALS = ("too_long", "too_large", "too_long_for_step")
#: The ratio (measured / limit) of an SLO whose measure is missing: its class's requests gave no
#: sample of it (none finished, so no TPOT; none had a first token, so no TTFT). That misses the
#: SLO, by far: no setting that meets it measures nothing. ``priosim tune`` (its constraints and
#: ``slo_ratio``) and ``priosim sensitivity`` (its ``slo_ratio`` metric) judge alike.
MISSED = 1e6


def slo_ratio(value: float | None, limit: float) -> float:
    """A measured p99 (s) over its SLO ``limit`` (s): <= 1 met; :data:`MISSED` when there is no
    measure (``value`` None)."""
    return MISSED if value is None else float(value) / limit


# ---- SLOs ----------------------------------------------------------------------------------------
def parse_slo_text(text: str, classes, keys, off_words: tuple[str, ...] = ()) -> tuple[str, list]:
    """``CLASS:key=SECONDS[,key=SECONDS]`` -> ``(CLASS, [(key, seconds or None), ...])``; a value
    in ``off_words`` gives None (no such SLO). Raises ValueError with one line naming the text,
    the part and what was expected (callers re-raise it as their own error)."""
    cname, sep, rest = text.partition(":")
    cname = cname.strip()
    if not sep or cname not in classes:
        raise ValueError(f"--slo {text!r}: expected CLASS:key=SECONDS[,key=SECONDS] with CLASS one of "
                         f"{', '.join(classes)}")
    out = []
    for part in rest.split(","):
        k, sep, v = part.partition("=")
        k, v = k.strip(), v.strip()
        if not sep or k not in keys:
            raise ValueError(f"--slo {text!r}: '{part.strip()}': expected key=SECONDS with key one of "
                             f"{', '.join(keys)}")
        if any(k == seen for seen, _ in out):
            raise ValueError(f"--slo {text!r}: {k} given twice (expected each key once)")
        if v.lower() in off_words:
            out.append((k, None))
            continue
        try:
            val = float(v)
        except ValueError:
            raise ValueError(f"--slo {text!r}: {k}: expected a number of seconds (got {v!r})") from None
        if not val > 0:
            raise ValueError(f"--slo {text!r}: {k}: expected > 0 (got {v})")
        out.append((k, val))
    return cname, out


def parse_slos(sc, items: list[str] | None = None, grace: float = 0.1, load_scale: float = 1.0,
               workload=None, refused: dict | None = None) -> dict[str, dict]:
    """Per class: {'ttft': s|None, 'tpot': s|None, 'done': s|None} (see module docstring); a
    class given the implicit deadline also has ``done_from``, what it was made of
    (:func:`implicit_deadline`). ``workload``: the request stream at ``load_scale`` when the
    caller built it (else built here, only if a class needs the implicit deadline);
    ``refused``: :func:`refused_requests` when the caller has it."""
    slos = {c.name: {"ttft": c.ttft_slo_s, "tpot": c.tpot_slo_s, "done": None} for c in sc.classes}
    for item in items or []:
        try:
            cname, pairs = parse_slo_text(item, list(slos), SLO_KEYS, off_words=("none", "off", "-"))
        except ValueError as exc:
            raise ScenarioError(str(exc)) from None
        slos[cname].update(pairs)
        warn_ms(item, pairs)
    bare = [c for c, s in slos.items() if s["ttft"] is None and s["tpot"] is None and s["done"] is None]
    if not bare:
        return slos
    if workload is None:
        from sim.experiments.capacity import scenario_workload

        workload = scenario_workload(sc, load_scale)
    if refused is None:
        refused = refused_requests(sc, workload)
    for c in bare:
        basis = implicit_deadline(sc, workload, c, grace, refused.get(c, {}).get("rows"))
        slos[c]["done"] = basis["done_s"]
        slos[c]["done_from"] = {k: v for k, v in basis.items() if k != "done_s"}
    return slos


def warn_ms(item: str, pairs: list) -> None:
    """Warn (one line) about a ``--slo`` latency that looks like milliseconds, as the scenario's
    ``ttft_slo_s`` / ``tpot_slo_s`` keys are warned about."""
    from plumbing.notices import warn
    from sim.config import slo_looks_like_ms

    for key, v in pairs:
        why = slo_looks_like_ms(key, v) if key in ("ttft", "tpot") else None
        if why:
            warn(f"--slo {item!r}: {key} = {v:g} {why}")


def implicit_deadline(sc, workload, cls: str, grace: float, skip=None) -> dict:
    """The implicit deadline of class ``cls`` (see module docstring): ``done_s``, and what it
    was made of: ``horizon_s``, ``grace``, ``longest_s`` (s) and the longest request (its row in
    the stream, ``request``, with its arrival, s, and lengths, tokens; None without one).
    ``skip``: rows left out (refused at any count)."""
    from sim.assembly import engine_costs

    base = sc.horizon_s * (1 + grace)
    out = {"horizon_s": sc.horizon_s, "grace": grace, "longest_s": 0.0, "request": None}
    df = getattr(workload, "open", None)
    if df is None or not len(df):
        return {"done_s": base, **out}
    mine = (df["cls"] == cls).to_numpy().copy()  # (pandas may hand out a read-only view)
    if skip is not None and len(skip):
        mine[np.asarray(skip, dtype=np.int64)] = False
    rows = np.flatnonzero(mine)
    if not len(rows):
        return {"done_s": base, **out}
    prompt = df["prompt_tokens"].to_numpy(np.int64)[rows]
    gen = np.minimum(df["output_tokens"].to_numpy(np.int64), df["max_tokens"].to_numpy(np.int64))[rows]
    costs = engine_costs(sc)
    # (service time grows with either length: the longest lies on the pareto front of the two)
    best, best_s = None, -1.0
    for i in _pareto_front(prompt, gen):
        t = unloaded_service_s(costs, sc.engine, int(prompt[i]), int(gen[i]))
        if t > best_s:
            best, best_s = i, t
    r = int(rows[best])
    out.update(longest_s=best_s, request={"id": r, "arrival_s": float(df["arrival_s"].iat[r]),
                                          "prompt_tokens": int(prompt[best]), "output_tokens": int(gen[best])})
    return {"done_s": base + best_s, **out}


def _pareto_front(a: np.ndarray, b: np.ndarray) -> list[int]:
    """Indices of the points not dominated in both ``a`` and ``b`` (one per distinct pair)."""
    order = np.lexsort((-b, -a))  # a descending, then b descending
    out, top = [], -1
    for i in order:
        if b[i] > top:
            out.append(int(i))
            top = b[i]
    return out


def unloaded_service_s(costs, engine, prompt: int, gen: int) -> float:
    """Seconds one request takes on an idle replica: the front end's latency, its prompt
    prefilled in the engine's chunks (the first token comes with the last chunk) and ``gen - 1``
    decode steps at batch 1, its context growing a token a step."""
    t = costs.overhead.frontend_s
    chunk = prompt
    if engine.chunked_prefill:
        chunk = min(engine.max_batched_tokens, engine.max_prefill_chunk or prompt) or prompt
    done = 0
    while done < prompt:
        n = min(chunk, prompt - done)
        t += costs.step_ns(n, 0, n * n, n * done, 0, 1, 1 if done == 0 else 0) / NS
        done += n
    steps = max(gen - 1, 0)
    if steps:
        line = costs.decode_line(1)
        if line is not None:  # (a + b * context per step: summed in closed form)
            a, b = line
            t += steps * a + b * (steps * prompt + steps * (steps + 1) / 2)
        else:
            t += sum(costs.step_ns(0, 1, 0, 0, prompt + j) for j in range(1, steps + 1)) / NS
    return t


def refused_requests(sc, workload) -> dict[str, dict]:
    """The open requests a replica of ``sc``'s ``[engine]`` refuses at their arrival for their
    length, whatever the load and the replica count (the engine's own rule,
    :meth:`sim.core.engine.Engine.size_refusal`: ``too_long``, ``too_large``,
    ``too_long_for_step``), per class with any: ``{REFUSALS[i]: n, ..., "arrived": n,
    "max_model_len": tokens or None, "rows": [row, ...]}``. The last answer is kept: capacity
    asks it for the implicit deadlines and again for its search, of the same stream (not to be
    changed by the caller)."""
    df = getattr(workload, "open", None)
    if df is None or not len(df):
        return {}
    import simpy

    from sim.assembly import build_engine

    asked = json.dumps([sc.engine.model_dump(mode="json"), [(c.name, c.priority) for c in sc.classes]],
                       sort_keys=True, default=str)
    if _REFUSED[0] is workload and _REFUSED[1] == asked:
        return _REFUSED[2]
    eng = build_engine(sc, simpy.Environment())
    prio = {c.name: c.priority for c in sc.classes}
    why: dict[tuple, str] = {}  # (prompt, max_tokens, priority) -> the engine's answer, asked once
    out: dict[str, dict] = {}
    rows = zip(df["prompt_tokens"].to_numpy(np.int64).tolist(), df["max_tokens"].to_numpy(np.int64).tolist(),
               df["cls"].tolist())
    for i, (p, m, c) in enumerate(rows):
        key = (p, m, prio[c])
        reason = why.get(key)
        if reason is None:
            reason = why[key] = eng.size_refusal(*key)
        if reason:
            r = out.setdefault(c, {**dict.fromkeys(REFUSALS, 0), "arrived": 0, "max_model_len": sc.engine.max_model_len,
                                   "rows": []})
            r[reason] += 1
            r["rows"].append(i)
    for c, r in out.items():
        r["arrived"] = int((df["cls"] == c).sum())
    _REFUSED[:] = [workload, asked, out]
    return out


_REFUSED: list = [None, "", {}]  # the last refused_requests answer: (its stream, its engine and classes, it)


def check_point(summary: dict, requests: pd.DataFrame, slos: dict[str, dict]) -> dict[str, dict]:
    """Per class: ok plus the measured values the SLOs are judged on."""
    out = {}
    for cname, s in slos.items():
        m = summary["classes"][cname]
        g = requests[requests["class"] == cname]
        fin = g["finish_s"]
        last = float(fin.max()) if len(g) and fin.notna().any() else 0.0
        # (the request that finished last, by its arrival: a partition probed alone numbers its
        # requests from 0, so an id would not name the same request everywhere)
        last_arrival = float(g["arrival_s"].loc[fin.idxmax()]) if len(g) and fin.notna().any() else None
        ok = m["finished"] == m["arrived"]
        ratio = 0.0
        for key, col in (("ttft", "ttft_p99_s"), ("tpot", "tpot_p99_s")):
            if s[key] is not None and m[col] is not None:
                ratio = max(ratio, m[col] / s[key])
                ok = ok and m[col] <= s[key]
        if s["done"] is not None:
            ratio = max(ratio, last / s["done"])
            ok = ok and last <= s["done"]
        out[cname] = {"ok": bool(ok), "arrived": m["arrived"], "finished": m["finished"],
                      "ttft_p99_s": m["ttft_p99_s"], "tpot_p99_s": m["tpot_p99_s"], "last_finish_s": last,
                      "last_arrival_s": last_arrival, "output_tokens_per_s": m["output_tokens_per_s"],
                      "slo_ratio": ratio}
    return out


# ---- stopping a probe that has lost ---------------------------------------------------------------
class ProbeLost(Exception):
    """Raised inside a probe's simulation once it can no longer meet its SLOs."""


class SloWatch:
    """Told of every request that ends in a probe; raises :class:`ProbeLost` as soon as every
    searched dimension has a class that can no longer meet its SLOs, so that a failing probe
    stops early with the same verdict it would reach at the end.

    A class is lost, for certain, when one of its requests is rejected (not every request would
    finish), finishes after its ``done`` deadline (its last finish can only be later), or when
    enough of its requests exceed the TTFT or TPOT SLO that the p99 must exceed it: with ``n``
    requests in the class, pandas' linear p99 is at least the sorted value at index
    ``floor((n - 1) * 0.99)``, so ``n - floor((n - 1) * 0.99)`` values above the SLO decide it
    (``n`` is the class's number of requests; fewer values, e.g. TPOT of one-token answers, need no
    more). Values are computed exactly as the requests table computes them.

    Args:
        slos: per class ``{'ttft', 'tpot', 'done'}`` (seconds or None).
        totals: requests per class in the stream (open arrivals only).
        dims: the classes of each searched dimension of the probe.
    """

    def __init__(self, slos: dict, totals: dict[str, int], dims: list[list[str]]) -> None:
        self.slos = slos
        self.dims = dims
        self.need = {c: n - math.floor((n - 1) * 0.99) for c, n in totals.items() if n}
        self.over: dict[tuple[str, str], list[float]] = {}  # (class, key) -> heap of the largest values
        self.lost: dict[str, float] = {}  # class -> a lower bound of its slo_ratio
        self.at_ns = -1

    def _over(self, c: str, key: str, v: float, limit: float) -> None:
        h = self.over.setdefault((c, key), [])
        m = self.need.get(c, 1)
        if len(h) < m:
            heapq.heappush(h, v)
        elif v > h[0]:
            heapq.heapreplace(h, v)
        if len(h) >= m:
            self._lose(c, h[0] / limit)  # the p99 is at least the m-th largest value

    def _lose(self, c: str, ratio: float) -> None:
        self.lost[c] = max(self.lost.get(c, 0.0), ratio)

    def __call__(self, req, now_ns: int) -> None:
        c = req.cls
        s = self.slos.get(c)
        if s is None:
            return
        if req.state is State.REJECTED:
            self._lose(c, 0.0)
        elif req.state is State.FINISHED:
            finish = req.finish_ns / NS
            if s["done"] is not None and finish > s["done"]:
                self._lose(c, finish / s["done"])
            first = req.first_token_ns / NS
            if s["ttft"] is not None:
                v = first - req.arrival_ns / NS
                if v > s["ttft"]:
                    self._over(c, "ttft", v, s["ttft"])
            if s["tpot"] is not None and req.generated > 1:
                v = (finish - first) / (req.generated - 1)
                if v > s["tpot"]:
                    self._over(c, "tpot", v, s["tpot"])
        if self.lost and all(any(x in self.lost for x in d) for d in self.dims):
            self.at_ns = now_ns
            raise ProbeLost(c)
