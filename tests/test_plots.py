"""Figures: a run's four figures (timeline only when iterations were traced), a sweep's three,
each as PNG and SVG; `priosim plot` picks the kind of folder; `priosim run --plots` draws them."""
from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.conftest import small_scenario
from sim import scenario_from_dict, simulate
from sim.cli import main
from sim.experiments.plots import plot_run, run_figures
from sim.experiments.sweep import expand_grid, run_sweep

RUN_FIGS = ("latency_cdf", "token_share", "kv_queues")


@pytest.fixture(scope="module")
def traced_run(tmp_path_factory):
    sc = scenario_from_dict(small_scenario())
    out = tmp_path_factory.mktemp("run") / "r"
    return simulate(sc, trace_iterations=True).save(out)


def _names(paths: list[Path]) -> set[str]:
    return {p.name for p in paths}


def test_plot_run_writes_png_and_svg_with_timeline(traced_run):
    paths = plot_run(traced_run)
    want = {f"{n}.{e}" for n in (*RUN_FIGS, "timeline") for e in ("png", "svg")}
    assert _names(paths) == want
    assert all(p.parent == traced_run / "figures" and p.stat().st_size > 2000 for p in paths)


def test_run_figures_have_titles_axis_labels_and_legends(traced_run):
    for name, fig in run_figures(traced_run).items():
        assert fig._suptitle is not None and fig._suptitle.get_text(), name
        for ax in fig.axes:
            assert ax.get_xlabel() or ax.get_ylabel() or not ax.has_data(), (name, ax.get_title())
        assert any(ax.get_legend() for ax in fig.axes), name


def test_no_timeline_without_iterations(tmp_path):
    out = simulate(scenario_from_dict(small_scenario(horizon_s=5.0))).save(tmp_path / "r")
    assert _names(plot_run(out)) == {f"{n}.{e}" for n in RUN_FIGS for e in ("png", "svg")}


def test_plot_sweep_and_plot_command(tmp_path):
    specs = expand_grid(small_scenario(horizon_s=8.0), {"policy": ["fcfs", "priority"], "load": [0.5, 1.5],
                                                         "seed": [1, 2]})
    run_sweep(specs, tmp_path / "sw", workers=1, progress=False)
    res = CliRunner().invoke(main, ["plot", str(tmp_path / "sw"), "--out", str(tmp_path / "f")])
    assert res.exit_code == 0, res.output
    assert {p.name for p in (tmp_path / "f").iterdir() if not p.name.startswith(".")} == {
        f"{n}.{e}" for n in ("latency_vs_load", "throughput_vs_load", "preemptions_vs_load") for e in ("png", "svg")}
    res = CliRunner().invoke(main, ["plot", str(tmp_path)])
    assert res.exit_code == 2 and "neither a sweep folder" in res.output


def test_run_command_draws_figures_only_when_asked(tmp_path):
    """Drawing takes longer than a small run, so `priosim run` draws only with --plots."""
    args = ["run", "chat_vs_batch", "--set", "horizon_s=5", "--set", "streams.0.arrival.n=50"]
    res = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "a"), "--plots"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "a" / "figures" / "latency_cdf.png").exists()
    assert (tmp_path / "a" / "figures" / "latency_cdf.svg").exists()
    assert f"figures: 6 files in {tmp_path / 'a' / 'figures'}" in res.output
    for flags, name in (([], "b"), (["--no-plots"], "c")):
        res = CliRunner().invoke(main, [*args, "--out", str(tmp_path / name), *flags])
        assert res.exit_code == 0 and not (tmp_path / name / "figures").exists()


# ---- legends and titles inside the canvas ------------------------------------------------------

def _sweep_frame(n_series: int = 8):
    """A sweep table with ``n_series`` lines (4 policies x 2 values of a grid axis with a long
    name), two classes and two seeds, shaped as sweep.parquet is (run_id, axes, class, metrics)."""
    import numpy as np
    import pandas as pd
    rows = []
    policies = ["strict_priority", "fcfs", "wfq", "sjf_rank"][: max(1, n_series // 2)]
    for p in policies:
        for cap in (512, 8192):
            for load in (0.5, 1.0, 1.5):
                for seed in (0, 1):
                    for c, slo in (("interactive", 0.5), ("batch", None), ("overall", None)):
                        v = load * (1 + seed * 0.1) * (2 if cap == 512 else 1)
                        rows.append({"run_id": len(rows), "policy": p,
                                     "classes.1.max_prefill_tokens_per_step": cap, "load": load, "seed": seed,
                                     "class": c, "ttft_p50_s": v, "ttft_p99_s": 3 * v, "e2e_p50_s": 10 * v,
                                     "e2e_p99_s": 30 * v, "ttft_slo_s": slo, "output_tokens_per_s": 1000 * v,
                                     "throughput_rps": v, "goodput_rps": v / 2, "preemptions": int(10 * v)})
    return pd.DataFrame(rows)


def _inside(fig) -> list[str]:
    """The legends and titles of ``fig`` whose drawn extent leaves the canvas (with a pixel of slack)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    renderer = FigureCanvasAgg(fig).get_renderer()  # (a Figure built directly has no drawing canvas)
    fig.draw(renderer)  # (the constrained layout is computed at draw time)
    box = fig.bbox
    texts = [("suptitle", fig._suptitle)] if fig._suptitle is not None else []
    texts += [(f"legend {i}", lg) for i, lg in enumerate(fig.legends)]
    for ax in fig.axes:
        texts.append((f"title {ax.get_title()!r}", ax.title))
        if ax.get_legend() is not None:
            texts.append((f"axes legend of {ax.get_title()!r}", ax.get_legend()))
    out = []
    for what, artist in texts:
        e = artist.get_window_extent(renderer)
        if e.x0 < box.x0 - 1 or e.y0 < box.y0 - 1 or e.x1 > box.x1 + 1 or e.y1 > box.y1 + 1:
            out.append(f"{what}: {e} outside {box}")
    return out


@pytest.mark.parametrize("name", ["latency_vs_load", "throughput_vs_load", "preemptions_vs_load"])
def test_sweep_figures_keep_legend_and_titles_inside_with_8_series(name):
    from sim.experiments import plots
    df = _sweep_frame(8)
    assert df.groupby(["policy", "classes.1.max_prefill_tokens_per_step"]).ngroups == 8
    fig = getattr(plots, f"fig_{name}")(df, "— chat_vs_batch_with_a_long_scenario_name")
    assert fig.legends or any(ax.get_legend() for ax in fig.axes)
    assert _inside(fig) == []


def test_run_figures_keep_legends_and_titles_inside(traced_run):
    figs = run_figures(traced_run)
    assert "timeline" in figs
    assert {n: _inside(f) for n, f in figs.items()} == {n: [] for n in figs}
