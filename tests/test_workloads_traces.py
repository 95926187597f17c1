"""Trace loaders: the shared data README's statistics, and bad traces named by file and line."""
from pathlib import Path

import numpy as np
import pytest

from workloads import WorkloadError, build_workload, load_trace

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_shared = pytest.mark.skipif(not (SHARED / "conversation_trace.jsonl").exists(),
                                  reason="../shared/data not present")


@pytest.mark.parametrize("name,rows,rate,p_mean,p_p99,o_mean,o_max", [
    ("azure_code", 8819, 2.57, 2048, 7436, 27.9, 1899),
    ("azure_conv", 19366, 5.53, 1155, 4142, 211.1, 1000),
])
def test_azure_bundled_matches_readme(name, rows, rate, p_mean, p_p99, o_mean, o_max):
    df = load_trace({"format": "azure", "path": name}, Path(".")).df
    assert len(df) == rows
    assert df["arrival_s"].iloc[0] == 0.0
    assert len(df) / df["arrival_s"].iloc[-1] == pytest.approx(rate, abs=0.005)
    assert df["prompt_tokens"].mean() == pytest.approx(p_mean, abs=0.5)
    assert np.quantile(df["prompt_tokens"], 0.99) == pytest.approx(p_p99, abs=1)
    assert df["output_tokens"].mean() == pytest.approx(o_mean, abs=0.05)
    assert df["output_tokens"].max() == o_max


def test_azure_fractional_timestamp_parsed_to_100ns():
    df = load_trace({"format": "azure", "path": "azure_code"}, Path(".")).df
    # rows 1 and 2: 18:17:03.9799600 and 18:17:04.0319600
    assert df["arrival_s"].iloc[1] == pytest.approx(0.052, abs=1e-9)


def test_shared_t0_puts_two_traces_on_one_clock():
    t0 = "2023-11-16 18:15:46.6805900"
    code = load_trace({"format": "azure", "path": "azure_code", "t0": t0}, Path(".")).df
    assert code["arrival_s"].iloc[0] == pytest.approx(77.299, abs=1e-3)  # 18:17:03.97996 - t0


@needs_shared
def test_mooncake_conversation_matches_readme():
    tr = load_trace({"format": "mooncake", "path": str(SHARED / "conversation_trace.jsonl"),
                     "spread_bucket_s": 0}, Path("."))
    df = tr.df
    assert len(df) == 12031
    assert len(df) / 3537.0 == pytest.approx(3.40, abs=0.005)
    assert df["arrival_s"].iloc[-1] == pytest.approx(3536.999)
    assert df["prompt_tokens"].mean() == pytest.approx(12035, abs=0.5)
    assert df["output_tokens"].mean() == pytest.approx(342.6, abs=0.05)
    lens = df["hash_ids"].map(len)
    assert lens.mean() == pytest.approx(24.0, abs=0.05)
    assert (lens == np.ceil(df["prompt_tokens"] / 512)).all()
    assert df["hash_ids"].iloc[0][0] == 0 and isinstance(df["hash_ids"].iloc[0], tuple)
    assert df["arrival_s"].nunique() == 1180


@needs_shared
def test_mooncake_bucket_spreading():
    """Requests sharing a timestamp are spread evenly over the 3 s bucket."""
    df = load_trace({"format": "mooncake", "path": str(SHARED / "conversation_trace.jsonl")},
                    Path(".")).df
    first = df[df["arrival_s"] < 3.0]["arrival_s"].to_numpy()
    n = first.size
    assert np.allclose(first, 3.0 * np.arange(n) / n)
    assert np.all(np.diff(df["arrival_s"].to_numpy()) >= 0)


@needs_shared
def test_sharegpt_lengths_only_table():
    df = load_trace({"format": "sharegpt",
                     "path": str(SHARED / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv")},
                    Path(".")).df
    assert len(df) == 30731 and "arrival_s" not in df
    assert df["prompt_tokens"].mean() == pytest.approx(2340, abs=0.5)
    assert df["output_tokens"].mean() == pytest.approx(438.7, abs=0.05)


@needs_shared
def test_servegen_rate_follows_the_windows():
    w = build_workload([{"tenant": "t", "class": "c", "trace": {
        "format": "servegen", "path": str(SHARED / "servegen/language/m-large/chunk-143"),
        "window": [0, 3600]}}], horizon_s=3600, seed=0, base_dir=Path("."))
    import pandas as pd
    rates = pd.read_csv(SHARED / "servegen/language/m-large/chunk-143-trace.csv", header=None)[1][:6]
    assert len(w.open) / 3600 == pytest.approx(rates.mean(), rel=0.03)
    assert w.open["output_tokens"].median() == 3


def test_generic_csv_with_mapping_and_time_unit(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("ts_ms,inp,out,src\n1000,10,5,a\n1500,20,6,b\n4000,30,7,a\n")
    tr = load_trace({"format": "csv", "path": "t.csv", "time_unit": "ms",
                     "columns": {"arrival_s": "ts_ms", "prompt_tokens": "inp",
                                 "output_tokens": "out", "f_source": "src"}}, tmp_path)
    assert tr.df["arrival_s"].tolist() == [0.0, 0.5, 3.0]
    assert tr.df["f_source"].tolist() == ["a", "b", "a"]


def test_generic_jsonl(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text('{"t": 0.5, "p": 3, "o": 4}\n\n{"t": 1.0, "p": 5, "o": 6}\n')
    tr = load_trace({"format": "jsonl", "path": str(f), "t0": 0,
                     "columns": {"arrival_s": "t", "prompt_tokens": "p", "output_tokens": "o"}},
                    Path("."))
    assert tr.df["arrival_s"].tolist() == [0.5, 1.0]


AZ_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
GOOD = ["2023-11-16 18:17:03.9799600,4808,10", "2023-11-16 18:17:04.0319600,3180,8"]


def _azure(tmp_path, rows, header=AZ_HEADER):
    f = tmp_path / "bad.csv"
    f.write_text(header + "\n".join(rows) + "\n")
    return {"format": "azure", "path": str(f)}


@pytest.mark.parametrize("bad_row,line,fragment", [
    ("2023-11-16 25:99:00.0000000,10,5", 3, "TIMESTAMP '2023-11-16 25:99:00.0000000'"),
    ("yesterday,10,5", 3, "TIMESTAMP 'yesterday'"),
    ("2023-11-16 18:17:05.0000000,-4,5", 3, "ContextTokens '-4' is not a non-negative integer"),
    ("2023-11-16 18:17:05.0000000,12.5,5", 3, "ContextTokens '12.5'"),
    ("2023-11-16 18:17:05.0000000,10,abc", 3, "GeneratedTokens 'abc'"),
    ("2023-11-16 18:17:05.0000000,10,", 3, "GeneratedTokens ''"),
])
def test_bad_azure_row_names_file_line_and_value(tmp_path, bad_row, line, fragment):
    spec = _azure(tmp_path, [GOOD[0], bad_row, GOOD[1]])
    with pytest.raises(WorkloadError) as e:
        load_trace(spec, Path("."))
    msg = str(e.value)
    assert f"bad.csv line {line}:" in msg and fragment in msg


def test_unsorted_times_name_the_line(tmp_path):
    spec = _azure(tmp_path, [GOOD[1], GOOD[0], "2023-11-16 18:17:09.0000000,1,1"])
    with pytest.raises(WorkloadError, match=r"bad.csv line 3: TIMESTAMP '2023-11-16 18:17:03.9799600' "
                                            r"is earlier than an earlier row"):
        load_trace(spec, Path("."))


def test_missing_column_names_the_header_line(tmp_path):
    spec = _azure(tmp_path, ["2023-11-16 18:17:03.9799600,1"], header="TIMESTAMP,ContextTokens\n")
    with pytest.raises(WorkloadError, match=r"bad.csv line 1 \(header\): missing column 'GeneratedTokens'"):
        load_trace(spec, Path("."))


def test_lenient_skips_and_counts_bad_rows(tmp_path):
    rows = [GOOD[0], "oops,1,1", "2023-11-16 18:17:04.0000000,-1,3", GOOD[1],
            "2023-11-16 18:17:03.0000000,5,5"]
    spec = _azure(tmp_path, rows)
    tr = load_trace(spec, Path("."), lenient=True)
    assert len(tr.df) == 2 and tr.rows_skipped == 3 and tr.rows_read == 5
    assert any("line 3" in s for s in tr.skipped_examples)
    w = build_workload([{"tenant": "a", "class": "c", "trace": spec}], horizon_s=100, seed=0,
                       base_dir=Path("."), lenient=True)
    assert w.meta["streams"][0]["rows_skipped"] == 3 and len(w.open) == 2
    with pytest.raises(WorkloadError, match="line 3"):
        build_workload([{"tenant": "a", "class": "c", "trace": spec}], horizon_s=100, seed=0,
                       base_dir=Path("."))


def test_zero_length_raised_to_one_and_counted(tmp_path):
    spec = _azure(tmp_path, [GOOD[0], "2023-11-16 18:17:04.0319600,0,8"])
    tr = load_trace(spec, Path("."))
    assert tr.df["prompt_tokens"].tolist() == [4808, 1] and tr.zero_lengths == 1


def test_mooncake_bad_json_and_missing_field(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0]}\n'
                 '{"timestamp": 0, "input_length": 5\n')
    with pytest.raises(WorkloadError, match=r"m.jsonl line 2: not a JSON object"):
        load_trace({"format": "mooncake", "path": str(f)}, Path("."))
    f.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1}\n'
                 '{"timestamp": 3000, "output_length": 2}\n'
                 '{"timestamp": 1000, "input_length": 5, "output_length": 1}\n')
    with pytest.raises(WorkloadError, match=r"m.jsonl line 2: missing field 'input_length'"):
        load_trace({"format": "mooncake", "path": str(f)}, Path("."))
    tr = load_trace({"format": "mooncake", "path": str(f)}, Path("."), lenient=True)
    assert tr.rows_skipped == 1 and len(tr.df) == 2  # line 3 is fine once line 2 is gone


def test_mooncake_unsorted_names_line(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_text('{"timestamp": 3000, "input_length": 5, "output_length": 1}\n'
                 '{"timestamp": 0, "input_length": 5, "output_length": 1}\n')
    with pytest.raises(WorkloadError, match=r"m.jsonl line 2: timestamp '0' is earlier"):
        load_trace({"format": "mooncake", "path": str(f)}, Path("."))
