"""``priosim report DIR``: one self-contained, interactive HTML page for a result folder.

The folder's kind comes from its marker (:mod:`sim.outdir`: ``.priosim.json``): a run
(:mod:`.run`), a sweep (:mod:`.sweep`), a capacity search (:mod:`.capacity`) or a tune study
(:mod:`.tune`). The page embeds plotly.js once (from the ``plotly`` package: the ``report`` extra)
and every chart's data as strict JSON, so it opens offline from a ``file://`` address, with no
server; the same folder gives the same bytes.

The report goes to ``DIR/report.html`` (written whole or not at all, and added to the marker's
list of priosim's files, so replacing the result later replaces its report too and the folder
keeps its kind), or wherever ``out`` says. A ``report.html`` in ``DIR`` that priosim did not write
is never replaced.
"""
from __future__ import annotations

from pathlib import Path

from sim.core.errors import ScenarioError

REPORT = "report.html"
KINDS = ("run", "sweep", "capacity", "tune")


def plotly_js() -> str:
    """plotly.js (minified) from the installed ``plotly`` package; ScenarioError when missing."""
    try:
        from plotly.offline import get_plotlyjs
    except ImportError:
        raise ScenarioError("report needs plotly: pip install -e '.[report]'") from None
    return get_plotlyjs()


def kind_of(folder: Path) -> str:
    """The kind of result in ``folder`` (one-line ScenarioError when it is not one a report reads)."""
    from sim.outdir import marker

    if not folder.is_dir():
        raise ScenarioError(f"{folder}: not a folder (expected a priosim result folder: a run, sweep, capacity "
                            f"search or tune)")
    doc = marker(folder)
    if doc is None:
        raise ScenarioError(f"{folder}: not a priosim result folder (no .priosim.json, manifest.json, sweep.json, "
                            f"capacity.json or study.db) (expected a run, sweep, capacity search or tune folder)")
    if doc["kind"] not in KINDS:
        raise ScenarioError(f"{folder}: holds a priosim {doc['kind']!r} result (expected a run, sweep, capacity "
                            f"search or tune folder)")
    return doc["kind"]


def render(folder: str | Path) -> tuple[str, str]:
    """The report of ``folder`` as HTML text, and the folder's kind."""
    folder = Path(folder)
    kind = kind_of(folder)
    js = plotly_js()
    if kind == "run":
        from sim.experiments.report.run import build
    elif kind == "sweep":
        from sim.experiments.report.sweep import build
    elif kind == "capacity":
        from sim.experiments.report.capacity import build
    else:
        from sim.experiments.report.tune import build
    return build(folder).html(js), kind


def check_target(folder: str | Path) -> Path:
    """``folder/report.html``, refused (ScenarioError) when a file there was not made by priosim."""
    from sim.experiments.report.page import is_priosim_report

    path = Path(folder) / REPORT
    if path.is_symlink() or path.is_dir():
        raise ScenarioError(f"{path}: is a link or a folder, not a report priosim wrote (expected no file there, "
                            f"or pass --out FILE)")
    if path.exists():
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                head = fh.read(4096)
        except OSError as exc:
            raise ScenarioError(f"{path}: cannot be read ({exc.strerror or exc})") from None
        if not is_priosim_report(head):
            raise ScenarioError(f"{path}: exists and was not written by priosim report (expected no file there, "
                                f"or pass --out FILE)")
    return path


def write_report(folder: str | Path, out: str | Path | None = None) -> Path:
    """Write the report of ``folder`` to ``out`` (default ``folder/report.html``, see
    :func:`check_target`), whole or not at all; returns its path. ``out`` is the caller's to
    check (``sim.cli.group.check_out_file``)."""
    from sim.outdir import write_file, write_marker

    folder = Path(folder)
    target = Path(out) if out is not None else check_target(folder)
    text, kind = render(folder)
    write_file(target, text)
    if out is None:  # (listed as priosim's: a result replaced later takes its report along)
        write_marker(folder, kind, [REPORT])
    return target
