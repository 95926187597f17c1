"""Per (tenant, class) statistics of a request table: what ``priosim workload`` prints.

Rates are requests/s over ``horizon_s`` (default: 0 to the last arrival in the table);
inter-arrival CV is std/mean of the gaps within the group (population std); token
percentiles use numpy's default linear interpolation.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

COLUMNS = ["tenant", "cls", "count", "rate", "interarrival_cv", "prompt_mean", "prompt_p50",
           "prompt_p99", "output_mean", "output_p50", "output_p99"]


def stream_stats(df: pd.DataFrame, horizon_s: float | None = None) -> pd.DataFrame:
    """One row per (tenant, cls): count, rate (req/s), inter-arrival CV, token mean/p50/p99."""
    if len(df) == 0:
        return pd.DataFrame({c: [] for c in COLUMNS})
    span = float(horizon_s) if horizon_s is not None else float(df["arrival_s"].max())
    rows = []
    for (tenant, cls), g in df.groupby(["tenant", "cls"], sort=True):
        gaps = np.diff(np.sort(g["arrival_s"].to_numpy()))
        cv = float(gaps.std() / gaps.mean()) if gaps.size >= 2 and gaps.mean() > 0 else float("nan")
        p = g["prompt_tokens"].to_numpy(dtype=float)
        o = g["output_tokens"].to_numpy(dtype=float)
        pq = np.quantile(p, [0.5, 0.99])
        oq = np.quantile(o, [0.5, 0.99])
        rows.append([tenant, cls, len(g), len(g) / span if span > 0 else float("nan"), cv,
                     p.mean(), pq[0], pq[1], o.mean(), oq[0], oq[1]])
    return pd.DataFrame(rows, columns=COLUMNS)


__all__ = ["stream_stats"]
