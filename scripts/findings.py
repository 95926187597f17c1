"""The findings pages (docs/findings/*.md, docs/validation.md, docs/sjf_tau_curve.md,
docs/fidelity.md): the command that produced each of their tables, and the regeneration of the
tables a registered producer prints.

    python -m scripts.findings                  # list: page, commit, date, command (also --list)
    python -m scripts.findings --commands       # only the commands, one per line (to rerun by hand)
    python -m scripts.findings --run [NAME ...] # rerun producers, rewrite their generated blocks
    python -m scripts.findings --run --all      # ... the slow ones (minutes each) too

A generated block of a page is everything between ``<!-- generated: NAME -->`` and
``<!-- end -->``: the stamp line (:func:`scripts.stamp.produced`: command, commit, date) and
what the producer ``NAME`` of :data:`PRODUCERS` printed. ``--run`` rewrites only those lines;
the prose around a block is never touched, and it cites the block's numbers instead of
retyping them (a retyped number would go stale at the next run). Tables whose command is not a
registered producer (a GPU run, a tuning study, a table put together by hand from several runs)
are listed with their command, to rerun by hand.
"""
from __future__ import annotations

import argparse
import datetime
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from scripts.stamp import PRODUCED, produced

ROOT = Path(__file__).resolve().parents[1]
# Pages written by a command of their own (their first lines say which), listed with the
# findings pages proper.
GENERATED_ELSEWHERE = {"docs/validation.md": "python -m scripts.validation_table",
                       "docs/sjf_tau_curve.md": "python -m scripts.sjf_tau_curve",
                       "docs/fidelity.md": "priosim fidelity --docs"}
STAMP_PARTS = re.compile(r"> Produced by `([^`]+)` at commit `([0-9a-f]+)` \(([^)]+)\)\.")
BEGIN = re.compile(r"^<!-- generated: ([a-z0-9_-]+) -->$", re.M)
END = "<!-- end -->"


@dataclass(frozen=True)
class Producer:
    """A command that prints one generated block of a findings page (Markdown on stdout).

    ``command`` is run as written (``python`` is this interpreter, ``priosim`` is ``python -m
    sim.cli``) from the repository root, and named in the block's stamp line. ``slow``: it runs
    for minutes, so ``--run`` skips it unless named or ``--all``."""

    page: str
    command: str
    slow: bool = False


# In run order: the two speculation runs draw the same figure, and the page shows the last one's.
PRODUCERS: dict[str, Producer] = {
    "preemption-costs": Producer("docs/findings/preemption.md", "python -m scripts.preemption_costs"),
    "admission-none": Producer("docs/findings/admission.md", "python -m scripts.admission_figures --overhead none"),
    "admission-default": Producer("docs/findings/admission.md", "python -m scripts.admission_figures"),
    "speculation-default": Producer("docs/findings/speculation.md", "python -m scripts.speculation_crossover"),
    "speculation-none": Producer("docs/findings/speculation.md",
                                 "python -m scripts.speculation_crossover --overhead none"),
    "sjf-tau-curve": Producer("docs/findings/size-based.md", "python -m scripts.sjf_tau_curve"),
    "distribution-shift": Producer("docs/findings/size-based.md",
                                   "python -m scripts.distribution_shift --overhead none"),
}


class FindingsError(Exception):
    """A page without the block a producer writes, or a producer that failed; one line."""


def findings(root: Path = ROOT) -> list[tuple[str, str, str, str]]:
    """(page, commit, date, command) of every stamped table, page by page in file order."""
    out = []
    for page in sorted(p for p in (root / "docs" / "findings").glob("*.md") if p.name != "index.md"):
        for line in page.read_text().splitlines():
            if PRODUCED.fullmatch(line):
                command, commit, date = STAMP_PARTS.fullmatch(line).groups()
                out.append((page.relative_to(root).as_posix(), commit, date, command))
    out += [(page, "", "", command) for page, command in GENERATED_ELSEWHERE.items()]
    return out


def blocks(text: str) -> list[str]:
    """The names of the generated blocks of a page's text, in order."""
    return BEGIN.findall(text)


def replace_block(text: str, name: str, body: str) -> str:
    """``text`` with the lines between ``<!-- generated: name -->`` and the next
    ``<!-- end -->`` replaced by ``body``; every other character is kept as it was."""
    starts = [m for m in BEGIN.finditer(text) if m.group(1) == name]
    if len(starts) != 1:
        raise FindingsError(f"{len(starts)} blocks <!-- generated: {name} --> (expected one)")
    head = starts[0].end()
    end = text.find("\n" + END, head)
    if end < 0 or BEGIN.search(text, head, end):
        raise FindingsError(f"<!-- generated: {name} --> has no {END} before the next block")
    return text[:head] + "\n" + body.rstrip("\n") + text[end:]


def argv(command: str) -> list[str]:
    """The process to start for a producer's command: this interpreter for ``python`` and for
    ``priosim`` (so the checkout's own code runs, not an installed copy elsewhere)."""
    words = shlex.split(command)
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    if words[0] == "priosim":
        return [sys.executable, "-m", "sim.cli", *words[1:]]
    return words


def commit(root: Path = ROOT) -> str:
    """The short commit of ``root``'s checkout ("0000000" outside a git checkout)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                              text=True, check=True).stdout.strip() or "0000000"
    except (OSError, subprocess.CalledProcessError):
        return "0000000"


def produce(name: str, root: Path = ROOT) -> str:
    """Run producer ``name`` in ``root``; the block body: its stamp line, a blank line, and what
    it printed, less its "wrote PATH" lines (paths of this machine, not findings)."""
    p = PRODUCERS[name]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(argv(p.command), cwd=root, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise FindingsError(f"{name}: `{p.command}` exited {done.returncode}: {tail}")
    lines = [ln for ln in done.stdout.splitlines() if not ln.startswith("wrote ")]
    stamp = produced(p.command, commit(root), datetime.date.today().isoformat())
    return "\n".join([stamp, "", *lines]).rstrip("\n") + "\n"


def regenerate(name: str, root: Path = ROOT) -> Path:
    """Rerun producer ``name`` and rewrite its block on its page (only that block); the page."""
    from sim.outdir import write_file

    page = root / PRODUCERS[name].page
    replace_block(page.read_text(), name, "")  # the page has the block: checked before the run
    body = produce(name, root)
    new = replace_block(page.read_text(), name, body)  # (read again: the run may take minutes)
    write_file(page, new)  # (a page of the repository, rewritten in place: only the block changed)
    return page


def main(argv_: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scripts.findings", description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="list page, commit, date and command (the default)")
    ap.add_argument("--commands", action="store_true", help="print only the commands")
    ap.add_argument("--run", nargs="*", metavar="NAME",
                    help=f"rerun these producers (default: every one not marked slow): {', '.join(PRODUCERS)}")
    ap.add_argument("--all", action="store_true", help="with --run and no NAME: the slow producers too")
    args = ap.parse_args(argv_)
    if args.run is None:
        for page, sha, date, command in findings():
            print(command if args.commands else f"{page}\t{sha or '-'}\t{date or '-'}\t{command}")
        return 0
    unknown = [n for n in args.run if n not in PRODUCERS]
    if unknown:
        print(f"error: --run {unknown[0]}: no such producer (expected one of {', '.join(PRODUCERS)})",
              file=sys.stderr)
        return 2
    names = args.run or [n for n, p in PRODUCERS.items() if args.all or not p.slow]
    for name in names:
        print(f"{name}: {PRODUCERS[name].command}", file=sys.stderr, flush=True)
        try:
            page = regenerate(name)
        except FindingsError as e:
            print(f"error: {PRODUCERS[name].page}: {e}", file=sys.stderr)
            return 2
        print(f"rewrote {page.relative_to(ROOT)} (block {name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
