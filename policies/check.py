"""The policy conformance suite: ``check_policy(policy_or_name, **params)``.

Runs a policy — a registered name, a class, or an instance (deep-copied, never mutated) — through
a small reference scheduler that calls it exactly as the engine does (``bind``; ``on_arrival``
then ``key`` on entry; re-key when ``dynamic`` or when ``next_change`` has passed, after
``before_ranking`` with a :class:`~policies.base.RankingContext` (no prefix cache here: every
waiting request's cached prefix is 0 for a policy with ``needs_prefix_info``); admit in key
order; ``on_scheduled`` after each step; ``on_preempt`` then ``key`` on preemption; ``on_finish``),
and checks, raising :class:`PolicyCheckError` on the first failure:

1. ``key`` returns a tuple ending in ``(arrival_s, request_id)`` (ties end in arrival then id),
   and keys of distinct requests are mutually comparable and distinct (the order is total);
2. ``key`` is deterministic: asked twice at the same moment it answers the same;
3. the declared next-change time is honoured: a non-dynamic policy's keys do not change before
   the time ``next_change`` announced (the engine caches keys until then);
4. the same seed gives the same schedule (two fresh copies, identical admission logs);
5. no request is lost or served twice: each is admitted while waiting only, finishes exactly
   once, and receives exactly its output length;
6. a policy that is not an oracle never reads ``true_output_tokens``;
7. a policy writes nothing into a request (an attribute, or an item of ``features``; its
   ``predicted`` dict is its own).

It needs nothing from ``sim``; tests also run every registered policy through the real engine.
"""
from __future__ import annotations

import copy
import math
from types import MappingProxyType
from typing import Any

import numpy as np

from policies.base import RankingContext


class PolicyCheckError(AssertionError):
    """A policy broke the contract of :mod:`policies.base`."""


class OracleReadError(AttributeError):
    pass


class FakeRequest:
    """A minimal :class:`~policies.base.RequestView` for the reference scheduler, read-only to
    the policy (the scheduler moves its progress with :func:`_set`)."""

    request_id: int
    arrival_s: float
    tenant: str
    cls: str
    priority: int
    prompt_tokens: int
    max_tokens: int
    generated: int
    attained_s: float
    admitted_s: float
    last_scheduled_s: float
    preemptions: int
    features: MappingProxyType
    predicted: dict
    hidden_output_tokens: int
    _oracle_ok: bool

    def __init__(self, rid: int, arrival_s: float, cls: str, priority: int, prompt: int, output: int,
                 tenant: str, oracle_ok: bool) -> None:
        self.__dict__.update(
            request_id=rid, arrival_s=arrival_s, tenant=tenant, cls=cls, priority=priority,
            prompt_tokens=prompt, max_tokens=4 * output + 8, generated=0, attained_s=0.0,
            admitted_s=math.nan, last_scheduled_s=math.nan, preemptions=0,
            features=MappingProxyType({"f_len_hint": float(prompt % 7)}), predicted={},
            hidden_output_tokens=output, _oracle_ok=oracle_ok)

    def __setattr__(self, name: str, value: Any) -> None:
        _fail(f"the policy wrote req.{name} (request {self.request_id}): policies see requests read-only")

    def __delattr__(self, name: str) -> None:
        self.__setattr__(name, None)

    @property
    def true_output_tokens(self) -> int:
        if not self._oracle_ok:
            raise OracleReadError("true_output_tokens read by a policy that is not an oracle")
        return self.hidden_output_tokens


CLASSES = {"hi": {"name": "hi", "priority": 0, "ttft_slo_s": 0.5},
           "mid": {"name": "mid", "priority": 1, "ttft_slo_s": 2.0},
           "lo": {"name": "lo", "priority": 2, "ttft_slo_s": None}}


def _build(policy: Any, params: dict):
    from policies import make_policy
    if isinstance(policy, str):
        return lambda: make_policy(policy, **params)
    if isinstance(policy, type):
        return lambda: policy(**params)
    if params:
        raise TypeError("check_policy: parameters go with a name or a class, not an instance")
    return lambda: copy.deepcopy(policy)


def _requests(n: int, seed: int, oracle_ok: bool) -> list[FakeRequest]:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(0.02, n))
    t[5:8] = t[5]  # simultaneous arrivals: ties must break on id
    names = list(CLASSES)
    out = []
    for i in range(n):
        c = names[int(rng.integers(3))]
        out.append(FakeRequest(i, float(t[i]), c, CLASSES[c]["priority"], int(rng.integers(1, 400)),
                               int(rng.geometric(0.08)), f"t{int(rng.integers(2))}", oracle_ok))
    return out


def _fail(msg: str):
    raise PolicyCheckError(msg)


def _set(r: FakeRequest, **fields: Any) -> None:
    """The reference scheduler moves a request's progress (the policy cannot: it reads)."""
    r.__dict__.update(fields)


def _key(pol, r, now: float) -> tuple:
    try:
        k = pol.key(r, now)
    except OracleReadError:
        _fail(f"{getattr(pol, 'name', pol)!s}: reads true_output_tokens but does not declare "
              "oracle = True")
    if not isinstance(k, tuple):
        _fail(f"key() must return a tuple (got {type(k).__name__} {k!r})")
    if len(k) < 2 or k[-2] != r.arrival_s or k[-1] != r.request_id:
        _fail(f"key() must end in (arrival_s, request_id) = ({r.arrival_s!r}, {r.request_id}); "
              f"got {k!r}")
    if k != pol.key(r, now):
        _fail(f"key() is not deterministic for request {r.request_id} at t={now}: {k!r}")
    return k


def _run(pol, reqs: list[FakeRequest], slots: int, step_s: float, preempt_every: int,
         seed: int = 12345) -> list:
    """Reference scheduler; returns the log of (step, event, request id). ``seed``: the seed the
    policy is bound with."""
    pol.bind(copy.deepcopy(CLASSES), seed)
    # read once after bind, as the engine does: (dynamic, before_ranking, needs_prefix_info)
    hooks = (bool(getattr(pol, "dynamic", False)), getattr(pol, "before_ranking", None),
             bool(getattr(pol, "needs_prefix_info", False)))
    log: list[tuple] = []
    waiting: dict[int, FakeRequest] = {}
    running: dict[int, FakeRequest] = {}
    keys: dict[int, tuple] = {}
    finished: set[int] = set()
    now, i, step, change = 0.0, 0, 0, math.inf
    n = len(reqs)
    while len(finished) < n:
        step += 1
        if step > 200_000:
            _fail("reference run did not finish (a request is never admitted?)")
        while i < n and reqs[i].arrival_s <= now:
            r = reqs[i]
            pol.on_arrival(r, now)
            keys[r.request_id] = _key(pol, r, now)
            waiting[r.request_id] = r
            i += 1
        live = list(waiting.values()) + list(running.values())
        change = _refresh_keys(pol, hooks, live, waiting, keys, now, change)
        order = _waiting_order(waiting, live, keys)
        if not waiting and not running:
            now = max(now + step_s, reqs[i].arrival_s)
            continue
        # preempt the lowest-ranked running request now and then (exercises on_preempt)
        if preempt_every and step % preempt_every == 0 and running and waiting:
            _preempt_lowest(pol, running, waiting, keys, now, (step, log))
        _admit(order, waiting, running, finished, slots, now, (step, log))
        now = round(now + step_s, 9)
        _decode_one_token(pol, running, finished, step_s, now, (step, log))
    bad = [r.request_id for r in reqs if r.generated != r.hidden_output_tokens]
    if bad:
        _fail(f"requests {bad[:5]} received the wrong number of tokens")
    return log


def _refresh_keys(pol, hooks: tuple, live: list, waiting: dict, keys: dict, now: float, change: float) -> float:
    """Re-rank at a declared change (or every step for a dynamic policy), else check the cached
    keys still hold; returns the policy's next declared change (s, inf when none)."""
    dynamic, before_ranking, prefix_info = hooks
    if dynamic or now >= change - 1e-9:  # the engine rounds the change up to a nanosecond
        if before_ranking is not None:
            cached = {r.request_id: 0 for r in waiting.values()} if prefix_info else {}
            before_ranking(RankingContext(now, len(waiting), cached))
        for r in live:
            keys[r.request_id] = _key(pol, r, now)
    else:
        for r in live:  # 3: the cached keys must still hold before the declared change
            k = _key(pol, r, now)
            if k != keys[r.request_id]:
                _fail(f"key of request {r.request_id} changed at t={now:.6f} from "
                      f"{keys[r.request_id]!r} to {k!r} before the declared next change "
                      f"({change}) and without dynamic = True")
    nc = pol.next_change(now)
    return math.inf if nc is None else max(float(nc), now)


def _waiting_order(waiting: dict, live: list, keys: dict) -> list:
    """The waiting requests in key order, after checking the keys of all live requests form a
    total order (distinct and mutually comparable)."""
    all_keys = [keys[r.request_id] for r in live]
    try:
        if len(set(all_keys)) != len(all_keys):
            _fail("two requests have equal keys (the order is not total)")
        order = sorted(waiting.values(), key=lambda r: keys[r.request_id])
        sorted(all_keys)
    except TypeError as exc:
        _fail(f"keys are not mutually comparable: {exc}")
    return order


def _preempt_lowest(pol, running: dict, waiting: dict, keys: dict, now: float, at: tuple) -> None:
    """Move the lowest-ranked running request back to waiting; ``at``: (step, log)."""
    step, log = at
    v = max(running.values(), key=lambda r: keys[r.request_id])
    del running[v.request_id]
    _set(v, preemptions=v.preemptions + 1)
    pol.on_preempt(v, now)
    keys[v.request_id] = _key(pol, v, now)
    waiting[v.request_id] = v
    log.append((step, "preempt", v.request_id))


def _admit(order: list, waiting: dict, running: dict, finished: set, slots: int, now: float, at: tuple) -> None:
    """Admit waiting requests in ``order`` while fewer than ``slots`` run; ``at``: (step, log)."""
    step, log = at
    for r in order:
        if len(running) >= slots:
            break
        if r.request_id in running or r.request_id in finished:
            _fail(f"request {r.request_id} admitted twice")
        del waiting[r.request_id]
        _set(r, admitted_s=now)
        running[r.request_id] = r
        log.append((step, "admit", r.request_id))


def _decode_one_token(pol, running: dict, finished: set, step_s: float, now: float, at: tuple) -> None:
    """Every running request emits one token in a ``step_s`` s step ending at ``now``; those
    done finish. ``at``: (step, log)."""
    step, log = at
    for r in list(running.values()):
        _set(r, generated=r.generated + 1, attained_s=r.attained_s + step_s, last_scheduled_s=now)
        pol.on_scheduled(r, 1, step_s, now)
    for r in list(running.values()):
        if r.generated >= r.hidden_output_tokens:
            if r.request_id in finished:
                _fail(f"request {r.request_id} finished twice")
            del running[r.request_id]
            finished.add(r.request_id)
            pol.on_finish(r, now)
            log.append((step, "finish", r.request_id))


def check_policy(policy: Any, *, n_requests: int = 300, seed: int = 0, slots: int = 4,
                 step_s: float = 0.01, preempt_every: int = 7, **params: Any) -> dict:
    """Run the conformance suite (module docstring); return a summary dict on success.

    ``policy``: a registered name, a dotted ``pkg.mod:Class``, a class, or an instance.
    ``params``: the policy's parameters (with a name or a class).
    """
    make = _build(policy, params)
    first = make()
    if not callable(getattr(first, "key", None)):
        _fail(f"{policy!r} has no key() method")
    for hook in ("next_change", "on_arrival", "on_scheduled", "on_preempt", "on_finish", "bind"):
        if not callable(getattr(first, hook, None)):
            _fail(f"{policy!r} has no {hook}() method (inherit policies.BasePolicy for defaults)")
    oracle = bool(getattr(first, "oracle", False))
    logs = []
    for pol in (first, make()):
        reqs = _requests(n_requests, seed, oracle)
        logs.append(_run(pol, reqs, slots, step_s, preempt_every))
    if logs[0] != logs[1]:
        diff = next(i for i, (a, b) in enumerate(zip(logs[0], logs[1])) if a != b)
        _fail(f"same seed, different schedule: event {diff}: {logs[0][diff]} vs {logs[1][diff]}")
    report = getattr(first, "report", lambda: {})()
    return {"policy": getattr(first, "name", repr(policy)), "requests": n_requests,
            "events": len(logs[0]), "preemptions": sum(1 for e in logs[0] if e[1] == "preempt"),
            "report": report}


def uses_seed(policy: Any, *, n_requests: int = 300, **params: Any) -> bool:
    """Whether the policy's schedule depends on the seed it is bound with: the reference run
    (above) under two seeds gives different admission logs (e.g. a noisy length predictor)."""
    make = _build(policy, params)
    oracle = bool(getattr(make(), "oracle", False))
    logs = [_run(make(), _requests(n_requests, 0, oracle), 4, 0.01, 7, seed=s) for s in (1, 2)]
    return logs[0] != logs[1]
