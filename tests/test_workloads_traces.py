"""Trace loaders: the bundled traces' statistics (workloads/data/README.md), and bad traces named
by file and line."""
import gzip
import re
import tomllib
from pathlib import Path

import numpy as np
import pytest

from workloads import WorkloadError, build_workload, load_trace
from workloads.traces import DATA_DIR, bundled_names

ROOT = Path(__file__).resolve().parents[1]



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


def test_mooncake_conversation_matches_readme():
    tr = load_trace({"format": "mooncake", "path": "bundled:conversation_trace.jsonl.gz",
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


def test_mooncake_bucket_spreading():
    """Requests sharing a timestamp are spread evenly over the 3 s bucket."""
    df = load_trace({"format": "mooncake", "path": "bundled:conversation_trace.jsonl.gz"},
                    Path(".")).df
    first = df[df["arrival_s"] < 3.0]["arrival_s"].to_numpy()
    n = first.size
    assert np.allclose(first, 3.0 * np.arange(n) / n)
    assert np.all(np.diff(df["arrival_s"].to_numpy()) >= 0)


def test_sharegpt_lengths_only_table():
    df = load_trace({"format": "sharegpt",
                     "path": "bundled:sharegpt_8k_filtered_stats_llama2_tokenizer.csv.gz"},
                    Path(".")).df
    assert len(df) == 30731 and "arrival_s" not in df
    assert df["prompt_tokens"].mean() == pytest.approx(2340, abs=0.5)
    assert df["output_tokens"].mean() == pytest.approx(438.7, abs=0.05)


def test_servegen_rate_follows_the_windows():
    w = build_workload([{"tenant": "t", "class": "c", "trace": {
        "format": "servegen", "path": "bundled:servegen/language/m-large/chunk-143",
        "window": [0, 3600]}}], horizon_s=3600, seed=0, base_dir=Path("."))
    import pandas as pd
    rates = pd.read_csv(DATA_DIR / "servegen/language/m-large/chunk-143-trace.csv.gz", header=None)[1][:6]
    assert len(w.open) / 3600 == pytest.approx(rates.mean(), rel=0.03)
    assert w.open["output_tokens"].median() == 3


def test_mooncake_synthetic_matches_readme():
    df = load_trace({"format": "mooncake", "path": "bundled:synthetic_trace.jsonl.gz",
                     "spread_bucket_s": 0}, Path(".")).df
    assert len(df) == 3993
    assert df["arrival_s"].iloc[-1] == pytest.approx(1022.025)
    assert df["prompt_tokens"].mean() == pytest.approx(15325, abs=0.5)
    assert (df["hash_ids"].map(len) == np.ceil(df["prompt_tokens"] / 512)).all()


@pytest.mark.parametrize("name", [n for n in bundled_names() if n.startswith("bundled:servegen/")])
def test_every_bundled_servegen_client_samples(name):
    w = build_workload([{"tenant": "t", "class": "c", "trace": {
        "format": "servegen", "path": name, "window": [0, 86400]}}],
        horizon_s=86400, seed=0, base_dir=Path("."))
    assert len(w.open) > 0 and (w.open["prompt_tokens"] >= 1).all()


def test_bundled_names_cover_every_data_file_and_the_readme_lists_them():
    names = bundled_names()
    readme = (DATA_DIR / "README.md").read_text()
    for n in names:
        short = re.sub(r"chunk-\d+$", "chunk-N", n)
        assert short in readme, n
    assert "bundled:conversation_trace.jsonl.gz" in names
    assert sum(n.startswith("bundled:servegen/") for n in names) == 7
    for lic in ("Apache-2.0.txt", "CC-BY-4.0.txt"):
        assert (DATA_DIR / "LICENSES" / lic).stat().st_size > 10_000
    assert "Patel et al." in readme and "Qin et al." in readme and "Xiang et al." in readme


def test_bundled_data_is_package_data():
    """Every file under workloads/data is matched by pyproject's package-data globs, so a wheel
    (not only an editable install) carries it."""
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["workloads"]
    pkg = ROOT / "workloads"
    covered = {p for g in globs for p in pkg.glob(g) if p.is_file()}
    files = {p for p in DATA_DIR.rglob("*") if p.is_file()}
    assert files and files <= covered, sorted(map(str, files - covered))


def test_bundled_name_resolves_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tr = load_trace({"format": "sharegpt", "path": "bundled:sharegpt_8k_filtered_stats_llama2_tokenizer.csv.gz"},
                    tmp_path / "elsewhere")
    assert tr.rows_read == 30731


@pytest.mark.parametrize("path,fragment", [
    ("bundled:nosuch.csv", "bundled: azure_code, azure_conv, bundled:AzureLLMInferenceTrace_code.csv"),
    ("bundled:../pyproject.toml", "bundled:<a file under workloads/data>"),
    ("bundled:", "bundled:<a file under workloads/data>"),
])
def test_bad_bundled_name_says_what_exists(path, fragment):
    with pytest.raises(WorkloadError, match=re.escape(fragment)):
        load_trace({"format": "sharegpt", "path": path}, Path("."))


def test_users_own_gzip_files_read_compressed(tmp_path):
    with gzip.open(tmp_path / "t.csv.gz", "wt") as f:
        f.write("num_prefill_tokens,num_decode_tokens\n5,6\n7,8\n")
    with gzip.open(tmp_path / "m.jsonl.gz", "wt") as f:
        f.write('{"timestamp": 0, "input_length": 3, "output_length": 4, "hash_ids": [1]}\n')
    assert load_trace({"format": "sharegpt", "path": "t.csv.gz"}, tmp_path).df["prompt_tokens"].tolist() == [5, 7]
    assert load_trace({"format": "mooncake", "path": "m.jsonl.gz"}, tmp_path).rows_read == 1
    (tmp_path / "bad.jsonl.gz").write_bytes(b"not gzip")
    with pytest.raises(WorkloadError, match="bad.jsonl.gz: cannot read"):
        load_trace({"format": "mooncake", "path": "bad.jsonl.gz"}, tmp_path)


def test_generic_csv_with_mapping_and_time_unit(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("ts_ms,inp,out,src\n1000,10,5,a\n1500,20,6,b\n4000,30,7,a\n")
    tr = load_trace({"format": "csv", "path": "t.csv", "time_unit": "ms",
                     "columns": {"arrival_s": "ts_ms", "prompt_tokens": "inp",
                                 "output_tokens": "out", "f_source": "src"}}, tmp_path)
    assert tr.df["arrival_s"].tolist() == [0.0, 0.5, 3.0]
    assert tr.df["f_source"].tolist() == ["a", "b", "a"]


def test_generic_csv_maps_each_requests_max_tokens_and_a_replay_keeps_it(tmp_path):
    # what each request's client declared (SGLang's admission reserves it): kept per request,
    # at least the request's own output
    (tmp_path / "t.csv").write_text("t,inp,out,cap\n0,10,5,500\n0.5,20,6,6\n1,30,7,3\n")
    trace = {"format": "csv", "path": "t.csv",
             "columns": {"arrival_s": "t", "prompt_tokens": "inp", "output_tokens": "out", "max_tokens": "cap"}}
    assert load_trace(trace, tmp_path).df["max_tokens"].tolist() == [500, 6, 3]
    wl = build_workload([{"tenant": "a", "class": "c", "trace": trace}], horizon_s=10.0, seed=1, base_dir=tmp_path)
    assert wl.open["max_tokens"].tolist() == [500, 6, 7]
    (tmp_path / "bad.csv").write_text("t,inp,out,cap\n0,10,5,-1\n")
    with pytest.raises(WorkloadError, match="cap '-1' is not a non-negative integer"):
        load_trace({**trace, "path": "bad.csv"}, tmp_path)


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


def _pdf_by_pattern(text: str):
    """A ServeGen length PDF read by the pattern alone (as before the plain tables' fast path)."""
    from workloads.lengths import Empirical
    from workloads.servegen import _PAIR
    pairs = _PAIR.findall(text)
    if not pairs and text.strip() == "{}":
        return None
    if not pairs:
        raise WorkloadError("not a value -> probability table")
    arr = np.array(pairs, dtype=float)
    return Empirical(arr[:, 0], arr[:, 1])


def _same_pdf(text: str) -> None:
    from workloads.servegen import _pdf
    try:
        want = _pdf_by_pattern(text)
    except (WorkloadError, ValueError) as exc:
        with pytest.raises(type(exc)):
            _pdf(text, "here")
        return
    got = _pdf(text, "here")
    assert (got is None) == (want is None)
    if want is not None:
        assert got.values.tobytes() == want.values.tobytes() and got.probs.tobytes() == want.probs.tobytes()


@pytest.mark.parametrize("text", [
    "{}", " {} ", "{ }", "", "{572: 1.0}", "{1: 0.25, 2: 0.75}", "{1:0.25,2:0.75}", "{ 1 : 0.5 ,\n 2 : 0.5 }",
    "{1e3: 0.5, 2E-1: 0.5}", "{+1: .5, 2.: 0.5}", "{1: 0.5, 2: 0.5,}", "{1 2: 3}", "{1:2:3}", "{1: 2, 3}",
    "{a: 1, 2: 3}", "{1: e}", "{1: 0.5, nan: 0.5}", "1: 0.5, 2: 0.5", "{1: 0.5}}", "{-1: 1}", "{1: 0.5, 2: -0.5}",
    "{1: 0.5\t, 2: 0.5}", "{1.0.0: 1}",
])
def test_servegen_pdf_tables_read_as_the_pattern_reads_them(text):
    """A plain table is split by str methods; every table gives what the pattern gives (or the
    same kind of error)."""
    _same_pdf(text)


def test_bundled_servegen_pdfs_read_as_the_pattern_reads_them():
    import json

    from workloads.traces import read_text
    for name in [n for n in bundled_names() if n.startswith("bundled:servegen/")]:
        path = DATA_DIR / (name.removeprefix("bundled:") + "-dataset.json.gz")
        for entry in json.loads(read_text(path)).values():
            for key in ("input_tokens", "output_tokens"):
                _same_pdf(str(entry[key]))
