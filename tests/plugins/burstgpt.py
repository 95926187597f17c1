"""A trace format in one file: BurstGPT's CSV (Azure OpenAI service logs, Wang et al. 2024).

Columns ``Timestamp`` (seconds from the trace's start), ``Model``, ``Request tokens``,
``Response tokens``, ``Total tokens``, ``Log Type``; rows sorted by time. Named in a scenario as
``trace = { format = "tests.plugins.burstgpt:BURSTGPT", path = "BurstGPT_1.csv" }``, or
registered under a short name with ``workloads.register_format("burstgpt", BURSTGPT)``. The rows
are checked as the shipped formats' are (bad ones named by file and line; lenient mode skips
them), and a short run stops reading past its horizon (``streams=True``).
"""
from pathlib import Path

from workloads.traceformat import Trace, TraceFormat
from workloads.tracefile import csv_chunks
from workloads.tracerows import Columns, read_table


def load_burstgpt(path: Path, spec: dict, lenient: bool, until_s: float | None = None) -> Trace:
    cols = Columns("Timestamp", "s", "Request tokens", "Response tokens")
    rows, df, lines = read_table(path, csv_chunks(path), cols, spec, lenient, until_s)
    return rows.trace(df, lines)


BURSTGPT = TraceFormat(load_burstgpt, "BurstGPT CSV (s timestamps, request and response tokens)", streams=True)
