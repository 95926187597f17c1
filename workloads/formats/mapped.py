"""The ``columns`` mapping the generic formats (``csv``, ``jsonl``) read a file through:
``columns = {arrival_s = ..., prompt_tokens = ..., output_tokens = ..., max_tokens?, hash_ids?,
tenant?, class?, f_name?}``, each the file's column that holds it (``max_tokens``: the cap each
request's client sent, which SGLang's admission reserves; without it a stream's default applies).
"""
from __future__ import annotations

import pandas as pd

from workloads.errors import require
from workloads.tracerows import Columns

#: the ``columns`` keys that are not features: what each row's column becomes
MAPPED = ("arrival_s", "prompt_tokens", "output_tokens", "max_tokens", "hash_ids", "tenant", "class")


def mapping(spec: dict) -> dict[str, str]:
    """The trace table's ``columns``, checked (no file read): ours -> the file's column."""
    cols = spec.get("columns")
    require("columns", cols, isinstance(cols, dict),
            "a table {arrival_s = ..., prompt_tokens = ..., output_tokens = ...}")
    for k, v in cols.items():
        ok = k in MAPPED or k.startswith("f_")
        require(f"columns.{k}", k, ok, "one of arrival_s, prompt_tokens, output_tokens, "
                "max_tokens, hash_ids, tenant, class, or a feature name starting with f_")
        require(f"columns.{k}", v, isinstance(v, str), "a column name")
    for k in ("prompt_tokens", "output_tokens"):
        require(f"columns.{k}", None, k in cols, "given (the column holding it)")
    return cols


def generic_columns(spec: dict) -> Columns:
    cols = mapping(spec)
    return Columns(cols.get("arrival_s"), spec.get("time_unit", "s"), cols["prompt_tokens"], cols["output_tokens"],
                   names={ours: cols[k] for k, ours in (("tenant", "tenant"), ("class", "cls")) if k in cols},
                   features={k: c for k, c in cols.items() if k.startswith("f_")},
                   hash_ids=cols.get("hash_ids"), max_tokens=cols.get("max_tokens"), datetime_hint=True,
                   sort_first=True)


def generic_order(df: pd.DataFrame, spec: dict) -> pd.DataFrame:
    """The table's columns in the mapping's order after the three fixed ones (as before chunks)."""
    cols = mapping(spec)
    first = [c for c in ("arrival_s", "prompt_tokens", "output_tokens") if c in df.columns]
    rest = [k for k in cols if k.startswith("f_") or k in ("hash_ids", "max_tokens")]
    names = [ours for k, ours in (("tenant", "tenant"), ("class", "cls")) if k in cols]
    return df[first + rest + names] if len(df.columns) else df


def mapped_times(spec: dict) -> bool:
    """Whether the rows carry arrival times: the mapping names an ``arrival_s`` column."""
    return "arrival_s" in spec.get("columns", {})
