"""Length models: token counts for prompts and outputs, and think times in seconds.

Each *law* (``Constant``, ``Uniform``, ``Exponential``, ``Lognormal``, ``Zipf``, ``Empirical``) is a
small object with an inverse CDF ``ppf(u)`` and analytic ``mean`` and ``var``. Sampling always goes
through ``ppf`` of uniforms drawn from the simulation's own generator, which is what lets a
Gaussian copula correlate prompt and output lengths (:func:`sample_pair`).

A :class:`ClippedLength` (the shipped :class:`~workloads.contracts.LengthModel`) wraps a law with
``min``/``max`` clipping and, for token counts, rounding to integers (nearest integer;
``Uniform`` draws each integer of ``[low, high]`` with equal chance).
``mean``/``var`` describe the law *before* clipping (for the discrete laws they are exact; for
the continuous ones rounding adds at most 1/12 to the variance).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from plumbing.registry import Registry
from workloads.contracts import LengthModel
from workloads.errors import WorkloadError, integer, made_with, number, prefixed, require, unknown_keys

LENGTHS = Registry("length model")  # laws: workloads.contracts.LengthLaw


@dataclass(frozen=True)
class Constant:
    """Always ``value`` (tokens or seconds)."""

    value: float

    def __post_init__(self) -> None:
        number("value", self.value, ge=0)

    def ppf(self, u: np.ndarray) -> np.ndarray:
        return np.full(np.shape(u), float(self.value))

    @property
    def mean(self) -> float:
        return float(self.value)

    @property
    def var(self) -> float:
        return 0.0


@dataclass(frozen=True)
class Uniform:
    """Uniform on ``[low, high]``; as token counts every integer in it is equally likely."""

    low: float
    high: float

    def __post_init__(self) -> None:
        number("low", self.low, ge=0)
        number("high", self.high)
        require("high", self.high, self.high >= self.low, f">= low ({self.low})")

    def ppf(self, u: np.ndarray) -> np.ndarray:
        return self.low + np.asarray(u, dtype=float) * (self.high - self.low)

    def integer_ppf(self, u: np.ndarray) -> np.ndarray:
        lo, hi = math.ceil(self.low), math.floor(self.high)
        k = np.floor(np.asarray(u, dtype=float) * (hi - lo + 1))
        return lo + np.minimum(k, hi - lo)

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2

    @property
    def var(self) -> float:
        return (self.high - self.low) ** 2 / 12

    @property
    def integer_var(self) -> float:
        n = math.floor(self.high) - math.ceil(self.low) + 1
        return (n * n - 1) / 12


@dataclass(frozen=True)
class Exponential:
    """Exponential with the given ``mean`` (tokens or seconds); CV = 1."""

    mean: float

    def __post_init__(self) -> None:
        number("mean", self.mean, gt=0)

    def ppf(self, u: np.ndarray) -> np.ndarray:
        return -self.mean * np.log1p(-np.asarray(u, dtype=float))

    @property
    def var(self) -> float:
        return self.mean ** 2


@dataclass(frozen=True)
class Lognormal:
    """Lognormal: ``median * exp(sigma * Z)``, Z standard normal."""

    median: float
    sigma: float

    def __post_init__(self) -> None:
        number("median", self.median, gt=0)
        number("sigma", self.sigma, ge=0)

    def ppf(self, u: np.ndarray) -> np.ndarray:
        from scipy import special  # imported here: 0.1-0.2 s that commands without this law skip
        with np.errstate(divide="ignore"):
            return self.median * np.exp(self.sigma * special.ndtri(np.asarray(u, dtype=float)))

    @property
    def mean(self) -> float:
        return self.median * math.exp(self.sigma ** 2 / 2)

    @property
    def var(self) -> float:
        s2 = self.sigma ** 2
        return (math.exp(s2) - 1) * self.median ** 2 * math.exp(s2)


class Empirical:
    """A discrete law on ``values`` with probabilities ``probs`` (normalised; default equal).

    Built from a value->probability table, or from a trace column (every row one value).
    """

    def __init__(self, values: Any, probs: Any = None) -> None:
        v = np.asarray(values, dtype=float)
        require("values", values, v.ndim == 1 and v.size > 0, "a non-empty list of numbers")
        require("values", values, bool(np.all(np.isfinite(v))) and bool(np.all(v >= 0)),
                "non-negative finite numbers")
        p = np.ones_like(v) if probs is None else np.asarray(probs, dtype=float)
        require("probs", probs, p.shape == v.shape, f"a list of {v.size} probabilities (one per value)")
        require("probs", probs, bool(np.all(p >= 0)) and p.sum() > 0,
                "non-negative with a positive sum")
        order = np.argsort(v, kind="stable")
        self.values = v[order]
        self.probs = p[order] / p.sum()
        self._cdf = np.cumsum(self.probs)
        self._cdf[-1] = 1.0

    def ppf(self, u: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(self._cdf, np.asarray(u, dtype=float), side="right")
        return self.values[np.minimum(idx, self.values.size - 1)]

    integer_ppf = None  # values are used as they are (rounded only if they are not integers)

    @property
    def mean(self) -> float:
        return float(np.dot(self.values, self.probs))

    @property
    def var(self) -> float:
        return float(np.dot((self.values - self.mean) ** 2, self.probs))

    def __repr__(self) -> str:
        return f"Empirical({self.values.size} values, mean={self.mean:.4g})"


class Zipf(Empirical):
    """Bounded Zipf on ``1..n``: P(k) proportional to ``k ** -a`` (``a`` > 0)."""

    def __init__(self, a: float, n: int) -> None:
        number("a", a, gt=0)
        n = integer("n", n, ge=1)
        require("n", n, n <= 10_000_000, "<= 10,000,000")
        k = np.arange(1, n + 1, dtype=float)
        super().__init__(k, k ** -float(a))
        self.a, self.n = float(a), n

    def __repr__(self) -> str:
        return f"Zipf(a={self.a}, n={self.n})"


for _name, _cls, _desc in [
    ("constant", Constant, "always `value`"),
    ("uniform", Uniform, "uniform on [low, high]"),
    ("exponential", Exponential, "exponential with `mean`"),
    ("lognormal", Lognormal, "lognormal with `median` and `sigma`"),
    ("zipf", Zipf, "bounded Zipf on 1..n with exponent `a`"),
    ("empirical", Empirical, "`values` with `probs`, or a trace `column`"),
]:
    LENGTHS.register(_name, _cls, _desc)


@dataclass(frozen=True)
class ClippedLength:
    """A law (:class:`~workloads.contracts.LengthLaw`) with clipping to ``[min, max]``; ``integer`` rounds (token counts)."""

    law: Any
    min: float = 1
    max: float | None = None
    integer: bool = True
    spec: Any = field(default=None, compare=False)

    def from_uniform(self, u: np.ndarray) -> np.ndarray:
        """Map uniforms in [0, 1) to clipped values (int64 tokens, or float64 seconds)."""
        ippf = getattr(self.law, "integer_ppf", None)
        if self.integer and ippf is not None:
            x = ippf(u)
        else:
            x = self.law.ppf(u)
            if self.integer:
                x = np.rint(x)
        x = np.clip(x, self.min, np.inf if self.max is None else self.max)
        return x.astype(np.int64) if self.integer else x.astype(np.float64)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.from_uniform(rng.random(n))

    @property
    def mean(self) -> float:
        return float(self.law.mean)

    @property
    def var(self) -> float:
        if self.integer and hasattr(self.law, "integer_var"):
            return float(self.law.integer_var)
        return float(self.law.var)

    def upper_bound(self) -> int:
        """``max`` if given, else the law's 99.99th percentile rounded up (at least ``min``)."""
        if self.max is not None:
            return int(math.ceil(self.max))
        q = float(self.from_uniform(np.array([0.9999]))[0])
        return int(math.ceil(max(q, self.min)))


def parse_length(spec: Any, *, integer_values: bool = True, default_min: float = 1,
                 column_loader: Any = None) -> ClippedLength:
    """Build a :class:`ClippedLength` from a bare number or a ``{dist = ..., ...}`` table.

    ``column_loader(trace_spec, column) -> array`` supplies values for
    ``{dist = "empirical", trace = {...}, column = "prompt_tokens"}``.
    Errors are :class:`WorkloadError` with the key relative to ``spec`` (callers add the path).
    """
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        if integer_values:
            integer("", spec, ge=1 if default_min >= 1 else 0)
        return ClippedLength(Constant(float(number("", spec, ge=0))), min=default_min,
                           integer=integer_values, spec=spec)
    if not isinstance(spec, dict):
        raise WorkloadError(f": must be a number or a table {{ dist = ... }} (got {spec!r})")
    if "dist" not in spec:
        raise WorkloadError(f"dist: missing (expected one of {', '.join(LENGTHS.names())})")
    name = spec["dist"]
    try:
        factory = LENGTHS.resolve(name)
    except KeyError as exc:
        raise WorkloadError(f"dist: {exc.args[0]}") from None
    params = {k: v for k, v in spec.items() if k not in ("dist", "min", "max")}
    lo = spec.get("min", default_min)
    hi = spec.get("max")
    if integer_values:
        lo = integer("min", lo, ge=0)
        hi = None if hi is None else integer("max", hi, ge=max(lo, 1))
    else:
        lo = number("min", lo, ge=0)
        hi = None if hi is None else number("max", hi, ge=lo)
    if name == "empirical" and "trace" in params:
        unknown_keys("", params, ["trace", "column"])
        require("column", params.get("column"), isinstance(params.get("column"), str),
                "a column name such as 'prompt_tokens'")
        if column_loader is None:
            raise WorkloadError("trace: empirical-from-trace needs a base directory")
        params = {"values": column_loader(params["trace"], params["column"])}
    elif name == "empirical" and params.get("probs") is not None:
        # a user's table must be a distribution (a typo in one entry would otherwise be
        # silently renormalised away)
        probs = params["probs"]
        try:
            total = float(np.sum(np.asarray(probs, dtype=float)))
        except (TypeError, ValueError):
            total = 1.0  # not numbers: the law's own check names it
        require("probs", probs, abs(total - 1.0) <= 1e-6, f"probabilities that sum to 1 (they sum to {total:.6g})")
    elif name == "zipf" and "n" not in params and hi is not None:
        params["n"] = hi
    law = made_with(factory, params, f"dist '{name}'", also="min, max")
    return ClippedLength(law, min=lo, max=hi, integer=integer_values, spec=spec)


def correlated_uniforms(rng: np.random.Generator, n: int, rho: float) -> tuple[np.ndarray, np.ndarray]:
    """Two uniform vectors joined by a Gaussian copula with correlation ``rho`` (-1..1)."""
    from scipy import special  # imported here (not scipy.stats: seconds): importing it takes 0.1-0.2 s
    z1 = rng.standard_normal(n)
    z2 = rho * z1 + math.sqrt(max(0.0, 1 - rho * rho)) * rng.standard_normal(n)
    return special.ndtr(z1), special.ndtr(z2)  # the standard normal CDF (what scipy.stats.norm.cdf computes)


def sample_pair(rng: np.random.Generator, n: int, prompt: LengthModel, output: LengthModel,
                rho: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Sample ``n`` (prompt, output) lengths; ``rho`` != 0 couples them by a Gaussian copula."""
    if rho == 0.0:
        return prompt.sample(rng, n), output.sample(rng, n)
    u1, u2 = correlated_uniforms(rng, n, rho)
    return prompt.from_uniform(u1), output.from_uniform(u2)


__all__ = ["LENGTHS", "Constant", "Uniform", "Exponential", "Lognormal", "Zipf", "Empirical",
           "ClippedLength", "parse_length", "sample_pair", "correlated_uniforms", "prefixed"]
