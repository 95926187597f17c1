"""``priosim report DIR``, and the ``--report`` flag of run, sweep, capacity and tune (a report
beside the results, written when the command's results are)."""
from __future__ import annotations

from pathlib import Path

import click

from sim.core.errors import ScenarioError
from sim.cli.group import check_out_file, fail, main


@main.command()
@click.argument("path", type=click.Path(exists=True, file_okay=False))
@click.option("--out", help="write the report to this file (default PATH/report.html, replacing only a report "
                            "priosim wrote there)")
@click.option("--overwrite", is_flag=True, help="replace the file --out names")
def report(path, out, overwrite):
    """Write one self-contained HTML report (interactive charts, works offline) for a result
    folder: a run, a sweep, a capacity search or a tune. See docs/report.md."""
    from sim.experiments.report import check_target

    if out is not None:
        out = check_out_file(out, overwrite=overwrite)
    else:
        try:
            check_target(path)
        except ScenarioError as exc:
            fail(str(exc))
    click.echo(f"report: {write(path, out)}")


def write(folder, out=None) -> Path:
    """The report of ``folder`` written (to ``out``, or beside its results); bad or missing
    files fail in one line."""
    from sim.experiments.report import write_report

    try:
        return write_report(folder, out)
    except ScenarioError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"{out or Path(folder) / 'report.html'}: cannot write the report ({exc.strerror or exc})")


def report_option(f):
    """``--report``: the command also writes DIR/report.html when its results are written."""
    return click.option("--report", "report", is_flag=True,
                        help="also write an interactive HTML report beside the results (OUT/report.html; "
                             "later: priosim report OUT)")(f)


def check_report(flag: bool, out) -> None:
    """Before any work: with ``--report``, plotly is installed and ``out`` holds no report.html
    priosim did not write (``out`` may not exist yet)."""
    if not flag:
        return
    from sim.experiments.report import check_target, plotly_js

    try:
        plotly_js()
        if out is not None and Path(out).is_dir():
            check_target(out)
    except ScenarioError as exc:
        fail(str(exc))


def report_beside(flag: bool, out) -> None:
    """After the results are written: with ``--report``, write OUT/report.html and say where."""
    if flag:
        click.echo(f"report: {write(out)}")
