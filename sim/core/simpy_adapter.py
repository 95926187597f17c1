"""The one module that reaches into SimPy's private internals, and what of them it relies on.

Everything else in priosim uses SimPy's public API (``env.now``, ``env.timeout``, ``env.event``,
``env.process``, ``env.run``, ``Event.callbacks.append``, ``Event.triggered``). A cluster
(:mod:`sim.cluster.replicas`) needs a little more: it holds a replica's run past arrivals routed
elsewhere and routes arrivals ahead of the clock, and to keep that to one SimPy event per run
(where the public API would take two or three) it

* triggers an event to succeed ``delay`` ns from now in one heap entry (:func:`trigger`, where a
  ``Timeout`` whose callback calls ``succeed`` is two events), with SimPy's ``URGENT`` priority
  for the router (:func:`trigger_urgent`: it routes an instant's arrivals before any replica
  ends a step then);
* re-arms an event that was processed, to use it again (:func:`rearm`: cheaper than a new one;
  :func:`armed`, a spare one or a new one; :func:`after`, a waiter's own event as a timeout);
* moves an event's waiters to a new event when a run ends earlier than scheduled
  (:func:`hand_over`); the old event stays in the queue with no callback, a *dead* event;
* looks at the head of the event queue, dropping dead events there (:func:`next_event_ns`), and
  removes every dead event once every replica has exited (:func:`drop_dead_events`: processing
  one would only move the clock, and the run's end is the clock's).

And since a cluster's run is a few SimPy events a request, it runs the queue in a compiled loop
(:func:`run_all`, what ``env.run()`` does) and reads the clock without the property's call
(:func:`clock_ns`).

What it relies on (SimPy 4.1's ``simpy/core.py`` and ``simpy/events.py``; each point is pinned by
``tests/test_simpy_adapter.py``, and pyproject.toml bounds simpy to the releases it passed on):

1. ``Environment._queue`` is a ``heapq`` list of ``(time, priority, eid, event)`` tuples, with
   ``eid`` unique and increasing, so the order is total; ``Environment.step`` pops its head,
   sets the clock (``_now``) to its time and processes it; removing entries and re-heapifying
   keeps the order of the rest.
2. ``Environment.schedule(event, priority, delay)`` pushes ``(now + delay, priority, eid,
   event)``, ``eid`` from the iterator ``Environment._eid``; ``URGENT`` (0) sorts before
   ``NORMAL`` (1) at one instant.
3. An event succeeds when processed with ``_ok = True`` (its value ``_value``); that is what
   ``Event.succeed`` and ``Timeout.__init__`` set before scheduling. A new or re-armed event has
   ``_value is PENDING`` (``Event.triggered`` is False).
4. ``step`` reads an event's ``callbacks`` list when it processes it, not when it is scheduled
   (so callbacks moved to another event before then go with it), calls each with the event, and
   sets ``callbacks`` to None. A process waiting on an event is one such callback.
5. A processed event that succeeded and has no callback does nothing when processed but move
   the clock (only a failed one, ``_ok`` False, raises in ``step``).
6. ``Environment._now`` is the clock, what ``Environment.now`` returns (:func:`clock_ns` reads it
   without the property's call: a disaggregated cluster reads the clock a dozen times a request).

Compiled with the engine (``sim.native.MODULES``): these run at every held run's end.
"""
from __future__ import annotations

from heapq import heapify, heappop, heappush

import simpy
from simpy.core import Infinity
from simpy.events import NORMAL, PENDING, URGENT, EventPriority

from sim.core.observe import ClockGuard


def clock_ns(env: simpy.Environment) -> int:
    """``env.now``, ns (point 6): an int in every priosim run (each delay is an int of ns)."""
    return int(env._now)


def trigger(ev: simpy.Event, delay: int, priority: EventPriority = NORMAL) -> None:
    """Schedule ``ev`` to succeed ``delay`` ns from now, with value None (one SimPy event).

    Sets what ``Event.succeed`` sets, as SimPy's own ``Timeout.__init__`` does (point 3), and
    schedules with the delay that ``succeed`` lacks (point 2)."""
    ev._ok = True
    ev._value = None
    env = ev.env  # (what Environment.schedule does, point 2, without its Python call)
    heappush(env._queue, (env._now + delay, priority, next(env._eid), ev))


def trigger_urgent(ev: simpy.Event, delay: int = 0) -> None:
    """:func:`trigger` with SimPy's URGENT priority: ``ev`` is processed before the ordinary
    events of its instant (point 2)."""
    trigger(ev, delay, URGENT)


def call_at(env: simpy.Environment, t_ns: int, callback) -> None:
    """Call ``callback(event)`` at instant ``t_ns`` (now, if that has passed): one SimPy timeout."""
    env.timeout(max(t_ns - env.now, 0)).callbacks.append(callback)


def rearm(ev: simpy.Event, callbacks: list) -> None:
    """Make ``ev``, processed (it left the queue; ``callbacks`` is None), an untriggered event
    again with ``callbacks`` (points 3 and 4)."""
    ev.callbacks = callbacks
    ev._value = PENDING


def armed(env: simpy.Environment, spare: simpy.Event | None, callbacks: list) -> simpy.Event:
    """An untriggered event of ``env`` with ``callbacks``: ``spare``, an event of the caller's
    that has been processed, armed again (:func:`rearm`), or a new one for None."""
    if spare is None:
        ev = simpy.Event(env)
        ev.callbacks = callbacks
        return ev
    rearm(spare, callbacks)
    return spare


def after(env: simpy.Environment, ev: simpy.Event | None, delay: int) -> simpy.Event:
    """An event that succeeds ``delay`` ns from now, as ``env.timeout(delay)`` (one queue entry,
    point 3): ``ev`` armed again (point 4), or a new one for None. ``ev`` must have been
    processed: the caller's own, which a process waiting on one event at a time has resumed
    from (or else waited on and resumed past) before it asks again."""
    ev = armed(env, ev, [])
    trigger(ev, delay)
    return ev


def hand_over(old: simpy.Event) -> simpy.Event:
    """A new event of ``old``'s environment taking over ``old``'s callbacks (its waiter); ``old``
    keeps none. If ``old`` is scheduled, it stays in the queue as a dead event (points 4, 5)."""
    ev = simpy.Event(old.env)
    ev.callbacks, old.callbacks = old.callbacks, []
    return ev


def next_event_ns(env: simpy.Environment) -> float:
    """When the next live event in ``env``'s queue happens (inf if none), first dropping the dead
    events at its head: those that succeed with no callback (points 1 and 5). The caller must
    know that no callback can be added to a dead event before its instant (in a cluster: every
    event is waited on, if at all, as soon as it is made)."""
    q = env._queue  # (SimPy's event heap: (time, priority, id, event))
    while q:
        ev = q[0][3]
        if ev.callbacks or not ev._ok:  # (live: a waiter, or a failure to raise)
            return q[0][0]
        heappop(q)
    return Infinity


def drop_dead_events(env: simpy.Environment) -> None:
    """Remove every dead event (one that succeeds with no callback) from ``env``'s queue (points 1
    and 5): the live ones keep their
    order, and the clock's last move is the last live event's."""
    q = env._queue
    live = [e for e in q if e[3].callbacks or not e[3]._ok]
    if len(live) < len(q):
        q[:] = live
        heapify(q)


def run_all(env: simpy.Environment, guard: ClockGuard | None = None) -> None:
    """``env.run()``: process the events in ``env``'s queue in their order until none is left,
    each as ``Environment.step`` does (points 1 and 4: a failed event that nobody defused
    raises, as there), in a compiled loop where SimPy's is interpreted. ``guard``, when given,
    checks the clock every ``guard.every`` events (:class:`sim.core.observe.ClockGuard`)."""
    q = env._queue
    left = guard.every if guard is not None else -1  # (events to the next check; never without a guard)
    while q:
        t, _, _, ev = heappop(q)
        env._now = t
        callbacks = ev.callbacks
        ev.callbacks = None  # type: ignore[assignment]  # (processed, as SimPy marks it)
        for callback in callbacks:
            callback(ev)
        if not ev._ok and not hasattr(ev, "_defused"):
            exc = type(ev._value)(*ev._value.args)
            exc.__cause__ = ev._value
            raise exc
        left -= 1
        if left == 0 and guard is not None:
            guard.check(int(env._now))
            left = guard.every
