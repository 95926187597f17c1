"""The reports in a real browser: Debian's headless Chromium opens each kind's report.html (a tiny
run, sweep, capacity search and tune made here) from a file:// address, with no network; every
chart must have drawn (plotly's ``<svg class="main-svg">`` inside it, marked ``data-rendered``),
no script or console error may occur, and the screenshot must not be blank.

Chromium absent: skipped, except where ``PRIOSIM_CI`` is set (.ci/run installs it and sets it),
where that fails.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("plotly")

from tests.report_folders import make_folders  # noqa: E402

KINDS = ["run", "sweep", "capacity", "tune"]
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def _browser() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("PRIOSIM_CI"):
        pytest.fail("no chromium on PATH, and PRIOSIM_CI is set: .ci/run installs it (apt-get install chromium)")
    pytest.skip("no chromium on PATH (apt-get install chromium; CI installs it)")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    _browser()  # (skip before making the folders)
    return make_folders(tmp_path_factory.mktemp("report-browser"))


def load(browser: str, html: Path, png: Path, profile: Path) -> tuple[str, str]:
    """Open ``html`` headless, let its scripts run, screenshot it; returns (the DOM after the
    scripts, the browser's log with the page's console lines)."""
    cmd = [browser, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--mute-audio",
           f"--user-data-dir={profile}", "--virtual-time-budget=15000", "--enable-logging=stderr", "--v=0",
           "--window-size=1400,3000", f"--screenshot={png}", "--dump-dom", html.resolve().as_uri()]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout, res.stderr


def console_errors(log: str) -> list[str]:
    """The page's uncaught exceptions and console errors in Chromium's log (``INFO:CONSOLE`` lines)."""
    return [line for line in log.splitlines() if ":CONSOLE" in line and
            re.search(r"Uncaught|Error|console error|script error", line)]


def charts(dom: str) -> list[str]:
    """Each chart element's markup, up to the next chart's JSON block."""
    starts = [m.start() for m in re.finditer(r'<div class="chart[^"]*" id="chart-\d+"', dom)]
    return [dom[a:b] for a, b in zip(starts, starts[1:] + [len(dom)])]


def blank(png: Path) -> bool:
    """Whether a screenshot is (nearly) one colour: a page that did not draw."""
    from matplotlib.image import imread

    img = imread(png)[..., :3].mean(axis=2)
    return float(np.std(img)) < 0.05 or float(np.mean(img < 0.9)) < 0.01


@pytest.mark.parametrize("kind", KINDS)
def test_report_draws_in_a_browser(folders, kind, tmp_path):
    browser = _browser()
    png = tmp_path / f"report-{kind}.png"
    dom, log = load(browser, folders[kind] / "report.html", png, tmp_path / "profile")
    assert not console_errors(log), console_errors(log)
    found = charts(dom)
    expected = len(re.findall(r'data-chart="chart-\d+"', (folders[kind] / "report.html").read_text(encoding="utf-8")))
    assert expected and len(found) == expected, (len(found), expected)
    for i, c in enumerate(found):
        assert 'data-rendered="1"' in c and 'class="main-svg"' in c, f"chart {i + 1} of {kind} did not draw"
    assert f'data-charts-rendered="{expected}"' in dom
    assert not re.search(r"<body[^>]*data-errors=", dom) and '<div id="report-errors"></div>' in dom
    assert png.is_file() and not blank(png)


def test_a_broken_chart_is_seen(folders, tmp_path):
    """The checks above would catch a chart that fails: one whose data plotly rejects shows in
    the red box and in the console, and is not marked drawn."""
    browser = _browser()
    text = (folders["capacity"] / "report.html").read_text(encoding="utf-8")
    broken = tmp_path / "broken.html"
    broken.write_text(re.sub(r'(data-chart="chart-1">)\{', r'\1{"data": 5, "x": ', text, count=1), encoding="utf-8")
    dom, log = load(browser, broken, tmp_path / "b.png", tmp_path / "profile")
    assert re.search(r'<body[^>]*data-errors="1"', dom) and console_errors(log)
    assert 'data-rendered="1"' not in charts(dom)[0]
