"""Hostile trace files: whatever the bytes, a loader either loads a checked table or raises
WorkloadError (never another exception). Derandomized, so the same files every run."""
import gzip
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workloads import WorkloadError, load_trace

COLS = {"arrival_s": "t", "prompt_tokens": "p", "output_tokens": "o", "f_x": "x"}
VALUES = st.one_of(st.sampled_from(["", "-1", "nan", "NaN", "inf", "-inf", "1e400", "1e308", "0", "1.5", "abc",
                                    "99999999999999999999", "2024-05-10 12:00:01.5", "2024-05-10T12:00:00+02:00",
                                    "9999-12-31 00:00:00", "\ufeff1", '"', "[1, 2]", "null", "true", "{}"]),
                   st.integers(-10**20, 10**20).map(str), st.floats(allow_nan=True).map(repr), st.text(max_size=6))
ROW = st.lists(VALUES, min_size=0, max_size=5)
SPECS = [("csv", {"format": "csv", "columns": COLS}),
         ("csv", {"format": "csv", "columns": COLS, "time_unit": "datetime"}),
         ("csv", {"format": "azure"}),
         ("jsonl", {"format": "jsonl", "columns": dict(COLS, hash_ids="h")}),
         ("jsonl", {"format": "mooncake"})]


def _json_value(v: str) -> str:
    return v if v in ("null", "true", "{}", "[1, 2]", "1e400", "1e308", "0", "1.5", "-1") else '"' + v.replace(
        "\\", "\\\\").replace('"', '\\"') + '"'


def _file(kind: str, rows: list[list[str]], bom: bool, cut: int | None) -> bytes:
    if kind == "csv":
        text = "t,p,o,x\n" + "".join(",".join(r) + "\n" for r in rows)
    else:
        keys = ["t", "p", "o", "x", "h", "timestamp", "input_length", "output_length", "hash_ids"]
        text = "".join("{" + ", ".join(f'"{k}": {_json_value(v)}' for k, v in zip(keys * 2, r * 2)) + "}\n"
                       for r in rows)
    data = ("\ufeff" if bom else "").encode() + text.encode("utf-8", "surrogatepass")
    return data[:cut] if cut is not None else data


def _load(path: Path, spec: dict, lenient: bool) -> None:
    try:
        tr = load_trace(dict(spec, path=path.name), path.parent, lenient=lenient)
    except WorkloadError:
        return
    df = tr.df
    assert len(df) > 0 and (df["prompt_tokens"] >= 1).all() and (df["output_tokens"] >= 1).all()
    if "arrival_s" in df:
        assert np.isfinite(df["arrival_s"]).all() and (np.diff(df["arrival_s"].to_numpy()) >= 0).all()


@settings(derandomize=True, max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(which=st.integers(0, len(SPECS) - 1), rows=st.lists(ROW, max_size=8), bom=st.booleans(),
       cut=st.one_of(st.none(), st.integers(0, 200)), gz=st.booleans(), lenient=st.booleans())
def test_hostile_rows_load_or_raise_workload_error(tmp_path_factory, which, rows, bom, cut, gz, lenient):
    kind, spec = SPECS[which]
    data = _file(kind, rows, bom, cut)
    d = tmp_path_factory.mktemp("f")
    path = d / (f"t.{kind}" + (".gz" if gz else ""))
    path.write_bytes(gzip.compress(data)[: (cut + 20) if cut is not None and gz else None] if gz else data)
    _load(path, spec, lenient)


@settings(derandomize=True, max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.binary(max_size=300), which=st.integers(0, len(SPECS) - 1), gz=st.booleans())
def test_random_bytes_load_or_raise_workload_error(tmp_path_factory, data, which, gz):
    kind, spec = SPECS[which]
    d = tmp_path_factory.mktemp("b")
    path = d / (f"t.{kind}" + (".gz" if gz else ""))
    path.write_bytes(data if not gz else (b"\x1f\x8b" + data))
    _load(path, spec, lenient=False)
