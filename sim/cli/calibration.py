"""priosim commands that measure or check the cost model: calibrate, validate, fidelity, and the
compiled build (native)."""
from __future__ import annotations

from pathlib import Path

import click

from sim.core.errors import ScenarioError, error_message
from sim.cli.group import check_out_file, claim_out, fail, fail_write, load, main


@main.command()
@click.option("--rows", "prefixes", multiple=True, metavar="PREFIX",
              help="only rows whose id starts with PREFIX (repeatable); the page is not rewritten")
@click.option("--overhead", help="price every row with this preset instead of its own (e.g. none)")
@click.option("--out", help="folder for the report and parity plot: new, empty or a fidelity report's "
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
            fail(str(exc))
    if out is not None and not docs:  # (a fidelity folder's own report is rewritten; nothing else is)
        out = claim_out(out, "fidelity", "fidelity", resume=True)
    try:
        run_suite(tuple(prefixes), overhead=overhead, out=out, docs=docs, echo=click.echo)
    except (ValueError, ScenarioError) as exc:
        fail(str(exc))


@main.command()
@click.option("--device", type=click.Choice(["cpu", "cuda", "auto"]), default="auto", show_default=True)
@click.option("--shape", required=True, help="model shape: tiny, llama-3-8b, llama-3-70b, mistral-7b, qwen2.5-7b")
@click.option("--dtype", default=None, help="fp32 | bf16 | fp16 (default: fp32 on CPU, bf16 on CUDA)")
@click.option("--grid", type=click.Choice(["quick", "full"]), default="quick", show_default=True)
@click.option("--out", "out", required=True, help="profile JSON to write (a new file)")
@click.option("--cuda-graphs/--no-cuda-graphs", default=None, help="decode under CUDA graphs (CUDA only)")
@click.option("--overwrite", is_flag=True, help="replace the file --out names")
def calibrate(device, shape, dtype, grid, out, cuda_graphs, overwrite):
    """Measure prefill, decode and KV transfers with PyTorch and write a fitted profile."""
    check_out_file(out, overwrite=overwrite)
    try:
        from calibrate.measure import calibrate_profile
    except ImportError as exc:  # torch is the `calibrate` extra
        fail(f"calibrate needs torch: pip install -e '.[calibrate]' ({exc})")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            fail("--device cuda: no CUDA device is available on this machine (expected cpu or auto here)")
    try:
        doc = calibrate_profile(device, shape, dtype=dtype, grid=grid, out_path=out, progress=None,
                                cuda_graphs=cuda_graphs)
    except OSError as exc:  # (the profile is written whole or not at all)
        fail_write(out, exc)
    except (KeyError, ValueError, RuntimeError) as exc:
        fail(error_message(exc))
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
@click.option("--out", "out", required=True, help="report folder: new, empty or an earlier validation's")
def validate(profile, scenario, n, repeats, out):
    """Run a trace for real on the device and in the simulator on PROFILE; compare per class."""
    out = claim_out(out, "validation", "validation", resume=True)
    try:
        from calibrate.against_sim import validate as run_validation
    except ImportError as exc:
        fail(f"validate needs torch: pip install -e '.[calibrate]' ({exc})")
    from sim.core.costs import ProfileError, load_profile

    try:  # a file that is not a profile fails here, in one line, before any measurement
        load_profile(str(profile), where=f"--profile {profile}")
    except ProfileError as exc:
        fail(str(exc))
    trace = None
    engine = None
    if scenario:
        from sim.assembly import build_workload

        sc = load(scenario, (), None, None)
        trace = build_workload(sc).open[["arrival_s", "cls", "prompt_tokens", "output_tokens"]].copy()
        trace.insert(0, "request_id", range(len(trace)))
        engine = {"token_budget": sc.engine.max_batched_tokens, "max_num_seqs": sc.engine.max_num_seqs,
                  "chunked_prefill": sc.engine.chunked_prefill}
    report = run_validation(profile, out, trace=trace, n=n, repeats=repeats, engine_params=engine, progress=None)
    click.echo(f"{'class':12s} {'metric':12s} {'real':>10s} {'sim':>10s} {'rel_error':>10s}")
    for m in report["metrics"]:
        click.echo(f"{m['class']:12s} {m['metric']:12s} {m['real']:10.4g} {m['sim']:10.4g} {m['rel_error']:+10.1%}")
    for kind, st in report.get("steps", {}).items():
        click.echo(f"{kind} steps: {st['steps']}, measured p50 {st['measured_s_p50'] * 1e3:.2f} ms, priced p50 "
                   f"{st['priced_s_p50'] * 1e3:.2f} ms, priced/measured - 1 p50 {st['rel_error_p50']:+.1%}, "
                   f"host gap after a step p50 {st['gap_s_p50'] * 1e3:.2f} ms")
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
