"""The findings pages (docs/findings/*.md, docs/validation.md, docs/sjf_tau_curve.md,
docs/fidelity.md) and the command that produced each of their tables.

    python -m scripts.findings            # list: page, commit, date, command
    python -m scripts.findings --commands # only the commands, one per line (to rerun by hand)

Reading the stamps is cheap; the commands are not (some run for minutes or need a GPU), so
this never runs them: rerun one by hand, then replace its table and its stamp line
(:func:`scripts.stamp.produced`).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from scripts.stamp import PRODUCED

ROOT = Path(__file__).resolve().parents[1]
# Pages written by a command of their own (their first lines say which), listed with the
# findings pages proper.
GENERATED_ELSEWHERE = {"docs/validation.md": "python -m scripts.validation_table",
                       "docs/sjf_tau_curve.md": "python -m scripts.sjf_tau_curve",
                       "docs/fidelity.md": "priosim fidelity --docs"}
STAMP_PARTS = re.compile(r"> Produced by `([^`]+)` at commit `([0-9a-f]+)` \(([^)]+)\)\.")


def findings() -> list[tuple[str, str, str, str]]:
    """(page, commit, date, command) of every stamped table, page by page in file order."""
    out = []
    for page in sorted(p for p in (ROOT / "docs" / "findings").glob("*.md") if p.name != "index.md"):
        for line in page.read_text().splitlines():
            if PRODUCED.fullmatch(line):
                command, commit, date = STAMP_PARTS.fullmatch(line).groups()
                out.append((page.relative_to(ROOT).as_posix(), commit, date, command))
    out += [(page, "", "", command) for page, command in GENERATED_ELSEWHERE.items()]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scripts.findings", description=__doc__.split("\n\n")[0])
    ap.add_argument("--commands", action="store_true", help="print only the commands")
    args = ap.parse_args(argv)
    for page, commit, date, command in findings():
        print(command if args.commands else f"{page}\t{commit or '-'}\t{date or '-'}\t{command}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
