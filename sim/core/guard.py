"""What a user's policy is handed: read-only views of requests, and checks of what it answers.

The policy contract (:mod:`policies.base`) says a policy reads requests and writes nothing the
engine owns. A shipped policy keeps to it (``tests/test_policy_guard.py`` runs every one of them
guarded and compares the results), so the engine hands shipped policies its requests directly.
A user's policy (``pkg.mod:Class`` or ``path/file.py:Class``) is wrapped by
:func:`guard_policy`, which

* hands it a :class:`ReadOnlyRequest` for each request (made once per request and kept while
  the request lives): reads are forwarded, an attribute write raises at once, in one line that
  names the policy and the attribute; ``features`` (and any other dict) reads through a
  read-only mapping, lists come as tuples; ``predicted`` is the policy's own scratch dict and
  stays writable; ``hidden_output_tokens`` is guarded as ``true_output_tokens`` is (oracles only);
* checks each rank key: a tuple (or a sequence, made a tuple as the engine always did) whose
  elements are real numbers (int, float, bool, numpy numbers, which are taken as int or float);
  inf and -inf order (last and first), NaN orders nothing and is refused, as are strings, None
  and nested containers;
* checks ``next_change``: None, or a number of seconds >= 0 (inf, or a time past the engine's
  integer-nanosecond range, means never: :func:`sim.core.engine.change_ns` caps it);
* hands ``before_ranking`` a read-only context and ``on_scheduled_run`` its items with views,
  its durations as a tuple.

* checks that the first keys (:data:`TAIL_CHECKS` of them) end in ``(arrival_s, request_id)``,
  the tie-break the contract asks for (a few calls show a policy that leaves it out; checking
  every key would cost every run).

Each refusal is a :class:`PolicyContractError` (a :class:`~sim.core.errors.ScenarioError`: the
command prints its one line and exits with status 2). Everything else a policy has (``name``,
``report()``, its own attributes) is read through the wrapper unchanged.

An exception the user's own code raises while the run goes on becomes one line naming the
policy, the hook and the line of the user's file: :mod:`sim.policy_code`, above the engine.
"""
from __future__ import annotations

import numbers
import operator
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from policies.base import BasePolicy, RankingContext
from sim.core.errors import ScenarioError

__all__ = ["PolicyContractError", "ReadOnlyRequest", "guard_policy", "checked_key", "checked_next_change",
           "one_line_repr", "TAIL_CHECKS"]

READ_ONLY = "policies see requests read-only"


class PolicyContractError(ScenarioError):
    """A policy broke the contract of :mod:`policies.base` while the run went on: it wrote into
    a request, or answered a key or a next-change time that is not one. One line."""


def one_line_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)`` on one line, at most ``limit`` characters (a message stays one line)."""
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


# ---- the read-only request ------------------------------------------------------------------
class ReadOnlyMapping(Mapping):
    """A dict a policy may read and not change: item and method writes raise one line."""

    __slots__ = ("_d", "_what")
    _d: Mapping
    _what: str

    def __init__(self, d: Mapping, what: str) -> None:
        object.__setattr__(self, "_d", d)
        object.__setattr__(self, "_what", what)  # "policy 'x' wrote req.features"

    def __getitem__(self, k):
        return self._d[k]

    def __iter__(self):
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, k) -> bool:
        return k in self._d

    def get(self, k, default=None):
        return self._d.get(k, default)

    def __repr__(self) -> str:
        return f"ReadOnlyMapping({self._d!r})"

    def _refuse(self, *_a, **_k):
        raise PolicyContractError(f"{self._what}: policies see requests read-only (the mapping "
                                  "cannot be changed; copy it with dict(...) to keep one of your own)")

    __setitem__ = __delitem__ = update = pop = popitem = setdefault = clear = __setattr__ = _refuse


# ``_r`` is the wrapper's own (private) slot: every attribute write *on the view* raises;
# reaching through a private attribute is outside the contract.
class ReadOnlyRequest:
    """A live, read-only view of one request for a user's policy (see the module docstring)."""

    __slots__ = ("_r", "_who", "_features")
    _r: Any
    _who: str
    _features: ReadOnlyMapping

    def __setattr__(self, name: str, value: Any) -> None:
        raise PolicyContractError(f"policy '{self._who}' wrote req.{name}: {READ_ONLY}")

    def __delattr__(self, name: str) -> None:
        raise PolicyContractError(f"policy '{self._who}' deleted req.{name}: {READ_ONLY}")

    @property
    def true_output_tokens(self) -> int:
        return self._r.true_output_tokens  # (raises unless the policy is an oracle)

    def __repr__(self) -> str:
        return f"ReadOnlyRequest({self._r!r})"


# (the slots are set through their descriptors: the view's own __setattr__ refuses)
_R_SLOT, _WHO_SLOT, _FEATURES_SLOT = (ReadOnlyRequest.__dict__[n] for n in ReadOnlyRequest.__slots__)


def _container(name: str) -> property:
    """A property reading the request's ``name``: a dict as a read-only mapping, a list as a tuple."""
    def read(view: ReadOnlyRequest) -> Any:
        value = getattr(view._r, name)
        if isinstance(value, dict):
            return ReadOnlyMapping(value, f"policy '{view._who}' wrote req.{name}")
        return tuple(value) if isinstance(value, (list, bytearray)) else value
    return property(read, doc=f"the request's {name} (read-only)")


# Every attribute of a request, read-only. No __getattr__: a class with one looks up every
# attribute through Python (about 7x slower reads, at every key). The true length is shown on
# an oracle's terms by either name; ``remaining_output`` (the engine's, from it) is not shown.
# A property reading in C (``attrgetter("_r.<name>")``) costs about 2x a plain read.
#: every attribute of a request (``sim.core.request.Request``; a test keeps the list complete)
FIELDS = (
    "request_id", "arrival_s", "arrival_ns", "tenant", "cls", "cls_idx", "priority", "prompt_tokens",
    "max_tokens", "hidden_output_tokens", "deadline_s", "stream", "user", "features", "predicted",
    "hash_ids", "reveals_output", "state", "tokens", "computed", "generated", "blocks", "host_blocks",
    "key", "admit_seq", "first_token_ns", "last_token_ns", "finish_ns", "admitted_s", "last_scheduled_s",
    "attained_ns", "attained_s", "first_admit_ns", "cohort_base_step", "cohort_base_svc_ns",
    "cohort_join_step", "spec_acceptance", "preemptions", "recomputed_tokens", "swapped_blocks",
    "swap_fallbacks", "max_itl_ns", "reject_reason", "shared", "base_blocks", "prefix_hit_tokens",
    "evicted_miss_tokens")
_CONTAINERS = ("hash_ids", "shared", "key")
for _n in FIELDS:
    if _n == "hidden_output_tokens":
        setattr(ReadOnlyRequest, _n, ReadOnlyRequest.true_output_tokens)
    elif _n in _CONTAINERS:
        setattr(ReadOnlyRequest, _n, _container(_n))
    elif _n != "features":
        setattr(ReadOnlyRequest, _n, property(operator.attrgetter("_r." + _n), doc=f"the request's {_n} (read-only)"))
ReadOnlyRequest.features = property(operator.attrgetter("_features"), doc="trace features (read-only)")  # type: ignore[attr-defined]


def make_view(req: Any, who: str) -> ReadOnlyRequest:
    """A new read-only view of ``req`` for policy ``who``."""
    v = object.__new__(ReadOnlyRequest)
    _R_SLOT.__set__(v, req)
    _WHO_SLOT.__set__(v, who)
    feats = getattr(req, "features", None)
    _FEATURES_SLOT.__set__(v, ReadOnlyMapping(feats if feats is not None else {},
                                              f"policy '{who}' wrote req.features"))
    return v


def request_of(view: Any, who: str) -> Any:
    """The request behind a view this module made (a policy's own waiting set hands them back)."""
    if type(view) is not ReadOnlyRequest:
        raise PolicyContractError(f"policy '{who}': its waiting set returned {one_line_repr(view)} where an "
                                  "entry's request was expected (the (key, seq, request) it was given)")
    return view._r


# ---- checks of what a policy answers --------------------------------------------------------
KEY_EXPECTED = ("expected a tuple of numbers (int or float; inf and -inf order last and first, NaN "
                "orders nothing) ending in (arrival_s, request_id)")


def checked_key(k: Any, who: str, req: Any) -> tuple:
    """``k`` as the tuple the engine ranks by, or PolicyContractError naming the policy, the
    request and the value (see the module docstring for what is accepted)."""
    if type(k) is not tuple:
        if isinstance(k, (str, bytes, Mapping)) or not hasattr(k, "__iter__"):
            _bad_key(k, who, req, "")
        k = tuple(k)
    plain = True
    for x in k:  # (a loop of type checks: faster than any C-level trick for a short tuple)
        t = type(x)
        if t is float:
            if x != x:
                _bad_key(k, who, req, _element(k, x))
        elif t is not int:
            if not isinstance(x, numbers.Real) or x != x:
                _bad_key(k, who, req, _element(k, x))
            plain = plain and t is bool
    return k if plain else tuple(_builtin_number(x) for x in k)


def _builtin_number(x: Any) -> Any:
    """Key element ``x`` as a built-in number where it is another kind of real number: a numpy
    number's comparisons give a numpy.bool, which the engine's compiled build refuses where it
    orders keys. Integers exactly; numpy floats as floats (exact but for float128); a Fraction,
    whose comparisons give a bool, as it is."""
    t = type(x)
    if t is int or t is float or t is bool or isinstance(x, Fraction):
        return x
    if isinstance(x, numbers.Integral):
        return int(x)
    try:
        return float(x)
    except OverflowError:  # (a real beyond any float: its own comparisons must do)
        return x


def _element(k: tuple, x: Any) -> str:
    i = next(i for i, y in enumerate(k) if y is x)
    what = "NaN" if isinstance(x, numbers.Real) else f"{one_line_repr(x, 40)} ({type(x).__name__})"
    return f" (element {i} is {what})"


#: how many of a user policy's first keys are checked to end in (arrival_s, request_id)
TAIL_CHECKS = 16


def check_tail(k: tuple, who: str, req: Any) -> None:
    """PolicyContractError unless key ``k`` (checked) ends in the request's ``(arrival_s,
    request_id)``: the tie-break that makes the order total and every run repeat."""
    if len(k) < 2 or k[-2] != req.arrival_s or k[-1] != req.request_id:
        raise PolicyContractError(f"policy '{who}': key() returned {one_line_repr(k)} for request {req.request_id}: "
                                  f"expected a tuple ending in (arrival_s, request_id) = ({req.arrival_s!r}, "
                                  f"{req.request_id}), the tie-break that makes the order total "
                                  f"(policies.check_policy checks the whole contract)")


def _bad_key(k: Any, who: str, req: Any, detail: str) -> None:
    raise PolicyContractError(f"policy '{who}': key() returned {one_line_repr(k)} for request "
                              f"{getattr(req, 'request_id', '?')}{detail}: {KEY_EXPECTED}")


def checked_next_change(t: Any, who: str, now: float) -> float | None:
    """``t`` as seconds (or None), or PolicyContractError: NaN, a negative time and anything
    that is not a number are refused; a number too large for a float is inf (never)."""
    if t is None or type(t) is float:
        if t is None or t >= 0:
            return t
    elif isinstance(t, numbers.Real) and not isinstance(t, bool):
        try:
            f = float(t)
        except OverflowError:  # an int beyond any float: never
            return float("inf") if t > 0 else _bad_change(t, who, now)  # type: ignore[operator]
        if f >= 0:
            return f
    _bad_change(t, who, now)
    return None  # (not reached)


def _bad_change(t: Any, who: str, now: float) -> float:
    raise PolicyContractError(f"policy '{who}': next_change({now:.9g}) returned {one_line_repr(t)}: expected None "
                              "(no change declared) or a time in seconds >= 0 (inf, or beyond 2^61 ns, "
                              "means never; NaN is not a time)")


# ---- the wrapper --------------------------------------------------------------------------
class _GuardedContext(RankingContext):
    """A RankingContext whose writes raise the one-line contract error."""

    __slots__ = ("_who",)

    def __setattr__(self, name: str, value: Any) -> None:
        raise PolicyContractError(f"policy '{object.__getattribute__(self, '_who')}' wrote ctx.{name}: "
                                  "the ranking context is read-only")

    def __delattr__(self, name: str) -> None:
        self.__setattr__(name, None)


class GuardedPolicy:
    """The wrapper :func:`guard_policy` returns (its class is made per wrapped class, so that
    the engine's checks of which hooks a policy has see the wrapped policy's)."""

    def __init__(self, inner: Any, who: str) -> None:
        self._inner = inner
        self._who = who
        self._views: dict[int, ReadOnlyRequest] = {}  # request id -> its view, while it lives
        self._key = inner.key  # (bound once: read at every key)
        self._tails = TAIL_CHECKS  # first keys still to check for the (arrival_s, request_id) tail
        hook = getattr(inner, "before_ranking", None)
        if hook is None or getattr(hook, "__func__", hook) is BasePolicy.before_ranking:
            self.before_ranking = hook  # none, or the default (it reads ctx.queue_len only)
        else:
            self.before_ranking = self._before_ranking

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_inner", "_who", "_views", "_key", "_tails"):
            raise AttributeError(name)
        return getattr(self._inner, name)

    def __repr__(self) -> str:
        return f"guarded({self._inner!r})"

    def view(self, req: Any) -> ReadOnlyRequest:
        """The request's view (made at its first sight, kept until it finishes)."""
        rid = req.request_id
        v = self._views.get(rid)
        if v is None:
            v = self._views[rid] = make_view(req, self._who)
        return v

    def bind(self, classes: dict, seed: int) -> None:
        import copy
        bind = getattr(self._inner, "bind", None)
        if bind is not None:
            bind(copy.deepcopy(classes), seed)

    def key(self, req: Any, now: float) -> tuple:
        v = self._views.get(req.request_id)  # (self.view(req), inline: read at every key)
        k = self._key(v if v is not None else self.view(req), now)
        if self._tails:
            return self._first_key(k, req)
        if type(k) is tuple:  # (checked_key's loop, inline for the usual key: ints and floats)
            for x in k:
                t = type(x)
                if (t is not float or x != x) and t is not int:
                    return checked_key(k, self._who, req)
            return k
        return checked_key(k, self._who, req)

    def _first_key(self, k: Any, req: Any) -> tuple:
        """One of the first keys: checked, its tail too."""
        self._tails -= 1
        k = checked_key(k, self._who, req)
        check_tail(k, self._who, req)
        return k

    def _next_change(self, now: float) -> float | None:
        return checked_next_change(self._inner.next_change(now), self._who, now)

    def _before_ranking(self, ctx: RankingContext) -> None:
        g = _GuardedContext(ctx.now, ctx.queue_len,
                            ReadOnlyMapping(ctx.cached_prefix_tokens, f"policy '{self._who}' wrote "
                                                                      "ctx.cached_prefix_tokens"))
        object.__setattr__(g, "_who", self._who)
        self._inner.before_ranking(g)

    def _on_arrival(self, req: Any, now: float) -> None:
        self._inner.on_arrival(self.view(req), now)

    def _on_scheduled(self, req: Any, tokens: int, service_s: float, now: float) -> None:
        self._inner.on_scheduled(self.view(req), tokens, service_s, now)

    def _on_scheduled_run(self, items: list, start_ns: int, durations: list[int]) -> None:
        view = self.view
        self._inner.on_scheduled_run([(view(r), t, k) for r, t, k in items], start_ns, tuple(durations))

    def on_preempt(self, req: Any, now: float) -> None:
        hook = getattr(self._inner, "on_preempt", None)
        if hook is not None:
            hook(self.view(req), now)

    def on_finish(self, req: Any, now: float) -> None:
        hook = getattr(self._inner, "on_finish", None)
        v = self._views.pop(req.request_id, None)
        if hook is not None:
            hook(v if v is not None else make_view(req, self._who), now)

    def report(self) -> dict:
        report = getattr(self._inner, "report", None)
        return report() if report is not None else {}

    def _waiting_queues(self) -> Any:
        q = self._inner.waiting_queues()
        return None if q is None else GuardedQueues(q, self)


class GuardedQueues:
    """A user policy's own waiting set (``waiting_queues()``), read by the engine as its heap of
    ``(key, seq, request)``: the policy's structure holds views; the engine gets its requests
    back, each with the entry's key (checked) recorded as the engine records a heap entry's."""

    def __init__(self, queues: Any, guard: GuardedPolicy) -> None:
        self.q = queues
        self.g = guard

    def _out(self, entry: tuple) -> tuple:
        who = self.g._who
        k, seq, v = entry
        r = request_of(v, who)
        k = checked_key(k, who, r)
        r.key = k
        return (k, seq, r)

    def push(self, entry: tuple) -> None:
        k, seq, r = entry
        self.q.push((k, seq, self.g.view(r)))

    def pop(self) -> tuple:
        return self._out(self.q.pop())

    def rekey(self) -> None:
        self.q.rekey()

    def __getitem__(self, i: int) -> tuple:
        return self._out(self.q[i])

    def __len__(self) -> int:
        return len(self.q)

    def __iter__(self):
        for entry in self.q:
            yield self._out(entry)


_CLASSES: dict[type, type] = {}


def _guard_class(cls: type) -> type:
    """The wrapper class for policies of class ``cls``: a hook the engine skips when it is
    BasePolicy's default (``on_arrival``, ``on_scheduled``, ``next_change``: read from the
    type) is that default here too, else the guarded one; ``on_scheduled_run`` and
    ``waiting_queues`` exist only when ``cls`` has them."""
    made = _CLASSES.get(cls)
    if made is not None:
        return made
    ns: dict[str, Any] = {}
    for hook in ("on_arrival", "on_scheduled", "next_change"):
        default = getattr(BasePolicy, hook)
        own = getattr(cls, hook, None)
        ns[hook] = default if own is None or own is default else getattr(GuardedPolicy, "_" + hook)
    ns["on_scheduled_run"] = GuardedPolicy._on_scheduled_run if callable(getattr(cls, "on_scheduled_run", None)) else None
    ns["waiting_queues"] = GuardedPolicy._waiting_queues if callable(getattr(cls, "waiting_queues", None)) else None
    made = _CLASSES[cls] = type(f"Guarded{cls.__name__}", (GuardedPolicy,), ns)
    return made


def guard_policy(policy: Any, who: str) -> Any:
    """``policy`` wrapped so that it sees read-only requests and its answers are checked (see
    the module docstring); ``who``: the name it was given by (``pkg.mod:Class``)."""
    return _guard_class(type(policy))(policy, who)
