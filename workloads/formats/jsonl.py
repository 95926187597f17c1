"""Any JSON-lines file, read through a ``columns`` mapping (:mod:`workloads.formats.mapped`); a
row without a mapped field is a bad row, but for the tenant and class (the stream's own then)."""
from __future__ import annotations

from pathlib import Path

from workloads.formats.mapped import generic_columns, generic_order, mapped_times, mapping
from workloads.traceformat import Trace, TraceFormat, register_format
from workloads.tracefile import json_chunks
from workloads.tracerows import read_table


def load_jsonl(path: Path, spec: dict, lenient: bool, until_s: float | None = None) -> Trace:
    """Any JSON-lines file, read through a ``columns`` mapping (missing field = bad row, but for
    the tenant and class)."""
    cols = generic_columns(spec)
    fields = list(dict.fromkeys(mapping(spec).values()))
    named = set(cols.names.values())
    required = [f for f in fields if f not in named]  # (each one a row must have)
    rows, df, lines = read_table(path, json_chunks(path, fields), cols, spec, lenient, until_s, json_fields=required)
    return rows.trace(generic_order(df, spec), lines)


register_format("jsonl", TraceFormat(load_jsonl, "any JSON lines through a columns mapping", times=mapped_times,
                                     options={"columns": None}, checker=mapping, streams=True))
