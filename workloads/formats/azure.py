"""The Azure LLM inference trace 2023 (CSV): ``TIMESTAMP, ContextTokens, GeneratedTokens``.

Timestamps are dates and times with 7-digit fractions (100 ns), taken as seconds after ``t0``
(default: the first row). Bundled as ``azure_code`` and ``azure_conv``.
"""
from __future__ import annotations

from pathlib import Path

from workloads.traceformat import Trace, TraceFormat, register_format
from workloads.tracefile import csv_chunks
from workloads.tracerows import Columns, read_table


def load_azure(path: Path, spec: dict, lenient: bool, until_s: float | None = None) -> Trace:
    """Azure LLM inference trace 2023: ``TIMESTAMP, ContextTokens, GeneratedTokens``."""
    cols = Columns("TIMESTAMP", "datetime", "ContextTokens", "GeneratedTokens")
    rows, df, lines = read_table(path, csv_chunks(path), cols, spec, lenient, until_s)
    return rows.trace(df, lines)


register_format("azure", TraceFormat(load_azure, "Azure LLM inference trace 2023 (CSV)", streams=True))
