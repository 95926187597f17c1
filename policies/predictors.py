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


PREDICTORS = Registry("predictor")
PREDICTORS.register("oracle", OraclePredictor, "the true output length (simulation-only bound)")
PREDICTORS.register("noisy", NoisyPredictor, "true length plus Gaussian-copula noise at a requested Kendall tau")
PREDICTORS.register("learned", LearnedPredictor, "ridge regression of log length on arrival features, trained online")


def make_predictor(name: Any, **params: Any) -> Predictor:
    """Build a predictor from a name (or ``{name = ..., ...}`` table) and parameters."""
    if isinstance(name, dict):
        params = {**{k: v for k, v in name.items() if k != "name"}, **params}
        name = name.get("name")
    if not isinstance(name, str):
        raise ValueError(f"predictor must be a name such as 'oracle', 'noisy', 'learned' (got {name!r})")
    try:
        factory = PREDICTORS.resolve(name)
    except KeyError as exc:
        raise ValueError(exc.args[0]) from None
    try:
        return factory(**params)
    except TypeError as exc:
        raise ValueError(f"predictor '{name}': bad parameters {sorted(params)}: {exc}") from None
