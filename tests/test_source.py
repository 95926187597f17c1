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
