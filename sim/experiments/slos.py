"""Service-level objectives of a capacity search: parsing ``CLASS:key=SECONDS`` text, judging a
simulated point against the SLOs, and stopping a probe as soon as its verdict is certain.

A point *meets the SLOs* when, for every class: every request finished (none rejected or left
unfinished), ``ttft_p99_s <= ttft`` and ``tpot_p99_s <= tpot`` where the class has those SLOs, and
the class's last request finished by ``done`` (simulated seconds) where given.
"""
from __future__ import annotations

import heapq
import math

import pandas as pd

from sim.core.costs import NS
from sim.core.errors import ScenarioError
from sim.core.request import State

SLO_KEYS = ("ttft", "tpot", "done")
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


def parse_slos(sc, items: list[str] | None = None, grace: float = 0.1) -> dict[str, dict]:
    """Per class: {'ttft': s|None, 'tpot': s|None, 'done': s|None} (see module docstring)."""
    slos = {c.name: {"ttft": c.ttft_slo_s, "tpot": c.tpot_slo_s, "done": None} for c in sc.classes}
    for item in items or []:
        try:
            cname, pairs = parse_slo_text(item, list(slos), SLO_KEYS, off_words=("none", "off", "-"))
        except ValueError as exc:
            raise ScenarioError(str(exc)) from None
        slos[cname].update(pairs)
    for s in slos.values():
        if s["ttft"] is None and s["tpot"] is None and s["done"] is None:
            s["done"] = sc.horizon_s * (1 + grace)
    return slos


def check_point(summary: dict, requests: pd.DataFrame, slos: dict[str, dict]) -> dict[str, dict]:
    """Per class: ok plus the measured values the SLOs are judged on."""
    out = {}
    for cname, s in slos.items():
        m = summary["classes"][cname]
        g = requests[requests["class"] == cname]
        last = float(g["finish_s"].max()) if len(g) and g["finish_s"].notna().any() else 0.0
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
                      "output_tokens_per_s": m["output_tokens_per_s"], "slo_ratio": ratio}
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
