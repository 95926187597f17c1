"""Per-request parity of a replay: measured against simulated TTFT and E2E, one point per
request, the diagonal drawn (matplotlib, imported here only)."""
from __future__ import annotations

from pathlib import Path


def parity(cmp, path: str | Path, fmt: str = "png") -> None:
    """Draw ``cmp``'s (a :class:`~calibrate.runs.compare.Comparison`) parity plots into ``path``
    in format ``fmt`` (png, svg or pdf: the suffix of the file the user named; ``path`` may be a
    temporary file's)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = cmp.requests
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.2))
    for ax, key, title in ((axes[0], "ttft", "TTFT"), (axes[1], "e2e", "E2E latency")):
        x, y = r[f"{key}_measured_s"] * 1e3, r[f"{key}_simulated_s"] * 1e3
        ax.scatter(x, y, s=8, alpha=0.6)
        hi = float(max(x.max(), y.max())) * 1.05 if len(r) else 1.0
        ax.plot([0, hi], [0, hi], color="grey", lw=1)
        ax.set_xlim(0, hi)
        ax.set_ylim(0, hi)
        ax.set_xlabel(f"measured {title} (ms)")
        ax.set_ylabel(f"simulated {title} (ms)")
        ax.set_title(title)
    fig.suptitle(f"replay ({cmp.mode}): {len(r)} requests")
    fig.tight_layout()
    fig.savefig(path, format=fmt, dpi=110)
    plt.close(fig)
