"""The ``priosim`` command group and what its commands share: one-line failures (exit 2),
loading a scenario with the CLI's overrides, and checks of output folders, worker counts and loads."""
from __future__ import annotations

import contextlib
import os
import re
import sys
import warnings
from pathlib import Path

import click

from sim.core.errors import ScenarioError


#: The exit statuses of every priosim command (also in ``priosim --help`` and docs/errors.md).
EXIT_OK, EXIT_FAILED_RUNS, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130

EPILOG = ("Exit status, every command: 0 done; 1 a run failed inside a sweep, tune or capacity search "
          "(the others finished; see its failures); 2 bad input (one line 'error: ...', before any work); "
          "130 interrupted (Ctrl-C; one line 'interrupted', no partial result published).")


def fail(msg: str) -> None:
    """Print ``error: msg`` (one line) on stderr and exit with status 2: bad input, before any work."""
    click.echo(f"error: {msg}", err=True)
    sys.exit(EXIT_BAD_INPUT)


def usage_line(exc: click.UsageError) -> str:
    """A click usage error as one line: the option (or argument), the bad value and what was
    expected, then where the options are listed, e.g. ``--seed: 'abc' is not a valid integer
    (see priosim run --help)``; click's own text is a usage block of three lines."""
    param = getattr(exc, "param", None)
    if isinstance(exc, click.NoSuchOption):
        close = " or ".join(repr(p) for p in exc.possibilities or ())
        msg = f"no such option {exc.option_name!r}" + (f"; did you mean {close}?" if close else "")
    elif isinstance(exc, click.BadParameter) and not isinstance(exc, click.MissingParameter) and param is not None:
        hint = exc.param_hint or (" / ".join(param.opts) if isinstance(param, click.Option)
                                  else param.human_readable_name)
        msg = f"{hint if isinstance(hint, str) else ' / '.join(hint)}: {_lower(exc.message)}"
    else:
        msg = _lower(exc.format_message())
    msg = " ".join(msg.split()).rstrip(".")
    if exc.ctx is not None:
        msg += f" (see {command_words(exc.ctx)} --help)"
    return msg


def command_words(ctx: click.Context) -> str:
    """The command as a user types it, ``priosim replay``, whatever the program was started as:
    the subcommands' own names under ``priosim`` (the root's name may be several words,
    ``python -m sim.cli``, which ``command_path`` would split into ``-m sim.cli replay``)."""
    names = []
    while ctx.parent is not None:
        names.append(ctx.info_name)
        ctx = ctx.parent
    return " ".join(["priosim", *reversed(names)])


def _lower(text: str) -> str:
    """Click's sentence as a clause: its first letter lower-case ('Missing option' -> 'missing
    option'), unless the word is an acronym."""
    text = text.strip()
    return text[:1].lower() + text[1:] if text[:1].isupper() and not text[1:2].isupper() else text


class Priosim(click.Group):
    """The ``priosim`` group: every command's failures in one line and its exit statuses the
    same (:data:`EPILOG`): a usage error (a bad option value, an unknown option) is one line
    ``error: ...`` with status 2, Ctrl-C one line ``interrupted`` with status 130 (click's own
    are a three-line usage block, and ``Aborted!`` with status 1)."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:  # (a caller that handles click's exceptions itself)
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.UsageError as exc:
            click.echo(f"error: {usage_line(exc)}", err=True)
            sys.exit(EXIT_BAD_INPUT)
        except click.ClickException as exc:  # (not bad input: e.g. a failed compiled build)
            click.echo(f"error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except (click.Abort, KeyboardInterrupt, EOFError):
            interrupted()
        sys.exit(code if isinstance(code, int) else EXIT_OK)  # (--help and --version: 0)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:  # (before click turns it into Abort, with a blank line)
            interrupted()


def interrupted() -> None:
    """Ctrl-C: one line ``interrupted`` on stderr and exit status 130. What the command was
    writing stays unpublished (results are written under a hidden name and renamed when whole)."""
    click.echo("interrupted", err=True)
    sys.exit(EXIT_INTERRUPTED)


@click.group(cls=Priosim, context_settings={"help_option_names": ["-h", "--help"]}, epilog=EPILOG)
@click.version_option(package_name="priosim")
def main() -> None:
    """priosim: simulate an LLM serving replica under priority scheduling."""
    click.get_current_context().with_resource(one_line_warnings())


@contextlib.contextmanager
def one_line_warnings():
    """While a command runs, print each warning about suspicious input
    (:class:`plumbing.notices.InputWarning`) as one line ``warning: <message>`` on stderr, each
    distinct message once, whichever code raised it and for however many of a sweep's runs
    (:func:`warning_key`); other warnings are shown as Python shows them."""
    from plumbing.notices import InputWarning

    with warnings.catch_warnings():
        shown = warnings.showwarning
        # (Python's "default" action shows a message once per place that raises it: a scenario
        # is checked when loaded and again when run, so the set below does the once-only)
        warnings.simplefilter("always", InputWarning)
        said: set[str] = set()

        def show(message, category, filename, lineno, file=None, line=None):
            if issubclass(category, InputWarning):
                key = warning_key(str(message))
                if key not in said:
                    said.add(key)
                    click.echo(f"warning: {message}", err=True)
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        yield


#: A sweep run's tag in a scenario's source, ``chat.toml [policy=fcfs__load=0.5__seed=1]: ...``
RUN_TAG = re.compile(r" \[[^\]]*\](?=: )")


def warning_key(message: str) -> str:
    """What makes two warnings the same: the message less a sweep run's tag in its source, so
    that a scenario's warning is shown once for the scenario rather than once per run (the first
    shown names its run)."""
    return RUN_TAG.sub("", message, count=1)


def load(scenario, sets, policy, seed):
    """The scenario (a file or a shipped name; None: the default) with the command's ``--set``,
    ``--policy`` and ``--seed`` applied; bad input fails in one line."""
    from sim.config import load_scenario

    overrides = list(sets)
    if policy:
        overrides.append(f"policy.name={toml_str(policy)}")
    if seed is not None:
        overrides.append(f"seed={seed}")
    try:
        return load_scenario(scenario, overrides=overrides)
    except ScenarioError as exc:
        fail(str(exc))


def claim_out(out, kind: str, stem: str, *, flag: str = "--out", overwrite: bool = False,
              resume: bool = False) -> Path:
    """The folder a command's results of ``kind`` go to, checked before any work: ``out``, or a
    new ``results/<stem>-<timestamp>`` (never one that exists); a folder priosim may not write
    fails in one line (:func:`sim.outdir.claim`)."""
    import datetime as _dt

    from sim.outdir import OutError, claim, fresh

    if out is None:
        out = fresh("results", f"{stem}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}")
    try:
        return claim(out, kind, flag=flag, overwrite=overwrite, resume=resume)
    except OutError as exc:
        fail(str(exc))


def write_refused(exc: BaseException) -> str | None:
    """Why the file system refused a write, in a few words, when ``exc`` is that (an ``OSError``:
    a full disk, a quota, a folder gone; SQLite's "database or disk is full"); None for anything
    else, which is a bug whose traceback is wanted."""
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    orig = getattr(exc, "orig", None)  # sqlalchemy's error wraps sqlite3's
    if type(orig).__name__ == "OperationalError" and any(
            s in str(orig) for s in ("disk is full", "disk I/O error", "unable to open database")):
        return str(orig)
    return None


def fail_write(out, exc: BaseException) -> None:
    """The one line for a write the file system refused while writing the results into ``out``
    (what was written before is kept; the same command, rerun with room, goes on from it)."""
    import errno

    name = getattr(exc, "filename", None)
    where = f" ({Path(name).name})" if name else ""
    why = write_refused(exc)
    if getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT):
        why = os.strerror(exc.errno)  # (pyarrow's own words wrap the system's)
    full = getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "disk is full" in why
    fail(f"--out {out}: cannot write the results{where}: {why} (expected "
         + ("room on the disk: free some and run the command again)" if full else "a writable folder)"))


def check_out_file(out, flag: str = "--out", overwrite: bool = False) -> Path:
    """A file a command will write, checked before any work (:func:`sim.outdir.claim_file`):
    refused in one line when it exists (unless ``overwrite``) or cannot be written."""
    from sim.outdir import OutError, claim_file

    try:
        return claim_file(out, flag=flag, overwrite=overwrite)
    except OutError as exc:
        fail(str(exc))


def check_figure_format(path, flag: str = "--figure") -> None:
    """A figure file's suffix names a format matplotlib writes (none: PNG), checked before any
    work: a typo otherwise fails only at the end of a long search, with a traceback."""
    ext = Path(str(path)).suffix.lstrip(".").lower()
    if not ext:
        return
    from matplotlib.backend_bases import FigureCanvasBase

    known = sorted(FigureCanvasBase.get_supported_filetypes())
    if ext not in known:
        fail(f"{flag} {path}: cannot draw a figure as '.{ext}' (expected one of {', '.join('.' + k for k in known)})")


def check_workers(value, flag: str = "--workers"):
    if value is not None and value < 1:
        fail(f"{flag}: must be at least 1 (got {value})")
    return value


def check_load(sc, load: float, flag: str = "--loads") -> None:
    """The scenario's streams at ``load`` times their rates are valid (not absurd volumes); a
    ScenarioError naming ``flag`` otherwise."""
    import workloads

    try:
        workloads.validate_streams(sc.streams, set(sc.class_names), Path(sc.base_dir), horizon_s=sc.horizon_s,
                                   load_scale=load)
    except workloads.WorkloadError as exc:
        raise ScenarioError(f"{sc.source}: {flag} {load:g}: {exc}") from None


def toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def csv_list(text: str | None, kind, what: str) -> list | None:
    if text is None:
        return None
    try:
        vals = [kind(v.strip()) for v in text.split(",") if v.strip()]
    except ValueError:
        fail(f"--{what}: expected a comma-separated list of {kind.__name__} values (got {text!r})")
    if not vals:
        fail(f"--{what}: empty list")
    return vals


def echo_cluster(res) -> None:
    """Per-group and per-replica tables of a cluster run."""
    lay = res.summary_dict["cluster"]
    scaled = " at the start, autoscaled" if lay.get("fleet", {}).get("decisions") else ""
    click.echo(f"cluster: {lay['replicas_total']} replicas ({lay['gpus_total']} GPUs){scaled}, router={lay['router']}")
    from sim.results import numeric_columns

    fmt = lambda v: f"{v:.4g}"  # noqa: E731
    click.echo(numeric_columns(res.group_table()).to_string(index=False, float_format=fmt, na_rep="-"))
    click.echo(numeric_columns(res.replica_table()).to_string(index=False, float_format=fmt, na_rep="-"))
    echo_fleet(res)


def echo_fleet(res) -> None:
    """An autoscaled cluster's replica counts, and the run's cost when it has a price or an autoscaler."""
    fleet = res.summary_dict["cluster"].get("fleet", {})
    decisions = fleet.get("decisions", {})
    ft = res.fleet_table()
    for g, n in decisions.items():
        rows = ft[ft.group == g]
        click.echo(f"autoscale: group {g}: {rows.serving.iloc[0]} serving at the start, {rows.serving.min()}.."
                   f"{rows.serving.max()} over the run, {n} decisions")
    cost = res.summary_dict.get("cost")
    if cost and (decisions or cost["cost_usd"] is not None):
        usd = "" if cost["cost_usd"] is None else (
            f", ${cost['cost_usd']:.4g}" + (f" (${cost['usd_per_million_output_tokens']:.4g} per M output tokens)"
                                            if cost["usd_per_million_output_tokens"] is not None else ""))
        click.echo(f"cost: {cost['gpu_hours']:.4g} GPU-hours{usd}")


#: A command whose simulations took at least this long (s) in pure Python ends with a hint
#: about the compiled build (:func:`hint_native`).
NATIVE_HINT_S = 30.0


def hint_native(wall_s: float) -> None:
    """After ``wall_s`` seconds of simulation in pure Python, say on stderr (one line) that the
    compiled build exists; nothing when the compiled build ran, when the user chose pure Python
    (``PRIOSIM_PURE_PYTHON=1``) or when the wait was short."""
    from sim import native

    if wall_s < NATIVE_HINT_S or native.BUILD != "python" or native.pure_forced():
        return
    click.echo(f"hint: the simulations took {wall_s:.0f} s in pure Python; the compiled engine takes about "
               f"half that, with the same results: pip install -e \".[native]\" && priosim native build "
               f"(priosim native status says which build runs)", err=True)
