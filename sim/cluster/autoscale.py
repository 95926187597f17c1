"""The fleet of a cluster run: which replicas serve, when each was provisioned and removed, and
the autoscaler that resizes each group (docs/autoscaling.md).

Every group has ``max`` replica slots, built before the run (an engine and a SimPy process each,
as for a fixed cluster; a slot that is off sleeps and costs nothing). A slot is OFF,
PROVISIONING (paid for, loading the model: serves ``provision_s`` after the decision), SERVING
(a candidate of the router) or DRAINING (no new requests; it leaves, and stops being paid for,
when it has nothing left: its process goes idle). Only SERVING replicas are candidates, so the
router's choice and everything the replicas do stay as for a fixed cluster of those replicas.

Each autoscaled group ticks every ``interval_s`` from t = interval_s (a replica's run stops at a
tick as at an arrival, so what the policy reads is what stepping one iteration at a time
would show, and fast-forward stays exact): its policy
(:mod:`sim.autoscalers`) reads an :class:`~sim.autoscalers.Observation` of the group at the tick
(the engines as their last applied step left them) and returns the count it wants; the
controller clamps it to [min, max] and acts: to grow, it first takes back draining replicas
(lowest index first; they still hold the model) and then provisions off slots (lowest index
first); to shrink, it first cancels provisioning replicas (the last provisioned first), then
drains serving ones (the fewest outstanding requests first, ties to the highest index).
Decisions depend only on the state at the tick, so a run repeats exactly (same seed, same bytes),
and they could be taken at a distributed run's window boundaries as they are.

A group without an autoscaler has its replicas SERVING from 0 to the end of the run.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from sim.autoscalers import Ended, Observation, ReplicaState, make_autoscaler
from sim.core.costs import NEVER, NS
from sim.core.simpy_adapter import trigger
from sim.core.request import State

OFF, PROVISIONING, SERVING, DRAINING = "off", "provisioning", "serving", "draining"


@dataclass
class Life:
    """One stretch a slot was paid for: from its provisioning start to its removal (ns; None
    while it lasts), and when it began serving (None if it never did)."""

    replica: int
    group: str
    start_ns: int
    serve_ns: int | None
    end_ns: int | None = None


class _Group:
    """One group's slots and, when autoscaled, its policy and the requests that ended in it."""

    def __init__(self, spec_group, replicas: list) -> None:
        self.name = spec_group.name
        self.cfg = spec_group.autoscale
        self.replicas = replicas
        self.policy = make_autoscaler(self.cfg.policy_name, **self.cfg.policy_params) if self.cfg else None
        self.look_back_ns = int(round(getattr(self.policy, "look_back_s", 0.0) * NS)) if self.policy else 0
        self.ended: deque[Ended] = deque()
        self.decisions = 0
        self.tick_ns = NEVER  # the next tick (NEVER: not autoscaled)


class Fleet:
    """The slots' states and lifetimes, and the autoscalers' ticks, of one cluster run.

    ``cl`` is the :class:`~sim.cluster.replicas._Cluster` (its replicas built, group by group,
    each group's slots contiguous); ``base`` each class index's candidate replicas when every
    slot serves. Call :meth:`start` before the clock runs and :meth:`close` at its end."""

    def __init__(self, cl, spec, base: list[list]) -> None:
        self.cl = cl
        self.env = cl.env
        self.base = base
        self.groups: list[_Group] = []
        self.state: list[str] = [OFF] * len(cl.replicas)
        self.life: list[Life | None] = [None] * len(cl.replicas)
        self.lives: list[Life] = []
        self.timeline: list[tuple[int, str, int, int, int]] = []
        self._gen = [0] * len(cl.replicas)  # bumped when a slot's provisioning is cancelled
        self.stopped = False
        self._pending: list = []  # the ticks' and provisionings' events not yet processed
        self.autoscaled = any(g.autoscale is not None for g in spec.groups)
        for g in spec.groups:
            reps = [r for r in cl.replicas if r.group == g.name]
            grp = _Group(g, reps)
            self.groups.append(grp)
            for r in reps[:g.replicas]:
                self.state[r.index] = SERVING
                self._begin(r.index, grp.name, 0, 0)
            if self.autoscaled:  # (a fixed cluster runs as it always has)
                for r in reps:
                    r.on_idle = self._on_idle
                    if grp.look_back_ns:
                        r.engine.on_request_end = self._recorder(grp, r.engine.on_request_end)
            self._record(grp)
        if self.autoscaled:
            self._candidates()

    # -- the run --
    def start(self) -> None:
        """Schedule each autoscaled group's first tick (its interval from now)."""
        for grp in self.groups:
            if grp.cfg is not None:
                self._next_tick(grp)

    def _next_tick(self, grp: _Group) -> None:
        """Schedule the group's next tick, and tell the replicas when the first of the groups' is
        (their runs stop there, as at an arrival)."""
        delay = round(grp.cfg.interval_s * NS)
        grp.tick_ns = int(self.env.now) + delay
        self._at(delay, lambda _e, g=grp: self._tick(g))
        self.cl.tick_ns = min(g.tick_ns for g in self.groups)

    def close(self, end_ns: int) -> None:
        """The run ended at ``end_ns``: every slot still paid for stops then."""
        self.stopped = True
        self.cl.tick_ns = NEVER
        for lf in self.lives:
            if lf.end_ns is None:
                lf.end_ns = end_ns

    def stop(self) -> None:
        """Every replica has exited: no more ticks or provisioning (their pending events are
        left without callbacks, so the clock's end is the last replica's)."""
        self.stopped = True
        self.cl.tick_ns = NEVER
        for ev in self._pending:
            ev.callbacks.clear()
        self._pending.clear()

    def _at(self, delay_ns: int, fn) -> None:
        ev = self.env.event()
        ev.callbacks.append(fn)
        ev.callbacks.append(self._done)
        self._pending.append(ev)
        trigger(ev, delay_ns)

    def _done(self, ev) -> None:
        self._pending.remove(ev)

    # -- observing --
    def _recorder(self, grp: _Group, prior):
        def on_end(req, now_ns: int) -> None:
            if req.state == State.FINISHED and req.first_token_ns >= 0:
                n = req.generated
                tpot = (req.finish_ns - req.first_token_ns) / (n - 1) / NS if n > 1 else math.nan
                grp.ended.append(Ended(now_ns / NS, req.cls, (req.first_token_ns - req.arrival_ns) / NS, tpot))
            if prior is not None:
                prior(req, now_ns)
        return on_end

    def observe(self, grp: _Group, now_ns: int) -> Observation:
        """The group at ``now_ns`` as its policy sees it."""
        serving = []
        for r in grp.replicas:
            if self.state[r.index] == SERVING:
                e = r.engine
                p = e.pool
                serving.append(ReplicaState(len(e.queues.running), len(e.queues.waiting) + len(r.inbox),
                                            e.limits.max_num_seqs, (p.total - p.free) / p.total))
        since = now_ns - grp.look_back_ns
        while grp.ended and grp.ended[0].end_s * NS <= since:
            grp.ended.popleft()
        states = [self.state[r.index] for r in grp.replicas]
        return Observation(now_ns / NS, tuple(serving), states.count(PROVISIONING), states.count(DRAINING),
                           tuple(grp.ended))

    # -- deciding and acting --
    def _tick(self, grp: _Group) -> None:
        if self.stopped:
            return
        now = int(self.env.now)
        cfg, policy = grp.cfg, grp.policy
        assert cfg is not None and policy is not None  # (only autoscaled groups tick)
        obs = self.observe(grp, now)
        want = min(max(int(policy.desired(obs)), cfg.min), cfg.max)
        self.resize(grp, want, now)
        self._next_tick(grp)

    def resize(self, grp: _Group, want: int, now: int) -> None:
        """Bring the group's serving + provisioning count to ``want`` (see the module's rules)."""
        st = self.state
        reps = grp.replicas
        cur = sum(st[r.index] in (SERVING, PROVISIONING) for r in reps)
        if want == cur:
            return
        grp.decisions += 1
        if want > cur:
            n = want - cur
            for r in reps:  # take back draining replicas, lowest index first
                if n and st[r.index] == DRAINING:
                    st[r.index] = SERVING
                    n -= 1
            for r in reps:
                if n and st[r.index] == OFF:
                    self._provision(grp, r, now)
                    n -= 1
        else:
            n = cur - want
            prov = sorted((r for r in reps if st[r.index] == PROVISIONING),
                          key=lambda r: (self.life[r.index].start_ns, r.index), reverse=True)
            for r in prov[:n]:
                st[r.index] = OFF
                self._gen[r.index] += 1
                self._end(r.index, now)
                n -= 1
            serving = sorted((r for r in reps if st[r.index] == SERVING),
                             key=lambda r: (len(r.engine.queues.running) + len(r.engine.queues.waiting)
                                            + len(r.inbox), -r.index))
            for r in serving[:n]:
                st[r.index] = DRAINING
                e = r.engine
                if not (e.queues.running or e.queues.waiting or r.inbox):
                    self._retire(r.index, now)  # (idle: it sleeps, and has nothing to finish)
        self._candidates()
        self._record(grp)

    def _provision(self, grp: _Group, r, now: int) -> None:
        self.state[r.index] = PROVISIONING
        self._begin(r.index, grp.name, now, None)
        gen = self._gen[r.index]
        self._at(round(grp.cfg.provision_s * NS), lambda _e, r=r, g=grp, gen=gen: self._serve(g, r, gen))

    def _serve(self, grp: _Group, r, gen: int) -> None:
        if self.stopped or self._gen[r.index] != gen or self.state[r.index] != PROVISIONING:
            return  # (cancelled meanwhile)
        self.state[r.index] = SERVING
        lf = self.life[r.index]
        assert lf is not None
        lf.serve_ns = int(self.env.now)
        self._candidates()
        self._record(grp)

    def _on_idle(self, r) -> None:
        """Replica ``r``'s process has nothing to do: a draining replica leaves now."""
        if self.state[r.index] == DRAINING and not r.inbox:
            self._retire(r.index, int(self.env.now))
            self._candidates()
            self._record(next(g for g in self.groups if g.name == r.group))

    def _retire(self, i: int, now: int) -> None:
        self.state[i] = OFF
        self._end(i, now)

    def _begin(self, i: int, group: str, start_ns: int, serve_ns: int | None) -> None:
        lf = Life(i, group, start_ns, serve_ns)
        self.life[i] = lf
        self.lives.append(lf)

    def _end(self, i: int, now: int) -> None:
        lf = self.life[i]
        if lf is not None and lf.end_ns is None:
            lf.end_ns = now
        self.life[i] = None

    def _candidates(self) -> None:
        """Each class's candidates: its replicas that serve (index order)."""
        cl = self.cl
        st = self.state
        cl.candidates = [[r for r in c if st[r.index] == SERVING] for c in self.base]
        cl.allowed = [{r.index for r in c} for c in cl.candidates]
        if self.autoscaled:
            cl.by_counts = [False] * len(cl.candidates)  # (the counts list is every slot's)

    def _record(self, grp: _Group) -> None:
        states = [self.state[r.index] for r in grp.replicas]
        row = (int(self.env.now), grp.name, states.count(SERVING), states.count(PROVISIONING),
               states.count(DRAINING))
        if self.timeline and self.timeline[-1][:2] == row[:2]:
            self.timeline[-1] = row  # (several changes at one instant: the last)
        else:
            self.timeline.append(row)

    # -- the results --
    def counts_at(self, times_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The replicas serving, and paid for (serving + provisioning + draining), at each of
        ``times_s`` (after the changes at that instant), summed over the groups."""
        serving = np.zeros(len(times_s), dtype=np.int64)
        paid = np.zeros(len(times_s), dtype=np.int64)
        for grp in self.groups:
            rows = [r for r in self.timeline if r[1] == grp.name]
            at = np.asarray([r[0] / NS for r in rows])
            k = np.searchsorted(at, times_s, side="right") - 1  # (the first row is at 0)
            serving += np.asarray([r[2] for r in rows])[k]
            paid += np.asarray([r[2] + r[3] + r[4] for r in rows])[k]
        return serving, paid

    def report(self) -> dict:
        """Replica counts over time (one row at each change, per group), each group's decisions
        (changes of its count), and every paid stretch of a replica (s; ``serve_s`` None if it
        never served)."""
        return {
            "replicas_over_time": [{"t_s": t / NS, "group": g, "serving": s, "provisioning": p, "draining": d}
                                   for t, g, s, p, d in self.timeline],
            "decisions": {g.name: g.decisions for g in self.groups if g.cfg is not None},
            "lives": [{"replica": lf.replica, "group": lf.group, "start_s": lf.start_ns / NS,
                       "serve_s": lf.serve_ns / NS if lf.serve_ns is not None else None,
                       "end_s": lf.end_ns / NS if lf.end_ns is not None else None} for lf in self.lives],
        }
