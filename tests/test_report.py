"""priosim report: one self-contained HTML file per result folder (run, sweep, capacity, tune),
plotly.js inlined once and no outside address, strict JSON chart data, the same bytes for the
same folder, recorded in the folder's marker without changing its kind, and never replacing a
report.html that priosim did not write. (The charts drawing in a real browser:
tests/test_report_browser.py.)"""
from __future__ import annotations

import json
import re
import sys

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("plotly")

from sim.experiments.report import REPORT  # noqa: E402
from sim.experiments.report.page import GENERATOR_TAG, Page, to_json  # noqa: E402
from sim.experiments.report.run import binned, cdf_points  # noqa: E402
from sim.outdir import MARKER, claim, marker  # noqa: E402
from tests.report_folders import cli, make_folders  # noqa: E402

KINDS = ["run", "sweep", "capacity", "tune"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return make_folders(tmp_path_factory.mktemp("report"))


def chart_blocks(text: str) -> list[str]:
    return re.findall(r'<script type="application/json" data-chart="[^"]+">(.*?)</script>', text, re.S)


def _no_constant(name):
    raise ValueError(f"not strict JSON: {name}")


@pytest.mark.parametrize("kind", KINDS)
def test_report_is_one_self_contained_file(folders, kind):
    text = (folders[kind] / REPORT).read_text(encoding="utf-8")
    assert GENERATOR_TAG in text[:4096]
    assert "<script src" not in text and "<link" not in text and "@import" not in text  # nothing fetched
    blocks = chart_blocks(text)
    assert blocks, "no chart"
    assert text.count('class="chart"') == len(blocks)
    for b in blocks:
        fig = json.loads(b, parse_constant=_no_constant)  # NaN / Infinity would raise
        assert isinstance(fig["data"], list) and "layout" in fig


def test_plotly_is_embedded_once(folders):
    from plotly.offline import get_plotlyjs

    js = get_plotlyjs()
    for kind in KINDS:
        assert (folders[kind] / REPORT).read_text(encoding="utf-8").count(js[:200]) == 1, kind


@pytest.mark.parametrize("kind", KINDS)
def test_report_is_listed_in_the_marker_and_keeps_the_kind(folders, kind):
    doc = json.loads((folders[kind] / MARKER).read_text())
    assert doc["kind"] == kind and REPORT in doc["files"]
    assert marker(folders[kind])["kind"] == kind
    if kind != "run":  # the folder can still be resumed as what it is
        assert claim(folders[kind], kind, resume=True) == folders[kind].resolve()


@pytest.mark.parametrize("kind", KINDS)
def test_same_folder_same_bytes(folders, kind, tmp_path):
    a, b = tmp_path / "a.html", tmp_path / "b.html"
    assert cli("report", folders[kind], "--out", a).exit_code == 0
    assert cli("report", folders[kind], "--out", b).exit_code == 0
    assert a.read_bytes() == b.read_bytes() == (folders[kind] / REPORT).read_bytes()


def test_report_sections_per_kind(folders):
    text = {k: (folders[k] / REPORT).read_text(encoding="utf-8") for k in KINDS}
    for needle in ("Time to first token", "Time per output token", "Inter-token latency", "End-to-end latency",
                   "Queue length", "Batch size", "KV-cache use", "Preemptions per interval", "Request timeline",
                   "Per-tenant shares", "SLO attainment per class", "Settings and provenance",
                   "priosim version", "stalled after starting"):
        assert needle in text["run"], needle
    assert "seed range" in text["sweep"] and "TTFT p99 (s) vs load" in text["sweep"]
    assert "goodput (finished within SLO / s) vs load" in text["sweep"]
    assert "Every probe of the search" in text["capacity"] and "headroom" in text["capacity"]
    for needle in ("Pareto front", "Parameter importance", "Best against the scenario", "every trial"):
        assert needle in text["tune"], needle


def test_sweep_bands_span_the_seeds(folders):
    """The band of a line is the lowest to the highest seed at each load (sweep.parquet)."""
    df = pd.read_parquet(folders["sweep"] / "sweep.parquet")
    figs = [json.loads(b) for b in chart_blocks((folders["sweep"] / REPORT).read_text(encoding="utf-8"))]
    fig = next(f for f in figs if f["layout"]["title"]["text"].startswith("TTFT p99"))
    band = next(t for t in fig["data"] if t["name"] == "fcfs: seed range" and t["visible"])
    g = df[(df["policy"] == "fcfs") & (df["class"] == "hi")].groupby("load")["ttft_p99_s"]
    assert band["y"][: len(g)] == pytest.approx(list(g.max()))
    assert band["y"][len(g):] == pytest.approx(list(g.min())[::-1])


def test_capacity_answer_and_margin(folders):
    doc = json.loads((folders["capacity"] / "capacity.json").read_text())
    text = (folders["capacity"] / REPORT).read_text(encoding="utf-8")
    for d, a in doc["designs"].items():
        if a.get("replicas"):
            worst = max(m["slo_ratio"] for m in a["classes"].values() if m["slo_ratio"] is not None)
            assert f"{1 - worst:.4g}" in text, d  # the headroom column


def test_a_run_without_iterations_gets_the_requests_timeline(folders, tmp_path):
    run = sorted((folders["sweep"] / "runs").iterdir())[0]
    out = tmp_path / "r.html"
    assert cli("report", run, "--out", out).exit_code == 0
    text = out.read_text(encoding="utf-8")
    assert "Run with --trace-iterations" in text and "Worst inter-token gap per request" in text


def test_rerun_replaces_its_own_report(folders):
    r = cli("report", folders["run"])
    assert r.exit_code == 0 and "report:" in r.output


def test_a_persons_report_html_is_never_replaced(tmp_path, folders):
    import shutil

    d = tmp_path / "run"
    shutil.copytree(folders["run"], d)
    (d / REPORT).write_text("<html>my own notes</html>")
    for args in (["report", d], ["run", folders["run"].parent / "s.toml", "--set", "horizon_s=2", "--out", d,
                                 "--overwrite", "--report"]):
        r = cli(*args)
        assert r.exit_code == 2, r.output
        assert "not written by priosim report" in r.stderr and len(r.stderr.strip().splitlines()) == 1
        assert (d / REPORT).read_text() == "<html>my own notes</html>"
    assert cli("report", d, "--out", tmp_path / "elsewhere.html").exit_code == 0  # --out goes around it


def test_a_replaced_run_takes_its_report_along(tmp_path, folders):
    d = tmp_path / "run"
    s = folders["run"].parent / "s.toml"
    assert cli("run", s, "--set", "horizon_s=2", "--out", d, "--report").exit_code == 0
    assert (d / REPORT).is_file()
    assert cli("run", s, "--set", "horizon_s=2", "--out", d, "--overwrite", "--seed", "9").exit_code == 0
    assert not (d / REPORT).exists()  # (a report of the old result would mislead)


def test_missing_plotly_is_one_line(folders, monkeypatch):
    monkeypatch.setitem(sys.modules, "plotly", None)
    monkeypatch.setitem(sys.modules, "plotly.offline", None)
    r = cli("report", folders["run"], "--out", folders["run"].parent / "never.html")
    assert r.exit_code == 2 and r.stderr.strip() == "error: report needs plotly: pip install -e '.[report]'"
    assert not (folders["run"].parent / "never.html").exists()


def test_report_of_a_figures_folder_is_refused(tmp_path, folders):
    assert cli("plot", folders["run"], "--out", tmp_path / "figs").exit_code == 0
    r = cli("report", tmp_path / "figs")
    assert r.exit_code == 2 and "holds a priosim 'figures' result" in r.stderr


# ---- pieces ---------------------------------------------------------------------------------------
def test_cdf_points_are_capped_and_keep_the_ends():
    v = np.random.default_rng(1).exponential(size=50_000)
    x, y = cdf_points(v, n=500)
    assert len(x) <= 500 and x[0] == v.min() and x[-1] == v.max() and y[-1] == 1.0
    assert np.all(np.diff(x) >= 0) and np.all(np.diff(y) > 0)
    x, y = cdf_points(np.array([3.0, 1.0, np.nan]))
    assert list(x) == [1.0, 3.0] and list(y) == [0.5, 1.0]


def test_binned_keeps_peaks_and_sums():
    t = np.arange(10_000, dtype=float)
    f = pd.DataFrame({"q": np.zeros(10_000), "p": np.ones(10_000)}, index=t)
    f.loc[1234.0, "q"] = 99
    b = binned(f, {"q": "max", "p": "sum"}, n=100)
    assert len(b) == 100 and b["q"].max() == 99 and b["p"].sum() == 10_000


def test_strict_json_and_script_safe():
    text = to_json({"y": [1.0, float("nan"), float("inf")], "s": "</script><b>", "a": np.array([np.nan, 2])})
    assert json.loads(text, parse_constant=_no_constant) == {"y": [1.0, None, None], "s": "</script><b>",
                                                             "a": [None, 2.0]}
    assert "</script>" not in text


def test_page_escapes_text():
    p = Page("<b>t</b>")
    p.table([{"a": "<script>x</script>"}])
    html = p.html("")
    assert "<script>x</script>" not in html and "&lt;script&gt;" in html
