"""ServeGen per-client workload descriptions, sampled into requests.

A client (tenant) ``chunk-N`` has ``chunk-N-trace.csv`` (no header; per 600 s window: start s,
mean rate req/s, inter-arrival CV, fitted law ``Gamma``/``Weibull`` or empty, shape, scale s) and
``chunk-N-dataset.json`` (per 6 h window start: empirical PDFs of ``input_tokens`` and
``output_tokens``, token count -> probability).

Sampling: inside each active window, gaps are drawn from the fitted law with its *shape* and
the scale rescaled so the mean gap is exactly ``1 / rate`` (the published rate column is
authoritative; the fitted scale alone does not always reproduce it); an idle or unfitted window
with a positive rate uses Poisson gaps. Each request's lengths are drawn independently from the
PDFs of the 6 h window containing it. Times are in trace seconds (0 = trace start).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from workloads.errors import WorkloadError, integer
from workloads.lengths import Empirical
from workloads.traces import read_text

WINDOW_S = 600.0
_PAIR = re.compile(r"([-+0-9.eE]+)\s*:\s*([-+0-9.eE]+)")


@dataclass
class ServeGenClient:
    """One client's windows (DataFrame) and length PDFs keyed by 6 h window start (s)."""

    name: str
    windows: pd.DataFrame  # start_s, rate, cv, law, shape, scale
    pdf_starts: np.ndarray
    inputs: list[Empirical | None]  # None: an idle 6 h window (the file gives ``{}``)
    outputs: list[Empirical | None]


def client_paths(path: Path, client: object = None) -> tuple[Path, Path]:
    """``path`` is ``.../chunk-N`` (a prefix) or a directory with ``client = N``; each file may
    also be stored gzip-compressed (``-trace.csv.gz``, ``-dataset.json.gz``, as bundled)."""
    if client is not None:
        n = integer("client", client, ge=0)
        prefix = Path(path) / f"chunk-{n}"
    else:
        prefix = Path(path)
    out = []
    for suffix in ("-trace.csv", "-dataset.json"):
        p = Path(f"{prefix}{suffix}")
        gz = Path(f"{p}.gz")
        out.append(gz if not p.is_file() and gz.is_file() else p)
    return out[0], out[1]


def _pdf(text: str, where: str) -> Empirical | None:
    """An empirical PDF; ``None`` for ``{}`` (the client sent nothing in that 6 h window)."""
    arr = _plain_pairs(text)
    if arr is None:
        pairs = _PAIR.findall(text)
        if not pairs and text.strip() == "{}":
            return None
        if not pairs:
            raise WorkloadError(f"{where}: not a value -> probability table")
        arr = np.array(pairs, dtype=float)
    elif not len(arr):
        return None
    return Empirical(arr[:, 0], arr[:, 1])


# characters of a plain table: the numbers (what _PAIR takes), the separators and blanks
_NOT_PLAIN = str.maketrans("", "", "0123456789.eE+-:, \t\n\r")
_NOT_SEPARATOR = str.maketrans("", "", "0123456789.eE+- \t\n\r")


def _plain_pairs(text: str) -> np.ndarray | None:
    """The (value, probability) rows of a plain table ``{v: p, v: p, ...}``, as _PAIR finds them,
    split by str methods and converted in one call (the bundled PDFs, 5.6 MB of text: 0.16 ->
    0.10 s); None for anything else (then _PAIR decides, as before)."""
    s = text.strip()
    if len(s) < 2 or s[0] != "{" or s[-1] != "}":
        return None
    inner = s[1:-1]
    if inner.translate(_NOT_PLAIN):
        return None
    if not inner.strip():
        return np.zeros((0, 2)) if s == "{}" else None
    seps = inner.translate(_NOT_SEPARATOR)
    k = len(seps) // 2 + 1
    if seps != ":," * (k - 1) + ":":  # (each pair one value and one probability)
        return None
    try:
        return np.array(inner.replace(":", ",").split(","), dtype=float).reshape(k, 2)
    except ValueError:  # (a token _PAIR would take that is no number: as before, from there)
        return None


def load_client(path: Path, client: object = None) -> ServeGenClient:
    """Read and check one ServeGen client's two files."""
    tpath, dpath = client_paths(path, client)
    for p in (tpath, dpath):
        if not p.is_file():
            raise WorkloadError(f"path: ServeGen file not found: {p} (expected chunk-N-trace.csv "
                                f"and chunk-N-dataset.json; give path = '.../chunk-N' or client = N)")
    raw = pd.read_csv(tpath, header=None, dtype=str, keep_default_na=False)  # .gz: read as gzip
    if raw.shape[1] != 6:
        raise WorkloadError(f"{tpath.name} line 1: expected 6 columns (start, rate, cv, law, "
                            f"shape, scale), got {raw.shape[1]}")
    num = {c: pd.to_numeric(raw[i].replace("", "nan"), errors="coerce")
           for i, c in [(0, "start_s"), (1, "rate"), (2, "cv"), (4, "shape"), (5, "scale")]}
    for c in ("start_s", "rate"):
        bad = num[c].isna() | (num[c] < 0)
        if bad.any():
            r = int(np.flatnonzero(bad.to_numpy())[0])
            raise WorkloadError(f"{tpath.name} line {r + 1}: {c} {raw.iloc[r, 0 if c == 'start_s' else 1]!r} "
                                f"is not a non-negative number")
    law = raw[3].str.strip()
    bad = ~law.isin(["", "Gamma", "Weibull"])
    if bad.any():
        r = int(np.flatnonzero(bad.to_numpy())[0])
        raise WorkloadError(f"{tpath.name} line {r + 1}: law {law.iloc[r]!r} is not Gamma, Weibull or empty")
    windows = pd.DataFrame({"start_s": num["start_s"], "rate": num["rate"], "cv": num["cv"],
                            "law": law, "shape": num["shape"], "scale": num["scale"]})
    try:
        data = json.loads(read_text(dpath))
    except ValueError as exc:
        raise WorkloadError(f"{dpath.name}: not JSON ({exc})") from None
    starts, ins, outs = [], [], []
    for key in sorted(data, key=float):
        entry = data[key]
        for f in ("input_tokens", "output_tokens"):
            if f not in entry:
                raise WorkloadError(f"{dpath.name}: window {key} has no '{f}'")
        starts.append(float(key))
        ins.append(_pdf(str(entry["input_tokens"]), f"{dpath.name} window {key} input_tokens"))
        outs.append(_pdf(str(entry["output_tokens"]), f"{dpath.name} window {key} output_tokens"))
    return ServeGenClient(tpath.name.removesuffix(".gz").removesuffix("-trace.csv"), windows, np.array(starts), ins, outs)


def _gaps(rng: np.random.Generator, law: str, shape: float, rate: float, n: int) -> np.ndarray:
    if law == "Gamma" and shape > 0:
        return rng.gamma(shape, 1 / (rate * shape), n)
    if law == "Weibull" and shape > 0:
        from scipy import special  # imported here: 0.1-0.2 s that commands without this law skip
        scale = 1 / (rate * special.gamma(1 + 1 / shape))
        return scale * rng.weibull(shape, n)
    return rng.exponential(1 / rate, n)


def sample_client(c: ServeGenClient, rng_arr: np.random.Generator, rng_len: np.random.Generator,
                  t_from: float, t_to: float, rate_scale: float = 1.0) -> pd.DataFrame:
    """Requests of client ``c`` in trace time ``[t_from, t_to)`` s: arrival_s, prompt, output.

    ``rate_scale`` multiplies every window's rate (the arrival times stay in trace seconds).
    """
    times = []
    w = c.windows
    for start, rate, law, shape in zip(w["start_s"], w["rate"], w["law"], w["shape"]):
        end = start + WINDOW_S
        if rate <= 0 or end <= t_from or start >= t_to:
            continue
        r = rate * rate_scale
        t, out = start, []
        while t < end:
            n = int(r * (end - t) * 1.1) + 16
            ts = t + np.cumsum(_gaps(rng_arr, law, float(shape), r, n))
            out.append(ts[ts < end])
            t = float(ts[-1])
        ts = np.concatenate(out)
        times.append(ts[(ts >= t_from) & (ts < t_to)])
    t = np.concatenate(times) if times else np.empty(0)
    win = np.clip(np.searchsorted(c.pdf_starts, t, side="right") - 1, 0, len(c.pdf_starts) - 1)
    p = np.empty(t.size, dtype=np.int64)
    o = np.empty(t.size, dtype=np.int64)
    for k in np.unique(win):
        m = win == k
        if c.inputs[k] is None or c.outputs[k] is None:
            raise WorkloadError(f"{c.name}: requests at {t[m][0]:.0f} s fall in the 6 h window starting "
                                f"{c.pdf_starts[k]:.0f} s, whose length PDFs are empty")
        p[m] = np.rint(c.inputs[k].ppf(rng_len.random(int(m.sum()))))
        o[m] = np.rint(c.outputs[k].ppf(rng_len.random(int(m.sum()))))
    return pd.DataFrame({"arrival_s": t, "prompt_tokens": np.maximum(p, 1),
                         "output_tokens": np.maximum(o, 1)})


__all__ = ["ServeGenClient", "load_client", "sample_client", "client_paths", "WINDOW_S"]
