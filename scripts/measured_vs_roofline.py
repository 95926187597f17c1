"""A measured profile's step times against the analytic roofline of the same device and model.

For every decode row (batch x context) and every single-prompt prefill row (``dense``: one
prompt of T tokens) of the measured profile, prints the measured median next to what the
roofline profile prices for the same step, alone (``--overhead none``) and with the roofline's
declared engine overhead (``vllm-v1`` for the shipped GPU profiles), as a Markdown table, and
draws both as a figure. Usage::

    python -m scripts.measured_vs_roofline [--measured h200-llama-3-8b-measured]
        [--roofline h200-llama-3-8b] [--out results]

writes ``OUT/measured_vs_roofline.md`` and ``OUT/measured_vs_roofline.png``.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from sim.core.costs import load_profile


def compare_rows(measured: str, roofline: str) -> list[dict]:
    """One dict per decode and dense row of ``measured``: kind, batch, context or tokens, the
    measured seconds, the roofline's alone and with its declared overhead."""
    m = load_profile(measured)
    alone = load_profile(roofline, overhead="none")
    with_ov = load_profile(roofline)
    out = []
    for r in m.raw.get("rows", []):
        if r.get("kind") == "decode":
            args = dict(D=r["D"], sum_ctx=r["sum_ctx"])
            row = {"op": "decode", "batch": r["batch"], "size": r["context"]}
        elif r.get("kind") == "dense":
            args = dict(P=r["P"], sum_l2=r["sum_l2"])
            row = {"op": "prefill", "batch": 1, "size": r["tokens"]}
        else:
            continue
        row.update(measured_s=float(r["time_s"]), roofline_s=alone.step_s(**args),
                   roofline_overhead_s=with_ov.step_s(**args))
        out.append(row)
    return out


def markdown(rows: list[dict], measured: str, roofline: str, overhead: str) -> str:
    lines = [f"Measured `{measured}` against the roofline `{roofline}` (alone, and with its declared "
             f"`{overhead}` overhead); milliseconds per step.", "",
             "| op | batch | context / tokens | measured | roofline | roofline + overhead | measured / roofline |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['op']} | {r['batch']} | {r['size']} | {r['measured_s'] * 1e3:.2f} | "
                     f"{r['roofline_s'] * 1e3:.2f} | {r['roofline_overhead_s'] * 1e3:.2f} | "
                     f"{r['measured_s'] / r['roofline_s']:.2f} |")
    return "\n".join(lines) + "\n"


def figure(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_d, ax_p) = plt.subplots(1, 2, figsize=(11, 4.2))
    contexts = sorted({r["size"] for r in rows if r["op"] == "decode"})
    for i, ctx in enumerate(contexts):
        pts = sorted((r["batch"], r) for r in rows if r["op"] == "decode" and r["size"] == ctx)
        b = [p for p, _ in pts]
        color = f"C{i}"
        ax_d.plot(b, [r["measured_s"] * 1e3 for _, r in pts], "o-", color=color, label=f"context {ctx}: measured")
        ax_d.plot(b, [r["roofline_s"] * 1e3 for _, r in pts], ":", color=color)
        ax_d.plot(b, [r["roofline_overhead_s"] * 1e3 for _, r in pts], "--", color=color)
    ax_d.plot([], [], "k:", label="roofline")
    ax_d.plot([], [], "k--", label="roofline + engine overhead")
    ax_d.set(xscale="log", yscale="log", xlabel="decode batch (sequences)", ylabel="step time (ms)",
             title="decode step (CUDA graph)")
    ax_d.legend(fontsize=7)
    pre = sorted((r["size"], r) for r in rows if r["op"] == "prefill")
    t = [s for s, _ in pre]
    ax_p.plot(t, [r["measured_s"] * 1e3 for _, r in pre], "o-", label="measured")
    ax_p.plot(t, [r["roofline_s"] * 1e3 for _, r in pre], ":", color="k", label="roofline")
    ax_p.plot(t, [r["roofline_overhead_s"] * 1e3 for _, r in pre], "--", color="k", label="roofline + engine overhead")
    ax_p.set(xscale="log", yscale="log", xlabel="prompt tokens (one prompt)", ylabel="step time (ms)",
             title="prefill step (eager)")
    ax_p.legend(fontsize=7)
    for ax in (ax_d, ax_p):
        ax.grid(alpha=0.3, which="both")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measured", default="h200-llama-3-8b-measured", help="measured profile (name or path)")
    ap.add_argument("--roofline", default="h200-llama-3-8b", help="analytic profile of the same device and model")
    ap.add_argument("--out", default="results", help="folder for the table and the figure")
    a = ap.parse_args(argv)
    rows = compare_rows(a.measured, a.roofline)
    if not rows:
        ap.error(f"--measured {a.measured}: the profile has no decode or dense rows to compare")
    overhead = load_profile(a.roofline).overhead.name
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(rows, a.measured, a.roofline, overhead)
    (out / "measured_vs_roofline.md").write_text(text)
    figure(rows, out / "measured_vs_roofline.png", f"{a.measured} vs {a.roofline}")
    print(text, end="")
    print(f"wrote {out / 'measured_vs_roofline.md'} and {out / 'measured_vs_roofline.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
