"""``priosim sensitivity``: which knobs move a scenario's answer (see
:mod:`sim.experiments.sensitivity` and docs/sensitivity.md)."""
from __future__ import annotations

import click

from sim.core.errors import ScenarioError
from sim.cli.group import check_workers, claim_out, csv_list, fail, hint_native, load, main


@main.command()
@click.argument("scenario")
@click.option("--knobs", required=True, metavar="KEY[,KEY...]",
              help="the knobs: dotted scenario keys (any --set accepts) or load")
@click.option("--metric", metavar="METRIC[:CLASS]",
              help="summary metric to read (default: the worst p99/SLO ratio, slo_ratio[:CLASS])")
@click.option("--ranges", metavar="KEY=[OFF/]LO..HI[:log],...",
              help="ranges of the knobs (default ranges exist for the common ones; KEY=a,b,c for choices)")
@click.option("--method", type=click.Choice(["oat", "sobol"]), default="oat", show_default=True,
              help="oat: one knob at a time over its range; sobol: variance-based indices (SALib)")
@click.option("--levels", type=int, default=3, show_default=True, help="oat: values per knob range (and OFF)")
@click.option("--samples", type=int, default=8, show_default=True,
              help="sobol: base samples N (runs: N x (knobs + 2); a power of 2)")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="override a scenario key in every run")
@click.option("--seed", type=int, help="override the scenario seed")
@click.option("--workers", type=int, help="parallel simulations (default: the CPU count)")
@click.option("--out", type=click.Path(file_okay=False),
              help="folder (default results/sensitivity-<name>-<timestamp>/)")
@click.option("--overwrite", is_flag=True, help="replace a sensitivity result in --out")
@click.option("--no-plots", is_flag=True, help="do not draw tornado.png")
def sensitivity(scenario, knobs, metric, ranges, method, levels, samples, sets, seed, workers, out, overwrite,
                no_plots):
    """Rank SCENARIO's knobs by how much they move a metric: a table, sensitivity.csv/.json and tornado.png."""
    import time

    from sim.experiments import sensitivity as sv
    from sim.outdir import staged

    if method == "sobol":
        try:
            import SALib  # noqa: F401
        except ImportError:
            fail("sensitivity --method sobol needs SALib: pip install -e '.[sensitivity]'")
    sc = load(scenario, sets, None, seed)
    check_workers(workers)
    _warn_unused_flag(method, levels, samples)
    keys = csv_list(knobs, str, "knobs")
    try:
        st = sv.make_study(sc, keys, ranges, metric, method, levels, samples)
    except ScenarioError as exc:
        fail(str(exc))
    out = claim_out(out, "sensitivity", f"sensitivity-{sc.name}", overwrite=overwrite)
    n = len(st.plan())
    what = (f"1 + {n - 1} one-at-a-time runs" if method == "oat" else
            f"{samples} samples x ({len(st.knobs)} knobs + 2)")
    click.echo(f"sensitivity {sc.name}: {len(st.knobs)} knobs, metric {st.metric.label}, {method}: {n} simulations "
               f"({what}) -> {out}")
    t0 = time.perf_counter()
    try:
        rep = sv.run_study(st, workers=workers)
    except RuntimeError as exc:
        fail(str(exc))
    wall = time.perf_counter() - t0
    with staged(out, "sensitivity") as tmp:
        sv.save(rep, sc.name, tmp, plots=not no_plots)
    if method == "oat":
        click.echo(f"{st.metric.label} of the scenario as it is: {sv.fmt_metric(rep['base_metric'], rep)}")
    click.echo(sv.table_text(rep))
    for r in rep["knobs"]:
        if r["priosim_only"]:
            click.echo(f"priosim-only: {r['knob']} has no vLLM or SGLang flag ({r['priosim_only']}; docs/engines.md)")
    click.echo(f"wall {wall:.1f}s, {n} simulations; results: {out}")
    hint_native(wall)


def _warn_unused_flag(method: str, levels: int, samples: int) -> None:
    """--levels is read by oat only and --samples by sobol only: one given to the other method
    would otherwise do nothing, silently."""
    from click.core import ParameterSource

    from plumbing.notices import warn

    ctx = click.get_current_context()
    for flag, name, value, used_by in (("--levels", "levels", levels, "oat"), ("--samples", "samples", samples,
                                                                             "sobol")):
        if method != used_by and ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE:
            warn(f"{flag} {value}: read by --method {used_by} only, so this {method} study ignores it")
