"""Fit measured step times into the simulator's step-time model (sim/core/costs.py).

Each measured row describes one engine step by the aggregates the cost model reads:
``P`` prefill tokens, ``D`` decoding sequences, ``sum_l2`` (sum of chunk length squared),
``sum_lc`` (sum of chunk length x cached prefix), ``sum_ctx`` (sum of decode contexts), and its
median time ``time_s``. The model is linear in its coefficients::

    t = base_s + interp(T; knots, token_s) + prefill_token_s*P [or decode_seq_s*D]
        + [chunks > 0]*(prefill_step_s + prefill_chunk_s*chunks + [D > 0]*mixed_step_s)
        + prefill_attn_s*sum_l2 + chunk_attn_s*sum_lc + decode_ctx_s*sum_ctx,   T = P + D

so it is fitted by non-negative least squares (``scipy.optimize.nnls``) on *relative* error
(each row divided by its measured time: a 1 ms decode step counts as much as a 1 s prefill).

Identifiability, and why only one of ``prefill_token_s`` / ``decode_seq_s`` is fitted: T = P + D
and any linear function of T lies in the span of the piecewise-linear token term, so
``a*P + b*D`` can only be told apart from the token term through its difference. The fit tries
both (the cheaper-per-token kind carries no extra term) and keeps the one with the lower error;
the other is 0. Likewise a constant lies in the token term's span, so the constant is moved into
``base_s`` afterwards (``base_s = min(token_s)``), which leaves every priced step unchanged.

With those choices the design has full column rank on any grid that mixes prefill and decode
rows at equal T, so the fit is unique and recovers the coefficients that generated an exact
synthetic table (tests/test_calibrate.py checks this).

The eager-step terms are told apart from the constant by the decode rows (P = 0): on a GPU the
decode rows run under CUDA graphs and every step with prefill runs eagerly, so a step that
prefills pays a fixed launch cost that a decode step does not, plus launches per prefill
chunk (``chunks``: prefill rows of several prompts) and for decode attention when decoders
share the step (mixed rows).

Knots of the token term are chosen from the measured T values so that every segment has data.
The leave-one-out error (each row predicted by a fit without it) is the number a profile
reports as its fit error.
"""
from __future__ import annotations

import numpy as np
from scipy.optimize import nnls

FEATURES = ("P", "D", "sum_l2", "sum_lc", "sum_ctx")
STEP_KINDS = ("prefill", "chunk", "decode", "dense", "mixed")
KNOT_LADDER = (16, 64, 256, 1024, 4096, 16384, 65536)


def interp_extrapolate(x, knots, values) -> np.ndarray:
    """Same evaluation as sim.core.costs: linear between knots, last slope beyond the last knot."""
    xs, ys = np.asarray(knots, float), np.asarray(values, float)
    x = np.asarray(x, float)
    y = np.interp(x, xs, ys)
    if len(xs) >= 2:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        y = np.where(x > xs[-1], ys[-1] + slope * (x - xs[-1]), y)
    return y


def choose_knots(T, ladder=KNOT_LADDER, min_points: int = 3) -> list[float]:
    """Knots [0, ...] from ``ladder`` such that each segment holds >= ``min_points`` distinct T."""
    ts = np.unique(np.asarray(T, float))
    knots = [0.0]
    cands = [c for c in ladder if c < ts.max()] + [float(ts.max())]
    for c in cands:
        if np.sum((ts > knots[-1]) & (ts <= c)) >= min_points:
            knots.append(float(c))
    if len(knots) == 1:
        knots.append(float(ts.max()))
    return knots


def chunks(row: dict) -> int:
    """Prefill chunks of a row's step: its ``chunks`` aggregate, or for rows written before it
    was recorded, the prompts of a prefill row and one chunk in any other row with prefill."""
    if "chunks" in row:
        return int(row["chunks"])
    if float(row["P"]) <= 0:
        return 0
    return int(row.get("batch", 1)) if row.get("kind") == "prefill" else 1


def _features(rows: list[dict]) -> dict[str, np.ndarray]:
    f = {k: np.array([float(r[k]) for r in rows]) for k in FEATURES}
    f["chunks"] = np.array([float(chunks(r)) for r in rows])
    f["prefill_step"] = (f["chunks"] > 0).astype(float)
    f["mixed_step"] = f["prefill_step"] * (f["D"] > 0)
    return f


def _matrix(rows: list[dict], knots, extra: str) -> np.ndarray:
    f = _features(rows)
    T = f["P"] + f["D"]
    hats = [interp_extrapolate(T, knots, np.eye(len(knots))[i]) for i in range(len(knots))]
    cols = hats + [f[extra], f["sum_l2"], f["sum_lc"], f["sum_ctx"], f["prefill_step"], f["chunks"],
                   f["mixed_step"]]
    return np.column_stack(cols)


def _solve(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    Aw = A / y[:, None]
    scale = np.linalg.norm(Aw, axis=0)
    scale[scale == 0] = 1.0
    x, _ = nnls(Aw / scale, np.ones_like(y), maxiter=50 * A.shape[1])
    return x / scale


def _coeffs(x: np.ndarray, knots, extra: str) -> dict:
    n = len(knots)
    token = x[:n]
    base = float(token.min())
    return {"base_s": base, "token_knots": [float(k) for k in knots],
            "token_s": [float(v - base) for v in token],
            "prefill_token_s": float(x[n]) if extra == "P" else 0.0,
            "decode_seq_s": float(x[n]) if extra == "D" else 0.0,
            "prefill_attn_s": float(x[n + 1]), "chunk_attn_s": float(x[n + 2]),
            "decode_ctx_s": float(x[n + 3]), "prefill_step_s": float(x[n + 4]),
            "prefill_chunk_s": float(x[n + 5]), "mixed_step_s": float(x[n + 6])}


def predict(step: dict, rows: list[dict]) -> np.ndarray:
    """Step times (s) the coefficients ``step`` give for ``rows`` (the sim's formula, in float)."""
    f = _features(rows)
    t = np.full(len(rows), step.get("base_s", 0.0))
    if step.get("token_knots"):
        t = t + interp_extrapolate(f["P"] + f["D"], step["token_knots"], step["token_s"])
    return (t + step.get("prefill_token_s", 0.0) * f["P"] + step.get("prefill_attn_s", 0.0) * f["sum_l2"]
            + step.get("chunk_attn_s", 0.0) * f["sum_lc"] + step.get("decode_seq_s", 0.0) * f["D"]
            + step.get("decode_ctx_s", 0.0) * f["sum_ctx"] + step.get("prefill_step_s", 0.0) * f["prefill_step"]
            + step.get("prefill_chunk_s", 0.0) * f["chunks"] + step.get("mixed_step_s", 0.0) * f["mixed_step"])


def fit_step(rows: list[dict], knots=None, loo: bool = True) -> tuple[dict, dict]:
    """Fit step rows; returns (``step`` section of a profile, fit report).

    The report holds the knots, which of P/D carries the extra per-token term, the in-sample
    relative errors and the leave-one-out relative errors (median, p90, max; fractions).
    """
    rows = [r for r in rows if r.get("kind") in STEP_KINDS]
    if len(rows) < 6:
        raise ValueError(f"fit needs at least 6 step rows (got {len(rows)})")
    y = np.array([float(r["time_s"]) for r in rows])
    if not np.all(np.isfinite(y) & (y > 0)):
        raise ValueError("fit: every row's 'time_s' must be a positive finite number")
    if knots is None:
        knots = choose_knots([r["P"] + r["D"] for r in rows])
    best = None
    for extra in ("P", "D"):
        A = _matrix(rows, knots, extra)
        x = _solve(A, y)
        err = np.abs(A @ x - y) / y
        if best is None or np.sqrt(np.mean(err ** 2)) < best[2]:
            best = (extra, x, float(np.sqrt(np.mean(err ** 2))), err)
    extra, x, _, err = best
    step = _coeffs(x, knots, extra)
    report = {"method": "scipy.optimize.nnls on relative error", "rows": len(rows),
              "knots": step["token_knots"],
              "extra_token_term": "prefill_token_s" if extra == "P" else "decode_seq_s",
              "rel_err_median": float(np.median(err)), "rel_err_max": float(err.max())}
    if loo:
        A = _matrix(rows, knots, extra)
        le = np.empty(len(rows))
        for i in range(len(rows)):
            keep = np.arange(len(rows)) != i
            xi = _solve(A[keep], y[keep])
            le[i] = abs(A[i] @ xi - y[i]) / y[i]
        report.update(loo_rel_err_median=float(np.median(le)), loo_rel_err_p90=float(np.percentile(le, 90)),
                      loo_rel_err_max=float(le.max()))
    return step, report


def fit_swap(rows: list[dict], block_bytes: int, method: str = "gather") -> tuple[dict, dict]:
    """Fit ``latency_s + blocks * block_s`` per transfer method and direction (NNLS, relative).

    Returns the profile's ``swap`` section (from ``method``, averaged over both directions, as
    ``bytes_per_s`` so it holds for other block sizes of the same shape) and a report of all fits.
    """
    report: dict = {}
    for r in rows:
        if r.get("kind") != "swap":
            continue
        report.setdefault(f"{r['method']}/{r['direction']}", []).append(r)
    fits = {}
    for key, rs in sorted(report.items()):
        n = np.array([float(r["blocks"]) for r in rs])
        y = np.array([float(r["time_s"]) for r in rs])
        x = _solve(np.column_stack([np.ones_like(n), n]), y)
        fits[key] = {"latency_s": float(x[0]), "block_s": float(x[1]),
                     "bytes_per_s": float(block_bytes / x[1]) if x[1] > 0 else None}
    chosen = [v for k, v in fits.items() if k.startswith(method + "/")]
    if not chosen:
        return {}, {"fits": fits}
    block_s = float(np.mean([c["block_s"] for c in chosen]))
    swap = {"latency_s": float(np.mean([c["latency_s"] for c in chosen]))}
    if block_s > 0:
        swap["bytes_per_s"] = float(block_bytes / block_s)
    else:
        swap["block_s"] = 0.0
    return swap, {"method": method, "fits": fits}
