"""priosim commands that run many simulations: sweep, tune, capacity."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from plumbing.numbers import in_range
from sim.core.errors import ScenarioError, error_message
from sim.cli.engine_flags import engine_flag_options, with_engine_flags
from sim.cli.group import (EXIT_FAILED_RUNS, EXIT_INTERRUPTED, EXIT_OK, check_figure_file, check_load, check_out_file,
                           check_workers, claim_out, csv_list, fail, fail_write, hint_native, load, main, write_refused)
from sim.cli.report import check_report, report_beside, report_option


@main.command()
@click.argument("scenario", required=False)
@click.option("--policies", help="comma-separated policy names, module:Class or file.py:Class (default: the scenario's policy)")
@click.option("--loads", help="comma-separated arrival-rate multipliers, e.g. 0.5,0.7,0.9,1.1 (traces: time "
                              "compression; default 1)")
@click.option("--seeds", help="N (the scenario seed and the N-1 following) or a comma-separated list of seeds "
                              "(default 1)")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="override a scenario key in every run")
@click.option("--grid", "grid_file", type=click.Path(dir_okay=False),
              help="TOML file of more axes: dotted scenario keys = [values]")
@click.option("--out", type=click.Path(file_okay=False), help="sweep folder (default results/sweep-<name>-<timestamp>/)")
@click.option("--workers", type=int, help="local worker processes (default: the CPU count)")
@click.option("--backend", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="where the runs execute: local processes or a Ray cluster (pip install 'priosim[distributed]')")
@click.option("--address", help="Ray cluster address (default: start a local Ray)")
@click.option("--trace-iterations", is_flag=True, help="each run also writes iterations.parquet")
@click.option("--no-plots", is_flag=True, help="do not draw the sweep's figures")
@click.option("--progress/--no-progress", default=None,
              help="progress bar (default: a bar on a terminal, else a line on stderr every 10 s)")
@click.option("--uncertainty", is_flag=True,
              help="also run each cell at its cost model's low and high time factors: headline metrics get "
                   "_lo/_hi columns, an 80 %% interval (docs/uncertainty.md)")
@report_option
@engine_flag_options
def sweep(scenario, policies, loads, seeds, sets, grid_file, out, workers, backend, address, trace_iterations,
          no_plots, progress, uncertainty, report, engine_args, sglang_args):
    """Run SCENARIO over policies x loads x seeds (x --grid axes); write DIR/sweep.parquet.

    Each run lands in DIR/runs/<axes>/ atomically; a rerun with the same DIR skips finished runs.
    A run that fails is recorded in DIR/failures/ and the others go on. Exit status: 0 every run
    done, 1 a run failed, 2 bad input (before any run), 130 interrupted."""
    from sim.experiments.sweep import run_sweep

    sc = load(scenario, with_engine_flags(sets, engine_args, sglang_args), None, None)
    check_workers(workers)
    axes = _sweep_axes(sc, policies, loads, seeds, grid_file)
    specs, repeats, unc_meta = _sweep_specs(sc, axes, uncertainty)
    if repeats:
        click.echo(f"seeds: {repeats} of {len(specs) + repeats} runs not run: the seed changes nothing in them "
                   f"(no random workload, policy, speculation or router), so each runs once, "
                   f"with seed {axes['seed'][0]}")
    out = claim_out(out, "sweep", f"sweep-{sc.name}", resume=True)  # a rerun skips the finished runs
    check_report(report, out)
    added = f", + {unc_meta['runs_added']} at the cost model's time factors" if unc_meta else ""
    click.echo(f"sweep {sc.name}: {len(specs)} runs ({' x '.join(f'{len(v)} {k}' for k, v in axes.items())}"
               f"{f' less {repeats} seed repeats' if repeats else ''}{added}) -> {out}  [{backend}]")
    try:
        rep = run_sweep(specs, out, base_dir=sc.base_dir, source=sc.source, backend=backend, workers=workers,
                        address=address, progress=progress, trace_iterations=trace_iterations,
                        meta={"scenario_name": sc.name, "axes": axes, "overrides": list(sets),
                              "seed_repeats_not_run": repeats,
                              **({"uncertainty": unc_meta} if unc_meta else {})},
                        log=click.echo)
        _report_sweep(out, axes, rep, no_plots)
    except OSError as exc:  # (a full disk: the runs finished so far are kept; a rerun goes on)
        fail_write(out, exc)
    except (RuntimeError, ValueError) as exc:
        fail(str(exc))
    report_beside(report, out)
    hint_native(rep.wall_s)
    if rep.interrupted:
        click.echo("interrupted: rerun the same command to finish the missing runs", err=True)
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(EXIT_FAILED_RUNS if rep.failed else EXIT_OK)


def _sweep_axes(sc, policies: str | None, loads: str | None, seeds: str, grid_file: str | None) -> dict:
    """The sweep's axes (policy, load, seed, then the --grid file's) from the flags, the grid
    file and the scenario's defaults; a flag and the grid naming the same axis is an error."""
    from sim.experiments.sweep import read_grid

    grid: dict = {}
    if grid_file:
        try:
            grid = read_grid(grid_file)
        except ValueError as exc:
            fail(str(exc))
    pol = csv_list(policies, str, "policies")
    lds = csv_list(loads, float, "loads")
    for v in lds or []:
        if not in_range(v, gt=0):  # (named here: the sweep's own check names its axis only)
            fail(f"--loads: expected arrival-rate multipliers > 0 (got {v:g})")
    if seeds is None:  # (a grid file's seed axis, else the scenario's seed)
        sds = None
    elif seeds.strip().isdigit() and "," not in seeds:
        n = int(seeds)
        if n < 1:
            fail(f"--seeds: must be at least 1 (got {n})")
        sds = [sc.seed + i for i in range(n)]
    else:
        sds = csv_list(seeds, int, "seeds")
    axes: dict = {}
    for name, flag, default in (("policy", pol, [sc.policy.name]), ("load", lds, [1.0]), ("seed", sds, [sc.seed])):
        if flag is not None and name in grid:
            fail(f"'{name}' is given both on the command line and in {grid_file}")
        axes[name] = flag if flag is not None else grid.pop(name, default)
    axes.update(grid)
    return axes


def _sweep_specs(sc, axes: dict, uncertainty: bool = False) -> tuple[list, int, dict | None]:
    """Every run of the grid, each scenario validated before any run starts; returns the runs,
    how many seed repeats were dropped (runs the seed does not change) and, with
    ``uncertainty``, what sweep.json records of the runs added at the time factors."""
    from sim.config import scenario_from_dict
    from sim.experiments.sweep import expand_grid

    base = sc.to_dict()
    try:
        specs = expand_grid(base, axes)
        # bad input fails here, before any run starts
        scs = [scenario_from_dict(s.scenario, source=f"{sc.source} [{s.run_id}]", base_dir=sc.base_dir)
               for s in specs]
        by_id = {s.run_id: x for s, x in zip(specs, scs)}
        for s, sc_s in zip(specs, scs):
            if s.load_scale != 1.0:  # (a load multiplies every rate: absurd volumes, too)
                check_load(sc_s, s.load_scale)
        repeats = 0
        if len(axes["seed"]) > 1:  # more seeds of a run the seed does not change would be copies
            from sim.experiments.seeds import drop_seed_repeats
            specs, repeats = drop_seed_repeats(specs, scs)
        unc_meta = None
        if uncertainty:
            from sim.experiments.sweep_uncertainty import bracket_specs

            specs, unc_meta = bracket_specs(specs, [by_id[s.run_id] for s in specs])
    except (ValueError, ScenarioError) as exc:  # (UncertaintyError is a ValueError)
        fail(str(exc))
    return specs, repeats, unc_meta


def _report_sweep(out, axes: dict, rep, no_plots: bool) -> None:
    """Print the sweep's summary table and run counts, list failures, draw its figures."""
    import pandas as pd
    from sim.experiments.sweep import summary_table

    df = pd.read_parquet(Path(out) / "sweep.parquet")
    if any(c.endswith("_lo") for c in df.columns):
        from sim.experiments.sweep_uncertainty import cell_table
        click.echo(cell_table(df, list(axes)))
    else:
        click.echo(summary_table(df, list(axes)))
    click.echo(f"runs: {rep.done} done, {rep.skipped} skipped (already complete), {len(rep.failed)} failed "
               f"of {rep.total}; wall {rep.wall_s:.1f}s ({rep.runs_per_minute:.0f} runs/min)")
    for rid, err in rep.failed.items():
        click.echo(f"FAILED {rid}: {err}  (traceback: {Path(out) / 'failures' / (rid + '.json')})", err=True)
    if not no_plots and len(df):
        from sim.experiments.plots import plot_sweep
        plot_sweep(out)
    click.echo(f"results: {Path(out) / 'sweep.parquet'}")


@main.command()
@click.argument("scenario")
@click.option("--space", "space", multiple=True, metavar="KEY=LOW..HIGH[:log]|KEY=a,b,c",
              help="a searched key (any key --set accepts); repeatable; adds to the scenario's [tune] space")
@click.option("--slo", "slos", multiple=True, metavar="CLASS:ttft=S,tpot=S[,done_by=S]",
              help="a constraint: the class's p99 TTFT / TPOT (s), or every request done by S (simulated s)")
@click.option("--maximize", "maximize", multiple=True, metavar="METRIC[:CLASS]", help="a summary metric to maximise")
@click.option("--minimize", "minimize", multiple=True, metavar="METRIC[:CLASS]", help="a summary metric to minimise")
@click.option("--trials", type=int, help="trials in all (a resumed tune counts its finished ones); default 20")
@click.option("--seeds", type=int, help="seeds per trial: the scenario seed and the next K-1; default 1")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="override a scenario key in every trial")
@click.option("--out", type=click.Path(file_okay=False), help="tune folder (default results/tune-<name>-<timestamp>/)")
@click.option("--workers", type=int, default=1, show_default=True, help="trials evaluated at once")
@click.option("--backend", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="where the runs execute: local processes or a Ray cluster (pip install 'priosim[distributed]')")
@click.option("--address", help="Ray cluster address (default: start a local Ray)")
@click.option("--resume", is_flag=True, help="continue the tune in --out (finished trials are kept)")
@click.option("--sampler-seed", type=int, default=0, show_default=True, help="the optimiser's random seed")
@click.option("--no-plots", is_flag=True, help="do not draw pareto.png")
@click.option("--uncertainty", is_flag=True,
              help="re-evaluate the best configuration and the defaults (not every trial) at the cost model's "
                   "time factors: 'central (lo-hi)', an 80 %% interval (docs/uncertainty.md)")
@report_option
@engine_flag_options
def tune(scenario, space, slos, maximize, minimize, trials, seeds, sets, out, workers, backend, address, resume,
         sampler_seed, no_plots, uncertainty, report, engine_args, sglang_args):
    """Search SCENARIO's knobs (Optuna) for the configuration that meets the SLOs and maximises a metric.

    One metric: TPE with the SLOs as constraints; several (--maximize/--minimize): NSGA-II and a
    Pareto front. Writes DIR/best.toml, trials.parquet, pareto.png, pareto.csv, importance.json,
    tune.json; prints the best configuration next to the scenario's defaults. Exit status: 0 done,
    1 a trial's run failed, 2 bad input (before any trial), 130 interrupted. See docs/tune.md."""
    try:
        import optuna  # noqa: F401
        import tomli_w  # noqa: F401
    except ImportError:
        fail("tune needs Optuna: pip install -e '.[tune]'")
    from sim.experiments import tune as tn

    sc = load(scenario, with_engine_flags(sets, engine_args, sglang_args), None, None)
    try:
        spec, trials, k = _tune_spec(sc, space, slos, maximize, minimize, trials, seeds)
    except tn.TuneError as exc:
        fail(str(exc))
    check_workers(workers)
    knobs, objs = spec.knobs, spec.objectives
    _warn_set_searched(sets, knobs)
    out = claim_out(out, "tune", f"tune-{sc.name}", resume=True)
    check_report(report, out)
    header = (f"tune {sc.name}: {len(knobs)} knobs, {trials} trials x {k} seeds, "
              f"{'NSGA-II' if len(objs) > 1 else 'TPE'} -> {out}  [{backend}]")
    from sim.experiments.uncertainty import UncertaintyError
    from sim.outdir import OutError

    try:
        rep = tn.run_tune(spec, out, trials=trials, workers=workers, backend=backend, address=address,
                          resume=resume, seed=sampler_seed, log=click.echo, report=True, plots=not no_plots,
                          uncertainty=uncertainty, header=header)
    except (tn.TuneError, OutError, UncertaintyError) as exc:
        fail(str(exc))
    except Exception as exc:  # noqa: BLE001 - a full disk (files or the study's SQLite), else re-raised
        if write_refused(exc) is None:
            raise
        fail_write(out, exc)
    _print_tune_report(spec, rep.info, rep, k, out)
    report_beside(report, out)
    if rep.interrupted:
        click.echo("interrupted: rerun with --resume to finish", err=True)
        sys.exit(EXIT_INTERRUPTED)
    if any(err != tn.NO_OBJECTIVE for err in rep.failed.values()):  # (a run failed, not a poor trial)
        sys.exit(EXIT_FAILED_RUNS)


def _warn_set_searched(sets, knobs) -> None:
    """A --set on a searched key holds only in the defaults: each trial sets its own value."""
    from plumbing.notices import warn

    searched = {k.key for k in knobs}
    for s in sets:
        key = s.partition("=")[0].strip()
        if key in searched:
            warn(f"--set {s}: {key} is searched (--space or [tune] space), so each trial sets its own value; "
                 f"this one holds only in the defaults the best trial is compared with")


def _tune_spec(sc, space, slos, maximize, minimize, trials, seeds):
    """The tune's search (knobs from [tune] and --space, objectives and SLOs from the flags or
    else [tune]), validated; returns ``(spec, trials, seeds per trial)``. Raises TuneError."""
    from sim.experiments import tune as tn

    table = tn.tune_table(sc)
    names = sc.class_names
    knobs = [tn.parse_knob(s) for s in [*table["space"], *space]]
    objs = ([tn.parse_objective(m, names, True) for m in (maximize or ())]
            + [tn.parse_objective(m, names, False) for m in (minimize or ())])
    if not objs:
        objs = ([tn.parse_objective(m, names, True) for m in table["maximize"]]
                + [tn.parse_objective(m, names, False) for m in table["minimize"]])
    slo = [x for s in (slos or table["slo"]) for x in tn.parse_slo(s, names)]
    trials = trials if trials is not None else int(table.get("trials", 20))
    k = seeds if seeds is not None else int(table.get("seeds", 1))
    if trials < 1:
        raise tn.TuneError(f"--trials: expected >= 1 (got {trials})")
    if k < 1:
        raise tn.TuneError(f"--seeds: expected >= 1 (got {k})")
    spec = tn.TuneSpec(sc.to_dict(), sc.base_dir, sc.source, knobs, objs, slo, [sc.seed + i for i in range(k)])
    tn.validate(spec)
    return spec, trials, k


def _print_tune_report(spec, info: dict, rep, k: int, out) -> None:
    """Print the best configuration beside the defaults, seed noise, importances and counts."""
    from sim.experiments.tune_report import side_by_side

    from sim.engines import priosim_only

    click.echo(side_by_side(spec, info))
    for key, value in (info.get("best") or {}).get("params", {}).items():
        what = priosim_only(key, value)
        if what:
            click.echo(f"priosim-only: {key} = {value!r} has no vLLM or SGLang flag ({what}; docs/engines.md)")
    for name, n in info["noise"].items():
        if n["median_std"] is not None:
            rel = f" ({n['median_rel_std']:.1%} of the mean)" if n["median_rel_std"] is not None else ""
            click.echo(f"noise: {name} std across {k} seeds, median over trials {n['median_std']:.3g}{rel}")
    for name, imp in info["importance"].items():
        if "error" not in imp:
            click.echo(f"importance ({name}): " + ", ".join(f"{a} {v:.2f}" for a, v in imp.items()))
    click.echo(f"trials: {rep.trials} evaluated ({rep.evaluated_now} now, {rep.simulations_now} simulations), "
               f"{info['feasible']} meet the SLOs; {info['chosen']}")
    click.echo(f"results: {out}")


@main.command()
@click.argument("scenario")
@click.option("--designs", default="shared,partitioned", show_default=True,
              help="comma-separated designs: shared (one pool, priority scheduling), partitioned (one "
                   "dedicated group per class), disaggregated (prefill and decode replicas: the split searched "
                   "too, GPUs per role)")
@click.option("--slo", "slos", multiple=True, metavar="CLASS:KEY=S[,KEY=S]",
              help="override a class's SLO: ttft / tpot (p99, seconds) or done (every request of the class "
                   "finished by this simulated time, taken literally); repeatable. Default: the classes' "
                   "ttft_slo_s / tpot_slo_s; classes with neither must finish by the implicit deadline (--grace)")
@click.option("--grace", type=float, default=0.1, show_default=True,
              help="implicit deadline of classes without SLOs: horizon_s * (1 + grace) + the longest unloaded "
                   "service time among the class's requests (prefill and decode at batch 1 on an idle replica: "
                   "no fleet could finish that request sooner)")
@click.option("--router", help="router of the shared design (default least_outstanding)")
@click.option("--max-replicas", type=int, default=64, show_default=True,
              help="search limit per dimension (disaggregated: per role)")
@click.option("--load", "load_scale", type=float, default=1.0, show_default=True, help="arrival-rate multiplier")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="override a scenario key")
@click.option("--seed", type=int, help="override the scenario seed")
@click.option("--workers", type=int, help="parallel simulations (default: the CPU count)")
@click.option("--refresh-s", "refresh_s", type=float,
              help="the routers read replica state every this many seconds (router.refresh_s; docs/distributed.md)")
@click.option("--backend", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="with --refresh-s: where each probe's replicas run (local processes or Ray actors)")
@click.option("--partitions", type=click.IntRange(min=1), default=1, show_default=True,
              help="with --refresh-s: workers each probe's replicas are spread over (probes then run one at a "
                   "time, to their end)")
@click.option("--address", help="with --backend ray: the Ray cluster's address (default: start a local one)")
@click.option("--out", type=click.Path(file_okay=False), help="folder (default results/capacity-<name>-<timestamp>/)")
@click.option("--figure", type=click.Path(dir_okay=False), help="also write the comparison figure here (a new .png, .svg or .pdf file)")
@click.option("--overwrite", is_flag=True, help="replace the file --figure names")
@click.option("--no-plots", is_flag=True, help="do not draw the figure")
@click.option("--uncertainty/--no-uncertainty", default=True, show_default=True,
              help="also search at the low and high time factors of the cost model's error: GPUs as "
                   "'N (lo-hi)' (docs/uncertainty.md)")
@report_option
@engine_flag_options
def capacity(scenario, designs, slos, grace, router, max_replicas, load_scale, sets, seed, workers, refresh_s, backend,
             partitions, address, out, figure, overwrite, no_plots, uncertainty, report, engine_args, sglang_args):
    """Fewest replicas per design that meet SCENARIO's SLOs (binary search; each probe a full simulation)."""
    from sim.experiments.capacity import (DESIGNS, capacity_search, idle_classes, plot_capacity, save_report,
                                          scenario_workload)
    from sim.outdir import OutError
    from sim.experiments.slos import parse_slos, refused_requests
    if not in_range(load_scale, gt=0):
        fail(f"--load: expected a number > 0 (the arrival-rate multiplier) (got {load_scale:g})")
    sc = load(scenario, with_engine_flags(sets, engine_args, sglang_args), None, seed)
    check_workers(workers)
    names = csv_list(designs, str, "designs")
    for i, d in enumerate(names):
        if d not in DESIGNS:
            fail(f"--designs: unknown design {d!r} (expected one of {', '.join(DESIGNS)})")
        if d in names[:i]:
            fail(f"--designs: {d!r} given twice (expected each design once)")
    if max_replicas < 1:
        fail(f"--max-replicas: expected >= 1 (got {max_replicas})")
    if not in_range(grace, ge=0):
        fail(f"--grace: expected >= 0 (got {grace})")
    try:
        if load_scale != 1.0:  # (a load multiplies every rate: absurd volumes, too)
            check_load(sc, load_scale, "--load")
        # (the stream is built before the folder is claimed: a bad trace leaves nothing behind)
        wl = scenario_workload(sc, load_scale)
        refused = refused_requests(sc, wl)
        slo = parse_slos(sc, list(slos), grace, load_scale, workload=wl, refused=refused)
        if router is not None:
            from sim.routers import make_router
            try:
                if make_router(router).class_aware:
                    fail(f"--router: the shared design needs a router that is not class-aware (got {router!r})")
            except (KeyError, ValueError, TypeError) as exc:
                fail(f"--router: {error_message(exc)}")
        # validate one point before the search starts
        from sim.experiments.capacity import design_cluster, design_dims, pd_settings
        from sim.config import with_cluster
        if "disaggregated" in names:  # (what prefill and decode groups do not run with yet)
            if refresh_s is not None:
                fail("--designs disaggregated: not available with --refresh-s yet (expected no --refresh-s; "
                     "docs/disaggregation.md)")
        for d in names:
            dims = design_dims(d, sc.class_names, max_replicas)
            with_cluster(sc, design_cluster(d, dims, [1] * len(dims), router, pd_settings(sc)))
        if refresh_s is not None:
            router = {"name": router or "least_outstanding", "refresh_s": refresh_s}
            for d in names:
                dims = design_dims(d, sc.class_names, max_replicas)
                with_cluster(sc, design_cluster(d, dims, [1] * len(dims), router))
    except ScenarioError as exc:
        fail(_no_lenient(str(exc)))
    distributed = None
    if backend != "local" or partitions != 1:
        if refresh_s is None:
            fail(f"--backend {backend} --partitions {partitions}: expected --refresh-s (each probe runs in windows "
                 f"of the routers' refresh; docs/distributed.md)")
        distributed = {"backend": backend, "workers": partitions, "address": address}
    if figure:
        check_figure_file(figure, "--figure", overwrite=overwrite)
    _warn_autoscaler_unused(sc)
    _warn_price_unused(sc)
    out = claim_out(out, "capacity", f"capacity-{sc.name}", resume=True)  # a rerun reuses the probes kept
    check_report(report, out)
    _print_slos(slo, refused, idle_classes(sc, load_scale) if "partitioned" in names else set())
    figures: list[Path] = []

    def finish(rep) -> None:  # (called while the folder's lock is held)
        # the explanation (capacity.json holds it) simulates its points meanwhile, unless a
        # design has no answer: then its points say which metric binds, which the searches at
        # the cost model's error bounds need first
        explaining = _explain_capacity(rep, sc, slo, router, load_scale, max_replicas, workers)
        from sim.experiments.capacity_explain import answer_kinds

        if not uncertainty or answer_kinds(rep, slo, sc.class_names) is None:
            _explained(rep, explaining)
        if uncertainty:
            try:
                _capacity_uncertainty(rep, sc, names, slo, router, max_replicas, load_scale, workers)
            except BaseException:  # (a failed search or Ctrl-C: the explanation's workers are not waited for)
                explaining.cancel()
                raise
        if rep.explain is None:
            _explained(rep, explaining)
        try:
            save_report(rep, out)
            if not no_plots:
                figures.append(plot_capacity(rep, Path(out) / "capacity.png"))
        except OSError as exc:
            fail_write(out, exc)

    try:
        rep = capacity_search(sc, names, slo, router=router, max_replicas=max_replicas, load_scale=load_scale,
                              workers=workers, log=click.echo, progress=None, out_dir=out, finish=finish,
                              distributed=distributed, early_stop=distributed is None)
    except OSError as exc:  # (a full disk: the probes kept so far stay; a rerun goes on from them)
        fail_write(out, exc)
    except (ScenarioError, OutError) as exc:
        fail(str(exc))
    except RuntimeError as exc:  # a probe's simulation failed (its traceback on the lines after)
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_FAILED_RUNS)
    click.echo(rep.table().to_string(index=False, float_format=lambda v: f"{v:.4g}", na_rep="-"))
    from sim.engines import priosim_only_settings

    for line in priosim_only_settings(sc):
        click.echo(f"priosim-only: {line} (no vLLM or SGLang flag; docs/engines.md)")
    for d, a in rep.designs.items():
        if a.get("note"):
            click.echo(f"{d}: {a['note']}")
    if uncertainty:
        from sim.experiments.uncertainty import capacity_lines

        for line in capacity_lines(rep, max_replicas):
            click.echo(line)
    if rep.explain is not None:
        from plumbing.notices import warn
        from sim.experiments.capacity_explain import explain_lines

        for line in explain_lines(rep.explain):
            click.echo(line)
        for line in rep.explain["warnings"]:
            warn(line)
    if figure and not no_plots:
        try:
            figures.append(plot_capacity(rep, figure))
        except OSError as exc:
            fail(f"--figure {figure}: cannot write the figure ({exc.strerror or exc})")
    for p in figures:
        click.echo(f"figure: {p}")
    report_beside(report, out)
    click.echo(f"search wall {rep.wall_s:.1f}s, {len(rep.points)} simulations; results: {out}")
    hint_native(rep.wall_s)


def _no_lenient(msg: str) -> str:
    """A trace error as capacity has it: every probe reads the whole stream, and capacity has no
    --lenient (the strict reader's hint names the commands that do)."""
    return msg.replace("(use lenient mode to skip bad rows)",
                       "(priosim capacity reads every row: fix or remove it; priosim workload --lenient counts "
                       "the bad rows)")


def _print_slos(slo: dict, refused: dict, idle: set) -> None:
    """The SLOs each class is judged by (an implicit deadline with what it is made of), then one
    warning per class with requests refused at any count, and one line per class with no traffic."""
    from plumbing.notices import warn
    from sim.experiments.capacity import refused_text

    for c, s in slo.items():
        line = f"SLO {c}: " + ", ".join(f"{k}<={s[k]:g}s" for k in ("ttft", "tpot", "done") if s.get(k) is not None)
        basis = s.get("done_from")
        if basis is not None:
            line += (f" (implicit: horizon {basis['horizon_s']:g} s x {1 + basis['grace']:g}"
                     + (f" + {basis['longest_s']:.1f} s, its longest request alone: "
                        f"{_request_text(basis['request'])}" if basis["request"] else "")
                     + f"; --grace, or --slo {c}:done=S)")
        click.echo(line)
    for c, r in refused.items():
        warn(f"capacity: {c}: {refused_text(r)}: no replica count can serve them, so no count meets {c}'s SLOs "
             f"(raise engine.max_model_len or the KV memory, or leave those requests out)")
    for c in sorted(idle):
        click.echo(f"partitioned: class {c} has no traffic (no request in the stream): no partition")


def _request_text(r: dict) -> str:
    """``arrives 24.6 s, 3,775 prompt + 2,828 output tokens`` for a request of an implicit deadline."""
    return f"arrives {r['arrival_s']:.1f} s, {r['prompt_tokens']:,} prompt + {r['output_tokens']:,} output tokens"


def _warn_autoscaler_unused(sc) -> None:
    """capacity searches fixed fleets, each design's own ``[cluster]``: the scenario's autoscaler
    is not used (one warning naming it)."""
    c = sc.cluster
    if c is None:
        return
    keys = (["cluster.autoscale"] if c.autoscale is not None else []) + [
        f"cluster.groups.{i}.autoscale" for i, g in enumerate(c.groups or []) if g.autoscale is not None]
    if keys:
        from plumbing.notices import warn
        warn(f"{sc.source}: {keys[0]} is not used by priosim capacity: it searches fixed fleets (each design's "
             f"replicas serve the whole run; docs/autoscaling.md); priosim run simulates the autoscaler")


def _warn_price_unused(sc) -> None:
    """capacity prices every design at one price, the scenario's number or its entry for
    ``engine.gpu``: a price keyed by a group name, or a group's own, prices no design (the
    designs' groups are their own), so ``cost_usd`` would vanish silently."""
    from sim.experiments.capacity import gpu_hour_price

    c = sc.cluster
    if c is None or gpu_hour_price(sc) is not None:
        return
    keys = (["cluster.gpu_hour_usd"] if c.gpu_hour_usd is not None else []) + [
        f"cluster.groups.{i}.gpu_hour_usd" for i, g in enumerate(c.groups or []) if g.gpu_hour_usd is not None]
    if keys:
        from plumbing.notices import warn
        gpu = (f"a table with an entry for engine.gpu = {sc.engine.gpu!r}" if sc.engine.gpu else
               "one number (the scenario sets no engine.gpu to key a table by)")
        warn(f"{sc.source}: {keys[0]} prices no design of priosim capacity, whose designs have groups of their "
             f"own: no cost_usd is reported (expected {gpu})")


def _capacity_uncertainty(rep, sc, names, slo: dict, router, max_replicas: int, load_scale: float, workers) -> None:
    """Add each answer's interval over the cost model's error to ``rep``: two more searches per
    design, at the low and high factors of the metric kind that binds it
    (:func:`sim.experiments.uncertainty.capacity_uncertainty`). Those searches keep no probes
    (the folder's lock is held by the search they widen)."""
    from sim.experiments.capacity import capacity_search
    from sim.experiments.uncertainty import UncertaintyError, capacity_uncertainty
    from sim.outdir import OutError

    def again(sc_f, known):  # (only each answer's GPUs count: not simulated again as a whole)
        return capacity_search(sc_f, names, slo, router=router, max_replicas=max_replicas, load_scale=load_scale,
                               workers=workers, log=None, progress=None, known=known, whole=False)
    try:
        capacity_uncertainty(rep, sc, slo, again, log=click.echo)
    except (ScenarioError, OutError, UncertaintyError) as exc:
        fail(str(exc))
    except RuntimeError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_FAILED_RUNS)


def _explain_capacity(rep, sc, slo: dict, router, load_scale: float, max_replicas: int, workers):
    """Begin explaining why each answer is what it is (margins, binding limits, knife edges: a
    few more simulations, see :mod:`sim.experiments.capacity_explain`); :func:`_explained`
    adds it to ``rep``."""
    from sim.experiments.capacity_explain import Explaining

    click.echo("explaining the answers (margins and binding limits: a few more simulations)")
    try:
        return Explaining(rep, sc, slo, router=router, load_scale=load_scale, max_replicas=max_replicas,
                          workers=workers)
    except (RuntimeError, ScenarioError) as exc:
        fail(str(exc))


def _explained(rep, explaining) -> None:
    """Wait for the explanation begun by :func:`_explain_capacity`, and add it to ``rep``."""
    try:
        rep.explain = explaining.result()
    except (RuntimeError, ScenarioError) as exc:
        fail(str(exc))
