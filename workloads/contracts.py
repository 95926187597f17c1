"""What a workload piece must provide: the contracts behind the registries.

* :class:`ArrivalProcess`: an open arrival process (registry ``workloads.ARRIVALS``);
* :class:`LengthLaw`: a law of token counts or seconds (registry ``workloads.LENGTHS``), which
  :class:`LengthModel` clips and rounds into what a stream samples;
* :class:`TraceLoader`: a per-request trace format (registry ``workloads.TRACE_LOADERS``).

A user's own piece needs no base class: any object with these members works, registered by
name or named by a dotted path ``pkg.mod:Class``. The shipped ones are frozen dataclasses
validated in ``__post_init__`` (a bad parameter raises :class:`~workloads.errors.WorkloadError`
naming it).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:  # (traces.py imports this module)
    from workloads.traceformat import Trace


@runtime_checkable
class ArrivalProcess(Protocol):
    """When an open stream's requests arrive, on the stream's own clock (seconds).

    Optional, for statistics and tests: ``cv`` (inter-arrival coefficient of variation) and
    ``gap_var`` (inter-arrival variance, s^2).
    """

    def sample(self, rng: np.random.Generator, duration_s: float) -> np.ndarray:
        """Sorted float64 arrival times in ``[0, duration_s)``, drawn only from ``rng``."""
        ...

    @property
    def mean_rate(self) -> float:
        """The long-run arrival rate, requests/s (analytic, not estimated)."""
        ...

    def scaled(self, k: float) -> "ArrivalProcess":
        """The same process with every rate multiplied by ``k`` (the scenario's load_scale)."""
        ...


@runtime_checkable
class LengthLaw(Protocol):
    """A distribution of non-negative values (tokens, or seconds of think time), sampled by
    its inverse CDF so that two laws can be correlated through their uniforms.

    Optional: ``integer_ppf(u)`` (a law with its own integer version, e.g. every integer of a
    uniform range equally likely) and ``integer_var``.
    """

    def ppf(self, u: np.ndarray) -> np.ndarray:
        """Values at the quantiles ``u`` in [0, 1)."""
        ...

    @property
    def mean(self) -> float: ...

    @property
    def var(self) -> float: ...


@runtime_checkable
class LengthModel(Protocol):
    """What a stream draws its prompt and output lengths (or think times) from: a law clipped
    to ``[min, max]`` and, for token counts, rounded (:class:`workloads.lengths.ClippedLength`)."""

    def from_uniform(self, u: np.ndarray) -> np.ndarray:
        """Clipped values at the quantiles ``u`` (int64 tokens, or float64 seconds)."""
        ...

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray: ...

    @property
    def mean(self) -> float:
        """The law's mean before clipping."""
        ...

    @property
    def var(self) -> float: ...

    def upper_bound(self) -> int:
        """The largest value it draws (``max``, or a high quantile when unbounded)."""
        ...


@runtime_checkable
class TraceLoader(Protocol):
    """One trace format: how a ``trace = { format = NAME, path = ..., ... }`` table is checked
    and its file read. ``workloads.traces.TraceFormat`` builds one from a load function.

    ``options``: the keys of the trace table it reads beyond the common ones (``format, path,
    t0, time_unit, window, sample``), each with a check of its value (or None when
    :meth:`check` looks at it). ``per_request``: False for a format that is sampled window by
    window rather than read row by row (ServeGen clients).
    """

    options: Mapping[str, Callable[[Any], Any] | None]
    per_request: bool

    def check(self, spec: dict) -> None:
        """Raise WorkloadError for a bad table (without reading the file)."""
        ...

    def has_times(self, spec: dict) -> bool:
        """Whether its rows carry arrival times (else the stream needs an ``arrival``)."""
        ...

    def load(self, path: Path, spec: dict, lenient: bool) -> "Trace":
        """The checked table: bad rows raise (naming file and line) or, when ``lenient``, are
        skipped and counted."""
        ...


__all__ = ["ArrivalProcess", "LengthLaw", "LengthModel", "TraceLoader"]
