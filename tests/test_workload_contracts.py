"""The workload contracts (workloads.contracts): every registered piece satisfies its Protocol,
and a trace format of one's own is one object, named by a dotted path."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from workloads import (ARRIVALS, LENGTHS, TRACE_LOADERS, ArrivalProcess, LengthLaw, LengthModel, TraceLoader,
                       WorkloadError, build_workload, load_trace, parse_arrival, parse_length)
from workloads.traces import Trace, TraceFormat, formats

ARRIVAL_PARAMS = {"poisson": {"rate": 2}, "gamma": {"rate": 2, "cv": 2}, "weibull": {"rate": 2, "shape": 0.7},
                  "mmpp2": {"rate_on": 4, "rate_off": 1, "mean_on_s": 5, "mean_off_s": 5},
                  "onoff": {"rate_on": 4, "mean_on_s": 5, "mean_off_s": 5},
                  "piecewise": {"times": [0, 10], "rates": [1, 3]}, "diurnal": {"rate": 2, "amplitude": 0.5, "period_s": 60},
                  "batch": {"n": 10, "spread_s": 5}}
LAW_PARAMS = {"constant": {"value": 3}, "uniform": {"low": 1, "high": 9}, "exponential": {"mean": 5},
              "lognormal": {"median": 5, "sigma": 1}, "zipf": {"a": 1.1, "n": 100},
              "empirical": {"values": [1, 2, 3]}}


def test_every_open_arrival_process_is_an_arrival_process():
    assert set(ARRIVALS.names()) == set(ARRIVAL_PARAMS) | {"closed_loop"}
    for name, params in ARRIVAL_PARAMS.items():
        proc = parse_arrival({"process": name, **params})
        assert isinstance(proc, ArrivalProcess), name
        t = proc.sample(np.random.default_rng(0), 30.0)
        assert np.all(np.diff(t) >= 0) and (len(t) == 0 or (t[0] >= 0 and t[-1] < 30.0))
        assert isinstance(proc.scaled(2.0), ArrivalProcess)


def test_every_length_law_is_a_law_and_a_model_wraps_it():
    assert set(LENGTHS.names()) == set(LAW_PARAMS)
    for name, params in LAW_PARAMS.items():
        law = LENGTHS.create(name, **params)
        assert isinstance(law, LengthLaw), name
        model = parse_length({"dist": name, **params})
        assert isinstance(model, LengthModel), name
        assert model.sample(np.random.default_rng(0), 5).dtype == np.int64


def test_every_registered_trace_format_is_a_trace_loader():
    assert formats() == ["azure", "mooncake", "sharegpt", "csv", "jsonl", "servegen"]
    for name in formats():
        assert isinstance(TRACE_LOADERS.resolve(name), TraceLoader), name


def _read_pairs(path: Path, spec: dict, lenient: bool) -> Trace:
    """A made-up format: one request per line, ``time prompt output`` separated by spaces."""
    rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
    df = pd.DataFrame({"arrival_s": [float(r[0]) for r in rows],
                       "prompt_tokens": np.array([int(r[1]) for r in rows], dtype=np.int64),
                       "output_tokens": np.array([int(r[2]) for r in rows], dtype=np.int64)})
    return Trace(df, path.name, len(rows))


PAIRS = TraceFormat(_read_pairs, "time prompt output per line", options={"scale": None})


def test_a_format_of_ones_own_is_one_object_named_by_a_dotted_path(tmp_path, monkeypatch):
    (tmp_path / "day.txt").write_text("0.0 100 10\n0.5 200 20\n2.0 50 5\n")
    monkeypatch.setitem(sys.modules, "my_pairs_format", sys.modules[__name__])
    spec = {"format": "my_pairs_format:PAIRS", "path": "day.txt", "scale": 1}
    assert load_trace(spec, tmp_path).df["prompt_tokens"].tolist() == [100, 200, 50]
    wl = build_workload([{"tenant": "t", "class": "c", "trace": spec}], horizon_s=10, seed=0, base_dir=tmp_path)
    assert wl.open["output_tokens"].tolist() == [10, 20, 5]
    with pytest.raises(WorkloadError, match="format: must be one of azure, mooncake, sharegpt, csv, jsonl, servegen"):
        load_trace({"format": "pairs", "path": "day.txt"}, tmp_path)
    with pytest.raises(WorkloadError, match="scal: unknown key"):
        load_trace({**spec, "scal": 1}, tmp_path)


def _burstgpt_file(path: Path) -> Path:
    """A BurstGPT-shaped CSV: 40 requests, one every 0.25 s, the last response failed (0 tokens)."""
    rows = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    rows += [f"{0.25 * i:.2f},ChatGPT,{100 + 7 * i},{0 if i == 39 else 20 + i},0,Conversation log" for i in range(40)]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_a_new_trace_format_is_one_file(tmp_path):
    """tests/plugins/burstgpt.py is all a new format takes: named by its dotted path, or
    registered under a short name with ``register_format``, a scenario runs on its rows, which are
    checked like a shipped format's (a bad row is named by file and line)."""
    from sim import scenario_from_dict, simulate
    from tests.conftest import small_scenario
    from tests.plugins.burstgpt import BURSTGPT
    from workloads import register_format

    _burstgpt_file(tmp_path / "burst.csv")

    def run(fmt: str):
        d = small_scenario()
        d["classes"] = d["classes"][:1]
        d["streams"] = [{"tenant": "a", "class": "hi", "trace": {"format": fmt, "path": "burst.csv"}}]
        return simulate(scenario_from_dict(d, base_dir=tmp_path)).requests

    mine = run("tests.plugins.burstgpt:BURSTGPT")
    assert len(mine) == 40 and mine["prompt_tokens"].tolist()[:3] == [100, 107, 114]
    assert mine["arrival_s"].tolist()[:3] == [0.0, 0.25, 0.5] and mine["output_tokens"].iloc[-1] == 1
    register_format("burstgpt", BURSTGPT)
    try:
        assert formats()[-1] == "burstgpt"
        pd.testing.assert_frame_equal(run("burstgpt"), mine)
        (tmp_path / "bad.csv").write_text((tmp_path / "burst.csv").read_text().replace("\n0.50,", "\nnoon,"))
        with pytest.raises(WorkloadError, match=r"bad\.csv line 4: Timestamp 'noon' is not a number"):
            load_trace({"format": "burstgpt", "path": "bad.csv"}, tmp_path)
        with pytest.raises(WorkloadError, match=r"did you mean 'burstgpt'\?"):
            load_trace({"format": "burstgp", "path": "burst.csv"}, tmp_path)
    finally:
        TRACE_LOADERS.unregister("burstgpt")
    assert "burstgpt" not in formats()
