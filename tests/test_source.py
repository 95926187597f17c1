"""The request source makes each open request from its row of the workload, in arrival order,
whatever the columns it carries (features, prompt hash ids)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from sim.core.costs import NS
from sim.core.source import RequestSource


@pytest.mark.parametrize("extra", [False, True])
def test_open_requests_carry_their_rows(extra):
    rng = np.random.default_rng(3)
    n = 40
    df = pd.DataFrame({
        "arrival_s": np.sort(rng.random(n) * 10), "tenant": rng.choice(["t0", "t1"], n).tolist(),
        "cls": rng.choice(["hi", "lo"], n).tolist(), "prompt_tokens": rng.integers(1, 500, n),
        "output_tokens": rng.integers(1, 300, n), "max_tokens": rng.integers(300, 600, n),
        "deadline_s": np.where(rng.random(n) < 0.5, np.nan, rng.random(n)), "stream": rng.integers(0, 3, n),
    })
    if extra:
        df["f_hint"] = rng.random(n)
        df["f_len"] = rng.integers(0, 9, n)
        df["hash_ids"] = [list(rng.integers(0, 99, int(k))) for k in rng.integers(0, 4, n)]
    src = RequestSource(SimpleNamespace(open=df, closed=[]), {"hi": 0, "lo": 1}, [0, 5])
    got = []
    for t in np.linspace(0, 11, 25):  # a few requests at a time, as the clock passes them
        due = src.pop_due(int(t * NS))
        assert all(r.arrival_ns <= t * NS for r in due)
        got += due
    assert [r.request_id for r in got] == list(range(n)) and src.i == n
    for i, r in enumerate(got):
        row = df.iloc[i]
        assert (r.tenant, r.cls, r.cls_idx, r.priority) == (row.tenant, row.cls, int(row.cls == "lo"), 5 * int(row.cls == "lo"))
        assert (r.prompt_tokens, r.hidden_output_tokens, r.max_tokens, r.stream, r.user) == (
            row.prompt_tokens, row.output_tokens, row.max_tokens, row.stream, -1)
        assert r.arrival_ns == round(row.arrival_s * NS)
        assert r.deadline_s == row.deadline_s or (np.isnan(r.deadline_s) and np.isnan(row.deadline_s))
        assert r.features == ({"f_hint": row.f_hint, "f_len": row.f_len} if extra else {})
        assert r.hash_ids == (row.hash_ids if extra else None)


class _Users:
    """A closed-loop stream of two users: user 0 thinks 10 s between requests, user 1 0.1 s."""

    stream, cls, tenant = 0, "c", "t"
    row = {"prompt_tokens": 10, "output_tokens": 5, "max_tokens": 5}

    def start(self):
        return [(0, 0.0, self.row), (1, 0.0, self.row)]

    def next(self, user, now_s):
        return now_s + (10.0 if user == 0 else 0.1), self.row


def test_a_busy_front_end_serves_closed_loop_sends_in_the_order_they_are_made():
    """A send scheduled far ahead (a long think) does not hold up another user's send made
    before it: the front end (frontend_busy_s) serves sends in the order they are made, not in
    the order they were scheduled; sends made together are one busy time apart."""
    busy = 1_000_000  # 1 ms
    src = RequestSource(SimpleNamespace(open=pd.DataFrame(columns=["arrival_s", "tenant", "cls", "prompt_tokens",
                                                                   "output_tokens", "max_tokens", "deadline_s",
                                                                   "stream"]),
                                        closed=[_Users()]), {"c": 0}, [0], delay_ns=0, busy_ns=busy)
    first = src.pop_due(0)
    assert [r.user for r in first] == [0] and src.next_arrival_ns() == busy  # (user 1 waits one busy time)
    second = src.pop_due(busy)
    assert [r.user for r in second] == [1]
    src.on_request_end(first[0], int(0.5 * NS))  # user 0 sends again at 10.5 s (scheduled first)
    src.on_request_end(second[0], int(0.6 * NS))  # user 1 sends again at 0.7 s
    assert src.next_arrival_ns() == int(0.7 * NS)
    again = src.pop_due(int(0.7 * NS))
    assert [(r.user, r.arrival_ns) for r in again] == [(1, int(0.7 * NS))]
    assert src.pop_due(int(10.5 * NS) - 1) == [] and src.closed_pending
    last = src.pop_due(int(10.5 * NS))
    assert [(r.user, r.arrival_ns) for r in last] == [(0, int(10.5 * NS))] and not src.closed_pending
