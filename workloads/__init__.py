"""Workloads: request streams for priosim, synthetic and from real production traces.

``build_workload(streams, horizon_s=..., seed=..., base_dir=...)`` turns the scenario's
``[[streams]]`` tables into a :class:`Workload`: ``open`` (a DataFrame of pre-generated
requests, seconds and tokens), ``closed`` (closed-loop users the engine drives) and ``meta``.
``validate_streams`` checks the tables first. Arrival processes and length models live in open
registries (``ARRIVALS``, ``LENGTHS``); a user's own loads by dotted path ``pkg.mod:Class``.
This package imports nothing from ``sim`` or ``calibrate``. See docs/workloads.md.
"""
from __future__ import annotations

from workloads.arrivals import ARRIVALS, parse_arrival
from workloads.build import (REQUIRED_COLUMNS, ClosedLoopStream, Workload, build_workload,
                             validate_streams)
from workloads.errors import WorkloadError
from workloads.lengths import LENGTHS, LengthModel, parse_length
from workloads.stats import stream_stats
from workloads.traces import BUNDLED, load_trace

__all__ = ["WorkloadError", "Workload", "ClosedLoopStream", "validate_streams", "build_workload",
           "stream_stats", "ARRIVALS", "LENGTHS", "LengthModel", "parse_arrival", "parse_length",
           "load_trace", "BUNDLED", "REQUIRED_COLUMNS"]
