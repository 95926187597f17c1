"""Explicit runs are logged raw and folded a block at a time (``Telemetry.log_run``): the tokens
per interval per class and per tenant, and the per-class step gaps, equal those counted run by
run (the reference below: the row-wise counting the log replaced), in any block size."""
from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

import sim.core.telemetry as telemetry
from sim.core.telemetry import Telemetry

CLASSES = ["a", "b", "c"]
IV = 1000  # ns per interval: runs often cross intervals


class RowWise:
    """The per-run counting of tokens and gaps, one Python loop per run (the reference)."""

    def __init__(self, nc: int, iv: int = IV) -> None:
        self.iv = iv
        self.tokens_bin: dict = defaultdict(int)
        self.tenant_tokens_bin: dict = defaultdict(int)
        self.vals: list[list[int]] = [[] for _ in range(nc)]
        self.wts: list[list[int]] = [[] for _ in range(nc)]

    def run(self, start_ns, durations, emitted, steady, by_tenant, extra=None) -> None:
        k = len(durations)
        for ci, em in enumerate(emitted):
            if steady[ci]:
                self.vals[ci].append(durations[0])
                self.wts[ci].append(steady[ci])
            if k > 1 and em:
                self.vals[ci].extend(durations[1:])
                self.wts[ci].extend([em] * (k - 1))
        tokens = emitted if extra is None else [m + x for m, x in zip(emitted, extra)]
        t = start_ns
        for d in durations:
            t += d
            for ci, m in enumerate(tokens):
                if m:
                    self.tokens_bin[(t // self.iv, ci)] += m
            for tenant, m in by_tenant.items():
                self.tenant_tokens_bin[(t // self.iv, tenant)] += m


def _runs(seed: int, n: int, spec: bool):
    """Random runs in time order: 1-40 steps, 0-3 tenants, some classes idle, speculation's
    extra tokens only on one-step runs (as the engine has them)."""
    rng = np.random.default_rng(seed)
    t = 0
    for _ in range(n):
        t += int(rng.integers(0, 3000))
        k = int(rng.integers(1, 41)) if rng.random() < 0.7 else 1
        durations = rng.integers(1, 400, k).tolist()
        emitted = [int(x) * int(rng.random() < 0.7) for x in rng.integers(0, 9, len(CLASSES))]
        steady = [int(rng.integers(0, e + 1)) for e in emitted]
        tenants = rng.choice(["t0", "t1", "t2", "t3"], int(rng.integers(0, 4)), replace=False).tolist()
        by_tenant = {x: int(rng.integers(1, 12)) for x in tenants}
        extra = [int(rng.integers(0, 4)) if k == 1 else 0 for _ in CLASSES] if spec else None
        yield t, durations, emitted, steady, by_tenant, extra
        t += sum(durations)


@pytest.mark.parametrize("block", [1, 7, 4096])
@pytest.mark.parametrize("spec", [False, True])
@pytest.mark.parametrize("iv", [IV, 3])  # (3 ns: far more intervals than steps, counted sparsely)
def test_logged_runs_fold_to_the_row_wise_counts(monkeypatch, block, spec, iv):
    monkeypatch.setattr(telemetry, "RUN_BLOCK", block)
    tel, ref = Telemetry(CLASSES, iv), RowWise(len(CLASSES), iv)
    for i, args in enumerate(_runs(block, 300, spec)):
        tel.log_run(*args) if spec else tel.log_run(*args[:-1])
        ref.run(*args)
        if i == 150:  # a read folds what is logged so far; later runs add to it
            assert sum(tel.tokens_bin.values()) == sum(ref.tokens_bin.values())
    assert dict(tel.tokens_bin) == dict(ref.tokens_bin)
    assert dict(tel.tenant_tokens_bin) == dict(ref.tenant_tokens_bin)
    for ci in range(len(CLASSES)):  # the same gaps in the same order
        assert tel.itl_step_vals[ci].tolist() == ref.vals[ci]
        assert tel.itl_step_wts[ci].tolist() == ref.wts[ci]


def test_merged_telemetry_folds_each_replicas_log():
    tels, ref = [], RowWise(len(CLASSES))
    for seed in range(3):
        tel = Telemetry(CLASSES, IV)
        for args in _runs(seed, 50, False):
            tel.log_run(*args[:-1])
            ref.run(*args)
        tels.append(tel)
    m = Telemetry.merged(tels, CLASSES, IV)
    assert dict(m.tokens_bin) == dict(ref.tokens_bin)
    assert dict(m.tenant_tokens_bin) == dict(ref.tenant_tokens_bin)
    for ci in range(len(CLASSES)):  # every gap with its weight, as the results read them
        vals, counts = m.itl_arrays(ci)
        want: dict[int, int] = defaultdict(int)
        for v, w in zip(ref.vals[ci], ref.wts[ci]):
            want[v] += w
        assert dict(zip(vals.tolist(), counts.tolist())) == dict(want)
