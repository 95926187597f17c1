"""Mooncake (Kimi) JSON lines: ``timestamp`` (ms), ``input_length``, ``output_length`` and the
prompt's prefix-block hashes ``hash_ids``. Reads the option ``spread_bucket_s``.
"""
from __future__ import annotations

from pathlib import Path

from workloads.errors import number
from workloads.traceformat import Trace, TraceFormat, register_format
from workloads.tracefile import json_chunks
from workloads.tracerows import Columns, read_table


def load_mooncake(path: Path, spec: dict, lenient: bool, until_s: float | None = None) -> Trace:
    """Mooncake JSONL: ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``.

    Requests sharing one timestamp are spread evenly over ``spread_bucket_s`` (default 3 s, the
    trace's bucketing): the k-th of n goes to ``t + spread * k / n``; 0 keeps them as a batch.
    """
    spread = number("spread_bucket_s", spec.get("spread_bucket_s", 3.0), ge=0)
    cols = Columns("timestamp", "ms", "input_length", "output_length", hash_ids="hash_ids")
    fields = ["timestamp", "input_length", "output_length"]
    rows, df, lines = read_table(path, json_chunks(path, fields), cols, spec, lenient, until_s, json_fields=fields)
    df = df[["arrival_s", "prompt_tokens", "output_tokens", "hash_ids"]] if len(df) else df
    tr = rows.trace(df, lines)
    if spread > 0 and len(tr.df):
        # (the read stops past the last row needed: every timestamp it kept has all its requests)
        g = tr.df.groupby("arrival_s", sort=False)["arrival_s"]
        k = g.cumcount().to_numpy()
        n = g.transform("size").to_numpy()
        tr.df["arrival_s"] = tr.df["arrival_s"].to_numpy() + spread * k / n
    return tr


register_format("mooncake", TraceFormat(
    load_mooncake, "Mooncake JSONL (ms timestamps, hash_ids)",
    options={"spread_bucket_s": lambda v: number("spread_bucket_s", v, ge=0)}, streams=True))
