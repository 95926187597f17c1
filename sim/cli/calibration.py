"""priosim commands that measure or check the cost model: calibrate, validate, fidelity, replay,
and the compiled build (native)."""
from __future__ import annotations

import os
import shlex
from pathlib import Path

import click

from sim.core.errors import ScenarioError, error_message
from sim.cli.group import check_figure_file, check_out_file, check_workers, claim_out, fail, fail_write, load, main
from sim.cli.engine_flags import engine_flag_options, with_engine_flags


def check_outputs(named: list[tuple[str | None, str]], inputs: list[str], overwrite: bool) -> list[Path | None]:
    """The files a command writes (``(path or None, flag)`` each), checked before any work: none
    may be one of the ``inputs`` (a user's measurement or profile: refused even with
    ``overwrite``, the command would destroy what it reads), no two the same file (the second
    would silently replace the first), and each as :func:`check_out_file` checks it (its folder
    may be missing: :func:`write_output` makes it)."""
    seen: dict[str, str] = {}
    checked: list[Path | None] = []
    for path, flag in named:
        if not path:
            checked.append(None)
            continue
        same = next((src for src in inputs if _same_file(path, src)), None)
        if same is not None:
            fail(f"{flag} {path}: is the input file {same} (expected another file: writing there would destroy "
                 f"what the command reads, --overwrite or not)")
        real = os.path.realpath(path)
        if real in seen:
            fail(f"{flag} {path}: is also the file {seen[real]} names (expected a different file for each)")
        seen[real] = flag
        check = check_figure_file if flag == "--figure" else check_out_file  # (a figure's suffix names its format)
        checked.append(check(path, flag, overwrite=overwrite))
    return checked


def _same_file(a: str, b: str) -> bool:
    """Whether paths ``a`` and ``b`` name one file (a hard or symbolic link too)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # (``a`` not written yet: the same path, links resolved)
        return os.path.realpath(a) == os.path.realpath(b)


def write_output(path: Path, data, flag: str) -> None:
    """Write one result file whole (:func:`sim.outdir.write_file`), making its missing folders
    first as ``run --out`` does (the nearest existing one was checked writable before any
    work); a write the file system refuses is one line, exit 2."""
    from sim.outdir import write_file

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file(path, data)
    except OSError as exc:
        fail(f"{flag} {path}: cannot write it: {exc.strerror or exc} (expected a writable folder with room)")


def check_distinct_runs(runs: tuple[str, ...]) -> None:
    """Each run file once: a file given twice, or a copy of another (the same sha256), would
    weigh twice in the fit and be 'left out' while its copy stays in (one line, exit 2)."""
    import hashlib

    seen: dict[str, str] = {}
    for r in runs:
        try:
            digest = hashlib.sha256(Path(r).read_bytes()).hexdigest()  # (as the profile's meta records it)
        except OSError:
            continue  # (the reader says what is wrong with it, in one line)
        if digest in seen:
            what = "given twice" if os.path.realpath(seen[digest]) == os.path.realpath(r) else \
                f"the same content as {seen[digest]}, sha256 {digest[:12]}..."
            fail(f"{r}: {what} (expected each run once: a copy would count twice in the fit, and stay in it "
                 f"while leave-one-run-out leaves the other out)")
        seen[digest] = r


def _profile_file(profile: str | None) -> list[str]:
    """``[profile]`` when it names a file (an input a result must not replace), else ``[]``."""
    return [profile] if profile and os.path.isfile(profile) else []


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
@click.argument("runs", nargs=-1, metavar="[RUN ...]")
@click.option("--from-runs", "from_runs", is_flag=True,
              help="fit a profile to your own benchmark result files RUN ... (vLLM, GuideLLM, SGLang, genai-perf; "
                   "no torch): engine overhead, achieved bandwidth and FLOPs fractions")
@click.option("--profile", "base", default=None, help="with --from-runs: the base profile (name or path) of the "
              "runs' model and GPU")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="with --from-runs: override a key of every replay scenario (e.g. engine.engine_version=0.6.3)")
@click.option("--seed", type=int, default=0, show_default=True, help="with --from-runs: seed of a generated "
              "arrival process")
@click.option("--loro/--no-loro", default=True, show_default=True,
              help="with --from-runs: leave each run out in turn (3 runs or more)")
@click.option("--workers", type=int, default=None,
              help="with --from-runs: processes replaying the runs side by side (default: the CPU count; "
                   "the same fit for any count)")
@engine_flag_options
@click.option("--device", type=click.Choice(["cpu", "cuda", "auto"]), default="auto", show_default=True,
              help="where to measure (auto: cuda when a GPU is visible, else cpu)")
@click.option("--shape", default=None, help="model shape: tiny, llama-3-8b, llama-3-70b, mistral-7b, qwen2.5-7b")
@click.option("--dtype", default=None, help="fp32 | bf16 | fp16 (default: fp32 on CPU, bf16 on CUDA)")
@click.option("--grid", type=click.Choice(["quick", "full"]), default="quick", show_default=True,
              help="cells measured: quick (seconds to minutes) or full (prefill to 8k tokens, decode at batch 1-256)")
@click.option("--out", "out", required=True, help="profile JSON to write (a new file)")
@click.option("--cuda-graphs/--no-cuda-graphs", default=None, help="decode under CUDA graphs (CUDA only)")
@click.option("--overwrite", is_flag=True, help="replace the file --out names")
def calibrate(runs, from_runs, base, sets, seed, loro, workers, engine_args, sglang_args, device, shape, dtype, grid,
              out, cuda_graphs, overwrite):
    """Measure prefill, decode and KV transfers with PyTorch and write a fitted profile; or, with
    --from-runs RUN ..., fit a profile to real benchmark results (docs/calibration.md)."""
    if from_runs:  # (every input checked, one line and exit 2, before the fit)
        from calibrate.runs import RunError
        from calibrate.runs.table import read_runs
        from sim.core.costs import ProfileError
        from plumbing.notices import warn

        if not runs:
            fail("--from-runs: no RUN files (expected one or more benchmark result files)")
        check_workers(workers)
        if base is None:
            fail("--profile: missing (expected the base profile of the runs' model and GPU, e.g. h100-sxm-llama-3-8b)")
        (path,) = check_outputs([(out, "--out")], list(runs) + _profile_file(base), overwrite)
        check_distinct_runs(runs)
        from calibrate.runs.fit import base_document, fit_runs, profile_document
        from calibrate.runs.inputs import input_warnings, redrawn_runs
        from calibrate.runs.scenario import unversioned_release
        from calibrate.runs.fitreport import report

        try:
            base_document(base)
            loaded = []
            for r in runs:
                each = read_runs(r)
                if len(each) > 1:  # (vLLM's --append-result, SGLang's output file: one result a line)
                    click.echo(f"note: {r}: {len(each)} results, one per line: each is a run of the fit "
                               f"({each[0].label} to {each[-1].label})")
                loaded += each
            warned = set()
            for run in loaded:
                for msg in input_warnings(run, base):
                    if msg not in warned:  # (once a file: its results' lines say the same)
                        warned.add(msg)
                        warn(msg)
            sets = with_engine_flags(sets, engine_args, sglang_args)
            input_notes = [n for n in (unversioned_release(loaded, list(sets)), redrawn_runs(loaded, seed)) if n]
            for note in input_notes:
                click.echo(f"note: {note}")
            fit = fit_runs(loaded, base, list(sets), seed=seed, loro=loro,
                           echo=lambda m: click.echo(f"... {m}", err=True), workers=workers or os.cpu_count() or 1)
        except (RunError, ScenarioError, ProfileError) as exc:
            fail(str(exc))
        from sim import jsonout

        click.echo(report(fit))
        from calibrate.runs.fit import bound_warnings

        for msg in bound_warnings(fit):
            warn(msg)
        doc = profile_document(fit, Path(path).stem, list(sets), input_notes=input_notes)
        write_output(path, jsonout.dumps(doc, indent=1) + "\n", "--out")
        same = "".join(f" --set {shlex.quote(s)}" for s in sets)
        click.echo(f"wrote {out}: check it on a run not used in the fit: priosim replay RUN --profile {out}{same}")
        return
    if runs:
        fail(f"{runs[0]}: result files are read with --from-runs (expected: calibrate --from-runs RUN ... "
             f"--profile BASE --out P.json)")
    if shape is None:
        fail("--shape: missing (expected a model shape to measure: tiny, llama-3-8b, llama-3-70b, mistral-7b, "
             "qwen2.5-7b; or --from-runs RUN ...)")
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
    from sim.core.costs import ProfileError, load_profile

    try:  # a file that is not a profile fails here, in one line, before any measurement
        load_profile(str(profile), where=f"--profile {profile}")
    except ProfileError as exc:
        fail(str(exc))
    try:  # (the real runs import torch only when they start: asked here, before any work)
        import torch  # noqa: F401

        from calibrate.against_sim import validate as run_validation
    except ImportError as exc:  # torch is the `calibrate` extra
        fail(f"validate needs torch: pip install -e '.[calibrate]' ({exc})")
    out = claim_out(out, "validation", "validation", resume=True)
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
@click.argument("run_file", metavar="RUN", type=click.Path(dir_okay=False))
@click.option("--profile", default="h200-llama-3-8b", show_default=True,
              help="cost profile (name or path): the run's model and GPU")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="override a key of the replay scenario")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of a generated arrival process")
@click.option("--arrivals", type=click.Choice(["auto", "closed", "recorded", "process"]), default="auto",
              show_default=True, help="how requests are sent (auto: closed-loop under max_concurrency, else the "
                                      "recorded send times, else the client's arrival process)")
@click.option("--json", "json_out", help="write measured vs simulated metrics to this JSON file (a new file)")
@click.option("--figure", "figure_out", help="draw per-request measured vs simulated TTFT and E2E (a new .png, .svg or .pdf file)")
@click.option("--overwrite", is_flag=True, help="replace the files --json and --figure name")
@click.option("--result", "result", type=int, default=None,
              help="of a file of several results (one a line, or a GuideLLM sweep), the N-th (from 1; default: "
                   "the last line, the first benchmark); calibrate --from-runs names them FILE#N")
@engine_flag_options
def replay(run_file, profile, sets, seed, arrivals, json_out, figure_out, overwrite, result, engine_args,
           sglang_args):
    """Replay a real benchmark result RUN (vLLM, GuideLLM, SGLang, genai-perf) in the simulator;
    print measured vs simulated TTFT, TPOT, ITL, E2E and throughput."""
    from calibrate.runs import RunError, read_run, read_runs
    from calibrate.runs.compare import replay as run_replay
    from calibrate.runs.inputs import input_warnings, replay_record
    from plumbing.notices import warn

    json_out, figure_out = check_outputs([(json_out, "--json"), (figure_out, "--figure")],
                                         [run_file] + _profile_file(profile), overwrite)
    try:
        if result is None:
            run = read_run(run_file)
        else:
            runs = read_runs(run_file)
            if not 1 <= result <= len(runs):
                fail(f"--result: {run_file} holds {len(runs)} result(s) (expected 1 to {len(runs)}, got {result})")
            run = runs[result - 1]
        if figure_out and run.summary_only:
            fail(f"--figure: {run_file} is a summary-only result (no per-request times to draw; expected a "
                 f"file saved with --save-detailed, or --output-details for SGLang)")
        warned = input_warnings(run, profile)
        for msg in warned:
            warn(msg)
        given = list(sets)
        sets = with_engine_flags(sets, engine_args, sglang_args)
        cmp = run_replay(run, list(sets), profile=profile, seed=seed, mode=None if arrivals == "auto" else arrivals)
    except (RunError, ScenarioError) as exc:
        fail(str(exc))
    st = run.settings
    where = f"{run_file}#{run.part}" if run.part else run_file
    click.echo(f"{where}: {run.format}, {len(run.requests)} requests, rate={st['request_rate']:g} "
               f"max_concurrency={st['max_concurrency']} model={st['model']}; sent: {cmp.mode}; profile={profile}")
    from calibrate.runs.scenario import fitted_to_runs, unversioned_release

    unversioned = "" if fitted_to_runs(profile) else unversioned_release([run], list(sets))
    notes = run.notes + cmp.notes + ([unversioned] if unversioned else [])
    for note in notes:
        click.echo(f"note: {note}")
    click.echo(cmp.table())
    if json_out:
        from sim import jsonout

        what = {"run": str(run_file), "result": run.part, "format": run.format, "mode": cmp.mode, "profile": profile,
                **replay_record(run, cmp, profile, seed, arrivals, given, list(sets), engine_args, sglang_args),
                "notes": notes, "warnings": warned}
        write_output(json_out, jsonout.dumps({**what, "metrics": cmp.metrics}, indent=1) + "\n", "--json")
        click.echo(f"wrote {json_out}")
    if figure_out:
        from calibrate.runs.figure import parity

        fmt = figure_out.suffix.lstrip(".").lower()  # (checked: png, svg or pdf)
        write_output(figure_out, lambda p: parity(cmp, p, fmt), "--figure")
        click.echo(f"wrote {figure_out}")


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
