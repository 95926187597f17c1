"""Ended requests' rows are kept flat and moved into the typed columns a block at a time: the
columns hold every request's values, converted, in the order they ended, whatever the block."""
from __future__ import annotations

import math

import numpy as np
import pytest

import sim.core.telemetry as telemetry
from sim.core.costs import NS
from sim.core.request import Request, State
from sim.core.telemetry import Telemetry


def _ended(n: int) -> list[Request]:
    rng = np.random.default_rng(5)
    out = []
    for i in rng.permutation(n).tolist():
        r = Request(i, int(rng.integers(0, 10**12)), f"t{i % 3}", "c", 0, 2, int(rng.integers(1, 900)),
                    50, 100, math.nan if i % 2 else 1.5, i % 4, -1 if i % 5 else 7)
        r.state = [State.FINISHED, State.REJECTED, State.UNFINISHED][i % 3]
        r.generated = i % 4
        r.first_token_ns = -1 if i % 4 == 0 else r.arrival_ns + 10
        r.finish_ns = r.arrival_ns + 99
        r.max_itl_ns = i * 1000
        r.reject_reason = "too_large" if r.state is State.REJECTED else ""
        out.append(r)
    return out


@pytest.mark.parametrize("block", [1, 7, 512])
def test_rows_reach_the_columns_in_end_order(monkeypatch, block):
    monkeypatch.setattr(telemetry, "ROW_BLOCK", block)
    tel = Telemetry(["c"], NS)
    reqs = _ended(100)
    for j, r in enumerate(reqs):
        tel.on_end(r)
        assert tel.rows_recorded() == j + 1
    cols = tel.columns()
    assert cols["request_id"].tolist() == [r.request_id for r in reqs]
    assert cols["tenant"] == [r.tenant for r in reqs] and cols["user"].tolist() == [r.user for r in reqs]
    assert cols["arrival_s"].tolist() == [r.arrival_ns / NS for r in reqs]
    assert cols["status"] == [{State.FINISHED: "finished", State.REJECTED: "rejected",
                               State.UNFINISHED: "unfinished"}[r.state] for r in reqs]
    finish = [r.finish_ns / NS if r.state is State.FINISHED else math.nan for r in reqs]
    np.testing.assert_array_equal(cols["finish_s"], finish)
    np.testing.assert_array_equal(cols["first_token_s"], [r.first_token_ns / NS if r.first_token_ns >= 0
                                                          else math.nan for r in reqs])
    np.testing.assert_array_equal(cols["max_itl_s"], [r.max_itl_ns / NS if r.generated > 1 else math.nan
                                                      for r in reqs])
    np.testing.assert_array_equal(cols["deadline_s"], [r.deadline_s for r in reqs])
    assert cols["reject_reason"] == [r.reject_reason for r in reqs]


def test_seconds_beyond_exact_floats_round_as_python():
    # clocks past 2**53 ns (104 days) do not convert to floats exactly: Python's int / int rounds once
    tel = Telemetry(["c"], NS)
    reqs = _ended(40)
    for j, r in enumerate(reqs):
        r.arrival_ns = 2**53 + 2 * j + 1 if j % 2 else j
        tel.on_end(r)
    assert tel.columns()["arrival_s"].tolist() == [r.arrival_ns / NS for r in reqs]



def test_a_row_holds_the_sources_in_order():
    """on_end names the attributes one by one: the row is SOURCES' values, in SOURCES' order."""
    from operator import attrgetter

    from sim.core.columns import SOURCES

    tel = Telemetry(["c"], NS)
    r = _ended(1)[0]
    for k, name in enumerate(SOURCES):  # (a distinct value each, of the attribute's own type)
        v = getattr(r, name)
        if not isinstance(v, (str, State)):
            setattr(r, name, type(v)(1000 + k))
    tel.on_end(r)
    assert tel._rows == list(attrgetter(*SOURCES)(r))
