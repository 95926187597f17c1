"""Workloads: request streams for priosim, synthetic and from real production traces.

``build_workload(streams, horizon_s=..., seed=..., base_dir=...)`` turns the scenario's
``[[streams]]`` tables into a :class:`Workload`: ``open`` (a DataFrame of pre-generated
requests, seconds and tokens), ``closed`` (closed-loop users the engine drives) and ``meta``.
``validate_streams`` checks the tables first. Arrival processes, length laws and trace formats
live in open registries (``ARRIVALS``, ``LENGTHS``, ``TRACE_LOADERS``: a shipped format is one
file in :mod:`workloads.formats`) whose contracts are the Protocols of :mod:`workloads.contracts`;
a user's own loads by dotted path ``pkg.mod:Class`` (or ``register_format(name, fmt)``).
This package imports nothing from ``sim`` or ``calibrate``. See docs/workloads.md.
"""
from __future__ import annotations

from workloads.arrivals import ARRIVALS, parse_arrival
from workloads.build import REQUIRED_COLUMNS, ClosedLoopStream, Workload, build_workload
from workloads.contracts import ArrivalProcess, LengthLaw, LengthModel, TraceLoader
from workloads.errors import WorkloadError
from workloads.lengths import LENGTHS, ClippedLength, parse_length
from workloads.library import DEFAULT_SCENARIO, SCENARIO_DIR, shipped_scenario, shipped_scenarios
from workloads.stats import stream_stats
from workloads.streams import validate_streams
from workloads.traces import BUNDLED, TRACE_LOADERS, Trace, TraceFormat, load_trace, register_format

__all__ = ["WorkloadError", "Workload", "ClosedLoopStream", "validate_streams", "build_workload",
           "stream_stats", "ARRIVALS", "LENGTHS", "TRACE_LOADERS", "ArrivalProcess", "LengthLaw",
           "LengthModel", "TraceLoader", "ClippedLength", "Trace", "TraceFormat", "register_format", "parse_arrival", "parse_length",
           "load_trace", "BUNDLED", "REQUIRED_COLUMNS", "SCENARIO_DIR", "DEFAULT_SCENARIO", "shipped_scenario",
           "shipped_scenarios"]
