"""Why a capacity answer is what it is: the margin at the answer, the limit that binds, and a
warning when the answer rests on a knife edge.

For each searched dimension of each design (the shared pool; each partition) a few more points
are simulated to their end (no early stopping, so every ratio is exact): ``N - 1`` and ``2 N``
replicas around the answer ``N`` (a design with no answer: ``max_replicas / 2`` and
``max_replicas``). With the answer itself and the search's probes that ran to their end they
make the dimension's *curve*: the worst p99/SLO ratio of its classes against its replica count.

* The **margin**: the worst ratio at ``N`` and at ``N - 1``, naming the class and the metric
  (``ttft`` / ``tpot``: p99 over the SLO; ``done``: the last finish over the deadline).
* The **binding limit**: ``queueing`` when doubling the replicas (``N - 1`` to ``2 N``) lowers the
  worst ratio by at least :data:`FLAT` (10 %): requests wait for a free replica, and more replicas
  help. Otherwise ``per-step time``: what a request sees is the time of the steps it runs in, and
  more replicas barely change that. The step-time component that binds is then read from one
  more run at the answer with the iteration trace: the mean time of steps that carry prefill
  tokens against decode-only steps, the share of step time the prefill tokens take, and how
  many of the binding class's tokens come in steps with prefill (skipped, and said so, when the
  trace would hold more than :data:`TRACE_ROWS_MAX` rows).
  When the metric that binds there is a class's deadline (``done``) and more replicas do not
  move it, the binding limit is ``deadline`` instead: the last request's own length decides
  when it finishes, not the step time nor the count; the text names that request (by its
  arrival) and what moves the deadline (``--grace`` for the implicit one, ``--slo CLASS:done=``).
* ``refused requests`` when a class of the dimension has requests refused at any count for
  their length (``rep.refused``): no count helps, and no more points are simulated for it. A
  partition of a class with no traffic (0 replicas) is ``none (no traffic)``.
* A **warning** when the curve is flat (its range over the exact points under :data:`FLAT` of
  its largest value) while the answer depends on crossing 1.0: the answer then moves with the
  step-time knobs (:data:`STEP_KNOBS`) far more than with the load (with a deadline binding,
  with the deadline instead). A dimension with its own answer in a design without one (a
  partition that meets its SLOs beside one that does not) is explained at its own answer.

The explanation adds simulations but never changes the answer (the search is done by then).
"""
from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pandas as pd

from sim.experiments.capacity import (_eval_task, _only, _refreshed, _workload, design_cluster, design_dims,
                                      partitions_apart, pd_settings)

#: a curve whose worst ratio moves less than this share of its value is flat in the replica count
FLAT = 0.10
#: the iteration trace of the step breakdown holds about one row per generated token: above this
#: many the breakdown is skipped (the traced run takes about ten times a plain one, and memory)
TRACE_ROWS_MAX = 3_000_000
#: the knobs that set the step time (what moves an answer bound by the per-step time)
STEP_KNOBS = ("engine.max_batched_tokens", "engine.max_prefill_chunk", "classes.*.max_prefill_tokens_per_step",
              "policy")
METRICS = (("ttft", "ttft_p99_s", "ttft p99"), ("tpot", "tpot_p99_s", "tpot p99"),
           ("done", "last_finish_s", "last finish"))


def worst_of(classes: dict, slos: dict, names: list[str]) -> dict | None:
    """The worst ratio to its SLO among ``names`` in a point's ``classes``: ``{ratio, class,
    metric}`` (metric ``ttft`` / ``tpot`` / ``done``), None when none of them has a value."""
    best = None
    for c in names:
        m, s = classes.get(c), slos.get(c)
        if m is None or s is None:
            continue
        for key, col, _ in METRICS:
            if s.get(key) is None or m.get(col) is None:
                continue
            r = float(m[col]) / s[key]
            if best is None or r > best["ratio"]:
                best = {"ratio": r, "class": c, "metric": key}
    return best


def metric_text(w: dict | None) -> str:
    if w is None:
        return "no value"
    label = next(lab for key, _, lab in METRICS if key == w["metric"])
    return f"{w['ratio']:.3f} ({w['class']} {label}{'/deadline' if w['metric'] == 'done' else '/SLO'})"


# ---- the points ----------------------------------------------------------------------------------
class _Dims:
    """The dimensions of the designs in a report, with each one's answer and how its points are
    simulated (a partition alone, or the whole design with the other counts at their answers)."""

    def __init__(self, rep, sc, slos, router, load_scale: float, max_replicas: int, apart: bool | None):
        self.rep, self.sc, self.slos, self.router = rep, sc, slos, router
        self.load_scale, self.max_replicas = load_scale, max_replicas
        if apart is None:
            apart = "partitioned" in rep.designs and partitions_apart(sc, load_scale)
        self.apart = apart

    def dims(self, d: str):
        return design_dims(d, self.sc.class_names, self.max_replicas)

    def answer(self, d: str) -> list[int] | None:
        split = self.rep.designs[d].get("split")
        return [split[x.name] for x in self.dims(d)] if split else None

    def dim_answer(self, d: str, j: int) -> int | None:
        """Dimension ``j``'s own answer: the design's, or in a design with none, the count that
        dimension found (a partition that meets its SLOs), else None."""
        found = self.rep.designs[d].get("split") or self.rep.designs[d].get("found") or {}
        return found.get(self.dims(d)[j].name)

    def refused(self, d: str, j: int) -> list[str]:
        """The classes of dimension ``j`` with requests refused at any count."""
        return [c for c in self.dims(d)[j].classes if c in (self.rep.refused or {})]

    def args(self, d: str, j: int, k: int) -> tuple:
        """The arguments of the capacity search's :func:`_eval_task` for dimension ``j`` of design
        ``d`` at ``k`` replicas, simulated to its end."""
        dims = self.dims(d)
        if d == "partitioned" and self.apart:
            return (self.sc, {"replicas": k, "router": _refreshed("least_outstanding", self.router)}, self.load_scale,
                    self.slos, None, dims[j].classes)
        counts = self.answer(d) or [self.max_replicas if a is None else a
                                     for a in (self.dim_answer(d, i) for i in range(len(dims)))]
        counts[j] = k
        return (self.sc, design_cluster(d, dims, counts, self.router, pd_settings(self.sc)), self.load_scale,
                self.slos, None)


def _curve(rep, d: str, j: int, names: list[str], slos: dict, extra: dict[int, dict],
           answer: list[int] | None = None) -> dict[int, dict]:
    """Replica count of dimension ``j`` -> the worst ratio of its classes, from every point of
    design ``d`` that ran to its end (the search's probes, its answer) and the extra points.
    The disaggregated design's roles serve the same classes, so there only the points with the
    other role's count at ``answer``'s count are on the curve."""
    out: dict[int, dict] = {}
    for p in rep.points:
        if p["design"] != d or p.get("stopped_at_s") is not None or p["counts"][j] is None:
            continue
        if d == "disaggregated" and (answer is None or any(k != a for i, (k, a) in enumerate(
                zip(p["counts"], answer)) if i != j)):
            continue
        w = worst_of(p["classes"], slos, names)
        if w is not None:
            out[p["counts"][j]] = w
    for k, classes in extra.items():
        w = worst_of(classes, slos, names)
        if w is not None:
            out[k] = w
    return dict(sorted(out.items()))


def explain_capacity(rep, sc, slos: dict, *, router: str | dict | None = None, load_scale: float = 1.0,
                     max_replicas: int = 64, workers: int | None = None, apart: bool | None = None,
                     trace: bool = True) -> dict:
    """Per design: per dimension the margin, the binding limit and the curve; the warnings (see
    the module docstring). ``rep``: a finished :class:`sim.experiments.capacity.CapacityReport`
    of scenario ``sc`` with SLOs ``slos`` (the search's own settings). ``trace=False`` skips the
    traced run of the step breakdown."""
    return Explaining(rep, sc, slos, router=router, load_scale=load_scale, max_replicas=max_replicas,
                      workers=workers, apart=apart, trace=trace).result()


class Explaining:
    """:func:`explain_capacity` begun: its points simulate on their own workers from the start
    (so that other work, such as the searches at the cost model's error bounds, can run
    meanwhile); :meth:`result` waits for them and explains."""

    def __init__(self, rep, sc, slos: dict, *, router: str | dict | None = None, load_scale: float = 1.0,
                 max_replicas: int = 64, workers: int | None = None, apart: bool | None = None,
                 trace: bool = True) -> None:
        self.rep, self.slos, self.max_replicas, self.trace = rep, slos, max_replicas, trace
        ds = self.ds = _Dims(rep, sc, slos, router, load_scale, max_replicas, apart)
        plan: list[tuple[str, int, int]] = []  # (design, dimension, count)
        for d in rep.designs:
            for j, _ in enumerate(ds.dims(d)):
                if ds.refused(d, j):  # (no count helps: nothing to measure)
                    continue
                a = ds.dim_answer(d, j)
                ks = [a - 1, 2 * a] if a is not None else [max_replicas // 2, max_replicas]
                plan += [(d, j, k) for k in ks if k >= 1]
        self.plan = list(dict.fromkeys(plan))
        self.args = [ds.args(d, j, k) for d, j, k in self.plan]
        n = max(1, min(workers or os.cpu_count() or 1, len(self.args)))
        self.pool = ProcessPoolExecutor(max_workers=n) if n > 1 else None
        self.futures = [self.pool.submit(_eval_task, a) for a in self.args] if self.pool is not None else None

    def cancel(self) -> None:
        """Give up the explanation: its points not started are dropped, and its workers are
        not waited for (a failure or an interruption elsewhere ends the command)."""
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = self.futures = None

    def result(self) -> dict:
        if self.pool is not None and self.futures is not None:
            try:
                outs = [f.result() for f in self.futures]
            finally:
                self.pool.shutdown()
        else:  # (one worker: simulated here, now)
            outs = [_eval_task(a) for a in self.args]
        rep, ds, slos, max_replicas = self.rep, self.ds, self.slos, self.max_replicas
        extra: dict[tuple[str, int], dict[int, dict]] = {}
        for (d, j, k), out in zip(self.plan, outs):
            if out[0] != "ok":
                raise RuntimeError(f"capacity explanation {d} {k} replicas failed: {out[1]}\n{out[2]}")
            extra.setdefault((d, j), {})[k] = out[1]["classes"]
        doc: dict = {"flat": FLAT, "designs": {}, "warnings": []}
        for d, a in rep.designs.items():
            ans = ds.answer(d)
            if ans:  # the answer as a whole is exact
                for j, _ in enumerate(ds.dims(d)):
                    extra.setdefault((d, j), {})[ans[j]] = a["classes"]
            parts = []
            for j, x in enumerate(ds.dims(d)):
                n = ds.dim_answer(d, j)
                if ds.refused(d, j) or n == 0:
                    parts.append(_cannot(x, n, rep.refused or {}))
                    continue
                curve = _curve(rep, d, j, x.classes, slos, extra.get((d, j), {}), ans)
                info = _judge(d, x.name, n, curve, max_replicas)
                if info["binding"] == "per-step time":
                    _deadline_binds(info, slos, extra.get((d, j), {}), d)
                if info["binding"] == "per-step time" and self.trace:
                    k = ans[j] if ans else max_replicas
                    info["steps"] = step_breakdown(ds.args(d, j, k), info["worst_more"] or info["at_answer"])
                parts.append(info)
                if info.get("warning"):
                    doc["warnings"].append(info["warning"])
            doc["designs"][d] = parts
        return doc


def _cannot(x, n: int | None, refused: dict) -> dict:
    """The explanation of a dimension no count decides: a partition with no traffic (``n``
    0), or one whose classes have requests refused at any count (``refused``)."""
    info = {"dimension": x.name, "replicas": n, "at_answer": None, "below": None, "more_replicas": None,
            "worst_more": None, "drop_when_doubled": None, "flat": False, "curve": {}}
    if n == 0:
        return {**info, "binding": "none (no traffic)"}
    from sim.experiments.capacity import refused_text

    why = "; ".join(f"{c}: {refused_text(refused[c])}" for c in x.classes if c in refused)
    return {**info, "binding": "refused requests", "refused": why}


def _deadline_binds(info: dict, slos: dict, points: dict[int, dict], design: str) -> None:
    """Where the worst ratio that more replicas barely move is a class's deadline (``done``),
    the binding limit is that deadline, not the step time: its last request's own length
    decides when it finishes. ``points``: count -> a point's classes (to name that request)."""
    w = info["worst_more"] or info["at_answer"]
    if w is None or w["metric"] != "done":
        return
    c = w["class"]
    s = slos[c]
    m = (points.get(info["more_replicas"]) or points.get(info["replicas"]) or {}).get(c) or {}
    info["binding"] = "deadline"
    # (a count above the answer probed: only then is "more replicas do not move it" measured)
    more = info["more_replicas"] if info["worst_more"] is not None and info["more_replicas"] > (
        info["replicas"] or 1) else None
    info["deadline"] = {"class": c, "done_s": s["done"], "implicit": s.get("done_from") is not None,
                        "last_arrival_s": m.get("last_arrival_s"), "last_finish_s": m.get("last_finish_s"),
                        "more_replicas": more}
    if info.get("warning"):
        where = design + (f" {info['dimension']}" if info["dimension"] != design else "")
        n = info["replicas"]
        what = f"the answer {n} rests on a knife edge" if n else f"no count meets {c}'s SLOs and more do not help"
        info["warning"] = f"capacity {where}: {what}: {deadline_text(info['deadline'])}"


def deadline_text(dl: dict) -> str:
    """What binds when a deadline does, in one line: the request that finishes last and what
    moves the deadline."""
    c = dl["class"]
    last = (f"its last request (arriving {dl['last_arrival_s']:.1f} s) finishes at {dl['last_finish_s']:.1f} s "
            if dl.get("last_arrival_s") is not None and dl.get("last_finish_s") is not None else
            "its last request finishes ")
    kind = "implicit deadline" if dl["implicit"] else "deadline"
    moves = f"--grace or --slo {c}:done=S" if dl["implicit"] else f"--slo {c}:done=S"
    if dl["more_replicas"] is None:  # (no count above the answer was probed)
        return (f"{c}'s {kind} (done <= {dl['done_s']:.1f} s) binds: {last}and no more replicas were tried "
                f"(--max-replicas), so whether more would move it is not known ({moves} moves the deadline)")
    return (f"{c}'s {kind} (done <= {dl['done_s']:.1f} s) binds: {last}even with {dl['more_replicas']} replicas, "
            f"so its own length decides, not the count or the step time ({moves} moves it)")


def answer_kinds(rep, slos: dict, class_names: list[str]) -> set[str] | None:
    """The metrics (``ttft`` / ``tpot`` / ``done``) with the worst ratio to their SLO at each
    design's answer, per searched dimension: what the explanation's ``at_answer`` says, read
    from the answers themselves (None when a design has no answer: its explanation's points
    say it)."""
    got = set()
    for d, a in rep.designs.items():
        if not a.get("split") or a.get("classes") is None:
            return None
        for x in design_dims(d, class_names, 1):
            w = worst_of(a["classes"], slos, x.classes)
            if w is not None:
                got.add(w["metric"])
    return got


def _judge(design: str, dim: str, n: int | None, curve: dict[int, dict], limit: int) -> dict:
    """Margin, binding limit and knife-edge warning of one dimension from its exact curve."""
    lo_k, hi_k = (n - 1, 2 * n) if n else (limit // 2, limit)
    at_n = curve.get(n) if n else curve.get(limit)
    below = curve.get(n - 1) if n and n > 1 else None
    ref = curve.get(lo_k) or at_n
    more = curve.get(hi_k)
    # (flat around the answer and above: what the answer's crossing of 1.0 depends on)
    ratios = [w["ratio"] for k, w in curve.items() if k >= lo_k]
    drop = (ref["ratio"] - more["ratio"]) / ref["ratio"] if ref and more and ref["ratio"] > 0 else None
    binding = None if drop is None else ("queueing" if drop >= FLAT else "per-step time")
    if n == 1 and at_n and at_n["ratio"] < 1 - 2 * FLAT:  # the fewest there are, with room: nothing binds
        binding = "none (one replica meets the SLOs with room to spare)"
    span = (max(ratios) - min(ratios)) / max(ratios) if ratios and max(ratios) > 0 else None
    flat = span is not None and span < FLAT and len(ratios) >= 2
    info = {"dimension": dim, "replicas": n, "at_answer": at_n, "below": below,
            "more_replicas": hi_k, "worst_more": more, "drop_when_doubled": drop, "binding": binding,
            "flat": flat, "curve": {str(k): w for k, w in curve.items()}}
    if flat and (n is None or max(ratios) >= 1 - FLAT):
        from sim.engines import priosim_only

        knobs = ", ".join(k + (" (priosim-only)" if priosim_only(k) else "") for k in STEP_KNOBS)
        where = f"{design}" + (f" {dim}" if dim != design else "")
        ks = sorted(k for k in curve if k >= lo_k)
        who = f"{at_n['class']}'s SLOs" if at_n else "the SLOs"  # (the class that fails, not the partition's)
        what = (f"the answer {n} rests on a knife edge" if n else f"no count meets {who} and more do not help")
        info["warning"] = (f"capacity {where}: the worst p99/SLO stays within {min(ratios):.3f}..{max(ratios):.3f} "
                           f"from {ks[0]} to {ks[-1]} replicas, so {what}: the limit is the per-step time, which "
                           f"{knobs} move (priosim sensitivity)")
    return info


# ---- the step breakdown --------------------------------------------------------------------------
def step_breakdown(args: tuple, worst: dict | None) -> dict:
    """One more run of the point ``args`` (:func:`_eval_task`'s arguments) with the iteration
    trace: steps with prefill tokens against decode-only ones, and what the binding class
    (``worst``) sees. ``{"skipped": why}`` when the trace would be too large."""
    from sim.cluster import simulate_cluster
    from sim.config import with_cluster

    base, cluster, load_scale, _slos, _dims, *part = args
    sc = with_cluster(base, cluster)
    wl = _workload(sc, load_scale)
    if part and wl is not None:
        wl = _only(wl, part[0])
    rows = int(wl.open["output_tokens"].sum()) if wl is not None else None
    if rows is None or rows > TRACE_ROWS_MAX:
        return {"skipped": f"the iteration trace would hold {'an unknown number of' if rows is None else rows} "
                           f"rows (more than {TRACE_ROWS_MAX}); priosim run --trace-iterations at this count "
                           f"gives it"}
    res = simulate_cluster(sc, load_scale=load_scale, per_replica=True, trace_iterations=True, workload=wl)
    if res.iterations is None or not len(res.iterations):
        return {"skipped": "the run had no steps"}
    cls = worst["class"] if worst else None
    return summarise_steps(res.iterations, res.requests, cls)


def summarise_steps(it: pd.DataFrame, requests: pd.DataFrame, cls: str | None) -> dict:
    """The step facts of an iteration trace (times in ms). ``prefill_time_share``: the time of
    steps with prefill beyond a mean decode-only step, over all step time (an estimate of the
    share the prefill tokens take)."""
    step = it["replica"].to_numpy(np.int64) * (int(it["iteration"].max()) + 1) + it["iteration"].to_numpy(np.int64)
    pf_rows = it["kind"].isin(["prefill", "recompute"]).to_numpy()
    codes, uniq = pd.factorize(step, sort=True)
    n = len(uniq)
    dur = np.zeros(n)
    dur[codes] = (it["end_s"] - it["start_s"]).to_numpy()  # (every row of a step has its times)
    pf_tok = np.bincount(codes, weights=np.where(pf_rows, it["tokens"].to_numpy(), 0), minlength=n)
    has_pf = pf_tok > 0
    dec = dur[~has_pf]
    mean_dec = float(dec.mean()) if len(dec) else 0.0
    total = float(dur.sum())
    out = {"steps": n, "steps_with_prefill": int(has_pf.sum()),
           "mean_step_ms_with_prefill": float(dur[has_pf].mean() * 1e3) if has_pf.any() else None,
           "mean_step_ms_decode_only": mean_dec * 1e3 if len(dec) else None,
           "mean_prefill_tokens_per_prefill_step": float(pf_tok[has_pf].mean()) if has_pf.any() else None,
           "prefill_time_share": float(np.clip(dur[has_pf] - mean_dec, 0, None).sum() / total) if total else 0.0,
           "class": cls}
    if cls is not None:
        mine = it["request_id"].isin(requests.loc[requests["class"] == cls, "request_id"]).to_numpy()
        d_rows = mine & (it["kind"] == "decode").to_numpy()
        if d_rows.any():
            out["class_decode_tokens_in_prefill_steps"] = float(has_pf[codes[d_rows]].mean())
            out["class_mean_decode_step_ms"] = float(dur[codes[d_rows]].mean() * 1e3)
        p_rows = mine & pf_rows
        if p_rows.any():
            per_req = pd.Series(it["request_id"].to_numpy()[p_rows]).value_counts()
            out["class_prefill_steps_per_request"] = float(per_req.mean())
            out["class_mean_prefill_step_ms"] = float(dur[codes[p_rows]].mean() * 1e3)
    return out


# ---- text ----------------------------------------------------------------------------------------
def component_text(info: dict) -> str | None:
    """The binding step-time component in one line, or None (no breakdown)."""
    st = info.get("steps")
    w = info.get("worst_more") or info.get("at_answer")
    if not st or w is None:
        return None
    if "skipped" in st:
        return f"step breakdown skipped: {st['skipped']}"
    cls = w["class"]
    pf, dec = st.get("mean_step_ms_with_prefill"), st.get("mean_step_ms_decode_only")
    both = (f"steps with prefill {pf:.1f} ms ({st['mean_prefill_tokens_per_prefill_step']:.0f} prefill tokens) "
            f"against {dec:.1f} ms decode-only" if pf is not None and dec is not None else "")
    share = f"prefill tokens take ~{st['prefill_time_share']:.0%} of step time"
    if w["metric"] == "ttft" and "class_prefill_steps_per_request" in st:
        return (f"{cls} ttft: prompts prefilled over {st['class_prefill_steps_per_request']:.1f} steps of "
                f"{st['class_mean_prefill_step_ms']:.1f} ms on average; {both}; {share}")
    if "class_mean_decode_step_ms" in st:
        return (f"{cls} {w['metric']}: decode steps stretched by co-scheduled prefill tokens: "
                f"{st['class_decode_tokens_in_prefill_steps']:.0%} of its tokens come in steps with prefill; "
                f"its decode steps average {st['class_mean_decode_step_ms']:.1f} ms; {both}; {share}")
    return f"{both}; {share}" if both else share


def explain_lines(doc: dict) -> list[str]:
    """The explanation as the lines ``priosim capacity`` prints (warnings apart)."""
    lines = []
    for d, parts in doc["designs"].items():
        for info in parts:
            where = d if info["dimension"] == d else f"{d} {info['dimension']}"
            if info["binding"] == "none (no traffic)":
                lines.append(f"why {where}: the class has no traffic (no request in the stream): no partition")
                continue
            if info["binding"] == "refused requests":
                lines.append(f"why {where}: no count helps: {info['refused']}")
                continue
            n = info["replicas"]
            at = (f"at {n}: {metric_text(info['at_answer'])}" if n else
                  f"no answer; at the limit: {metric_text(info['at_answer'])}")
            below = f", at {n - 1}: {metric_text(info['below'])}" if n and n > 1 else ""
            drop = info["drop_when_doubled"]
            bind = info["binding"] or "unknown"
            more = (f" (at {info['more_replicas']}: {info['worst_more']['ratio']:.3f}, "
                    f"{abs(drop):.0%} {'lower' if drop >= 0 else 'higher'})"
                    if info["worst_more"] and drop is not None else "")
            lines.append(f"why {where}: worst p99/SLO {at}{below}; binding limit: {bind}{more}")
            comp = component_text(info) if info["binding"] == "per-step time" else None
            if comp:
                lines.append(f"  per-step time: {comp}")
            if info["binding"] == "deadline":
                lines.append(f"  deadline: {deadline_text(info['deadline'])}")
    return lines
