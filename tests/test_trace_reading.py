"""Trace files read as a stream (only the rows a replay needs), and hostile files named in one
line: a damaged gzip body, JSON nested too deeply, a byte-order mark, datetimes without
``time_unit = "datetime"``, an out-of-order row under lenient mode, tenant / class columns."""
import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from workloads import WorkloadError, build_workload, load_trace
from workloads.tracefile import FIRST_CHUNK_ROWS
from workloads.tracerows import out_of_order

COLS = {"arrival_s": "t", "prompt_tokens": "p", "output_tokens": "o"}


def _csv(tmp_path, good: int, garbage: int = 10, name: str = "t.csv") -> dict:
    """``good`` rows one second apart, then ``garbage`` rows no loader could accept."""
    rows = [f"{i},{10 + i % 7},{1 + i % 5}" for i in range(good)] + ["garbage,x,y"] * garbage
    (tmp_path / name).write_text("t,p,o\n" + "\n".join(rows) + "\n")
    return {"format": "csv", "path": name, "columns": COLS}


def _replay(spec: dict, horizon_s: float, tmp_path, **stream) -> object:
    return build_workload([{"tenant": "a", "class": "c", "trace": spec, **stream}], horizon_s=horizon_s,
                          seed=0, base_dir=tmp_path)


def test_rows_past_the_horizon_are_never_parsed(tmp_path):
    """Garbage after 3 * FIRST_CHUNK_ROWS good rows: a 10 s replay (max_tokens declared) never reaches it; a
    horizon that covers it names its line."""
    good = 3 * FIRST_CHUNK_ROWS
    spec = _csv(tmp_path, good)
    w = _replay(spec, 10.0, tmp_path, max_tokens=64)
    m = w.meta["streams"][0]
    assert len(w.open) == 10 and m["trace_read_until_s"] == 10.0
    assert m["rows_read"] <= FIRST_CHUNK_ROWS  # (the first chunk)
    with pytest.raises(WorkloadError, match=rf"t.csv line {good + 2}: t 'garbage' is not a number"):
        _replay(spec, 2.0 * good, tmp_path, max_tokens=64)


def test_a_replay_without_max_tokens_streams_too(tmp_path):
    """The default max_tokens is the largest output among the rows read: a later row with a longer
    output (or garbage) the replay never reaches changes nothing."""
    good = 3 * FIRST_CHUNK_ROWS
    spec = _csv(tmp_path, good)
    w = _replay(spec, 10.0, tmp_path)
    assert len(w.open) == 10 and w.meta["streams"][0]["rows_read"] <= FIRST_CHUNK_ROWS
    assert w.meta["streams"][0]["max_tokens_default"] == 5  # outputs 1 + i % 5 in the rows read


def test_jsonl_rows_past_the_horizon_are_never_parsed(tmp_path):
    good = 2 * FIRST_CHUNK_ROWS
    lines = [json.dumps({"t": i, "p": 5, "o": 2}) for i in range(good)] + ["{not json"] * 3
    (tmp_path / "t.jsonl").write_text("\n".join(lines) + "\n")
    spec = {"format": "jsonl", "path": "t.jsonl", "columns": COLS}
    assert len(_replay(spec, 5.0, tmp_path, max_tokens=8).open) == 5
    with pytest.raises(WorkloadError, match=rf"t.jsonl line {good + 1}: not a JSON object"):
        _replay(spec, 2.0 * good, tmp_path, max_tokens=8)


@pytest.mark.parametrize("stream", [{}, {"max_tokens": 64}, {"max_tokens": 64, "start_s": 3.0},
                                    {"max_tokens": 64, "stop_s": 7.5}])
def test_a_streamed_replay_has_the_same_requests_as_a_whole_read(tmp_path, stream, monkeypatch):
    """The same table for the rows used, whatever reading stopped at (load_scale and window too)."""
    n = 3 * FIRST_CHUNK_ROWS
    rng = np.random.default_rng(0)
    t = np.cumsum(rng.exponential(0.01, n))
    (tmp_path / "t.csv").write_text("t,p,o\n" + "".join(f"{float(x)!r},{1 + i % 50},{i % 9}\n" for i, x in enumerate(t)))
    for spec in ({"format": "csv", "path": "t.csv", "columns": COLS},
                 {"format": "csv", "path": "t.csv", "columns": COLS, "window": [4.0, 30.0]}):
        for scale in (1.0, 2.5):
            streamed = build_workload([{"tenant": "a", "class": "c", "trace": spec, **stream}], horizon_s=10.0,
                                      seed=0, base_dir=tmp_path, load_scale=scale)
            whole = load_trace(spec, tmp_path)  # the whole file, as every replay was read before
            assert whole.complete
            if "max_tokens" in stream:
                assert streamed.meta["streams"][0]["rows_read"] < n
            monkeypatch.setattr("workloads.build.replay_until", lambda *a: None)  # (read whole)
            ref = build_workload([{"tenant": "a", "class": "c", "trace": spec, **stream}], horizon_s=10.0, seed=0,
                                 base_dir=tmp_path, load_scale=scale)
            monkeypatch.undo()
            assert ref.meta["streams"][0]["rows_read"] == n
            assert streamed.open.equals(ref.open)
            w0 = spec.get("window", [0, 0])[0]
            end = stream.get("stop_s", 10.0)
            start = stream.get("start_s", 0.0)
            used = whole.df[(whole.df.arrival_s >= w0) &
                            ((whole.df.arrival_s - w0) / scale + start < end)]
            assert len(streamed.open) == len(used)
            assert np.array_equal(streamed.open["prompt_tokens"].to_numpy(), used["prompt_tokens"].to_numpy())


def test_corrupt_gzip_body_is_one_line(tmp_path):
    body = gzip.compress(b"t,p,o\n" + b"".join(b"%d,5,5\n" % i for i in range(20000)))
    damaged = body[:200] + bytes(b ^ 0x55 for b in body[200:400]) + body[400:]
    for name, spec in (("t.csv.gz", {"format": "csv", "columns": COLS}),
                       ("t.jsonl.gz", {"format": "jsonl", "columns": COLS})):
        (tmp_path / name).write_bytes(damaged)
        with pytest.raises(WorkloadError, match=rf"^{name}: cannot (read|parse as CSV): .*expected a whole "
                                                r"gzip-compressed file"):
            load_trace(dict(spec, path=name), tmp_path)
    (tmp_path / "cut.csv.gz").write_bytes(body[: len(body) // 2])  # truncated
    with pytest.raises(WorkloadError, match=r"cut.csv.gz: cannot parse as CSV"):
        load_trace({"format": "csv", "path": "cut.csv.gz", "columns": COLS}, tmp_path)


def test_deeply_nested_json_names_file_and_line(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"t": 0, "p": 1, "o": 1}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(WorkloadError, match=r"^t.jsonl line 2: not a JSON object \(nested too deeply"):
        load_trace({"format": "jsonl", "path": "t.jsonl", "columns": COLS}, tmp_path)


def test_a_byte_order_mark_is_accepted_in_jsonl_as_in_csv(tmp_path):
    (tmp_path / "t.jsonl").write_bytes(b"\xef\xbb\xbf" + b'{"t": 0, "p": 3, "o": 4}\n{"t": 1, "p": 5, "o": 6}\n')
    (tmp_path / "t.csv").write_bytes(b"\xef\xbb\xbft,p,o\n0,3,4\n1,5,6\n")
    (tmp_path / "m.jsonl.gz").write_bytes(gzip.compress(
        b'\xef\xbb\xbf{"timestamp": 0, "input_length": 3, "output_length": 4}\n'))
    for name in ("t.jsonl", "t.csv"):
        df = load_trace({"format": name.split(".")[1], "path": name, "columns": COLS}, tmp_path).df
        assert df["prompt_tokens"].tolist() == [3, 5]
    assert load_trace({"format": "mooncake", "path": "m.jsonl.gz"}, tmp_path).rows_read == 1


def test_datetimes_in_a_numeric_time_column_get_the_hint(tmp_path):
    (tmp_path / "t.csv").write_text("t,p,o\n2024-05-10 12:00:01.5,3,4\n2024-05-10 12:00:03,5,6\n")
    spec = {"format": "csv", "path": "t.csv", "columns": COLS}
    with pytest.raises(WorkloadError, match=r"t.csv line 2: t '2024-05-10 12:00:01.5' is not a number "
                                            r"\(it looks like a date and time: set time_unit = \"datetime\""):
        load_trace(spec, tmp_path)
    assert load_trace(dict(spec, time_unit="datetime"), tmp_path).df["arrival_s"].tolist() == [0.0, 1.5]
    (tmp_path / "n.csv").write_text("t,p,o\nsoon,3,4\n")
    with pytest.raises(WorkloadError) as e:
        load_trace(dict(spec, path="n.csv"), tmp_path)
    assert "datetime" not in str(e.value)  # (the hint only for what looks like a date)


def test_lenient_skips_one_out_of_order_row_alone(tmp_path):
    """A row far ahead (a spike) or one behind (a dip): one bad row, one row skipped."""
    ahead = [0, 1, 2, 3, 1000] + list(range(4, 300))
    behind = list(range(0, 5)) + [2.5] + list(range(5, 300))
    for times, bad_line in ((ahead, 6), (behind, 7)):
        (tmp_path / "t.csv").write_text("t,p,o\n" + "".join(f"{t},5,5\n" for t in times))
        spec = {"format": "csv", "path": "t.csv", "columns": COLS}
        tr = load_trace(spec, tmp_path, lenient=True)
        assert tr.rows_skipped == 1 and len(tr.df) == len(times) - 1
        assert tr.skipped_examples == [f"line {bad_line}: t '{times[bad_line - 2]}' is out of order "
                                       f"(times must be sorted)"]
        assert np.all(np.diff(tr.df["arrival_s"].to_numpy()) >= 0)
        with pytest.raises(WorkloadError, match="is earlier than an earlier row"):
            load_trace(spec, tmp_path)


@pytest.mark.parametrize("name,text", [
    ("t.csv", "t,p,o,who,kind\n0,5,5,,chat\n1,5,5,bob,\n"),
    ("t.jsonl", '{"t": 0, "p": 5, "o": 5, "kind": "chat"}\n{"t": 1, "p": 5, "o": 5, "who": "bob"}\n'),
])
def test_a_row_without_tenant_or_class_takes_its_streams(tmp_path, name, text):
    """docs/own-traffic.md: the stream's tenant (and class) is the default when a row names none,
    an empty cell or a JSON line without the field; an empty class cell was refused as class
    None."""
    (tmp_path / name).write_text(text)
    spec = {"format": name.split(".")[1], "path": name, "columns": dict(COLS, tenant="who", **{"class": "kind"})}
    w = build_workload([{"tenant": "x", "class": "batch", "trace": spec}], horizon_s=10, seed=0,
                       base_dir=tmp_path, class_names=["chat", "batch"])
    assert w.open["tenant"].tolist() == ["x", "bob"]
    assert w.open["cls"].tolist() == ["chat", "batch"]


def test_out_of_order_keeps_the_most_rows_in_simple_cases():
    assert out_of_order(np.array([1.0, 2, 3])).tolist() == [False] * 3
    assert np.flatnonzero(out_of_order(np.array([5.0, 1, 2, 3]))).tolist() == [0]  # the first row ahead
    assert np.flatnonzero(out_of_order(np.array([1.0, 2, 3, 0]))).tolist() == [3]  # the last behind
    assert np.flatnonzero(out_of_order(np.array([1.0, 3, 2, 4]))).tolist() == [2]  # (either; the next row agrees with 3)


def test_tenant_and_class_columns_map_directly(tmp_path):
    (tmp_path / "t.csv").write_text("t,p,o,who,kind\n0,5,5,alice,chat\n1,5,5,bob,batch\n2,5,5,alice,batch\n")
    spec = {"format": "csv", "path": "t.csv", "columns": dict(COLS, tenant="who", **{"class": "kind"})}
    w = build_workload([{"tenant": "x", "class": "chat", "trace": spec}], horizon_s=10, seed=0,
                       base_dir=tmp_path, class_names=["chat", "batch"])
    assert w.open["tenant"].tolist() == ["alice", "bob", "alice"]
    assert w.open["cls"].tolist() == ["chat", "batch", "batch"]
    with pytest.raises(WorkloadError, match=r"streams\[0\].trace: t.csv line 3: kind 'batch' is not a class of "
                                            r"the scenario \(expected one of the \[\[classes\]\] names: chat\)"):
        build_workload([{"tenant": "x", "class": "chat", "trace": spec}], horizon_s=10, seed=0,
                       base_dir=tmp_path, class_names=["chat"])
    rule = {"column": "prompt_tokens", "equals": 5, "class": "chat"}
    w = build_workload([{"tenant": "x", "class": "chat", "trace": spec, "assign": [rule]}], horizon_s=10, seed=0,
                       base_dir=tmp_path, class_names=["chat", "batch"])
    assert w.open["cls"].tolist() == ["chat"] * 3  # (a rule still overrides the column)
    with pytest.raises(WorkloadError, match=r"streams\[0\].trace.columns.tenant: must be absent for closed-loop"):
        build_workload([{"tenant": "x", "class": "chat", "trace": spec,
                         "arrival": {"process": "closed_loop", "users": 2, "think": 1.0}}],
                       horizon_s=10, seed=0, base_dir=tmp_path)


def test_mixed_utc_offsets_and_bad_hash_ids_are_rows_not_tracebacks(tmp_path):
    (tmp_path / "t.csv").write_text("t,p,o\n2024-05-10T12:00:00+02:00,3,4\n2024-05-10 10:00:01,5,6\n")
    spec = {"format": "csv", "path": "t.csv", "time_unit": "datetime", "columns": COLS}
    assert load_trace(spec, tmp_path).df["arrival_s"].tolist() == [0.0, 1.0]  # (both taken in UTC)
    (tmp_path / "h.jsonl").write_text('{"t": 0, "p": 1, "o": 1, "h": [1, 2]}\n{"t": 1, "p": 1, "o": 1, "h": ["x"]}\n')
    with pytest.raises(WorkloadError, match=r"h.jsonl line 2: h \['x'\] is not a list of integers"):
        load_trace({"format": "jsonl", "path": "h.jsonl", "columns": dict(COLS, hash_ids="h")}, tmp_path)


def test_a_row_that_names_no_tenant_or_class_gets_the_streams(tmp_path):
    """The stream's tenant and class are the default of a trace's tenant / class column: an
    empty CSV cell, a missing JSON field or null give the stream's own; a number is refused."""
    (tmp_path / "a.csv").write_text("t,p,o,who\n0,10,5,x\n0.5,10,5,\n1.0,10,5,y\n")
    (tmp_path / "a.jsonl").write_text('{"t":0,"p":10,"o":5,"who":"x"}\n{"t":0.5,"p":10,"o":5}\n'
                                      '{"t":1,"p":10,"o":5,"who":null}\n')
    cols = {**COLS, "tenant": "who"}
    for fmt, name, want in (("csv", "a.csv", ["x", "acme", "y"]), ("jsonl", "a.jsonl", ["x", "acme", "acme"])):
        w = build_workload([{"tenant": "acme", "class": "c", "trace": {"format": fmt, "path": name, "columns": cols}}],
                           horizon_s=10.0, seed=0, base_dir=tmp_path)
        assert w.open["tenant"].tolist() == want, fmt
    (tmp_path / "b.csv").write_text("t,p,o,who\n0,10,5,x\n0.5,10,5,  \n")
    with pytest.raises(WorkloadError, match=r"b.csv line 3: who '  ' is not a name"):
        build_workload([{"tenant": "acme", "class": "c", "trace": {"format": "csv", "path": "b.csv", "columns": cols}}],
                       horizon_s=10.0, seed=0, base_dir=tmp_path)


def test_a_streamed_replay_that_stops_with_a_handful_of_rows_warns_of_milliseconds(tmp_path):
    """Millisecond times read as seconds leave the first row or two of a trace in a minute's
    replay, the rest of the file unread (streamed): one warning naming time_unit. The same trace
    in seconds, or with time_unit declared, runs without it."""
    import warnings

    from plumbing.notices import InputWarning

    def lines(spec: dict) -> list[str]:
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always", InputWarning)
            _replay(spec, 60.0, tmp_path, max_tokens=64)
        return [str(w.message) for w in got if issubclass(w.category, InputWarning)]

    gaps = np.random.default_rng(1).exponential(1 / 6, 400)
    for unit, scale in (("ms", 1000.0), ("s", 1.0)):
        t = np.cumsum(gaps) * scale
        (tmp_path / f"{unit}.csv").write_text("t,p,o\n" + "".join(f"{x:.3f},10,5\n" for x in t))
        got = lines({"format": "csv", "path": f"{unit}.csv", "columns": COLS})
        assert any("set time_unit = 'ms'" in ln and "only" in ln for ln in got) == (unit == "ms"), (unit, got)
    assert not any("time_unit" in ln for ln in lines({"format": "csv", "path": "ms.csv", "columns": COLS,
                                                       "time_unit": "ms"}))
