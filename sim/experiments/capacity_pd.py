"""The ``disaggregated`` capacity design's search: the fewest prefill + decode replicas that meet
the SLOs, and how they split.

A point is a split ``(P, D)``: ``P`` prefill replicas and ``D`` decode replicas
(docs/disaggregation.md), each at least 1 and at most the limit (``--max-replicas``). The search
assumes more replicas of either role never hurt: the passing splits are an *up-set* (if ``(P, D)``
meets the SLOs, so does every ``(P', D')`` with ``P' >= P`` and ``D' >= D``). It finds the smallest
total ``P + D`` with a passing split in three phases, each probe a full simulation:

1. **Diagonal.** The fewest ``k`` with ``(k, k)`` passing: doubling from 1, then bisection (as the
   other designs search their counts). No ``k`` up to the limit: no answer. The answer's total is
   then at most ``U = 2 k``.
2. **Corners.** With the other role at ``R = min(U - 1, limit)`` (the most any split of at most
   ``U`` replicas gives it): the fewest prefill replicas ``p`` with ``(p, R)`` passing, and the
   fewest decode replicas ``d`` with ``(R, d)`` passing, each by bisection in ``1..k`` (``(k, R)``
   passes, being above ``(k, k)``). A passing split of at most ``U`` replicas has ``D <= R``, so
   ``(P, R)`` passes too and ``P >= p``; likewise ``D >= d``. The answer's total is at least
   ``p + d``.
3. **Staircase.** For ``N = p + d, p + d + 1, ...``: every split ``(P, N - P)`` with ``P >= p``
   and ``N - P >= d`` that is not known to fail (at or below a failed split in both counts) is
   probed. The first ``N`` with a passing split is the answer; of its passing splits, the one
   with the lowest worst p99/SLO ratio (then the fewer prefill replicas). ``N = U`` always has
   one: ``(k, k)``.

Probes per round: up to ``m`` for the diagonal, and for each corner (k-ary probing, as
:class:`sim.experiments.capacity.Dim`); in the staircase the unprobed splits of ``N``, then of
``N + 1``, ... up to ``m`` (workers that would idle look one total ahead). Every split of the
answer's total is probed, so the answer does not depend on ``m`` (under the up-set assumption).
On a workload where prefill and decode interact little, ``p + d`` is the answer or close to it,
and the staircase costs a probe or two.
"""
from __future__ import annotations

from dataclasses import dataclass

from sim.experiments.capacity import Dim

Split = tuple[int, int]  # (prefill replicas, decode replicas)


@dataclass
class Seen:
    """A probed split's verdict, and its worst class ratio to its SLO (exact when it passed)."""

    ok: bool
    worst: float


class SplitSearch:
    """The search of one ``disaggregated`` design (module docstring). Drive it by rounds:
    ``probes(m)`` says which splits to simulate, ``told({split: (ok, worst)})`` takes their
    verdicts; ``done`` then ``answer`` (None: no split up to the limit meets the SLOs)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.phase = "diagonal"
        self.diagonal = Dim("diagonal", [], limit=limit)
        self.corners: tuple[Dim, Dim] | None = None  # prefill's count at (P, R), decode's at (R, D)
        self.reach = 0  # R: the other role's count in the corners
        self.total = 0  # N: the total the staircase checks
        self.seen: dict[Split, Seen] = {}
        self.answer: Split | None = None

    @property
    def done(self) -> bool:
        return self.phase in ("found", "none")

    @property
    def exhausted(self) -> bool:
        """No split up to the limit meets the SLOs ((limit, limit) misses them)."""
        return self.phase == "none"

    # -- what is known without a probe --
    def known_to_fail(self, s: Split) -> bool:
        return any(not v.ok and s[0] <= f[0] and s[1] <= f[1] for f, v in self.seen.items())

    def known_to_pass(self, s: Split) -> bool:
        return any(v.ok and s[0] >= f[0] and s[1] >= f[1] for f, v in self.seen.items())

    def splits(self, n: int) -> list[Split]:
        """The staircase's candidate splits of ``n`` replicas, by prefill count."""
        assert self.corners is not None
        p, d = self.corners[0].hi, self.corners[1].hi
        assert p is not None and d is not None
        return [(k, n - k) for k in range(max(p, n - self.limit), min(n - d, self.limit) + 1)]

    def open_splits(self, n: int) -> list[Split]:
        """The splits of ``n`` still to probe."""
        return [s for s in self.splits(n) if s not in self.seen and not self.known_to_fail(s)]

    # -- one round --
    def probes(self, m: int) -> list[Split]:
        """The splits to simulate this round (each one not simulated yet)."""
        if self.phase == "diagonal":
            out = [(k, k) for k in self.diagonal.probes(m)]
        elif self.phase == "corners":
            assert self.corners is not None
            cp, cd = self.corners
            out = [(k, self.reach) for k in cp.probes(m)] + [(self.reach, k) for k in cd.probes(m)]
        elif self.phase == "staircase":
            out, n = [], self.total
            while len(out) < max(1, m) and n <= 2 * self.limit:
                out += self.open_splits(n)
                n += 1
            out = out[:max(1, m)]
        else:
            out = []
        return list(dict.fromkeys(out))

    def told(self, verdicts: dict[Split, tuple[bool, float]]) -> None:
        """Take the verdicts of this round's probes, then move on as far as they allow."""
        for s, (ok, worst) in verdicts.items():
            self.seen[s] = Seen(bool(ok), float(worst))
        if self.phase == "diagonal":
            for s in verdicts:
                if s[0] == s[1]:
                    self.diagonal.update(s[0], self.seen[s].ok)
        elif self.phase == "corners":
            assert self.corners is not None
            for s in verdicts:
                if s[1] == self.reach:
                    self.corners[0].update(s[0], self.seen[s].ok)
                if s[0] == self.reach:
                    self.corners[1].update(s[1], self.seen[s].ok)
        self._advance()

    def take_known(self, verdicts) -> None:
        """Start from verdicts established before (``(split, ok)`` pairs): taken as seen, with no
        ratio (a known pass ranks after the passes probed here among the answer's splits)."""
        for s, ok in verdicts:
            self.seen[s] = Seen(bool(ok), float("inf"))
            if s[0] == s[1]:
                self.diagonal.update(s[0], bool(ok))
        self._advance()

    def _advance(self) -> None:
        if self.phase == "diagonal" and self.diagonal.done:
            if self.diagonal.exhausted or self.diagonal.hi is None:
                self.phase = "none"
                return
            k = self.diagonal.hi
            self.reach = min(2 * k - 1, self.limit)
            self.corners = (self._corner("prefill", k, lambda j: (j, self.reach)),
                            self._corner("decode", k, lambda j: (self.reach, j)))
            self.phase = "corners"
        if self.phase == "corners" and self.corners is not None and all(c.done for c in self.corners):
            self.total = sum(c.hi for c in self.corners if c.hi is not None)
            self.phase = "staircase"
        while self.phase == "staircase" and not self.open_splits(self.total):
            passed = [s for s in self.splits(self.total) if s in self.seen and self.seen[s].ok]
            if passed:
                self.answer = min(passed, key=lambda s: (self.seen[s].worst, s[0]))
                self.phase = "found"
            else:
                self.total += 1
                assert self.total <= 2 * self.limit, "the diagonal's (k, k) passes"

    def _corner(self, name: str, k: int, point) -> Dim:
        """A corner's bisection in 1..k, started from what the probes so far already tell."""
        c = Dim(name, [], limit=k)
        # (point(k) lies above (k, k), which passed)
        c.hi = min([j for j in range(1, k) if self.known_to_pass(point(j))] + [k])
        c.lo = max([j for j in range(1, c.hi) if self.known_to_fail(point(j))] + [0])
        return c
