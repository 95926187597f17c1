"""The "Your own trace" examples of docs/workloads.md: the files it shows are the files in
docs/examples/, and its commands run as written (a tenant and a class per row)."""
from __future__ import annotations

import os
import re
import shlex
import shutil

import pandas as pd
from click.testing import CliRunner

from sim.cli import main
from tests.doc_commands import ROOT, bash_commands, fenced_blocks

DOC = ROOT / "docs" / "workloads.md"
SHOWN = re.compile(r"File `(docs/examples/[^`]+)`:\n\n```\w*\n(.*?)^```", re.S | re.M)


def test_the_files_shown_are_the_example_files():
    text = DOC.read_text()
    shown = dict(SHOWN.findall(text))
    assert set(shown) == {"docs/examples/own_trace.csv", "docs/examples/own_trace.toml",
                          "docs/examples/own_trace.jsonl"}
    for name, body in shown.items():
        assert (ROOT / name).read_text() == body, name
    stanza = next(b for _, lang, b in fenced_blocks(DOC) if lang == "toml" and "own_trace.jsonl" in b)
    jsonl = (ROOT / "docs/examples/own_trace_jsonl.toml").read_text()
    csv_toml = (ROOT / "docs/examples/own_trace.toml").read_text()
    csv_stanza = next(line for line in csv_toml.splitlines() if line.startswith("trace = "))
    assert jsonl == csv_toml.replace('name = "own_trace"', 'name = "own_trace_jsonl"').replace(
        csv_stanza, stanza.strip())


def test_the_documented_commands_run_with_a_tenant_and_class_per_row(tmp_path):
    cmds = [c for _, c in bash_commands(DOC) if "docs/examples/own_trace" in c]
    assert len(cmds) == 2
    (tmp_path / "docs").mkdir()
    shutil.copytree(ROOT / "docs" / "examples", tmp_path / "docs" / "examples")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        for cmd in cmds:
            args = shlex.split(cmd)
            assert args[0] == "priosim"
            res = CliRunner().invoke(main, args[1:])
            assert res.exit_code == 0, res.output
            out = tmp_path / args[args.index("--out") + 1]
            req = pd.read_parquet(out / "requests.parquet")
            assert set(req["tenant"]) == {"acme", "globex"} and set(req["class"]) == {"chat", "batch"}
    finally:
        os.chdir(cwd)
