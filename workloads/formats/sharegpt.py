"""The ShareGPT length table (Sarathi-Serve's): ``num_prefill_tokens, num_decode_tokens``, no
times (a stream that reads it needs an ``arrival`` process).
"""
from __future__ import annotations

from pathlib import Path

from workloads.traceformat import Trace, TraceFormat, register_format
from workloads.tracefile import csv_chunks
from workloads.tracerows import Columns, read_table


def load_sharegpt(path: Path, spec: dict, lenient: bool, until_s: float | None = None) -> Trace:
    """ShareGPT length table (Sarathi-Serve): ``num_prefill_tokens``, ``num_decode_tokens``."""
    cols = Columns(None, "s", "num_prefill_tokens", "num_decode_tokens")
    rows, df, lines = read_table(path, csv_chunks(path), cols, spec, lenient, None)
    return rows.trace(df, lines)


register_format("sharegpt", TraceFormat(load_sharegpt, "ShareGPT length table (lengths only)", times=False))
