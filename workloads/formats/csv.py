"""Any CSV file with a header, read through a ``columns`` mapping (:mod:`workloads.formats.mapped`)."""
from __future__ import annotations

from pathlib import Path

from workloads.formats.mapped import generic_columns, generic_order, mapped_times, mapping
from workloads.traceformat import Trace, TraceFormat, register_format
from workloads.tracefile import csv_chunks
from workloads.tracerows import read_table


def load_csv(path: Path, spec: dict, lenient: bool, until_s: float | None = None) -> Trace:
    """Any CSV with a header, read through ``columns = {arrival_s=..., prompt_tokens=..., ...}``."""
    rows, df, lines = read_table(path, csv_chunks(path), generic_columns(spec), spec, lenient, until_s)
    return rows.trace(generic_order(df, spec), lines)


register_format("csv", TraceFormat(load_csv, "any CSV through a columns mapping", times=mapped_times,
                                   options={"columns": None}, checker=mapping, streams=True))
