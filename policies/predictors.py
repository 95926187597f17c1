"""Output-length predictors for size-based policies, registered like policies (``PREDICTORS``).

A predictor estimates a request's output length in tokens at arrival (``estimate``); only the
order of estimates matters to a ranking policy (Fu et al. 2024, arXiv:2408.15792: ranking is an
easier problem than regression). It learns from finished requests (``observe``: a finished
request's ``generated`` is its true length, which any real system knows afterwards) and reports
how good its ranking was: Kendall tau of estimate vs true length overall and per window of
``window`` finished requests (with the window's last finish time), so drift shows over a run.

* ``oracle``: the true length (simulation-only; sets ``oracle = True``).
* ``noisy {tau}``: a Gaussian-copula score with a requested Kendall tau against the true length:
  ``score = rho * z + sqrt(1 - rho^2) * eps`` with ``rho = sin(pi * tau / 2)``, ``z`` the normal
  score of the true length under the lengths seen so far (mid-ranks), ``eps`` standard normal from
  the policy's seed. For a continuous length, Kendall tau(score, length) = (2/pi) asin(rho) = tau.
  Simulation-only (reads the true length).
* ``learned {train_requests, refit_every, l2, window}``: ridge regression of log(output) on the
  features a scheduler has at arrival — log prompt length, one-hot class, one-hot tenant, and
  ``log1p`` of every numeric ``f_*`` trace column — fitted on the first ``train_requests``
  finished requests, then refitted on the latest ``train_requests`` every ``refit_every``
  finishes (0: never again, so a shift in the traffic mix shows as a falling tau). Before the
  first fit every estimate is equal (FCFS order).
* ``ranker {tau, pair_acc_2x, kind_from, kind_bias, window}``: a stand-in for a trained ranker
  (e.g. Fu et al.'s OPT-125M listwise ranker) with a ranker's error *structure*, not only its
  tau (:class:`RankerPredictor`). Simulation-only (reads the true length).
"""
from __future__ import annotations

import bisect
import math
from typing import Any

import numpy as np

from policies.base import RequestView
from policies.common import check_int, check_number
from plumbing.numbers import is_number
from plumbing.registry import Registry


def kendall_tau(x, y) -> float:
    from scipy.stats import kendalltau
    if len(x) < 2:
        return math.nan
    t = kendalltau(x, y).statistic
    return float(t) if t == t else math.nan


class Predictor:
    """Base: records (finish time, estimate, true length) and reports tau overall and per window."""

    name = "predictor"
    oracle = False

    def __init__(self, window: int = 200) -> None:
        self.window = check_int(self.name, "window", window, ge=10)
        self._est: dict[int, float] = {}
        self._rows: list[tuple[float, float, int]] = []
        self.seed = 0

    def bind(self, seed: int) -> None:
        self.seed = seed

    def estimate(self, req: RequestView, now: float) -> float:
        """Estimated output tokens (cached per request: a request is estimated once)."""
        rid = req.request_id
        est = self._est.get(rid)
        if est is None:
            est = float(self._predict(req, now))
            self._est[rid] = est
            req.predicted["tokens"] = est
        return est

    def _predict(self, req: RequestView, now: float) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def observe(self, req: RequestView, now: float) -> None:
        est = self._est.pop(req.request_id, None)
        if est is not None:
            self._rows.append((now, est, req.generated))

    def windows(self) -> list[dict]:
        out = []
        rows = self._rows
        for i in range(0, len(rows) - self.window + 1, self.window):
            chunk = rows[i:i + self.window]
            t = kendall_tau([r[1] for r in chunk], [r[2] for r in chunk])
            out.append({"t_s": round(chunk[-1][0], 3), "tau": None if t != t else round(t, 4),
                        "n": len(chunk)})
        return out

    def report(self) -> dict:
        t = kendall_tau([r[1] for r in self._rows], [r[2] for r in self._rows])
        return {"name": self.name, "tau": None if t != t else round(t, 4), "observed": len(self._rows),
                "tau_windows": self.windows()}


class OraclePredictor(Predictor):
    name = "oracle"
    oracle = True

    def _predict(self, req: RequestView, now: float) -> float:
        return float(req.true_output_tokens)


class NoisyPredictor(Predictor):
    name = "noisy"
    oracle = True

    def __init__(self, tau: float = 0.7, window: int = 200) -> None:
        super().__init__(window)
        self.tau = check_number("noisy", "tau", tau, gt=0, le=1)
        self.rho = math.sin(math.pi * self.tau / 2)
        self._seen: list[int] = []
        self._rng = np.random.default_rng(0)

    def bind(self, seed: int) -> None:
        super().bind(seed)
        self._rng = np.random.default_rng(seed)

    def _predict(self, req: RequestView, now: float) -> float:
        from scipy.special import ndtri
        L = req.true_output_tokens
        bisect.insort(self._seen, L)
        n = len(self._seen)
        lo = bisect.bisect_left(self._seen, L)
        hi = bisect.bisect_right(self._seen, L)
        u = (lo + 0.5 * (hi - lo)) / n  # mid-rank ECDF; n >= 1 and hi > lo
        z = float(ndtri(min(max(u, 1e-6), 1 - 1e-6)))
        eps = float(self._rng.standard_normal())
        score = self.rho * z + math.sqrt(max(0.0, 1 - self.rho ** 2)) * eps
        return math.exp(score)  # any increasing map of the score; positive like a length

    def report(self) -> dict:
        return {**super().report(), "requested_tau": self.tau}


class LearnedPredictor(Predictor):
    name = "learned"

    def __init__(self, train_requests: int = 500, refit_every: int = 0, l2: float = 1.0,
                 window: int = 200) -> None:
        super().__init__(window)
        self.train_requests = check_int("learned", "train_requests", train_requests, ge=10)
        self.refit_every = check_int("learned", "refit_every", refit_every, ge=0)
        self.l2 = check_number("learned", "l2", l2, ge=0)
        self._X: list[dict] = []
        self._y: list[float] = []
        self._coef: np.ndarray | None = None
        self._vocab: list[tuple] = []
        self._since_fit = 0
        self.fits: list[dict] = []

    @staticmethod
    def _raw(req: RequestView) -> dict:
        f = {"log_prompt": math.log1p(req.prompt_tokens), ("cls", req.cls): 1.0,
             ("tenant", req.tenant): 1.0}
        for k, v in (req.features or {}).items():
            if is_number(v):
                f[("f", k)] = math.log1p(max(float(v), 0.0))
        return f

    def _vec(self, raw: dict) -> np.ndarray:
        return np.array([1.0] + [raw.get(k, 0.0) for k in self._vocab])

    def _fit(self, now: float) -> None:
        X = self._X[-self.train_requests:]
        y = np.asarray(self._y[-self.train_requests:])
        self._vocab = sorted({k for r in X for k in r}, key=str)
        A = np.stack([self._vec(r) for r in X])
        reg = self.l2 * np.eye(A.shape[1])
        reg[0, 0] = 0.0
        self._coef = np.linalg.solve(A.T @ A + reg, A.T @ y)
        pred = A @ self._coef
        self.fits.append({"t_s": round(now, 3), "train_size": len(X),
                          "train_tau": round(kendall_tau(pred, y), 4)})
        self._since_fit = 0

    def _predict(self, req: RequestView, now: float) -> float:
        if self._coef is None:
            return 1.0
        return float(math.exp(self._vec(self._raw(req)) @ self._coef))

    def observe(self, req: RequestView, now: float) -> None:
        super().observe(req, now)
        self._X.append(self._raw(req))
        self._y.append(math.log(max(req.generated, 1)))
        self._since_fit += 1
        if self._coef is None:
            if len(self._y) >= self.train_requests:
                self._fit(now)
        elif self.refit_every and self._since_fit >= self.refit_every:
            self._fit(now)

    def report(self) -> dict:
        return {**super().report(), "fits": self.fits, "features": [str(k) for k in self._vocab]}


def _phi(x: np.ndarray) -> np.ndarray:
    from scipy.special import ndtr
    return ndtr(x)


#: measured error tables for ``ranker``'s ``length_errors``: rows ``(below_tokens, bias, spread)``
#: in log-length units (None: no upper bound).
#:
#: ``fu2024_sharegpt``: Fu et al.'s OPT-125M ranker (arXiv:2408.15792, their released ShareGPT
#: predictor) scoring their Llama-3-8B ShareGPT trace, as one public reproduction logged it per
#: request (anshsarkar/vllm-ltr-sched, experiments/analysis/predictions/
#: sharegpt_8b_h100_metrics_predictions_r64.csv: true output length and ranking score; Kendall
#: tau 0.51 on the 605 requests read, plus the 55 under 100 tokens among the next 600). The score
#: is put in log-length units by its least-squares line against log length (slope 1.87 score
#: units per log token), and each row holds the mean and standard deviation of (score - log
#: length) of that length band. Only these summary numbers are kept here.
RANKER_ERROR_TABLES: dict[str, tuple[tuple[int | None, float, float], ...]] = {
    "fu2024_sharegpt": ((20, 1.98, 1.84), (50, -0.54, 1.20), (100, -0.18, 1.24), (200, -0.26, 1.05),
                        (300, -0.34, 0.84), (400, -0.21, 0.79), (600, 0.08, 0.92), (900, 0.44, 0.94),
                        (None, 0.25, 1.13)),
}


def _error_table(spec: Any) -> tuple[tuple[float, float, float], ...] | None:
    """``ranker``'s ``length_errors``: None, a shipped table's name, or rows
    ``[below_tokens, bias, spread]`` with ascending bounds (the last may be None); checked here
    so a bad table stops before the run."""
    if spec is None:
        return None
    if isinstance(spec, str):
        if spec not in RANKER_ERROR_TABLES:
            raise ValueError(f"ranker: length_errors {spec!r} is not a shipped table (expected one of "
                             f"{', '.join(sorted(RANKER_ERROR_TABLES))}, or rows [below_tokens, bias, spread])")
        spec = RANKER_ERROR_TABLES[spec]
    if not isinstance(spec, (list, tuple)) or not spec:
        raise ValueError(f"ranker: length_errors must be rows [below_tokens, bias, spread] (got {spec!r})")
    rows: list[tuple[float, float, float]] = []
    last = 0.0
    for k, row in enumerate(spec):
        good = isinstance(row, (list, tuple)) and len(row) == 3
        if good:
            below, bias, spread = row
            good = (below is None or (is_number(below) and float(below) > last)) and is_number(bias) \
                and is_number(spread) and float(spread) > 0 and (below is not None or k == len(spec) - 1)
        if not good:
            raise ValueError(f"ranker: length_errors row {k} must be [below_tokens, bias, spread] with "
                             f"ascending bounds > 0 (None only last) and spread > 0 (got {row!r})")
        rows.append((math.inf if below is None else float(below), float(bias), float(spread)))
        last = rows[-1][0]
    return tuple(rows)


def _lookup(table: tuple[tuple[float, float, float], ...] | None, length: int) -> tuple[float, float]:
    """(bias, spread) of a true length in an error table; (0, 1) without one (and above its last
    bound)."""
    if table is None:
        return 0.0, 1.0
    for below, bias, spread in table:
        if length < below:
            return bias, spread
    return 0.0, 1.0


class RankerPredictor(Predictor):
    """A trained ranker's error structure, calibrated to a stated Kendall tau.

    Score of a request of true output length ``L`` and prompt kind ``k``::

        score = log L + b[k] + sigma * eps          (with probability 1 - p_fail)
        score = m + s * eps'                        (with probability p_fail: the ranker "misreads")

    ``eps``, ``eps'`` standard normal from the policy's seed, ``m`` and ``s`` the mean and standard
    deviation of the log lengths seen so far. What this gives, unlike ``noisy``:

    * **Errors concentrate among similar lengths.** Two well-read requests whose true lengths
      differ by a factor ``r`` (same kind) are ordered right with probability
      ``Phi(ln r / (sigma sqrt 2))``: about 1/2 for near-equal lengths, rising with the gap. The
      misread share caps it below 1 however large the gap (a real ranker has confidently-wrong
      cases: a long answer to a short question).
    * **Per-prompt-kind bias.** Every kind (``kind_from``: ``"prompt_bucket"`` = the prompt's
      length octave, ``floor(log2 prompt_tokens)``; ``"class"``; ``"tenant"``; or a trace feature
      ``"f_<name>"``) has a bias ``b[k] ~ N(0, kind_bias)`` in log-length units, drawn once from
      the seed and the kind's name: a kind the ranker over- or under-estimates as a whole, so its
      mistakes cluster on particular prompt kinds, not spread evenly.

    Calibration: the expected Kendall tau-b over the lengths seen so far (the latest 512, biases
    included) is made to equal ``tau``. Without ``pair_acc_2x``: ``p_fail = 0`` and ``sigma`` is
    solved. With it: ``sigma`` is set so that well-read same-kind pairs two-fold apart in length
    are ordered right with probability ``pair_acc_2x`` (the slope of the accuracy-vs-gap curve),
    and ``p_fail`` is solved (the curve's ceiling). The solve is
    redone whenever the number of lengths seen reaches a power of two (up to 4096), so early
    estimates use an early fit; the report carries the fitted values and the realised
    accuracy by length gap.

    **A measured error table** (``length_errors``): a real ranker is not equally good at every
    length. Its errors by true length, measured from its scores, are a table of rows
    ``[below_tokens, bias, spread]`` (ascending; the last row's ``below_tokens`` may be None):
    a request of true length ``L`` takes the first row with ``L < below_tokens`` and is scored
    ``log L + b[k] + bias + sigma * spread * eps``, so ``sigma`` near 1 gives the measured spread,
    and calibration solves ``sigma`` for the tau. ``length_errors`` may also name a shipped table
    (``RANKER_ERROR_TABLES``): ``"fu2024_sharegpt"`` is Fu et al.'s OPT-125M ranker on their
    Llama-3-8B ShareGPT trace, whose shortest answers (under 20 tokens) it reads as about seven
    times longer than they are, with twice the spread of the middle (an answer cut short by
    sampling is not visible in its prompt). The table holds the ranker's whole error, so use it
    with ``kind_bias = 0``.

    What it cannot mimic: errors tied to prompt *content* beyond a kind label (two prompts of one
    kind and one length are alike to it), drift of the ranker's quality over a run (see
    ``learned``), a ranker that is better on some kinds than others (the noise scale is shared),
    and a tau above what the kind biases (or ``pair_acc_2x``) allow: then the fit keeps the
    nearest it can reach and ``report()["achievable"]`` is False.

    Parameters:
        tau: target Kendall tau-b of score vs true length (0 < tau <= 1; Fu et al. report 0.54
            for their ShareGPT ranker and 0.62 for LMSYS-Chat-1M, §5.4 and Table 3; default 0.55).
        pair_acc_2x: accuracy of well-read same-kind pairs two-fold apart (0.5 < x < 1), or None
            (no misreads).
        length_errors: a table ``[[below_tokens, bias, spread], ...]`` (log-length units; bias
            any number, spread > 0), the name of a shipped table, or None (bias 0, spread 1).
        kind_from: what names a request's kind (above). kind_bias: standard deviation of the
            kind biases, log-length units (>= 0; 0 = none).
    """

    name = "ranker"
    oracle = True
    CALIB_N = 512

    def __init__(self, tau: float = 0.55, pair_acc_2x: float | None = None,
                 kind_from: str = "prompt_bucket", kind_bias: float = 0.25, window: int = 200,
                 length_errors: Any = None) -> None:
        super().__init__(window)
        self.tau = check_number("ranker", "tau", tau, gt=0, le=1)
        self.pair_acc_2x = check_number("ranker", "pair_acc_2x", pair_acc_2x, gt=0.5, allow_none=True)
        if self.pair_acc_2x is not None and self.pair_acc_2x >= 1:
            raise ValueError(f"ranker: pair_acc_2x must be a finite number > 0.5 and < 1 (got {pair_acc_2x!r})")
        if not isinstance(kind_from, str) or not (kind_from in ("prompt_bucket", "class", "tenant")
                                                  or kind_from.startswith("f_")):
            raise ValueError("ranker: kind_from must be 'prompt_bucket', 'class', 'tenant' or a trace "
                             f"feature 'f_<name>' (got {kind_from!r})")
        self.kind_from = kind_from
        self.kind_bias = check_number("ranker", "kind_bias", kind_bias, ge=0)
        self.length_errors = _error_table(length_errors)
        self.sigma = 1.0
        self.p_fail = 0.0
        self.achievable = True
        self._logs: list[float] = []
        self._bias_seen: list[float] = []
        self._spread_seen: list[float] = []
        self._bias: dict[str, float] = {}
        self._sum = self._sumsq = 0.0
        self._next_fit = 2
        self._rng = np.random.default_rng(0)

    def bind(self, seed: int) -> None:
        super().bind(seed)
        self._rng = np.random.default_rng(seed)

    def kind(self, req: RequestView) -> str:
        if self.kind_from == "prompt_bucket":
            return str(int(math.log2(max(req.prompt_tokens, 1))))
        if self.kind_from == "class":
            return str(req.cls)
        if self.kind_from == "tenant":
            return str(req.tenant)
        return str((req.features or {}).get(self.kind_from[2:], ""))

    def bias(self, kind: str) -> float:
        b = self._bias.get(kind)
        if b is None:
            import zlib
            # drawn from the seed and the kind's name alone, so a kind's bias does not depend on
            # the order kinds first appear in
            g = np.random.default_rng([self.seed, zlib.crc32(kind.encode())])
            b = self._bias[kind] = float(g.standard_normal()) * self.kind_bias
        return b

    # ---- calibration ----------------------------------------------------------------------
    def expected_tau(self, sigma: float, p_fail: float, x: np.ndarray, b: np.ndarray,
                     spread: np.ndarray | None = None) -> float:
        """Expected Kendall tau-b of the scores against the log lengths ``x`` (biases ``b``: the
        kind's plus the length table's; noise ``sigma * spread``, spread 1 by default) for a
        noise scale ``sigma`` and a misread share ``p_fail``."""
        n = len(x)
        sp = np.ones(n) if spread is None else spread
        if n < 2:
            return 0.0
        i, j = np.triu_indices(n, 1)
        d = x[i] - x[j]
        nt = d != 0
        i, j, d = i[nt], j[nt], d[nt]
        sgn = np.sign(d)
        # both read well: the score gap is d + (b_i - b_j) + noise of variance
        # sigma^2 (spread_i^2 + spread_j^2)
        ww = _phi((np.abs(d) + sgn * (b[i] - b[j])) / (sigma * np.sqrt(sp[i] ** 2 + sp[j] ** 2)))
        # one misread (score m + s eps'): right when the well-read one falls on its side of it
        m, s = float(x.mean()), float(max(x.std(), 1e-6))
        scale = math.sqrt(s * s + sigma * sigma)
        zi, zj = _phi((x[i] + b[i] - m) / scale), _phi((x[j] + b[j] - m) / scale)
        up = d > 0  # i is the longer one
        mi = np.where(up, 1 - zj, zj)  # i misread
        mj = np.where(up, zi, 1 - zi)  # j misread
        w = 1 - p_fail
        acc = w * w * ww + w * p_fail * (mi + mj) + p_fail * p_fail * 0.5
        return float((2 * acc - 1).mean() * math.sqrt(nt.mean()))

    def _fit(self) -> None:
        x = np.asarray(self._logs[-self.CALIB_N:])
        b = np.asarray(self._bias_seen[-self.CALIB_N:])
        sp = np.asarray(self._spread_seen[-self.CALIB_N:])
        self.achievable = True
        if self.pair_acc_2x is None:
            self.p_fail = 0.0
            lo, hi = 1e-3, 50.0  # the expected tau falls as sigma grows: bisect in log space
            if self.expected_tau(lo, 0.0, x, b, sp) < self.tau:
                self.achievable, self.sigma = False, lo
                return
            for _ in range(40):
                mid = math.sqrt(lo * hi)
                lo, hi = (mid, hi) if self.expected_tau(mid, 0.0, x, b, sp) > self.tau else (lo, mid)
            self.sigma = math.sqrt(lo * hi)
            return
        from scipy.special import ndtri
        # the two-fold accuracy of well-read same-kind pairs sets the noise; misreads lower the
        # tau to its target (the expected tau falls as the misread share grows)
        self.sigma = math.log(2) / (math.sqrt(2) * float(ndtri(self.pair_acc_2x)))
        lo, hi = 0.0, 1.0
        if self.expected_tau(self.sigma, 0.0, x, b, sp) < self.tau:
            self.achievable, self.p_fail = False, 0.0
            return
        for _ in range(30):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if self.expected_tau(self.sigma, mid, x, b, sp) > self.tau else (lo, mid)
        self.p_fail = (lo + hi) / 2

    def _predict(self, req: RequestView, now: float) -> float:
        length = max(req.true_output_tokens, 1)
        x = math.log(length)
        lb, spread = _lookup(self.length_errors, length)
        b = self.bias(self.kind(req)) + lb
        self._logs.append(x)
        self._bias_seen.append(b)
        self._spread_seen.append(spread)
        self._sum += x
        self._sumsq += x * x
        n = len(self._logs)
        if n >= self._next_fit and n <= 4096:
            self._fit()
            self._next_fit *= 2
        # three draws for every request, whichever branch it takes, so one request's fate does
        # not shift the next one's noise
        eps, eps2, u = self._rng.standard_normal(), self._rng.standard_normal(), self._rng.random()
        if u < self.p_fail:
            m = self._sum / n
            s = math.sqrt(max(self._sumsq / n - m * m, 1e-12))
            return math.exp(m + s * float(eps2))
        return math.exp(x + b + self.sigma * spread * float(eps))

    def accuracy_by_gap(self, last: int = 1000) -> list[dict]:
        """Pairwise ordering accuracy of the finished requests (the latest ``last``) by the
        factor between their true lengths: bins of log2(ratio)."""
        rows = self._rows[-last:]
        if len(rows) < 2:
            return []
        est = np.log([r[1] for r in rows])
        true = np.log2(np.maximum([r[2] for r in rows], 1))
        i, j = np.triu_indices(len(rows), 1)
        d = true[i] - true[j]
        keep = d != 0
        gap = np.abs(d[keep])
        right = np.sign(est[i] - est[j])[keep] == np.sign(d[keep])
        out = []
        for lo, hi in ((0, 0.5), (0.5, 1), (1, 2), (2, 4), (4, math.inf)):
            m = (gap > lo) & (gap <= hi)
            if m.any():
                out.append({"log2_ratio": f"{lo:g}-{hi:g}", "pairs": int(m.sum()),
                            "accuracy": round(float(right[m].mean()), 4)})
        return out

    def report(self) -> dict:
        return {**super().report(), "requested_tau": self.tau, "sigma": round(self.sigma, 4),
                "p_fail": round(self.p_fail, 4), "achievable": self.achievable,
                "kind_from": self.kind_from, "kind_bias": self.kind_bias,
                "length_errors": [list(r) for r in self.length_errors] if self.length_errors else None,
                "accuracy_by_gap": self.accuracy_by_gap()}


PREDICTORS = Registry("predictor")
PREDICTORS.register("oracle", OraclePredictor, "the true output length (simulation-only bound)")
PREDICTORS.register("noisy", NoisyPredictor, "true length plus Gaussian-copula noise at a requested Kendall tau")
PREDICTORS.register("learned", LearnedPredictor, "ridge regression of log length on arrival features, trained online")
PREDICTORS.register("ranker", RankerPredictor,
                    "a trained ranker's errors: log length + per-kind bias + noise, calibrated to a tau")


def make_predictor(name: Any, **params: Any) -> Predictor:
    """Build a predictor from a name (or ``{name = ..., ...}`` table) and parameters."""
    if isinstance(name, dict):
        params = {**{k: v for k, v in name.items() if k != "name"}, **params}
        name = name.get("name")
    if not isinstance(name, str):
        raise ValueError(f"predictor must be a name such as 'oracle', 'noisy', 'learned', 'ranker' (got {name!r})")
    try:
        factory = PREDICTORS.resolve(name)
    except KeyError as exc:
        raise ValueError(exc.args[0]) from None
    try:
        return factory(**params)
    except TypeError as exc:
        raise ValueError(f"predictor '{name}': bad parameters {sorted(params)}: {exc}") from None
