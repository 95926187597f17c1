"""The ``priosim`` command: parse, load, run, write. Heavy imports live inside commands.

Bad input (scenario, profile, policy) exits with status 2 and one line naming the file, the key
and what was expected, before any simulation starts.
"""
from __future__ import annotations

import datetime as _dt
import sys
from pathlib import Path

import click

from sim.core.errors import ScenarioError


def _fail(msg: str) -> None:
    click.echo(f"error: {msg}", err=True)
    sys.exit(2)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="priosim")
def main() -> None:
    """priosim: simulate an LLM serving replica under priority scheduling."""


def _load(scenario, sets, policy, seed):
    from sim.config import load_scenario

    overrides = list(sets)
    if policy:
        overrides.append(f"policy.name={_toml_str(policy)}")
    if seed is not None:
        overrides.append(f"seed={seed}")
    try:
        return load_scenario(scenario, overrides=overrides)
    except ScenarioError as exc:
        _fail(str(exc))


def _check_out(out, flag: str = "--out") -> None:
    """Fail in one line, before any work, when results could not be written under ``out``: a
    probe file is made and removed in the nearest existing folder (nothing is left behind)."""
    import tempfile

    p = Path(out)
    if p.exists() and not p.is_dir():
        _fail(f"{flag} {out}: exists and is not a folder (expected a folder for the results)")
    probe = p
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        _fail(f"{flag} {out}: {probe} is a file (expected a folder for the results)")
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as exc:
        _fail(f"{flag} {out}: cannot write in {probe} ({exc.strerror or exc}) (expected a writable folder)")


def _workers(value, flag: str = "--workers"):
    if value is not None and value < 1:
        _fail(f"{flag}: must be at least 1 (got {value})")
    return value


def _check_load(sc, load: float) -> None:
    import workloads

    try:
        workloads.validate_streams(sc.streams, set(sc.class_names), Path(sc.base_dir), horizon_s=sc.horizon_s,
                                   load_scale=load)
    except workloads.WorkloadError as exc:
        raise ScenarioError(f"{sc.source}: --loads {load:g}: {exc}") from None


def _toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


@main.command()
@click.argument("scenario", required=False)
@click.option("--policy", help="policy name, module:Class or path/to/file.py:Class (overrides [policy] name)")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="override a scenario key, e.g. engine.max_num_seqs=64")
@click.option("--seed", type=int, help="override the scenario seed")
@click.option("--out", type=click.Path(file_okay=False), help="results folder (default results/<name>-<timestamp>/)")
@click.option("--trace-iterations", is_flag=True, help="also write iterations.parquet (one row per request per iteration)")
@click.option("--plots/--no-plots", default=False,
              help="also draw the run's figures (PNG and SVG) into OUT/figures; off by default, as drawing "
                   "them takes longer than the run (later: priosim plot OUT)")
@click.option("--progress/--no-progress", default=None,
              help="progress bar (default: a bar on a terminal, else a line on stderr every 10 s)")
@click.option("--lenient", is_flag=True, help="skip bad trace rows (and report how many) instead of failing")
def run(scenario, policy, sets, seed, out, trace_iterations, plots, progress, lenient):
    """Run SCENARIO (a TOML file or a shipped name; default: the contended-moment scenario)."""
    from sim.run import simulate

    sc = _load(scenario, sets, policy, seed)
    if out is None:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        out = Path("results") / f"{sc.name}-{stamp}"
    _check_out(out)
    try:
        res = simulate(sc, trace_iterations=trace_iterations, progress=progress, lenient=lenient)
    except ScenarioError as exc:
        _fail(str(exc))
    if lenient:
        from sim.assembly import skipped_rows
        click.echo(f"lenient: skipped {skipped_rows(res.summary_dict['run'].get('workload', {}))} bad trace rows",
                   err=True)
    try:
        path = res.save(out)
    except OSError as exc:
        _fail(f"--out {out}: cannot write the results ({exc})")
    run_info = res.summary_dict["run"]
    click.echo(f"{sc.name}: policy={sc.policy.name} seed={sc.seed} profile={res.manifest['profile']} "
               f"kv_blocks={run_info['kv_blocks']}")
    click.echo(res.table())
    click.echo(f"events={run_info['engine_events']} iterations={run_info['iterations']} "
               f"simulated={run_info['end_s']:.1f}s wall={run_info['wall_s']:.2f}s "
               f"thrash_ratio={run_info['thrash_ratio']:.3f}")
    if sc.cluster:
        _echo_cluster(res)
    if plots:
        from sim.experiments.plots import plot_run

        click.echo(f"figures: {len(plot_run(path))} files in {Path(path) / 'figures'}")
    click.echo(f"results: {path}")


@main.command()
def policies():
    """List registered policies with a one-line description and their parameters."""
    import inspect

    from policies import POLICIES

    for e in POLICIES.entries():
        try:
            cls = POLICIES.resolve(e.name)
            sig = inspect.signature(cls.__init__)
            params = [f"{p.name}={p.default!r}" if p.default is not inspect.Parameter.empty else p.name
                      for p in list(sig.parameters.values())[1:] if p.kind is not p.VAR_KEYWORD]
        except Exception:  # pragma: no cover - a broken plugin must not hide the others
            params = ["?"]
        click.echo(f"{e.name:14s} {e.description}")
        click.echo(f"{'':14s} parameters: {', '.join(params) if params else '(none)'}")


@main.command()
def profiles():
    """List shipped and local cost profiles with their provenance."""
    import json

    from sim.core.costs import list_profiles

    for name, path in list_profiles():
        try:
            meta = json.loads(path.read_text()).get("meta", {})
        except Exception as exc:  # pragma: no cover
            meta = {"kind": f"unreadable: {exc}"}
        click.echo(f"{name:34s} {meta.get('kind', '?'):9s} {meta.get('device', '')}  [{path}]")
    from sim.core.overhead import default_preset, describe, preset_names, resolve_overhead

    click.echo(f"engine overhead presets (engine.overhead; GPU profiles default to {default_preset()}):")
    for name in preset_names():
        o = resolve_overhead(name)
        click.echo(f"  {name:10s} {o.meta.get('engine', 'the profile alone')}: {describe(o)}")


@main.command()
@click.option("--rows", "prefixes", multiple=True, metavar="PREFIX",
              help="only rows whose id starts with PREFIX (repeatable); the page is not rewritten")
@click.option("--overhead", help="price every row with this preset instead of its own (e.g. none)")
@click.option("--out", type=click.Path(file_okay=False), help="folder for the report and parity plot "
              "(default results/fidelity when every row runs with its own preset)")
@click.option("--docs", is_flag=True, help="write the report to docs/fidelity.md and docs/figures/ instead")
def fidelity(prefixes, overhead, out, docs):
    """Reproduce published measurements of real engines; print published vs simulated."""
    from sim.core.overhead import OverheadError, resolve_overhead
    from calibrate.fidelity.report import run_suite

    if overhead is not None:
        try:
            resolve_overhead(overhead, "--overhead")
        except OverheadError as exc:
            _fail(str(exc))
    try:
        run_suite(tuple(prefixes), overhead=overhead, out=out, docs=docs, echo=click.echo)
    except (ValueError, ScenarioError) as exc:
        _fail(str(exc))


@main.command()
@click.argument("scenario", required=False)
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE")
@click.option("--seed", type=int)
@click.option("--out", type=click.Path(dir_okay=False), help="write the request stream to this parquet file")
@click.option("--lenient", is_flag=True, help="skip bad trace rows (and report how many) instead of failing")
def workload(scenario, sets, seed, out, lenient):
    """Print SCENARIO's request-stream statistics per tenant and class (no simulation)."""
    from sim.core.costs import load_profile
    from sim.assembly import build_workload, skipped_rows
    from workloads.stats import stream_stats

    sc = _load(scenario, sets, None, seed)
    try:
        wl = build_workload(sc, lenient=lenient)
    except ScenarioError as exc:
        _fail(str(exc))
    stats = stream_stats(wl.open, horizon_s=sc.horizon_s)
    costs = load_profile(sc.engine.profile, Path(sc.base_dir), overhead=sc.engine.overhead)
    # Offered load: engine seconds per second the stream asks for, pricing each request as a
    # lone prefill of its mean prompt plus its mean output decoded in a full batch
    # (max_num_seqs sequences at its mean context). 1.0 is the replica's capacity, roughly.
    B = sc.engine.max_num_seqs
    if len(stats):
        def work_s(row):
            ctx = row["prompt_mean"] + row["output_mean"] / 2
            return (costs.prefill_s(int(row["prompt_mean"]))
                    + row["output_mean"] * costs.step_s(D=B, sum_ctx=B * ctx) / B)
        stats["offered_load"] = stats["rate"] * stats.apply(work_s, axis=1)
    click.echo(stats.to_string(float_format=lambda v: f"{v:.4g}"))
    if len(stats):
        click.echo(f"offered load, all streams: {stats['offered_load'].sum():.3g} of one replica "
                   f"({costs.name}, {B} sequences a step)")
    if lenient:
        click.echo(f"lenient: skipped {skipped_rows(wl.meta)} bad trace rows", err=True)
    if out:
        wl.open.drop(columns=[c for c in ("hash_ids",) if c in wl.open.columns]).to_parquet(out, index=False)
        click.echo(f"wrote {out}")


# ---- sweeps, plots, comparison ----------------------------------------------------------------
def _csv(text: str | None, kind, what: str) -> list | None:
    if text is None:
        return None
    try:
        vals = [kind(v.strip()) for v in text.split(",") if v.strip()]
    except ValueError:
        _fail(f"--{what}: expected a comma-separated list of {kind.__name__} values (got {text!r})")
    if not vals:
        _fail(f"--{what}: empty list")
    return vals


@main.command()
@click.argument("scenario", required=False)
@click.option("--policies", help="comma-separated policy names, module:Class or file.py:Class (default: the scenario's policy)")
@click.option("--loads", help="comma-separated arrival-rate multipliers, e.g. 0.5,0.7,0.9,1.1 (traces: time "
                              "compression; default 1)")
@click.option("--seeds", default="1", show_default=True,
              help="N (the scenario seed and the N-1 following) or a comma-separated list of seeds")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="override a scenario key in every run")
@click.option("--grid", "grid_file", type=click.Path(dir_okay=False),
              help="TOML file of more axes: dotted scenario keys = [values]")
@click.option("--out", type=click.Path(file_okay=False), help="sweep folder (default results/sweep-<name>-<timestamp>/)")
@click.option("--workers", type=int, help="local worker processes (default: the CPU count)")
@click.option("--backend", type=click.Choice(["local", "ray"]), default="local", show_default=True)
@click.option("--address", help="Ray cluster address (default: start a local Ray)")
@click.option("--trace-iterations", is_flag=True, help="each run also writes iterations.parquet")
@click.option("--no-plots", is_flag=True, help="do not draw the sweep's figures")
@click.option("--progress/--no-progress", default=None,
              help="progress bar (default: a bar on a terminal, else a line on stderr every 10 s)")
def sweep(scenario, policies, loads, seeds, sets, grid_file, out, workers, backend, address, trace_iterations,
          no_plots, progress):
    """Run SCENARIO over policies x loads x seeds (x --grid axes); write DIR/sweep.parquet.

    Each run lands in DIR/runs/<axes>/ atomically; a rerun with the same DIR skips finished runs.
    A run that fails is recorded in DIR/failures/ and the others go on. Exit status: the number of
    failed runs (at most 100; 130 when interrupted; 2 for bad input before any run)."""
    from sim.experiments.sweep import run_sweep

    sc = _load(scenario, sets, None, None)
    _workers(workers)
    axes = _sweep_axes(sc, policies, loads, seeds, grid_file)
    specs, repeats = _sweep_specs(sc, axes)
    if repeats:
        click.echo(f"seeds: {repeats} of {len(specs) + repeats} runs not run: the seed changes nothing in them "
                   f"(no random workload, policy, speculation or router), so each runs once, "
                   f"with seed {axes['seed'][0]}")
    if out is None:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        out = Path("results") / f"sweep-{sc.name}-{stamp}"
    _check_out(out)
    click.echo(f"sweep {sc.name}: {len(specs)} runs ({' x '.join(f'{len(v)} {k}' for k, v in axes.items())}"
               f"{f' less {repeats} seed repeats' if repeats else ''}) -> {out}  [{backend}]")
    try:
        rep = run_sweep(specs, out, base_dir=sc.base_dir, source=sc.source, backend=backend, workers=workers,
                        address=address, progress=progress, trace_iterations=trace_iterations,
                        meta={"scenario_name": sc.name, "axes": axes, "overrides": list(sets),
                              "seed_repeats_not_run": repeats})
    except (RuntimeError, ValueError) as exc:
        _fail(str(exc))
    _report_sweep(out, axes, rep, no_plots)
    if rep.interrupted:
        click.echo("interrupted: rerun the same command to finish the missing runs", err=True)
        sys.exit(130)
    sys.exit(min(len(rep.failed), 100))


def _sweep_axes(sc, policies: str | None, loads: str | None, seeds: str, grid_file: str | None) -> dict:
    """The sweep's axes (policy, load, seed, then the --grid file's) from the flags, the grid
    file and the scenario's defaults; a flag and the grid naming the same axis is an error."""
    from sim.experiments.sweep import read_grid

    grid: dict = {}
    if grid_file:
        try:
            grid = read_grid(grid_file)
        except ValueError as exc:
            _fail(str(exc))
    pol = _csv(policies, str, "policies")
    lds = _csv(loads, float, "loads")
    if seeds.strip().isdigit() and "," not in seeds:
        n = int(seeds)
        if n < 1:
            _fail(f"--seeds: must be at least 1 (got {n})")
        sds = [sc.seed + i for i in range(n)]
    else:
        sds = _csv(seeds, int, "seeds")
    axes: dict = {}
    for name, flag, default in (("policy", pol, [sc.policy.name]), ("load", lds, [1.0]), ("seed", sds, None)):
        if flag is not None and name in grid:
            _fail(f"'{name}' is given both on the command line and in {grid_file}")
        axes[name] = flag if flag is not None else grid.pop(name, default)
    axes.update(grid)
    return axes


def _sweep_specs(sc, axes: dict) -> tuple[list, int]:
    """Every run of the grid, each scenario validated before any run starts; returns the runs
    and how many seed repeats were dropped (runs the seed does not change)."""
    from sim.config import scenario_from_dict
    from sim.experiments.sweep import expand_grid

    base = sc.to_dict()
    try:
        specs = expand_grid(base, axes)
        # bad input fails here, before any run starts
        scs = [scenario_from_dict(s.scenario, source=f"{sc.source} [{s.run_id}]", base_dir=sc.base_dir)
               for s in specs]
        for s, sc_s in zip(specs, scs):
            if s.load_scale != 1.0:  # (a load multiplies every rate: absurd volumes, too)
                _check_load(sc_s, s.load_scale)
        repeats = 0
        if len(axes["seed"]) > 1:  # more seeds of a run the seed does not change would be copies
            from sim.experiments.seeds import drop_seed_repeats
            specs, repeats = drop_seed_repeats(specs, scs)
    except (ValueError, ScenarioError) as exc:
        _fail(str(exc))
    return specs, repeats


def _report_sweep(out, axes: dict, rep, no_plots: bool) -> None:
    """Print the sweep's summary table and run counts, list failures, draw its figures."""
    import pandas as pd
    from sim.experiments.sweep import summary_table

    df = pd.read_parquet(Path(out) / "sweep.parquet")
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
@click.option("--backend", type=click.Choice(["local", "ray"]), default="local", show_default=True)
@click.option("--address", help="Ray cluster address (default: start a local Ray)")
@click.option("--resume", is_flag=True, help="continue the tune in --out (finished trials are kept)")
@click.option("--sampler-seed", type=int, default=0, show_default=True, help="the optimiser's random seed")
@click.option("--no-plots", is_flag=True, help="do not draw pareto.png")
def tune(scenario, space, slos, maximize, minimize, trials, seeds, sets, out, workers, backend, address, resume,
         sampler_seed, no_plots):
    """Search SCENARIO's knobs (Optuna) for the configuration that meets the SLOs and maximises a metric.

    One metric: TPE with the SLOs as constraints; several (--maximize/--minimize): NSGA-II and a
    Pareto front. Writes DIR/best.toml, trials.parquet, pareto.png, pareto.csv, importance.json,
    tune.json; prints the best configuration next to the scenario's defaults. Bad input exits 2
    before any trial. See docs/tune.md."""
    try:
        import optuna  # noqa: F401
        import tomli_w  # noqa: F401
    except ImportError:
        _fail("tune needs Optuna: pip install -e '.[tune]'")
    from sim.experiments import tune as tn
    from sim.experiments.tune_report import write_report

    sc = _load(scenario, sets, None, None)
    try:
        spec, trials, k = _tune_spec(sc, space, slos, maximize, minimize, trials, seeds)
    except tn.TuneError as exc:
        _fail(str(exc))
    knobs, objs = spec.knobs, spec.objectives
    if out is None:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        out = Path("results") / f"tune-{sc.name}-{stamp}"
    click.echo(f"tune {sc.name}: {len(knobs)} knobs, {trials} trials x {k} seeds, "
               f"{'NSGA-II' if len(objs) > 1 else 'TPE'} -> {out}  [{backend}]")
    try:
        rep = tn.run_tune(spec, out, trials=trials, workers=workers, backend=backend, address=address,
                          resume=resume, seed=sampler_seed, log=click.echo)
    except tn.TuneError as exc:
        _fail(str(exc))
    info = write_report(spec, out, plots=not no_plots)
    _print_tune_report(spec, info, rep, k, out)
    if rep.interrupted:
        click.echo("interrupted: rerun with --resume to finish", err=True)
        sys.exit(130)


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

    click.echo(side_by_side(spec, info))
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
@click.argument("path", type=click.Path(exists=True, file_okay=False))
@click.option("--out", type=click.Path(file_okay=False), help="figures folder (default PATH/figures)")
def plot(path, out):
    """Draw figures (PNG and SVG) for a run folder or a sweep folder."""
    from sim.experiments.plots import plot_any

    try:
        files = plot_any(path, out)
    except FileNotFoundError as exc:
        _fail(str(exc))
    for f in files:
        if f.suffix == ".png":
            click.echo(str(f))


@main.command()
@click.argument("run_a", type=click.Path(exists=True, file_okay=False))
@click.argument("run_b", type=click.Path(exists=True, file_okay=False))
@click.option("--metric", "metrics", multiple=True, help="only these metrics (e.g. ttft_p99_s); repeatable")
@click.option("--csv", "csv_out", type=click.Path(dir_okay=False), help="also write the table as CSV")
def compare(run_a, run_b, metrics, csv_out):
    """Side-by-side per-class metrics of two runs, with ratios B/A."""
    from sim.experiments.compare import compare_runs, format_comparison

    try:
        df = compare_runs(run_a, run_b, list(metrics) or None)
    except (FileNotFoundError, ValueError) as exc:
        _fail(str(exc))
    click.echo(format_comparison(df, run_a, run_b), nl=False)
    if csv_out:
        df.to_csv(csv_out, index=False)


@main.command()
@click.option("--device", type=click.Choice(["cpu", "cuda", "auto"]), default="auto", show_default=True)
@click.option("--shape", required=True, help="model shape: tiny, llama-3-8b, llama-3-70b, mistral-7b, qwen2.5-7b")
@click.option("--dtype", default=None, help="fp32 | bf16 | fp16 (default: fp32 on CPU, bf16 on CUDA)")
@click.option("--grid", type=click.Choice(["quick", "full"]), default="quick", show_default=True)
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False), help="profile JSON to write")
@click.option("--cuda-graphs/--no-cuda-graphs", default=None, help="decode under CUDA graphs (CUDA only)")
def calibrate(device, shape, dtype, grid, out, cuda_graphs):
    """Measure prefill, decode and KV transfers with PyTorch and write a fitted profile."""
    try:
        from calibrate.measure import calibrate_profile
    except ImportError as exc:  # torch is the `calibrate` extra
        _fail(f"calibrate needs torch: pip install -e '.[calibrate]' ({exc})")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            _fail("--device cuda: no CUDA device is available on this machine (expected cpu or auto here)")
    try:
        doc = calibrate_profile(device, shape, dtype=dtype, grid=grid, out_path=out, progress=None,
                                cuda_graphs=cuda_graphs)
    except (KeyError, ValueError, RuntimeError) as exc:
        _fail(str(exc.args[0] if exc.args else exc))
    fit = doc.get("fit", {})
    click.echo(f"wrote {out}: {doc['meta'].get('device')} {shape} {doc['meta'].get('dtype')}, "
               f"{len(doc.get('rows', []))} rows, fit leave-one-out error median "
               f"{fit.get('loo_rel_err_median', float('nan')):.1%}, p90 {fit.get('loo_rel_err_p90', float('nan')):.1%}")


@main.command()
@click.option("--profile", "profile", required=True, type=click.Path(exists=True, dir_okay=False),
              help="a measured profile (from priosim calibrate)")
@click.option("--scenario", default=None, help="replay this scenario's request stream (default: a built-in trace)")
@click.option("--requests", "n", default=300, show_default=True, help="requests in the built-in trace")
@click.option("--repeats", default=3, show_default=True, help="real runs; per-request medians are compared")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False))
def validate(profile, scenario, n, repeats, out):
    """Run a trace for real on the device and in the simulator on PROFILE; compare per class."""
    try:
        from calibrate.against_sim import validate as run_validation
    except ImportError as exc:
        _fail(f"validate needs torch: pip install -e '.[calibrate]' ({exc})")
    from sim.core.costs import ProfileError, load_profile

    try:  # a file that is not a profile fails here, in one line, before any measurement
        load_profile(str(profile), where=f"--profile {profile}")
    except ProfileError as exc:
        _fail(str(exc))
    trace = None
    engine = None
    if scenario:
        from sim.assembly import build_workload

        sc = _load(scenario, (), None, None)
        trace = build_workload(sc).open[["arrival_s", "cls", "prompt_tokens", "output_tokens"]].copy()
        trace.insert(0, "request_id", range(len(trace)))
        engine = {"token_budget": sc.engine.max_batched_tokens, "max_num_seqs": sc.engine.max_num_seqs,
                  "chunked_prefill": sc.engine.chunked_prefill}
    report = run_validation(profile, out, trace=trace, n=n, repeats=repeats, engine_params=engine, progress=None)
    click.echo(f"{'class':12s} {'metric':12s} {'real':>10s} {'sim':>10s} {'rel_error':>10s}")
    for m in report["metrics"]:
        click.echo(f"{m['class']:12s} {m['metric']:12s} {m['real']:10.4g} {m['sim']:10.4g} {m['rel_error']:+10.1%}")
    click.echo(f"wrote {Path(out) / 'validation.json'}")


@main.command()
@click.argument("action", type=click.Choice(["build", "status", "clean"]))
def native(action):
    """The engine's optional compiled build (mypyc): build it in place, show status, or remove it."""
    from sim import native as nat

    try:
        if action == "build":
            nat.build()
        elif action == "clean":
            nat.clean()
    except RuntimeError as e:
        raise click.ClickException(str(e))
    click.echo(nat.describe())


# ---- clusters and capacity planning --------------------------------------------------------------
def _echo_cluster(res) -> None:
    """Per-group and per-replica tables of a cluster run."""
    lay = res.summary_dict["cluster"]
    click.echo(f"cluster: {lay['replicas_total']} replicas ({lay['gpus_total']} GPUs), router={lay['router']}")
    fmt = lambda v: f"{v:.4g}"  # noqa: E731
    click.echo(res.group_table().to_string(index=False, float_format=fmt, na_rep="-"))
    click.echo(res.replica_table().to_string(index=False, float_format=fmt, na_rep="-"))


@main.command()
def routers():
    """List registered routers (for [cluster] router = ...)."""
    from sim.cluster.routers import ROUTERS

    for e in ROUTERS.entries():
        click.echo(f"{e.name:18s} {e.description}")


@main.command()
@click.argument("scenario")
@click.option("--designs", default="shared,partitioned", show_default=True,
              help="comma-separated designs: shared (one pool, priority scheduling) and/or partitioned "
                   "(one dedicated group per class)")
@click.option("--slo", "slos", multiple=True, metavar="CLASS:KEY=S[,KEY=S]",
              help="override a class's SLO: ttft / tpot (p99, seconds) or done (every request of the class "
                   "finished by this simulated time); repeatable. Default: the classes' ttft_slo_s / "
                   "tpot_slo_s; classes with neither must finish by horizon_s * (1 + grace)")
@click.option("--grace", type=float, default=0.1, show_default=True,
              help="default deadline of classes without SLOs: horizon_s * (1 + grace)")
@click.option("--router", help="router of the shared design (default least_outstanding)")
@click.option("--max-replicas", type=int, default=64, show_default=True, help="search limit per dimension")
@click.option("--load", "load_scale", type=float, default=1.0, show_default=True, help="arrival-rate multiplier")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="override a scenario key")
@click.option("--seed", type=int, help="override the scenario seed")
@click.option("--workers", type=int, help="parallel simulations (default: the CPU count)")
@click.option("--out", type=click.Path(file_okay=False), help="folder (default results/capacity-<name>-<timestamp>/)")
@click.option("--figure", type=click.Path(dir_okay=False), help="also write the comparison figure here")
@click.option("--no-plots", is_flag=True, help="do not draw the figure")
def capacity(scenario, designs, slos, grace, router, max_replicas, load_scale, sets, seed, workers, out, figure,
             no_plots):
    """Fewest replicas per design that meet SCENARIO's SLOs (binary search; each probe a full simulation)."""
    from sim.experiments.capacity import DESIGNS, capacity_search, parse_slos, plot_capacity, save_report

    sc = _load(scenario, sets, None, seed)
    _workers(workers)
    names = _csv(designs, str, "designs")
    for d in names:
        if d not in DESIGNS:
            _fail(f"--designs: unknown design {d!r} (expected one of {', '.join(DESIGNS)})")
    if max_replicas < 1:
        _fail(f"--max-replicas: expected >= 1 (got {max_replicas})")
    if grace < 0:
        _fail(f"--grace: expected >= 0 (got {grace})")
    try:
        slo = parse_slos(sc, list(slos), grace)
        if router is not None:
            from sim.cluster.routers import make_router
            try:
                if make_router(router).class_aware:
                    _fail(f"--router: the shared design needs a router that is not class-aware (got {router!r})")
            except (KeyError, ValueError, TypeError) as exc:
                _fail(f"--router: {exc.args[0] if exc.args else exc}")
        # validate one point before the search starts
        from sim.experiments.capacity import design_cluster, design_dims
        from sim.config import with_cluster
        for d in names:
            dims = design_dims(d, sc.class_names, max_replicas)
            with_cluster(sc, design_cluster(d, dims, [1] * len(dims), router))
    except ScenarioError as exc:
        _fail(str(exc))
    for c, s in slo.items():
        click.echo(f"SLO {c}: " + ", ".join(f"{k}<={v:g}s" for k, v in s.items() if v is not None))
    try:
        rep = capacity_search(sc, names, slo, router=router, max_replicas=max_replicas, load_scale=load_scale,
                              workers=workers, log=click.echo, progress=None)
    except (RuntimeError, ScenarioError) as exc:
        _fail(str(exc))
    if out is None:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        out = Path("results") / f"capacity-{sc.name}-{stamp}"
    save_report(rep, out)
    click.echo(rep.table().to_string(index=False, float_format=lambda v: f"{v:.4g}", na_rep="-"))
    for d, a in rep.designs.items():
        if a.get("note"):
            click.echo(f"{d}: {a['note']}")
    if not no_plots:
        paths = [plot_capacity(rep, Path(out) / "capacity.png")]
        if figure:
            paths.append(plot_capacity(rep, figure))
        for p in paths:
            click.echo(f"figure: {p}")
    click.echo(f"search wall {rep.wall_s:.1f}s, {len(rep.points)} simulations; results: {out}")


if __name__ == "__main__":  # pragma: no cover
    main()
