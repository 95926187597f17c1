"""The text ``priosim calibrate --from-runs`` prints: the fitted terms with their bounds and
uncertainty, each run's metric errors before and after the fit, and the leave-one-run-out
errors (relative errors, simulated / measured - 1, in %)."""
from __future__ import annotations

import math

from calibrate.runs.fit import FIT_METRICS, FitResult

#: the metric columns of the error tables, shortened
SHORT = {"ttft_mean_ms": "ttft", "ttft_p50_ms": "ttft50", "tpot_mean_ms": "tpot", "tpot_p50_ms": "tpot50",
         "itl_mean_ms": "itl", "itl_p50_ms": "itl50", "e2e_mean_ms": "e2e", "e2e_p50_ms": "e2e50",
         "request_throughput": "req/s", "output_throughput": "tok/s"}


def _v(x: float | None, scale: float) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x / scale:.4g}"


def _pct(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:+.1%}"


def terms_table(fit: FitResult) -> list[str]:
    lines = [f"{'term':18s} {'unit':>4s} {'base':>9s} {'fitted':>9s} {'+/-':>9s} {'bounds':>15s}  status"]
    for t in fit.terms:
        s = t.term.scale
        status = t.status
        bounds = f"{_v(t.term.lo, s)}-{_v(t.term.hi, s)}"
        lines.append(f"{t.term.name:18s} {t.term.unit:>4s} {_v(t.base, s):>9s} {_v(t.value, s):>9s} "
                     f"{_v(t.sigma, s) if t.identified else '-':>9s} {bounds:>15s}  {status}")
    return lines


def errors_table(fit: FitResult, which: str) -> list[str]:
    cols = [SHORT[m] for m in FIT_METRICS]
    lines = [f"{'run':28s} " + " ".join(f"{c:>7s}" for c in cols)]
    for r in fit.runs:
        errs = getattr(r, which)
        if errs is None:
            continue
        lines.append(f"{_short(r.label, 28):28s} " + " ".join(f"{_pct(errs.get(m)):>7s}" for m in FIT_METRICS))
    return lines


def report(fit: FitResult) -> str:
    out = [f"fitted on {len(fit.runs)} runs ({fit.engine}), base profile {fit.base_profile}, "
           f"{fit.evaluations} replays"]
    out += terms_table(fit)
    for note in fit.notes:
        out.append(f"note: {note}")
    out.append("errors before the fit (base profile), simulated / measured - 1:")
    out += errors_table(fit, "before")
    out.append("errors after the fit:")
    out += errors_table(fit, "after")
    if any(r.loro is not None for r in fit.runs):
        out.append("leave one run out (fitted on the others, this run replayed):")
        out += errors_table(fit, "loro")
    elif len(fit.runs) < 3:
        out.append("leave one run out: needs 3 runs or more")
    return "\n".join(out)


def _short(label: str, width: int) -> str:
    """``label`` in ``width`` characters, its ``#N`` (a result of several in one file) kept."""
    if len(label) <= width:
        return label
    stem, sep, part = label.rpartition("#")
    tail = sep + part if sep and part.isdigit() else ""
    return (stem if tail else label)[:width - len(tail) - 1] + "~" + tail


__all__ = ["report", "terms_table", "errors_table"]
