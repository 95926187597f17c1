"""Open arrival processes: when requests arrive, in seconds on the stream's own clock.

Every process is a small frozen object with ``sample(rng, duration_s) -> float64 array`` (sorted
arrival times in ``[0, duration_s)``, the stream adds its ``start_s``), an analytic long-run
``mean_rate`` (requests/s) and, where it exists, the inter-arrival ``cv`` and ``gap_var`` (s^2).
``scaled(k)`` returns the same process with every rate multiplied by ``k`` (the ``load_scale``).
Renewal processes start at time 0 (an ordinary, not stationary, renewal process).
Time-varying rates (piecewise table, diurnal sine) are sampled by thinning a Poisson process.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from plumbing.registry import Registry
from workloads.errors import WorkloadError, integer, made_with, number, require
from workloads.lengths import ClippedLength, parse_length

ARRIVALS = Registry("arrival process")  # workloads.contracts.ArrivalProcess (and ClosedLoop)

_CHUNK_MAX = 1_000_000


def _renewal(rng: np.random.Generator, draw: Callable[[int], np.ndarray], mean_gap: float,
             duration_s: float) -> np.ndarray:
    """Arrival times of a renewal process with gaps from ``draw(n)`` in ``[0, duration_s)``."""
    out: list[np.ndarray] = []
    t = 0.0
    while True:
        left = (duration_s - t) / mean_gap
        n = int(min(_CHUNK_MAX, left * 1.05 + 5 * math.sqrt(left + 1) + 16))
        times = t + np.cumsum(draw(n))
        out.append(times[times < duration_s])
        if times.size == 0 or times[-1] >= duration_s:
            break
        t = float(times[-1])
    return np.concatenate(out) if out else np.empty(0)


def _poisson_times(rng: np.random.Generator, rate: float, duration_s: float) -> np.ndarray:
    """Homogeneous Poisson process: a Poisson count, then sorted uniform times."""
    if rate <= 0 or duration_s <= 0:
        return np.empty(0)
    n = rng.poisson(rate * duration_s)
    return np.sort(rng.random(n) * duration_s)


def _thin(rng: np.random.Generator, rate_fn: Callable[[np.ndarray], np.ndarray], rate_max: float,
          duration_s: float) -> np.ndarray:
    """Non-homogeneous Poisson by thinning (Lewis-Shedler): keep t with prob rate(t)/rate_max."""
    cand = _poisson_times(rng, rate_max, duration_s)
    keep = rng.random(cand.size) * rate_max < rate_fn(cand)
    return cand[keep]


@dataclass(frozen=True)
class Poisson:
    """Poisson process with ``rate`` requests/s: exponential gaps, CV = 1."""

    rate: float

    def __post_init__(self) -> None:
        number("rate", self.rate, gt=0)

    def sample(self, rng: np.random.Generator, duration_s: float) -> np.ndarray:
        return _poisson_times(rng, self.rate, duration_s)

    @property
    def mean_rate(self) -> float:
        return self.rate

    @property
    def cv(self) -> float:
        return 1.0

    @property
    def gap_var(self) -> float:
        return 1 / self.rate ** 2

    def scaled(self, k: float) -> "Poisson":
        return replace(self, rate=self.rate * k)


@dataclass(frozen=True)
class GammaRenewal:
    """Renewal process with Gamma gaps: mean 1/``rate`` s, coefficient of variation ``cv``.

    Shape ``1/cv^2``; cv > 1 is burstier than Poisson, cv < 1 more regular.
    """

    rate: float
    cv: float

    def __post_init__(self) -> None:
        number("rate", self.rate, gt=0)
        number("cv", self.cv, gt=0)

    def sample(self, rng: np.random.Generator, duration_s: float) -> np.ndarray:
        shape = 1 / self.cv ** 2
        scale = 1 / (self.rate * shape)
        return _renewal(rng, lambda n: rng.gamma(shape, scale, n), 1 / self.rate, duration_s)

    @property
    def mean_rate(self) -> float:
        return self.rate

    @property
    def gap_var(self) -> float:
        return (self.cv / self.rate) ** 2

    def scaled(self, k: float) -> "GammaRenewal":
        return replace(self, rate=self.rate * k)


@dataclass(frozen=True)
class WeibullRenewal:
    """Renewal process with Weibull gaps of shape ``shape`` and mean 1/``rate`` s (shape < 1: bursty)."""

    rate: float
    shape: float

    def __post_init__(self) -> None:
        number("rate", self.rate, gt=0)
        number("shape", self.shape, gt=0.05)

    @property
    def _scale(self) -> float:
        from scipy import special  # imported here: 0.1-0.2 s that commands without this law skip
        return 1 / (self.rate * special.gamma(1 + 1 / self.shape))

    def sample(self, rng: np.random.Generator, duration_s: float) -> np.ndarray:
        scale = self._scale
        return _renewal(rng, lambda n: scale * rng.weibull(self.shape, n), 1 / self.rate, duration_s)

    @property
    def mean_rate(self) -> float:
        return self.rate

    @property
    def gap_var(self) -> float:
        from scipy import special  # imported here: 0.1-0.2 s that commands without this law skip
        g1, g2 = special.gamma(1 + 1 / self.shape), special.gamma(1 + 2 / self.shape)
        return self._scale ** 2 * (g2 - g1 * g1)

    @property
    def cv(self) -> float:
        return math.sqrt(self.gap_var) * self.rate

    def scaled(self, k: float) -> "WeibullRenewal":
        return replace(self, rate=self.rate * k)


@dataclass(frozen=True)
class MMPP2:
    """Two-state Markov-modulated Poisson process (on/off bursts).

    The state alternates: "on" lasts Exp(mean ``mean_on_s``) seconds at ``rate_on`` req/s, "off"
    lasts Exp(mean ``mean_off_s``) at ``rate_off`` (0 for a pure on/off source). The initial state
    is drawn from the stationary law. Inter-arrival moments are those of the stationary
    phase-type law with D0 = Q - diag(rates), D1 = diag(rates).
    """

    rate_on: float
    mean_on_s: float
    mean_off_s: float
    rate_off: float = 0.0

    def __post_init__(self) -> None:
        number("rate_on", self.rate_on, gt=0)
        number("rate_off", self.rate_off, ge=0)
        number("mean_on_s", self.mean_on_s, gt=0)
        number("mean_off_s", self.mean_off_s, gt=0)

    def sample(self, rng: np.random.Generator, duration_s: float) -> np.ndarray:
        p_on = self.mean_on_s / (self.mean_on_s + self.mean_off_s)
        on = bool(rng.random() < p_on)
        t, out = 0.0, []
        while t < duration_s:
            dwell = rng.exponential(self.mean_on_s if on else self.mean_off_s)
            end = min(t + dwell, duration_s)
            out.append(t + _poisson_times(rng, self.rate_on if on else self.rate_off, end - t))
            t, on = t + dwell, not on
        return np.concatenate(out) if out else np.empty(0)

    @property
    def mean_rate(self) -> float:
        return (self.rate_on * self.mean_on_s + self.rate_off * self.mean_off_s) / (
            self.mean_on_s + self.mean_off_s)

    def _gap_moments(self) -> tuple[float, float]:
        a, b = 1 / self.mean_on_s, 1 / self.mean_off_s
        lam = np.array([self.rate_on, self.rate_off])
        d0 = np.array([[-a - lam[0], a], [b, -b - lam[1]]])
        pi = np.array([b, a]) / (a + b)
        alpha = pi * lam / float(pi @ lam)
        m = np.linalg.inv(-d0)
        one = np.ones(2)
        return float(alpha @ m @ one), float(2 * alpha @ m @ m @ one)

    @property
    def gap_var(self) -> float:
        m1, m2 = self._gap_moments()
        return m2 - m1 * m1

    @property
    def cv(self) -> float:
        m1, m2 = self._gap_moments()
        return math.sqrt(m2 - m1 * m1) / m1

    def scaled(self, k: float) -> "MMPP2":
        return replace(self, rate_on=self.rate_on * k, rate_off=self.rate_off * k)


@dataclass(frozen=True)
class Piecewise:
    """Poisson process whose rate is a step function: ``rates[i]`` from ``times[i]`` s on.

    ``times`` starts at 0 and increases; the last rate holds until ``period_s`` (if given, the
    table then repeats with that period) or forever. Sampled by thinning.
    """

    times: tuple
    rates: tuple
    period_s: float | None = None

    def __post_init__(self) -> None:
        t, r = list(self.times), list(self.rates)
        require("times", self.times, len(t) >= 1 and len(t) == len(r),
                "a non-empty list as long as rates")
        for i, x in enumerate(t):
            number(f"times[{i}]", x, ge=0)
        for i, x in enumerate(r):
            number(f"rates[{i}]", x, ge=0)
        require("times", self.times, t[0] == 0 and all(b > a for a, b in zip(t, t[1:])),
                "increasing and starting at 0")
        require("rates", self.rates, max(r) > 0, "not all zero")
        if self.period_s is not None:
            number("period_s", self.period_s, gt=t[-1])
        object.__setattr__(self, "times", tuple(float(x) for x in t))
        object.__setattr__(self, "rates", tuple(float(x) for x in r))

    def rate_at(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=float)
        if self.period_s is not None:
            t = np.mod(t, self.period_s)
        idx = np.searchsorted(np.asarray(self.times), t, side="right") - 1
        return np.asarray(self.rates)[idx]

    def sample(self, rng: np.random.Generator, duration_s: float) -> np.ndarray:
        return _thin(rng, self.rate_at, max(self.rates), duration_s)

    def expected_count(self, duration_s: float) -> float:
        """Integral of the rate over ``[0, duration_s)`` (requests)."""
        grid = np.linspace(0.0, duration_s, 200_001)
        return float(np.trapezoid(self.rate_at(grid), grid))

    @property
    def mean_rate(self) -> float:
        """Average over one period if periodic, else the long-run (last) rate."""
        if self.period_s is None:
            return self.rates[-1]
        edges = np.append(self.times, self.period_s)
        return float(np.dot(np.diff(edges), self.rates) / self.period_s)

    def scaled(self, k: float) -> "Piecewise":
        return replace(self, rates=tuple(r * k for r in self.rates))


@dataclass(frozen=True)
class Diurnal:
    """Poisson process with rate ``rate * (1 + amplitude * sin(2 pi t / period_s + phase))``.

    ``rate`` is the mean rate (req/s), ``amplitude`` in [0, 1] the relative swing, ``phase`` in
    radians (``-pi/2`` starts the day at the trough). Sampled by thinning.
    """

    rate: float
    amplitude: float
    period_s: float = 86_400.0
    phase: float = 0.0

    def __post_init__(self) -> None:
        number("rate", self.rate, gt=0)
        number("amplitude", self.amplitude, ge=0, le=1)
        number("period_s", self.period_s, gt=0)
        number("phase", self.phase)

    def rate_at(self, t: np.ndarray) -> np.ndarray:
        return self.rate * (1 + self.amplitude * np.sin(2 * np.pi * np.asarray(t) / self.period_s
                                                         + self.phase))

    def sample(self, rng: np.random.Generator, duration_s: float) -> np.ndarray:
        return _thin(rng, self.rate_at, self.rate * (1 + self.amplitude), duration_s)

    def expected_count(self, duration_s: float) -> float:
        w = 2 * np.pi / self.period_s
        return float(self.rate * duration_s + self.rate * self.amplitude / w
                     * (math.cos(self.phase) - math.cos(w * duration_s + self.phase)))

    @property
    def mean_rate(self) -> float:
        return self.rate

    def scaled(self, k: float) -> "Diurnal":
        return replace(self, rate=self.rate * k)


@dataclass(frozen=True)
class Batch:
    """A drop of ``n`` requests at ``at_s``, evenly spread over ``spread_s`` seconds if given.

    ``mean_rate`` is ``n / spread_s`` during the drop (infinite when all arrive at once);
    ``scaled(k)`` multiplies ``n`` (rounded).
    """

    n: int
    at_s: float = 0.0
    spread_s: float = 0.0

    def __post_init__(self) -> None:
        integer("n", self.n, ge=0)
        number("at_s", self.at_s, ge=0)
        number("spread_s", self.spread_s, ge=0)

    def sample(self, rng: np.random.Generator, duration_s: float) -> np.ndarray:
        t = self.at_s + self.spread_s * np.arange(self.n) / max(self.n, 1)
        return t[t < duration_s].astype(float)

    @property
    def mean_rate(self) -> float:
        return self.n / self.spread_s if self.spread_s > 0 else math.inf

    @property
    def cv(self) -> float:
        return 0.0

    def scaled(self, k: float) -> "Batch":
        return replace(self, n=int(round(self.n * k)))


@dataclass(frozen=True)
class ClosedLoop:
    """``users`` closed-loop users: each sends, waits for its answer, thinks, sends again.

    ``think`` is a length-model table in seconds (``{dist = "exponential", mean = 5}``) or a
    number. ``mean_rate`` is the upper bound ``users / mean think`` (zero response time).
    The engine drives these through :class:`workloads.build.ClosedLoopStream`.

    ``order``: ``"random"`` (each user draws its requests' lengths; a trace's rows at random)
    or ``"sequential"`` (a benchmark client's semaphore: the users share the stream's trace
    rows in file order, each row sent once, by the first user free, not before the row's own
    ``arrival_s`` if the trace has times; the stream ends with the last row).
    """

    users: int
    think: Any = 0.0
    order: str = "random"

    def __post_init__(self) -> None:
        integer("users", self.users, ge=1)
        if self.order not in ("random", "sequential"):
            raise WorkloadError(f"order: must be 'random' or 'sequential' (got {self.order!r})")
        if not isinstance(self.think, ClippedLength):
            try:
                model = parse_length(self.think, integer_values=False, default_min=0.0)
            except WorkloadError as exc:
                msg = str(exc)
                raise WorkloadError("think" + ("" if msg.startswith(":") else ".") + msg) from None
            object.__setattr__(self, "think", model)

    @property
    def mean_rate(self) -> float:
        m = self.think.mean
        return self.users / m if m > 0 else math.inf

    def scaled(self, k: float) -> "ClosedLoop":
        """Load scale k divides think times by k (the users keep their number)."""
        if k == 1:
            return self
        t = self.think
        think = ClippedLength(_ScaledLaw(t.law, 1 / k), t.min / k, None if t.max is None else t.max / k,
                            False, t.spec)
        return replace(self, think=think)


@dataclass(frozen=True)
class _ScaledLaw:
    """A law whose values are multiplied by ``factor`` (think times under load_scale)."""

    law: Any
    factor: float

    def ppf(self, u: np.ndarray) -> np.ndarray:
        return self.factor * self.law.ppf(u)

    @property
    def mean(self) -> float:
        return self.factor * self.law.mean

    @property
    def var(self) -> float:
        return self.factor ** 2 * self.law.var



for _name, _cls, _desc in [
    ("poisson", Poisson, "Poisson arrivals at `rate` req/s"),
    ("gamma", GammaRenewal, "Gamma renewal: `rate`, inter-arrival `cv`"),
    ("weibull", WeibullRenewal, "Weibull renewal: `rate`, `shape`"),
    ("mmpp2", MMPP2, "on/off bursts: `rate_on`, `rate_off`, `mean_on_s`, `mean_off_s`"),
    ("onoff", MMPP2, "alias of mmpp2 (rate_off defaults to 0)"),
    ("piecewise", Piecewise, "step rate table `times`, `rates` (optional `period_s`), thinning"),
    ("diurnal", Diurnal, "sine rate: mean `rate`, `amplitude`, `period_s`, `phase` (rad), thinning"),
    ("batch", Batch, "`n` requests at `at_s`, optionally spread over `spread_s`"),
    ("closed_loop", ClosedLoop, "`users` closed-loop users with `think` time (s)"),
]:
    ARRIVALS.register(_name, _cls, _desc)


def parse_arrival(spec: Any) -> Any:
    """Build an arrival process from ``{process = name, ...params}``; WorkloadError on bad input."""
    if not isinstance(spec, dict):
        raise WorkloadError(f": must be a table {{ process = ..., ... }} (got {spec!r})")
    if "process" not in spec:
        raise WorkloadError(f"process: missing (expected one of {', '.join(ARRIVALS.names())})")
    name = spec["process"]
    try:
        factory = ARRIVALS.resolve(name)
    except KeyError as exc:
        raise WorkloadError(f"process: {exc.args[0]}") from None
    params = {k: v for k, v in spec.items() if k != "process"}
    if isinstance(factory, type) and factory in (Piecewise,):
        params = {k: tuple(v) if isinstance(v, list) else v for k, v in params.items()}
    proc = made_with(factory, params, f"process '{name}'")
    for attr in ("sample", "mean_rate", "scaled"):
        if not hasattr(proc, attr) and not isinstance(proc, ClosedLoop):
            raise WorkloadError(f"process: '{name}' has no {attr} (not an arrival process)")
    return proc


__all__ = ["ARRIVALS", "Poisson", "GammaRenewal", "WeibullRenewal", "MMPP2", "Piecewise",
           "Diurnal", "Batch", "ClosedLoop", "parse_arrival"]
