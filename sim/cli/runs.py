"""priosim commands about one run: run, workload, plot, compare, and the lists (policies, profiles,
routers)."""
from __future__ import annotations

import math
from pathlib import Path

import click

from sim.core.errors import ScenarioError
from sim.cli.engine_flags import engine_flag_options, warn_priosim_only, with_engine_flags
from sim.cli.group import check_out_file, claim_out, echo_cluster, fail, fail_write, hint_native, load, main
from sim.cli.report import check_report, report_beside, report_option


def warn_overloaded(sc, run_info: dict) -> None:
    """One line on stderr when the run was overloaded (summary.json's ``backlog_at_horizon``):
    many requests still queued for their first token at the horizon."""
    b = run_info.get("backlog_at_horizon") or {}
    if not b.get("overloaded"):
        return
    from plumbing.notices import warn

    worst = ", ".join(f"{c} {n:,}" for c, n in sorted(b["by_class"].items(), key=lambda x: -x[1]))
    warn(f"overloaded: {b['requests']:,} of the {b['arrived']:,} requests that arrived by the horizon "
         f"({sc.horizon_s:g} s) had no first token by then ({b['share']:.0%}; {worst}): the offered load outran what "
         f"was served, so queues grew all run and its latencies grow with its length (how many replicas it needs: "
         f"priosim capacity)")


#: Reject reasons a request's length decides against the server's limits, whatever the load and
#: without an admission gate (engine.py ``admit_arrival``).
LENGTH_LIMITS = {"too_long": "prompt + max_tokens over engine.max_model_len{mml}",
                 "too_large": "prompt + max_tokens more than the KV cache can ever hold for one request",
                 "too_long_for_step": "{step} more than one step's token budget, engine.max_batched_tokens{budget}, "
                                      "without chunked prefill{why}"}


def lenient_line(skipped: int) -> str:
    """What ``--lenient`` says it did: the bad trace rows it skipped (``skipped``)."""
    return f"lenient: skipped {skipped:,} bad trace row{'' if skipped == 1 else 's'}"


def warn_too_long(sc, classes: dict) -> None:
    """One line on stderr when requests were refused at arrival for their length (``too_long``:
    over ``engine.max_model_len``, as vLLM's and SGLang's servers answer 400; ``too_large``: more
    KV than a replica could ever give one request; ``too_long_for_step``: without chunked
    prefill, a prompt, or what a preempted request prefills again, longer than one step's
    budget): a setting, not the load, decided them."""
    from plumbing.notices import warn
    from sim.core.preemption import PREEMPTION_MODES

    for reason, why in LENGTH_LIMITS.items():
        hit = {c: (m.get("reject_reasons") or {}).get(reason, 0) for c, m in classes.items() if c != "overall"}
        hit = {c: n for c, n in hit.items() if n}
        if not hit:
            continue
        per_class = ", ".join(f"{c} {n:,} of {classes[c]['arrived']:,}" for c, n in hit.items())
        mml = sc.engine.max_model_len
        mml = f" = {mml:,}" if mml and not sc.cluster else ""  # (a cluster's groups may set their own)
        budget = f" = {sc.engine.max_batched_tokens:,}" if not sc.cluster else ""
        # (a mode that preempts may make a request prefill again all it holds: that must fit a step)
        preempts = PREEMPTION_MODES.resolve(sc.engine.preemption).grows_blocks or sc.cluster
        step = "prompt + max_tokens" if preempts else "prompt"
        again = (": a preempted request prefills again all it holds, in one step" if preempts and not sc.cluster
                 else "")
        warn(f"refused at arrival as too long ({reason}): {per_class} "
             f"({why.format(mml=mml, budget=budget, step=step, why=again)}); "
             f"their rows in requests.parquet have reject_reason {reason}")


@main.command()
@click.argument("scenario", required=False)
@click.option("--policy", help="policy name, module:Class or path/to/file.py:Class (overrides [policy] name)")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="override a scenario key, e.g. engine.max_num_seqs=64")
@click.option("--seed", type=int, help="override the scenario seed")
@click.option("--out", help="results folder: new or empty (default results/<name>-<timestamp>/)")
@click.option("--overwrite", is_flag=True, help="replace the run result already in --out (only its own files)")
@click.option("--trace-iterations", is_flag=True, help="also write iterations.parquet (one row per request per iteration)")
@click.option("--plots/--no-plots", default=False,
              help="also draw the run's figures (PNG and SVG) into OUT/figures; off by default, as drawing "
                   "them takes longer than the run (later: priosim plot OUT)")
@click.option("--progress/--no-progress", default=None,
              help="progress bar (default: a bar on a terminal, else a line on stderr every 10 s)")
@click.option("--lenient", is_flag=True, help="skip bad trace rows (and report how many) instead of failing")
@click.option("--uncertainty", is_flag=True,
              help="also run at the low and high time factors of the cost model's error and report each headline "
                   "metric with its 80 %% interval (docs/uncertainty.md)")
@click.option("--backend", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="where a cluster's replicas run when its router has refresh_s: local processes, or Ray actors "
                   "(docs/distributed.md)")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="partitions of the cluster's replicas, each advanced by its own worker (needs refresh_s)")
@click.option("--address", help="with --backend ray: the Ray cluster's address (default: start a local one)")
@report_option
@engine_flag_options
def run(scenario, policy, sets, seed, out, overwrite, trace_iterations, plots, progress, lenient, uncertainty,
        backend, workers, address, report, engine_args, sglang_args):
    """Run SCENARIO (a TOML file, a run's scenario.json or a shipped name; default: the contended-moment scenario)."""
    from sim.run import simulate

    sc = load(scenario, with_engine_flags(sets, engine_args, sglang_args, policy), policy, seed)
    warn_priosim_only(sc)
    distributed = backend != "local" or workers != 1
    if distributed and (not sc.cluster or sc.cluster.refresh_s is None or uncertainty):
        fail(f"{sc.source}: --backend {backend} --workers {workers}: expected a [cluster] whose router has refresh_s "
             f"(router = {{ name = ..., refresh_s = 1.0 }}), without --uncertainty")
    out = claim_out(out, "run", sc.name, overwrite=overwrite)
    check_report(report, out)
    ivs = None
    try:
        if uncertainty:
            from sim.experiments.uncertainty import UncertaintyError, run_with_uncertainty
            try:
                res, ivs = run_with_uncertainty(sc, trace_iterations=trace_iterations, progress=progress,
                                                lenient=lenient, log=lambda m: click.echo(m, err=True))
            except UncertaintyError as exc:
                fail(str(exc))
        else:
            res = simulate(sc, trace_iterations=trace_iterations, progress=progress, lenient=lenient,
                           **({"backend": backend, "workers": workers, "address": address} if distributed else {}))
    except ScenarioError as exc:
        fail(str(exc))
    if lenient:
        from sim.assembly import skipped_rows
        click.echo(lenient_line(skipped_rows(res.summary_dict['run'].get('workload', {}))), err=True)
    try:
        path = res.save(out, overwrite=True)  # (claimed above: new, empty, or --overwrite)
    except OSError as exc:
        fail_write(out, exc)
    run_info = res.summary_dict["run"]
    click.echo(f"{sc.name}: policy={sc.policy.name} seed={sc.seed} profile={res.manifest['profile']} "
               f"kv_blocks={run_info['kv_blocks']}")
    if ivs is None:
        click.echo(res.table())
    else:
        from sim.experiments.uncertainty import table

        click.echo(table(res, ivs))
    click.echo(f"events={run_info['engine_events']} iterations={run_info['iterations']} "
               f"simulated={run_info['end_s']:.1f}s wall={run_info['wall_s']:.2f}s "
               f"thrash_ratio={run_info['thrash_ratio']:.3f}")
    if sc.cluster:
        echo_cluster(res)
    warn_thrashing(sc, run_info)
    warn_overloaded(sc, run_info)
    warn_too_long(sc, res.summary_dict["classes"])
    if plots:
        from sim.experiments.plots import plot_run

        click.echo(f"figures: {len(plot_run(path))} files in {Path(path) / 'figures'}")
    report_beside(report, path)
    click.echo(f"results: {path}")
    hint_native(run_info["wall_s"])


def warn_thrashing(sc, run_info: dict) -> None:
    """One line on stderr when the run thrashed (summary.json's ``thrashing``): its engine spent
    more of its busy time redoing preempted work than ``engine.thrash_threshold``."""
    if not run_info.get("thrashing"):
        return
    from plumbing.notices import warn

    warn(f"the run thrashed: {run_info['thrash_ratio']:.1%} of the engine's busy time went to redoing preempted "
         f"work (above engine.thrash_threshold = {sc.engine.thrash_threshold:g}); its latencies measure "
         f"preemption churn (engine.watermark or a lower engine.max_num_seqs may help)")


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
@click.option("--model", help="derive the profile of this model instead (a bundled name or a config.json path) "
                              "and print it with every constant and its source")
@click.option("--gpu", help="with --model: the device (priosim profiles --models lists them)")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True, help="with --model: tensor-parallel degree")
@click.option("--ep", type=click.IntRange(min=1), default=1, show_default=True, help="with --model: expert-parallel degree")
@click.option("--dtype", help="with --model: weight format (bf16, fp16, fp8, fp8-block, int8, w8a16, int4, mxfp4; default: the checkpoint's)")
@click.option("--kv-dtype", default="bf16", show_default=True, help="with --model: KV cache format (bf16, fp16, fp8)")
@click.option("--context", type=click.IntRange(min=1), help="with --model: typical context of a sliding-window model "
                                                            "(engine.typical_context; default 4096)")
@click.option("--json", "as_json", is_flag=True, help="with --model: print the profile document as JSON")
@click.option("--models", "list_models", is_flag=True, help="list the bundled models and the devices instead")
def profiles(model, gpu, tp, ep, dtype, kv_dtype, context, as_json, list_models):
    """List shipped and local cost profiles with their provenance; or derive one (--model, --gpu)."""
    import json

    from sim.core.costs import list_profiles

    if list_models:
        _list_models()
        return
    if model is not None or gpu is not None:
        _derived_profile(model, gpu, tp, ep, dtype, kv_dtype, context, as_json)
        return

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


def _list_models() -> None:
    from sim.models import DEVICES, bundled, load_architecture

    click.echo("bundled models (engine.model; or a path to a config.json):")
    for name in bundled():
        click.echo(f"  {name:18s} {load_architecture(name).kind}")
    click.echo("devices (engine.gpu):")
    for key, dev in DEVICES.items():
        click.echo(f"  {key:10s} {dev.name}")


def _derived_profile(model, gpu, tp, ep, dtype, kv_dtype, context, as_json) -> None:
    """Print the profile derived for ``model`` on ``gpu`` (bad input: one line, status 2)."""
    import json

    from sim.core.costs import profile_from_dict
    from sim.models import derived

    if model is None or gpu is None:
        fail(f"--{'gpu' if model is not None else 'model'}: required with --{'model' if model is not None else 'gpu'} "
             f"(expected both: priosim profiles --model M --gpu G)")
    try:
        doc = derived(model, gpu, dtype, kv_dtype, tp, ep, context, Path("."))
    except ScenarioError as exc:
        fail(str(exc).replace("engine.model", "--model", 1))
    except KeyError as exc:
        fail(f"--gpu: {exc.args[0]}")
    except ValueError as exc:
        fail(f"--{str(exc).replace('_', '-')}")
    if as_json:
        click.echo(json.dumps(doc, indent=1))
        return
    meta = doc["meta"]
    click.echo(f"{meta['name']}: {meta['shape']} ({meta['architecture']}) on {meta['device']}, weights {meta['dtype']}, "
               f"KV {meta['kv_dtype']}, tp={meta['tp']} ep={meta['ep']} ({meta['gpus']} GPUs per replica)")
    click.echo(f"config: {meta['config']}")
    click.echo("constants (value, source):")
    for k, c in meta["constants"].items():
        click.echo(f"  {k:26s} {c['value']:<14.6g} {c['source']}")
    step = doc["step"]
    click.echo("step terms (seconds per unit; docs/models.md has the formulas):")
    for k, v in step.items():
        if k in ("token_knots", "token_s"):
            continue
        click.echo(f"  {k:26s} {v:.6g}")
    knots = ", ".join(f"{t:g}: {s * 1e3:.4g} ms" for t, s in zip(step["token_knots"], step["token_s"]))
    click.echo(f"  token term (tokens: weights/compute time) {knots}")
    cm = profile_from_dict(doc, meta["name"], meta["name"])
    click.echo(f"memory: kv_capacity_bytes {doc['memory']['kv_capacity_bytes']:.6g} "
               f"({cm.kv_blocks(16)} blocks of 16 tokens, {cm.shape.kv_bytes_per_token} KV bytes per token)")
    click.echo(f"decode step, batch 1 at context 1: {cm.step_s(D=1, sum_ctx=1) * 1e3:.4f} ms "
               f"(overhead {doc['overhead']} included; engine.overhead = 'none' for the roofline alone: "
               f"{cm.with_overhead(_no_overhead()).step_s(D=1, sum_ctx=1) * 1e3:.4f} ms)")


def _no_overhead():
    from sim.core.overhead import resolve_overhead
    return resolve_overhead("none")


# Offered load: engine seconds per second the stream asks for, pricing each request as a lone
# prefill of its mean prompt (which gives its first token) plus its other output tokens decoded
# in a full batch at its mean context. 1.0 is the replica's capacity, roughly.
def decode_batch(row, max_num_seqs: int, kv_blocks: int, block_size: int) -> int:
    """The sequences a full decode step of this stream holds: ``max_num_seqs``, or fewer when
    the KV pool (``kv_blocks`` blocks of ``block_size`` tokens) holds fewer at the stream's mean
    context (its prompt and half its output); at least 1."""
    ctx = row["prompt_mean"] + row["output_mean"] / 2
    per_seq = max(1, math.ceil(ctx / block_size))
    return max(1, min(max_num_seqs, kv_blocks // per_seq))


def work_s(row, costs) -> float:
    """Engine seconds one mean request of this stream costs (``row["batch"]``: its decode
    batch): a prefill of its mean prompt, then its output less the first token (the prefill's)
    in decode steps shared by the batch."""
    b = int(row["batch"])
    ctx = row["prompt_mean"] + row["output_mean"] / 2
    return (costs.prefill_s(int(row["prompt_mean"]))
            + max(row["output_mean"] - 1.0, 0.0) * costs.step_s(D=b, sum_ctx=b * ctx) / b)


@main.command()
@click.argument("scenario", required=False)
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="override a scenario key, e.g. horizon_s=600")
@click.option("--seed", type=int, help="override the scenario seed")
@click.option("--out", help="write the request stream to this parquet file (a new file)")
@click.option("--overwrite", is_flag=True, help="replace the file --out names")
@click.option("--lenient", is_flag=True, help="skip bad trace rows (and report how many) instead of failing")
def workload(scenario, sets, seed, out, overwrite, lenient):
    """Print SCENARIO's request-stream statistics per tenant and class (no simulation)."""
    from sim.assembly import build_workload, engine_costs, kv_blocks_of, skipped_rows
    from workloads.stats import stream_stats

    sc = load(scenario, sets, None, seed)
    if out:
        check_out_file(out, overwrite=overwrite)
    try:
        wl = build_workload(sc, lenient=lenient)
    except ScenarioError as exc:
        fail(str(exc))
    stats = stream_stats(wl.open, horizon_s=sc.horizon_s)
    costs = engine_costs(sc)  # (as the engine prices its steps: cost scale and entrypoint too)
    B = sc.engine.max_num_seqs
    kv_blocks = kv_blocks_of(sc.engine, costs)  # (as the engine's pool has them)
    if len(stats):
        stats["batch"] = stats.apply(lambda row: decode_batch(row, B, kv_blocks, sc.engine.block_size), axis=1)
        stats["offered_load"] = stats["rate"] * stats.apply(lambda row: work_s(row, costs), axis=1)
    click.echo(stats.to_string(float_format=lambda v: f"{v:.4g}"))
    if len(stats):
        click.echo(f"offered load, all streams: {stats['offered_load'].sum():.3g} of one replica "
                   f"({costs.name}; a decode step of up to {B} sequences, as many as {kv_blocks} KV blocks hold)")
    if lenient:
        click.echo(lenient_line(skipped_rows(wl.meta)), err=True)
    if out:
        from sim.outdir import write_file

        table = wl.open.drop(columns=[c for c in ("hash_ids",) if c in wl.open.columns])
        try:
            Path(out).parent.mkdir(parents=True, exist_ok=True)  # (claimed: a new folder may be named)
            write_file(out, lambda p: table.to_parquet(p, index=False))
        except OSError as exc:
            fail_write(out, exc)
        click.echo(f"wrote {out}")


@main.command()
@click.argument("path", type=click.Path(exists=True, file_okay=False))
@click.option("--out", help="figures folder: new, empty or one of priosim's figures (default PATH/figures)")
def plot(path, out):
    """Draw figures (PNG and SVG) for a run folder or a sweep folder."""
    from sim.experiments.plots import plot_any

    # (the default, PATH/figures, is claimed alike: a folder of the user's there is never drawn into)
    out = claim_out(out if out is not None else str(Path(path) / "figures"), "figures", "figures", resume=True)
    try:
        files = plot_any(path, out)
    except FileNotFoundError as exc:
        fail(str(exc))
    for f in files:
        if f.suffix == ".png":
            click.echo(str(f))


@main.command()
@click.argument("run_a", type=click.Path(exists=True, file_okay=False))
@click.argument("run_b", type=click.Path(exists=True, file_okay=False))
@click.option("--metric", "metrics", multiple=True,
              help="only these metrics (e.g. ttft_p99_s; any of docs/metrics.md); repeatable")
@click.option("--also-a", "more_a", multiple=True, type=click.Path(exists=True, file_okay=False),
              help="another seed's run of A (repeatable): A is then the mean over its runs")
@click.option("--also-b", "more_b", multiple=True, type=click.Path(exists=True, file_okay=False),
              help="another seed's run of B (repeatable)")
@click.option("--csv", "csv_out", type=click.Path(dir_okay=False), help="also write the table as CSV (a new file)")
@click.option("--overwrite", is_flag=True, help="replace the file --csv names")
def compare(run_a, run_b, metrics, more_a, more_b, csv_out, overwrite):
    """Side-by-side per-class metrics of two runs, with ratios B/A and the better side
    ('same' within noise: 1 %, or the seeds' spread with --also-a/--also-b)."""
    from sim.experiments.compare import compare_runs, format_comparison

    if csv_out:
        check_out_file(csv_out, "--csv", overwrite=overwrite)
    a, b = [run_a, *more_a], [run_b, *more_b]
    try:
        df = compare_runs(a, b, list(metrics) or None)
    except (FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    click.echo(format_comparison(df, a, b), nl=False)
    if csv_out:
        from sim.outdir import write_file

        try:
            write_file(csv_out, df.to_csv(index=False))
        except OSError as exc:
            fail(f"--csv {csv_out}: cannot write the table ({exc.strerror or exc})")


@main.command()
def routers():
    """List registered routers (for [cluster] router = ...)."""
    from sim.routers import ROUTERS

    for e in ROUTERS.entries():
        click.echo(f"{e.name:18s} {e.description}")


@main.command()
def autoscalers():
    """List registered autoscaler policies (for [cluster] autoscale = { policy = ... })."""
    from sim.autoscalers import AUTOSCALERS

    for e in AUTOSCALERS.entries():
        click.echo(f"{e.name:18s} {e.description}")
