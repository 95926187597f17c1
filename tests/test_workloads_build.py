"""build_workload / validate_streams: the engine contract, determinism, replay options, scenarios."""
import io
import math
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from workloads import (REQUIRED_COLUMNS, WorkloadError, build_workload, stream_stats,
                       validate_streams)

HERE = Path(".")
SCEN = Path(__file__).resolve().parents[1] / "workloads" / "scenarios"


def poisson_stream(**kw):
    s = {"tenant": "t", "class": "c", "arrival": {"process": "poisson", "rate": 5.0},
         "prompt_tokens": {"dist": "lognormal", "median": 500, "sigma": 0.5},
         "output_tokens": {"dist": "uniform", "low": 10, "high": 50}}
    s.update(kw)
    return s


def build(streams, **kw):
    kw.setdefault("horizon_s", 100.0)
    kw.setdefault("seed", 7)
    kw.setdefault("base_dir", HERE)
    return build_workload(streams, **kw)


def _bytes(df):
    buf = io.BytesIO()
    df.to_csv(buf)
    return buf.getvalue()


def test_columns_and_dtypes_exact():
    df = build([poisson_stream(deadline_s=2.0)]).open
    assert list(df.columns) == list(REQUIRED_COLUMNS)
    assert {c: str(df[c].dtype) for c in df.columns} == REQUIRED_COLUMNS
    assert df["arrival_s"].is_monotonic_increasing and df["arrival_s"].lt(100).all()
    assert (df["max_tokens"] >= df["output_tokens"]).all() and df["prompt_tokens"].min() >= 1
    assert (df["deadline_s"] == 2.0).all() and (df["stream"] == 0).all()


def test_empty_workload_has_typed_columns():
    w = build([poisson_stream(start_s=200.0)])
    assert len(w.open) == 0 and {c: str(w.open[c].dtype) for c in w.open} == REQUIRED_COLUMNS


def test_same_seed_same_bytes_other_seed_differs():
    streams = [poisson_stream(), poisson_stream(tenant="u", correlation=0.4),
               {"tenant": "x", "class": "c", "trace": {"format": "azure", "path": "azure_code"}}]
    a, b = build(streams), build(streams)
    assert _bytes(a.open) == _bytes(b.open)
    assert _bytes(build(streams, seed=8).open) != _bytes(a.open)


def test_adding_a_stream_leaves_others_unchanged():
    one = build([poisson_stream()]).open
    two = build([poisson_stream(), poisson_stream(tenant="u")]).open
    assert _bytes(two[two.stream == 0].reset_index(drop=True)) == _bytes(one)


def test_sort_is_stable_by_stream_then_order():
    drop = {"process": "batch", "n": 3, "at_s": 1.0}
    df = build([poisson_stream(arrival=drop, tenant="a"), poisson_stream(arrival=drop, tenant="b")]).open
    assert df["tenant"].tolist() == ["a"] * 3 + ["b"] * 3


def test_load_scale_doubles_poisson_and_compresses_traces():
    n1 = len(build([poisson_stream()], horizon_s=400).open)
    n2 = len(build([poisson_stream()], horizon_s=400, load_scale=2.0).open)
    assert n2 / n1 == pytest.approx(2.0, rel=0.1)
    tr = {"tenant": "x", "class": "c", "trace": {"format": "azure", "path": "azure_conv"}}
    a = build([tr], horizon_s=1e5).open
    b = build([tr], horizon_s=1e5, load_scale=2.0).open
    assert np.allclose(b["arrival_s"], a["arrival_s"] / 2)


def test_replay_window_sample_and_start():
    tr = {"format": "azure", "path": "azure_conv", "window": [600.0, 1200.0]}
    w = build([{"tenant": "x", "class": "c", "trace": tr, "start_s": 10.0}], horizon_s=1e4)
    full = build([{"tenant": "x", "class": "c", "trace": {"format": "azure", "path": "azure_conv"}}],
                 horizon_s=1e4).open
    inside = full[(full.arrival_s >= 600) & (full.arrival_s < 1200)]
    assert len(w.open) == len(inside)
    assert w.open["arrival_s"].min() >= 10.0 and w.open["arrival_s"].max() < 610.0
    m = w.meta["streams"][0]
    assert m["rows_outside_window"] + len(w.open) == m["rows_read"]
    s = build([{"tenant": "x", "class": "c", "trace": dict(tr, sample=0.5)}], horizon_s=1e4)
    assert len(s.open) == pytest.approx(len(inside) / 2, rel=0.1)
    assert s.meta["streams"][0]["rows_sampled_out"] + len(s.open) == len(inside)


def test_horizon_cut_is_counted():
    w = build([{"tenant": "x", "class": "c", "trace": {"format": "azure", "path": "azure_code"}}],
              horizon_s=60.0)
    m = w.meta["streams"][0]
    # reading stops a little past the horizon: the rows read are the requests and those after it
    assert m["trace_read_until_s"] == 60.0 and m["rows_read"] < 8819
    assert m["requests"] + m["rows_after_horizon"] == m["rows_read"]
    whole = build([{"tenant": "x", "class": "c", "trace": {"format": "azure", "path": "azure_code"}}],
                  horizon_s=4000.0).meta["streams"][0]  # (the trace spans an hour: read whole)
    assert whole["requests"] + whole["rows_after_horizon"] == whole["rows_read"] == 8819


def test_trace_lengths_with_arrival_process():
    w = build([{"tenant": "x", "class": "c", "arrival": {"process": "poisson", "rate": 50},
                "trace": {"format": "azure", "path": "azure_conv"}}], horizon_s=200)
    assert len(w.open) == pytest.approx(10_000, rel=0.05)
    assert w.open["prompt_tokens"].mean() == pytest.approx(1155, rel=0.05)
    assert (w.open["max_tokens"] == 1000).all()


def test_assign_rules_by_threshold_column_and_fraction(tmp_path):
    w = build([poisson_stream(assign=[{"column": "prompt_tokens", "above": 600, "class": "long"},
                                      {"fraction": 0.5, "tenant": "half"}])], horizon_s=400)
    df = w.open
    assert (df.loc[df.prompt_tokens > 600, "cls"] == "long").all()
    assert (df.loc[df.prompt_tokens <= 600, "cls"] == "c").all()
    rest = df[df.prompt_tokens <= 600]
    assert (rest.tenant == "half").mean() == pytest.approx(0.5, abs=0.05)
    assert (df.loc[df.prompt_tokens > 600, "tenant"] == "t").all()  # first matching rule wins
    f = tmp_path / "t.csv"
    f.write_text("t,p,o,src\n0,1,1,a\n1,2,2,b\n")
    w = build([{"tenant": "x", "class": "c", "assign": [{"column": "f_src", "equals": "b", "tenant": "B"}],
                "trace": {"format": "csv", "path": "t.csv", "columns": {
                    "arrival_s": "t", "prompt_tokens": "p", "output_tokens": "o", "f_src": "src"}}}],
              base_dir=tmp_path)
    assert w.open["tenant"].tolist() == ["x", "B"] and w.open["f_src"].tolist() == ["a", "b"]


def test_tenant_and_class_cells_share_one_string_per_value():
    """Every row of a stream refers to the same tenant and class string objects (a million
    requests are not a million copies of a name), with the values as assigned."""
    df = build([poisson_stream(assign=[{"fraction": 0.5, "tenant": "half"}]),
                poisson_stream(tenant="tenant u", **{"class": "class d"})], horizon_s=200).open
    for col in ("tenant", "cls"):
        cells = df[col].tolist()
        assert len({id(v) for v in cells}) == len(set(cells))
    assert set(df["tenant"]) == {"t", "half", "tenant u"} and set(df["cls"]) == {"c", "class d"}


def test_max_tokens_rules():
    w = build([poisson_stream(output_tokens={"dist": "exponential", "mean": 100, "max": 300})])
    assert (w.open["max_tokens"] == 300).all()
    w = build([poisson_stream(output_tokens={"dist": "exponential", "mean": 100})])
    assert (w.open["max_tokens"] == w.open["max_tokens"].iloc[0]).all()
    assert w.open["max_tokens"].iloc[0] == math.ceil(round(100 * math.log(1e4)))
    w = build([poisson_stream(output_tokens={"dist": "exponential", "mean": 100}, max_tokens=50)])
    assert (w.open["max_tokens"] == 50).all() and w.open["output_tokens"].max() == 50
    assert w.meta["streams"][0]["outputs_capped"] > 0


def test_an_undeclared_max_tokens_fills_what_the_context_leaves():
    """A stream that declares no max_tokens: with a server context (``max_model_len``) each
    request may generate what the context leaves after its prompt, as vLLM's and SGLang's
    servers default it, and stops there; prompts that fill the context are left as they are
    (refused as too long); declared ones are unchanged (over the context the server refuses)."""
    out = {"dist": "uniform", "low": 400, "high": 800}
    plain = build([poisson_stream(output_tokens=out)]).open
    w = build([poisson_stream(output_tokens=out)], context_tokens=1000)
    df = w.open
    left = 1000 - df["prompt_tokens"]
    fits = left >= 1
    assert (df["max_tokens"][fits] == np.minimum(plain["max_tokens"][fits], left[fits])).all()
    assert (df["output_tokens"] == np.minimum(plain["output_tokens"], df["max_tokens"])).all()
    assert (df["max_tokens"][~fits] == plain["max_tokens"][~fits]).all()
    assert w.meta["streams"][0]["max_tokens_context_left"] == int((fits & (plain["max_tokens"] > left)).sum()) > 0
    declared = build([poisson_stream(output_tokens=out, max_tokens=900)], context_tokens=1000).open
    assert (declared["max_tokens"] == 900).all()
    c = build([closed_stream(output_tokens=out, prompt_tokens={"dist": "uniform", "low": 500, "high": 900})],
              context_tokens=1000).closed[0]
    for _, _, row in c.start():
        assert row["max_tokens"] == min(800, 1000 - row["prompt_tokens"]) >= row["output_tokens"]


def test_hash_ids_column_only_when_provided(tmp_path):
    assert "hash_ids" not in build([poisson_stream()]).open
    f = tmp_path / "m.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [0, 1]}\n')
    df = build([poisson_stream(), {"tenant": "m", "class": "c",
                                   "trace": {"format": "mooncake", "path": "m.jsonl"}}],
               base_dir=tmp_path).open
    assert df["hash_ids"].iloc[0] == (0, 1) and df["hash_ids"].iloc[1:].isna().all()


def closed_stream(**kw):
    return poisson_stream(arrival={"process": "closed_loop", "users": 3,
                                   "think": {"dist": "exponential", "mean": 2.0}}, **kw)


def test_closed_loop_start_and_next():
    w = build([closed_stream(deadline_s=5.0)], horizon_s=20.0)
    assert len(w.open) == 0 and len(w.closed) == 1
    c = w.closed[0]
    assert (c.stream, c.tenant, c.cls, c.users) == (0, "t", "c", 3)
    first = c.start()
    assert [u for u, _, _ in first] == [0, 1, 2]
    assert all(0 <= t < 2.0 for _, t, _ in first)
    row = first[0][2]
    assert set(row) == {"prompt_tokens", "output_tokens", "max_tokens", "deadline_s"}
    assert row["max_tokens"] >= row["output_tokens"] >= 1 and row["deadline_s"] == 5.0
    t, _ = c.next(0, 3.0)
    assert t >= 3.0
    assert c.next(0, 20.0) is None


def test_closed_loop_deterministic_and_independent_of_call_order():
    a = build([closed_stream()]).closed[0]
    b = build([closed_stream()]).closed[0]
    assert a.start() == b.start()
    a0, a1 = a.next(0, 1.0), a.next(1, 1.0)
    b1, b0 = b.next(1, 1.0), b.next(0, 1.0)
    assert (a0, a1) == (b0, b1)


def test_closed_loop_mean_think_time():
    c = build([closed_stream()], horizon_s=1e9).closed[0]
    c.start()
    gaps = [c.next(0, 0.0)[0] for _ in range(20_000)]
    assert np.mean(gaps) == pytest.approx(2.0, rel=0.03)


@pytest.mark.parametrize("stream,message", [
    (poisson_stream(arrival={"process": "poisson", "rate": -1.0}),
     "streams[0].arrival.rate: must be > 0 (got -1.0)"),
    (poisson_stream(arival={"process": "poisson", "rate": 1}), "streams[0].arival: unknown key"),
    (poisson_stream(**{"class": "nope"}), "streams[0].class: must be one of the [[classes]] names"),
    (poisson_stream(arrival={"process": "poison", "rate": 1}), "did you mean 'poisson'"),
    (poisson_stream(prompt_tokens={"dist": "lognormal", "median": 5}),
     "streams[0].prompt_tokens: bad parameters ['median'] for dist 'lognormal': missing 'sigma'"),
    (poisson_stream(output_tokens={"dist": "uniform", "low": 5, "high": 2}),
     "streams[0].output_tokens.high: must be >= low (5) (got 2)"),
    (poisson_stream(output_tokens={"dist": "constant", "value": 5, "min": -1}),
     "streams[0].output_tokens.min: must be an integer >= 0 (got -1)"),
    (poisson_stream(prompt_tokens=0), "streams[0].prompt_tokens: must be an integer >= 1 (got 0)"),
    ({"tenant": "t", "class": "c", "arrival": {"process": "poisson", "rate": 1}},
     "streams[0].prompt_tokens: must be a length model"),
    ({"tenant": "t", "class": "c", "trace": {"format": "azure", "path": "nope.csv"}},
     "streams[0].trace.path: must be an existing file"),
    ({"tenant": "t", "class": "c", "trace": {"format": "azur", "path": "azure_code"}},
     "streams[0].trace.format: must be one of"),
    ({"tenant": "t", "class": "c", "trace": {"format": "azure", "path": "azure_code"},
      "prompt_tokens": 5}, "streams[0].prompt_tokens: must be absent when the stream has a trace"),
    (poisson_stream(assign=[{"fraction": 2, "class": "c"}]),
     "streams[0].assign[0].fraction: must be <= 1 (got 2)"),
    (poisson_stream(arrival={"process": "gamma", "rate": 1}), "streams[0].arrival: bad parameters ['rate'] for process "
     "'gamma': missing"),
    (poisson_stream(arrival={"process": "poisson", "rat": 1}), "streams[0].arrival: bad parameters ['rat'] for process "
     "'poisson': 'rat' is not one of its parameters (expected rate); did you mean 'rate'?"),
    (poisson_stream(arrival={"process": "closed_loop", "users": 2, "think": {"dist": "exponential"}}),
     "streams[0].arrival.think: bad parameters [] for dist 'exponential': missing"),
    (poisson_stream(start_s=5, stop_s=1), "streams[0].stop_s: must be > 5 (got 1)"),
])
def test_validate_streams_names_the_key(stream, message):
    with pytest.raises(WorkloadError) as e:
        validate_streams([stream], {"c"}, HERE)
    assert message in str(e.value)


def test_validate_accepts_good_streams():
    validate_streams([poisson_stream(), closed_stream()], {"c"}, HERE)


def test_stream_stats_known_values():
    df = pd.DataFrame({"arrival_s": [0.0, 1.0, 2.0, 4.0], "tenant": ["a"] * 4, "cls": ["x"] * 4,
                       "prompt_tokens": [1, 2, 3, 4], "output_tokens": [10, 10, 10, 10]})
    s = stream_stats(df, horizon_s=8.0).iloc[0]
    gaps = np.array([1.0, 1.0, 2.0])
    assert s["count"] == 4 and s["rate"] == 0.5
    assert s["interarrival_cv"] == pytest.approx(gaps.std() / gaps.mean())
    assert s["prompt_mean"] == 2.5 and s["prompt_p50"] == 2.5 and s["output_p99"] == 10


@pytest.mark.parametrize("path", sorted(SCEN.glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_scenario_builds_at_reduced_horizon(path):
    text = path.read_text()
    data = tomllib.loads(text)
    assert text.lstrip().startswith("#"), "a scenario opens with the question it answers"
    validate_streams(data["streams"], {c["name"] for c in data["classes"]}, path.parent)
    w = build_workload(data["streams"], horizon_s=min(60.0, data["horizon_s"]),
                       seed=data.get("seed", 0), base_dir=path.parent)
    assert len(w.open) + len(w.closed) > 0
    assert w.open["arrival_s"].lt(60.0).all()
