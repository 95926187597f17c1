"""What sim/core/simpy_adapter.py relies on of SimPy's internals, pinned on the installed simpy.

Each test names the point of the adapter's docstring it holds. A SimPy release that changes one
of them fails here, not as a cluster run that quietly differs; pyproject.toml bounds simpy to the
releases this file passed on. The tests read logs of ``(name, time)`` events, as SimPy's own do.
"""
from __future__ import annotations

import math

import pytest
import simpy

from sim.core.simpy_adapter import (clock_ns, drop_dead_events, hand_over, next_event_ns, rearm, run_all,
                                    trigger, trigger_urgent)


def logger(log: list, name: str):
    """A callback that appends ``(name, now, ok, value)`` when its event is processed."""
    return lambda ev: log.append((name, ev.env.now, ev.ok, ev.value))


def test_the_queue_is_a_heap_of_time_priority_id_event():
    """Point 1 and 2: ``_queue`` is a heapq list of (time, priority, eid, event), eids unique and
    increasing; ``schedule`` pushes at now + delay; ``step`` pops the head and sets the clock."""
    env = simpy.Environment(initial_time=10)
    a, b = env.event(), env.event()
    trigger(a, 5)
    trigger_urgent(b, 5)
    q = env._queue
    assert isinstance(q, list) and [len(e) for e in q] == [4, 4]
    assert sorted(q)[0][:2] == (15, simpy.events.URGENT) and q[0][3] is b  # URGENT first at 15
    assert [e[1] for e in sorted(q)] == [0, 1] and q[0][2] > [e for e in q if e[3] is a][0][2]
    env.step()
    assert env.now == 15 and [e[3] for e in q] == [a]


def test_trigger_is_one_event_that_succeeds_after_the_delay():
    """Point 3: ``trigger`` sets what ``succeed`` sets and schedules with a delay: one queue
    entry; the event is processed then with ok True and value None; a process waiting on it
    resumes then, as after ``yield env.timeout(delay)``."""
    env = simpy.Environment()
    log: list = []
    ev = env.event()
    assert not ev.triggered
    ev.callbacks.append(logger(log, "ev"))
    trigger(ev, 7)
    assert ev.triggered and not ev.processed and len(env._queue) == 1

    def proc():
        got = yield ev
        log.append(("proc", env.now, True, got))

    env.process(proc())
    env.run()
    assert log == [("ev", 7, True, None), ("proc", 7, True, None)] and ev.processed


def test_urgent_goes_before_normal_at_one_instant():
    """Point 2: at one instant an URGENT event is processed before NORMAL ones scheduled earlier."""
    env = simpy.Environment()
    log: list = []
    for name, urgent in (("n1", False), ("n2", False), ("u", True)):
        ev = env.event()
        ev.callbacks.append(logger(log, name))
        (trigger_urgent if urgent else trigger)(ev, 3)
    env.run()
    assert [x[:2] for x in log] == [("u", 3), ("n1", 3), ("n2", 3)]


def test_a_processed_event_is_rearmed_and_used_again():
    """Points 3 and 4: processing sets ``callbacks`` to None; ``rearm`` makes the event untriggered
    with new callbacks, and triggered again it is processed again."""
    env = simpy.Environment()
    log: list = []
    ev = env.event()
    ev.callbacks.append(logger(log, "first"))
    trigger(ev, 2)
    env.run()
    assert ev.callbacks is None and ev.processed
    rearm(ev, [logger(log, "second")])
    assert not ev.triggered and not ev.processed
    trigger_urgent(ev, 4)
    env.run()
    assert [x[:2] for x in log] == [("first", 2), ("second", 6)]


def test_hand_over_moves_the_waiter_and_leaves_a_dead_event():
    """Points 4 and 5: a process waiting on a scheduled event resumes with the new event that took
    over its callbacks (``step`` reads them at processing, not scheduling); the old event, left
    with none, is processed without effect but to move the clock."""
    env = simpy.Environment()
    log: list = []
    old = env.event()
    trigger(old, 10)

    def proc():
        yield old
        log.append(("resumed", env.now))

    env.process(proc())
    env.step()  # (the process starts and waits on `old`)
    assert len(old.callbacks) == 1
    new = hand_over(old)
    assert old.callbacks == [] and len(new.callbacks) == 1 and not new.triggered
    trigger(new, 4)
    env.run()
    assert log == [("resumed", 4)] and env.now == 10  # (the dead `old` moved the clock to 10)


def test_dead_events_dropped_only_at_the_queue_head():
    """Points 1 and 5: ``next_event_ns`` drops only the events at the queue's head that would do
    nothing when processed (succeeded, no callback); an event with a waiter or a failed one
    (``step`` raises on it) stays. (Moved here from tests/test_cluster.py.)"""
    env = simpy.Environment()
    dead, waited, later_dead = env.event(), env.event(), env.event()
    trigger(dead, 5)
    trigger(waited, 7)
    waited.callbacks.append(lambda _e: None)
    trigger(later_dead, 9)
    assert next_event_ns(env) == 7 and len(env._queue) == 2  # (the one at 9 is not at the head)
    env.step()
    assert next_event_ns(env) == math.inf and not env._queue
    failed = env.event()
    failed.fail(ValueError("x"))
    assert next_event_ns(env) == 7 and len(env._queue) == 1  # (processing it raises: kept)


def test_dropping_dead_events_keeps_the_live_ones_in_order():
    """Points 1 and 5: every dead event is removed wherever it stands; the rest keep their order
    (time, priority, id), and the run ends at the last live event's time."""
    env = simpy.Environment()
    log: list = []
    events = []
    for i, t in enumerate([5, 1, 9, 1, 3, 12, 3]):
        ev = env.event()
        if i % 2 == 0:  # live: 5, 9, 3, 3
            ev.callbacks.append(logger(log, f"e{i}"))
        (trigger_urgent if i == 6 else trigger)(ev, t)
        events.append(ev)
    drop_dead_events(env)
    assert len(env._queue) == 4 and all(e[3].callbacks for e in env._queue)
    env.run()
    assert [x[:2] for x in log] == [("e6", 3), ("e4", 3), ("e0", 5), ("e2", 9)] and env.now == 9


def _mixed_run(env: simpy.Environment, log: list) -> None:
    """Timeouts, processes, URGENT and NORMAL events at shared instants, and an event triggered
    from a callback: what a cluster's queue holds."""
    def proc(name: str, delays: list[int]):
        for d in delays:
            yield env.timeout(d)
            log.append((name, env.now))
            ev = env.event()
            ev.callbacks.append(logger(log, name + "-urgent"))
            trigger_urgent(ev, 0)

    env.process(proc("a", [3, 4, 0, 5]))
    env.process(proc("b", [7, 0, 2]))
    for t in (7, 9, 12):
        ev = env.event()
        ev.callbacks.append(logger(log, f"normal-{t}"))
        trigger(ev, t)


def test_run_all_processes_the_queue_as_run_does():
    """Points 1 and 4: ``run_all`` gives the order and instants of ``Environment.run()``; a
    failed event nobody defused raises as there; ``clock_ns`` is ``now`` (point 6)."""
    logs = []
    for runner in (lambda env: env.run(), run_all):
        env, log = simpy.Environment(), []
        _mixed_run(env, log)
        runner(env)
        assert clock_ns(env) == env.now == 12 and not env._queue
        logs.append(log)
    assert logs[0] == logs[1] and len(logs[0]) == 17
    env = simpy.Environment()
    env.event().fail(ValueError("boom"))
    with pytest.raises(ValueError, match="boom"):
        run_all(env)


def _wakers(env: simpy.Environment, gap: int, n: int | None) -> None:
    """Two processes that wake each other ``gap`` ns apart, ``n`` times (forever for None)."""
    def proc():
        k = 0
        while n is None or k < n:
            yield env.timeout(gap)
            k += 1
    env.process(proc())
    env.process(proc())


def test_the_clock_guard_stops_a_clock_that_creeps_without_progress():
    """``run_all(env, guard)``: over ``guard.every`` events with no progress the clock must move
    at least CLOCK_SPAN_NS (1 s); processes waking each other 3 ns apart with nothing else
    happening stop with a StallError naming the stretch and the guard's description."""
    from sim.core.errors import StallError
    from sim.core.observe import ClockGuard

    env = simpy.Environment()
    _wakers(env, 3, None)
    with pytest.raises(StallError, match=r"cluster\.stalled: the clock crept from t=0\.00000\d+s to t=0\.00000\d+s over 1000 "
                                         r"events .*; two wakers"):
        run_all(env, ClockGuard(lambda: 7, lambda: "two wakers", 1000))


def test_the_clock_guard_leaves_progress_and_quiet_stretches_alone():
    """A run whose progress count grows, or whose clock moves a second or more between checks
    (periodic events over a quiet stretch), runs to its end with the guard as without it."""
    from sim.core.observe import ClockGuard

    ticks = iter(range(10**9))
    for gap, progress in ((3, lambda: next(ticks)), (10**9, lambda: 0)):
        env = simpy.Environment()
        _wakers(env, gap, 5000)
        run_all(env, ClockGuard(progress, lambda: "", 1000))
        assert env.now == 5000 * gap and not env._queue
