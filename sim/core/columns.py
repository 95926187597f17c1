"""The per-request table, declared once: every column of ``requests.parquet`` with its dtype and
where its value comes from, and every per-class summary statistic drawn from those columns.

Three readers, one table:

* :mod:`sim.core.telemetry` records a row when a request ends by reading the :class:`Request`
  attributes the ``RECORDED`` columns name (``source``), kept raw, and turns them into the
  column's values (``convert``) when the table is read;
* :mod:`sim.results` gives the table its dtypes, adds the ``DERIVED`` columns (``derive``) and
  computes each class's, tenant's and the overall ``STATS``;
* :mod:`sim.experiments.compare` lists the ``STATS`` marked ``compare`` with their units.

So a new per-request metric is a request slot (:mod:`sim.core.request`), the code that fills it
(the engine), and one ``Column`` here (plus, for a summary figure, one ``Stat``). Times are
seconds (``*_s``), counts are tokens, blocks or events.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from sim.core.costs import NS
from sim.core.states import State

INT = "int64"
FLOAT = "float64"
STR = "str"


@dataclass(frozen=True)
class Column:
    """One column of the request table.

    ``source``: the :class:`~sim.core.request.Request` attributes read when the request ends
    (empty for a derived column). ``convert``: how those raw values become the column (a name in
    :data:`CONVERSIONS`; ``""`` keeps the single source as it is). ``derive``: for a column
    computed from the finished table (``sim.results``), a function of the table.
    """

    name: str
    dtype: str
    source: tuple[str, ...] = ()
    convert: str = ""
    doc: str = ""
    derive: Callable[[Any], Any] | None = field(default=None, compare=False)


# How raw request attributes (ns clocks, the state) become column values; each takes the raw
# values (one int64 array per source attribute, every ended request's) and returns the column
# (NaN marks "did not happen"). Done once on whole columns when the table is read, not a Python
# loop per value as requests end.
NAN = float("nan")
STATUS = {State.FINISHED: "finished", State.REJECTED: "rejected", State.UNFINISHED: "unfinished"}
# below it an int converts to a float exactly, so ``ns / NS`` rounds once, as Python's int / int
_EXACT = 2**53


def _seconds(ns: np.ndarray) -> np.ndarray:
    if ns.size and (int(ns.max()) >= _EXACT or int(ns.min()) <= -_EXACT):
        return np.array([t / NS for t in ns.tolist()], dtype=np.float64)  # (Python's exact rounding)
    return ns / NS


def _seconds_if_set(ns: np.ndarray) -> np.ndarray:
    """ns -> s; a clock that never ran (negative) is NaN."""
    s = _seconds(ns)
    s[ns < 0] = NAN
    return s


def _seconds_if_finished(ns: np.ndarray, state: np.ndarray) -> np.ndarray:
    s = _seconds(ns)
    s[state != State.FINISHED] = NAN
    return s


def _seconds_if_two_tokens(ns: np.ndarray, generated: np.ndarray) -> np.ndarray:
    """A largest inter-token gap exists once a request has two tokens."""
    s = _seconds(ns)
    s[generated <= 1] = NAN
    return s


# each state's status word at its int (None for a state a row never ends in)
_STATUS_AT = np.array([STATUS.get(State(i)) for i in range(max(State) + 1)], dtype=object)
_NO_STATUS = np.array([i for i, w in enumerate(_STATUS_AT.tolist()) if w is None], dtype=np.int64)


def _status(state: np.ndarray) -> list:
    """Each row's status word: picked by numpy from the words at each state's int (a dict lookup
    of an IntEnum per row took 4 times as long); a state without one fails as the lookup did."""
    if state.size and (int(state.min()) < 0 or int(state.max()) >= len(_STATUS_AT)
                       or bool(np.bincount(state, minlength=len(_STATUS_AT))[_NO_STATUS].any())):
        return [STATUS[s] for s in state.tolist()]  # type: ignore[index]  # (raises KeyError)
    return _STATUS_AT[state].tolist()


CONVERSIONS: dict[str, Callable[..., Any]] = {
    "seconds": _seconds, "seconds_if_set": _seconds_if_set, "seconds_if_finished": _seconds_if_finished,
    "seconds_if_two_tokens": _seconds_if_two_tokens, "status": _status,
}


def _tpot(t: Any) -> Any:
    decoded = (t["generated_tokens"] - 1).where(t["generated_tokens"] > 1)
    return (t["finish_s"] - t["first_token_s"]) / decoded


#: Columns recorded when a request ends, in the table's order.
RECORDED: tuple[Column, ...] = (
    Column("request_id", INT, ("request_id",), doc="0..n-1 in arrival order, then closed-loop requests"),
    Column("tenant", STR, ("tenant",)),
    Column("class", STR, ("cls",)),
    Column("priority", INT, ("priority",), doc="the class's priority"),
    Column("stream", INT, ("stream",), doc="index of the stream that sent it"),
    Column("user", INT, ("user",), doc="closed-loop user, -1 for open arrivals"),
    Column("arrival_s", FLOAT, ("arrival_ns",), "seconds"),
    Column("admitted_s", FLOAT, ("first_admit_ns",), "seconds_if_set", "first admission"),
    Column("first_token_s", FLOAT, ("first_token_ns",), "seconds_if_set"),
    Column("finish_s", FLOAT, ("finish_ns", "state"), "seconds_if_finished", "NaN unless finished"),
    Column("prompt_tokens", INT, ("prompt_tokens",)),
    Column("output_tokens", INT, ("hidden_output_tokens",), doc="the true output length the workload drew"),
    Column("max_tokens", INT, ("max_tokens",)),
    Column("generated_tokens", INT, ("generated",)),
    Column("status", STR, ("state",), "status", "finished, rejected or unfinished"),
    Column("reject_reason", STR, ("reject_reason",)),
    Column("preemptions", INT, ("preemptions",)),
    Column("swapped_blocks", INT, ("swapped_blocks",)),
    Column("recomputed_tokens", INT, ("recomputed_tokens",)),
    Column("swap_fallbacks", INT, ("swap_fallbacks",)),
    Column("max_itl_s", FLOAT, ("max_itl_ns", "generated"), "seconds_if_two_tokens", "largest inter-token gap"),
    Column("deadline_s", FLOAT, ("deadline_s",)),
    Column("end_s", FLOAT, ("finish_ns",), "seconds_if_set",
           "when it left the system: finished, answered with a rejection, or the horizon"),
    Column("prefix_hit_tokens", INT, ("prefix_hit_tokens",), doc="prompt tokens found cached at first admission"),
    Column("evicted_miss_tokens", INT, ("evicted_miss_tokens",),
           doc="tokens prefilled again because a cached group they needed was evicted"),
)

#: Columns computed from the recorded ones once the table is built, in the table's order.
DERIVED: tuple[Column, ...] = (
    Column("queue_wait_s", FLOAT, derive=lambda t: t["admitted_s"] - t["arrival_s"]),
    Column("ttft_s", FLOAT, derive=lambda t: t["first_token_s"] - t["arrival_s"]),
    Column("e2e_s", FLOAT, derive=lambda t: t["finish_s"] - t["arrival_s"]),
    Column("tpot_s", FLOAT, derive=_tpot, doc="(finish - first token) / (generated - 1)"),
)

COLUMNS: tuple[Column, ...] = RECORDED + DERIVED
#: every Request attribute a recorded row reads, in the order a raw row holds them
SOURCES: tuple[str, ...] = tuple(dict.fromkeys(s for c in RECORDED for s in c.source))


@dataclass(frozen=True)
class Stat:
    """One summary figure of a group of requests (a class, a tenant, all), from one column.

    ``how``: ``p50``/``p90``/``p99`` (linear quantile), ``mean``, ``sum``, ``per_s`` (sum over the
    length of the group's rate window, :func:`sim.results.rate_window`: its first to last
    arrival, not the run), ``share`` (sum over the sum of ``per``). ``among``: the requests it is taken
    over: ``all``, ``started`` (have a first token), ``finished``, ``admitted``.
    ``compare``: shown by ``priosim compare`` by default. Lower is better unless
    ``higher_is_better`` (:data:`sim.metrics.METRIC_TABLE`).
    """

    key: str
    column: str
    how: str
    among: str = "all"
    unit: str = "s"
    compare: bool = False
    higher_is_better: bool = False
    per: str = ""


#: The per-group summary statistics, in the order they appear in summary tables.
STATS: tuple[Stat, ...] = (
    Stat("ttft_p50_s", "ttft_s", "p50", "started", compare=True),
    Stat("ttft_p90_s", "ttft_s", "p90", "started"),
    Stat("ttft_p99_s", "ttft_s", "p99", "started", compare=True),
    Stat("ttft_mean_s", "ttft_s", "mean", "started"),
    Stat("e2e_p50_s", "e2e_s", "p50", "finished", compare=True),
    Stat("e2e_p90_s", "e2e_s", "p90", "finished"),
    Stat("e2e_p99_s", "e2e_s", "p99", "finished", compare=True),
    Stat("e2e_mean_s", "e2e_s", "mean", "finished"),
    Stat("tpot_p50_s", "tpot_s", "p50", "finished", compare=True),
    Stat("tpot_p99_s", "tpot_s", "p99", "finished", compare=True),
    Stat("tpot_mean_s", "tpot_s", "mean", "finished"),
    Stat("queue_wait_p50_s", "queue_wait_s", "p50", "started"),
    Stat("queue_wait_p99_s", "queue_wait_s", "p99", "started", compare=True),
    Stat("queue_wait_mean_s", "queue_wait_s", "mean", "started"),
    Stat("output_tokens_per_s", "generated_tokens", "per_s", unit="tok/s", compare=True, higher_is_better=True),
    Stat("preemptions", "preemptions", "sum", unit="count", compare=True),
    Stat("prefix_hit_rate", "prefix_hit_tokens", "share", "admitted", unit="frac", per="prompt_tokens",
         higher_is_better=True),
    Stat("evicted_miss_tokens", "evicted_miss_tokens", "sum", unit="tok"),
    Stat("max_itl_p99_s", "max_itl_s", "p99", "finished"),
)
#: the columns a group's summary reads: the status and the clocks that pick the groups, then
#: every column a statistic is taken of
STAT_COLUMNS: tuple[str, ...] = tuple(dict.fromkeys(
    ["status", "reject_reason", "first_token_s", "admitted_s"]
    + [c for s in STATS for c in (s.column, s.per) if c]))
