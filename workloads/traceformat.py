"""What a trace format is and where formats are registered: :class:`Trace` (a loaded, checked
table), :class:`TraceFormat` (a load function and what it reads) and ``TRACE_LOADERS``, the open
registry of formats (a ``plumbing.registry.Registry``, like every pluggable piece).

A shipped format is one file in :mod:`workloads.formats` ending in one :func:`register_format`
call; a user's format is a :class:`TraceFormat` in their own module, named by its dotted path
(``format = "pkg.mod:obj"``), or registered by the same call.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd

from plumbing.registry import Registry


@dataclass
class Trace:
    """A loaded, checked trace table and where it came from."""

    df: pd.DataFrame
    source: str
    rows_read: int
    rows_skipped: int = 0
    zero_lengths: int = 0
    skipped_examples: list[str] = field(default_factory=list)
    #: each row's 1-based line in the file (None: not known, e.g. a user's own format)
    lines: np.ndarray | None = None
    #: False when reading stopped past the last row needed (``until_s``): ``rows_read`` then
    #: counts the rows read up to there, not the file's
    complete: bool = True

    @property
    def has_times(self) -> bool:
        return "arrival_s" in self.df.columns


@dataclass(frozen=True)
class TraceFormat:
    """A registered trace format (:class:`~workloads.contracts.TraceLoader`) built from its load
    function ``read(path, spec, lenient) -> Trace``. ``times``: whether rows carry arrival
    times, or a function of the table saying so. ``checker(spec)``: checks of the table beyond
    its options' own (no file read). ``per_request=False``: sampled window by window (ServeGen),
    not read here. ``streams``: ``read`` also takes ``until_s`` (seconds after t0) and stops
    reading past it (the rows are sorted by time)."""

    read: Callable[..., Trace] | None
    description: str = ""
    times: bool | Callable[[dict], bool] = True
    options: Mapping[str, Callable[[Any], Any] | None] = field(default_factory=dict)
    checker: Callable[[dict], None] | None = None
    per_request: bool = True
    streams: bool = False

    def check(self, spec: dict) -> None:
        if self.checker is not None:
            self.checker(spec)

    def has_times(self, spec: dict) -> bool:
        return self.times(spec) if callable(self.times) else self.times

    def load(self, path: Path, spec: dict, lenient: bool, until_s: float | None = None) -> Trace:
        assert self.read is not None, "not a per-request format"
        if self.streams:
            return self.read(path, spec, lenient, until_s=until_s)
        return self.read(path, spec, lenient)


TRACE_LOADERS = Registry("trace format")


def register_format(name: str, fmt: TraceFormat) -> None:
    """Add a trace format (a name used twice is an error)."""
    TRACE_LOADERS.register(name, fmt, fmt.description)


def formats() -> list[str]:
    """The registered format names, in the order they were registered."""
    return TRACE_LOADERS.names(sort=False)
