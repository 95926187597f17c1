"""What the engine exposes for checking and debugging: KV conservation, the progress guarantee,
and the iteration trace.

Progress guarantee: every PROGRESS_EVERY engine events the loop asks whether any token was
emitted or any request ended since the last progress; with none over a stretch of at least
STALL_MIN events (and twice the tokens all live requests hold, the most a progressing schedule
could spend re-prefilling them), the run stops with a StallError.

A cluster has a second guard, on its clock (:class:`ClockGuard`): replicas whose processes wake
each other without any of them taking an engine event would move the clock by a few ns a wake,
forever, where the engine's guard never runs.
"""
from __future__ import annotations

from typing import Callable, Final

import numpy as np

from sim.core.cohort import NOT_MEMBER
from sim.core.costs import NS
from sim.core.errors import StallError
from sim.core.parts import EngineParts as Engine
from sim.core.plan import StepPlan, least_urgent, rank

PROGRESS_EVERY: Final = 8192
STALL_MIN = 65536
#: a cluster's clock must move at least this far (ns) over ClockGuard.every SimPy events in which
#: nothing progressed
CLOCK_SPAN_NS = NS


def check_invariants(eng: Engine) -> None:
    """KV conservation at this instant: pool counts match what requests hold."""
    q = eng.queues
    if eng.cohort is not None:
        eng.cohort.sync_all()
    pool = eng.pool
    pool.check()
    used = [0] * len(q.class_priority)
    refs: dict[int, int] = {}
    for r in q.running.values():
        used[r.cls_idx] += r.blocks
        for h in r.shared:
            refs[h] = refs.get(h, 0) + 1
        if eng.grows_blocks and r.blocks + r.base_blocks < pool.blocks_for(r.computed):
            raise AssertionError(f"request {r.request_id} holds {r.blocks} blocks for {r.computed} tokens")
    for r in eng.held.values():  # (disaggregated: KV being sent, or arriving)
        used[r.cls_idx] += r.blocks
        for h in r.shared:
            refs[h] = refs.get(h, 0) + 1
    host = 0
    for _, _, r in q.waiting:
        if r.blocks:
            raise AssertionError(f"waiting request {r.request_id} holds {r.blocks} device blocks")
        host += r.host_blocks
    cache = pool.cache
    if cache is not None:
        live = {h: c for h, c in cache.refs.items() if c}
        if live != refs or any(c < 0 for c in cache.refs.values()):
            raise AssertionError(f"prefix reference counts {live} != holders {refs}")
        if set(cache.lru) != {h for h, c in cache.refs.items() if c == 0}:
            raise AssertionError("prefix LRU list out of step with reference counts")
    if used != pool.used or host != pool.host_used:
        raise AssertionError(f"KV not conserved: requests hold {used} (host {host}), pool says "
                             f"{pool.used} (host {pool.host_used})")
    check_counts(eng)


def check_counts(eng: Engine) -> None:
    """What the engine keeps as requests come and go equals a recount: requests per class
    waiting and running, the running request ranked last, the least urgent running priority,
    and the cohort's member ranked last, members per class and per block residue and least
    urgent priority."""
    q = eng.queues
    waiting = [0] * len(q.class_priority)
    running = [0] * len(q.class_priority)
    for _, _, r in q.waiting:
        waiting[r.cls_idx] += 1
    for r in q.running.values():
        running[r.cls_idx] += 1
    if waiting != q.waiting_count or running != q.running_count:
        raise AssertionError(f"requests per class: waiting {q.waiting_count}, running {q.running_count} "
                             f"kept, {waiting} and {running} counted")
    order = q.rank_order
    if order is not None and order != sorted((r for r in q.running.values() if r.cohort_base_step == NOT_MEMBER),
                                             key=q.walk_key):
        raise AssertionError("the walk order of the running requests outside the cohort is out of date")
    last = q.last_ranked
    if last:  # (kept while not empty: ascending, running, and every other running request below)
        ids = {r.request_id for r in last}
        below = [rank(r) for r in q.running.values() if r.request_id not in ids]
        if (any(rank(a) >= rank(b) for a, b in zip(last, last[1:])) or len(ids) != len(last)
                or len(below) != len(q.running) - len(last) or (below and max(below) >= rank(last[0]))):
            raise AssertionError("the least urgent running requests kept are out of date")
    if q.running:
        if q.lowest_running() is not max(q.running.values(), key=rank):
            raise AssertionError("the running request ranked last is out of date")
        if q.top_running_priority() != max(r.priority for r in q.running.values()):
            raise AssertionError("the least urgent running priority is out of date")
    coh = eng.cohort
    if coh is not None and coh.members and coh.last_member() is not max(coh.members.values(), key=rank):
        raise AssertionError("the cohort member ranked last is out of date")
    if coh is not None:
        n_cls = [0] * len(q.class_priority)
        residues = [[0] * coh.bs for _ in q.class_priority]
        for m in coh.members.values():
            n_cls[m.cls_idx] += 1
            if coh.grows:
                residues[m.cls_idx][(m.cohort_base_step - m.computed) % coh.bs] += 1
        by_residue = [[res[h] for res in residues] for h in range(coh.bs)]
        if n_cls != coh.n_cls or residues != coh.residues or by_residue != coh.by_residue:
            raise AssertionError(f"cohort members per class {coh.n_cls} (and per residue) kept, {n_cls} counted")
        if coh.least_urgent() != least_urgent(q.class_priority, n_cls):
            raise AssertionError("the cohort's least urgent priority is out of date")


class ProgressGuard:
    """The progress guarantee of one engine (see the module docstring)."""

    def __init__(self) -> None:
        self.last: tuple | None = None  # (mark, events, preemptions, t) at the last progress

    @staticmethod
    def mark(eng: Engine) -> tuple:
        """What only grows when the run progresses: requests ended, tokens emitted by explicit
        steps, cohort steps (each emits a token per member)."""
        tel = eng.tel
        coh = len(eng.cohort.log_durs) if eng.cohort is not None else 0
        return (tel.rows_recorded(), sum(tel.tokens_bin.values()), coh)

    def check(self, eng: Engine, now_ns: int) -> None:
        """Raise StallError when no token was emitted and no request ended over a long stretch
        of events while work exists. Runs that progress are not touched (this reads counters,
        changes nothing)."""
        mark = self.mark(eng)
        last = self.last
        preempts = sum(eng.tel.preempt_by_mode.values())
        if last is None or mark != last[0]:
            self.last = (mark, eng.events, preempts, now_ns)
            return
        _, since, preempts0, t0 = last
        q = eng.queues
        live = q.waiting_requests() + list(q.running.values())
        held = sum(r.prompt_tokens + r.generated + 1 for r in live)
        if eng.events - since < max(STALL_MIN, 2 * held):
            return
        if preempts > preempts0:
            cause = ("requests are preempted again and again before they emit a token, and preemption "
                     "discards their progress (thrash)")
        else:
            cause = "no step emits a token"
        raise StallError(f"engine.stalled: no token emitted and no request ended in {eng.events - since} engine "
                         f"events from t={t0 / NS:.3f}s to t={now_ns / NS:.3f}s: {cause}; "
                         f"{describe_live(eng)}")


class ClockGuard:
    """The progress guarantee of a cluster's clock (:func:`sim.core.simpy_adapter.run_all` calls
    :meth:`check` every ``every`` events). ``progress()``
    returns a count that grows whenever the run progresses (the replicas' engine events plus the
    requests made); ``describe()`` says, in one phrase, what the replicas hold. Over ``every``
    events with no progress the clock must have moved at least CLOCK_SPAN_NS: periodic events
    over a quiet stretch do, while replicas that wake each other at bounds a few ns apart (each
    bound moved on by the other's) would creep on forever; those stop with a StallError naming
    the stretch."""

    def __init__(self, progress: Callable[[], int], describe: Callable[[], str], every: int) -> None:
        self.progress = progress
        self.describe = describe
        self.every = every
        self.count = -1  # progress() at the last check that saw progress
        self.since_ns = 0  # the clock then

    def check(self, now_ns: int) -> None:
        count = self.progress()
        if count != self.count or now_ns - self.since_ns >= CLOCK_SPAN_NS:
            self.count, self.since_ns = count, now_ns
            return
        raise StallError(f"cluster.stalled: the clock crept from t={self.since_ns / NS:.9f}s to t={now_ns / NS:.9f}s "
                         f"over {self.every} events with no engine event taken and no request made (replicas waking each "
                         f"other at bounds nanoseconds apart, none able to step); {self.describe()}")


def describe_live(eng: Engine, n: int = 3) -> str:
    """The live requests most involved in a stall, most preempted first, in one phrase."""
    q = eng.queues
    live = sorted(q.waiting_requests() + list(q.running.values()),
                  key=lambda r: (-r.preemptions, r.request_id))
    parts = [f"request {r.request_id} (class {r.cls}, prompt {r.prompt_tokens}, max_tokens {r.max_tokens}, "
             f"{r.generated} generated, preempted {r.preemptions} times, {r.recomputed_tokens} tokens "
             f"recomputed)" for r in live[:n]]
    more = f" and {len(live) - n} more" if len(live) > n else ""
    return f"{len(live)} live: " + "; ".join(parts) + more


def trace_rows(plan: StepPlan, first_iteration: int, start_ns: int, durations: list[int]) -> list[tuple]:
    """The iteration trace of a run: one row per request per iteration (fast-forwarded runs
    expanded): (iteration, start ns, end ns, request id, kind, tokens or blocks)."""
    ends = start_ns + np.cumsum(np.array(durations, dtype=np.int64))
    starts = ends - durations
    base = first_iteration
    t0, t1 = int(starts[0]), int(ends[0])
    rows: list[tuple] = []
    for r, blocks in plan.swapped_out:
        rows.append((base, t0, t1, r.request_id, "swap_out", blocks))
    for r, blocks in plan.swapped_in:
        rows.append((base, t0, t1, r.request_id, "swap_in", blocks))
    for s, kind in zip(plan.items, plan.kinds):
        rows.append((base, t0, t1, s.req.request_id, kind, s.tokens))
    # the run's later steps decode every running request, taken in rank order, each up to its
    # last token (called after the run was applied: ``last_token_ns`` is that token's end)
    later = sorted((s.req for s in plan.items), key=rank)
    for i in range(1, len(durations)):
        for r in later:
            if ends[i] <= r.last_token_ns:
                rows.append((base + i, int(starts[i]), int(ends[i]), r.request_id, "decode", 1))
    return rows
