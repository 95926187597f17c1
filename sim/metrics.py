"""Every figure a results summary gives a group of requests (a class, a tenant, ``overall``),
with its unit and which way is better: the one table ``priosim compare`` judges runs by and
docs/metrics.md describes.

``better`` is ``"higher"``, ``"lower"`` or ``"neither"`` (a count of what was offered, a share,
a setting: a difference is reported, never judged). The per-request statistics take theirs from
the column table (:data:`sim.core.columns.STATS`, ``higher_is_better``); the rest are declared
here. A new figure in ``summary.json`` needs a row here (tests/test_rates.py walks every
column a run's summary has).
"""
from __future__ import annotations

from dataclasses import dataclass

from sim.core.columns import STATS

HIGHER, LOWER, NEITHER = "higher", "lower", "neither"


@dataclass(frozen=True)
class Metric:
    """One summary figure: ``unit`` (``s``, ``req``, ``req/s``, ``tok/s``, ``frac`` ...) and
    ``better`` (``higher``, ``lower`` or ``neither``)."""

    key: str
    unit: str
    better: str


_COUNTS = (
    Metric("arrived", "req", NEITHER),  # the offered load, the same under both runs of a what-if
    Metric("finished", "req", HIGHER),
    Metric("rejected", "req", LOWER),
    Metric("unfinished", "req", LOWER),
)
_AFTER_STATS = (
    Metric("slo_attainment", "frac", HIGHER),
    Metric("goodput_rps", "req/s", HIGHER),
    Metric("throughput_rps", "req/s", HIGHER),
    Metric("priority", "", NEITHER),  # the class's setting
    Metric("itl_p50_s", "s", LOWER),
    Metric("itl_p99_s", "s", LOWER),
    Metric("itl_std_s", "s", LOWER),
    Metric("evicted_miss_prefill_s", "s", LOWER),
    Metric("swap_s", "s", LOWER),
    Metric("recompute_s", "s", LOWER),
    # prefix caching on: evictions a group's cached prefixes suffered, and the re-prefill they cost
    Metric("prefix_evictions_by_preemption", "count", LOWER),
    Metric("prefix_evictions_by_pressure", "count", LOWER),
    Metric("refill_pushed_tokens", "tok", LOWER),
    Metric("refill_pushed_s", "s", LOWER),
    Metric("refill_own_tokens", "tok", LOWER),
    # tenants only: how the work was shared, which no side wins
    Metric("token_share", "frac", NEITHER),
    Metric("gpu_s", "s", NEITHER),
    Metric("gpu_s_share", "frac", NEITHER),
    Metric("priced_token_share", "frac", NEITHER),
)

#: key -> Metric, in summary order
METRIC_TABLE: dict[str, Metric] = {m.key: m for m in (
    *_COUNTS,
    *(Metric(s.key, s.unit, HIGHER if s.higher_is_better else LOWER) for s in STATS),
    *_AFTER_STATS,
)}


def better_of(key: str) -> str:
    """``higher``, ``lower`` or ``neither`` for the summary figure ``key`` (KeyError if unknown)."""
    return METRIC_TABLE[key].better
