"""The documentation site: it builds with ``mkdocs build --strict`` (no broken link, anchor or
page, every page in the nav), its generated reference is current and complete, and the prose of
README.md and docs/ carries no dated measurement history (only a generated page's stamp line,
:mod:`scripts.stamp`, may hold a date, a time or a commit)."""
from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from scripts import reference
from scripts.stamp import generated, is_stamp, produced

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

# What dated measurement history looks like in prose: a timestamp, or the words of a re-run log.
DATED = [
    (re.compile(r"\b\d{4}-\d{2}-\d{2}[ T]\d{1,2}:\d{2}\b"), "a timestamp"),
    (re.compile(r"\bat \d{1,2}:\d{2}\b"), "a time of day"),
    (re.compile(r"\bre-?run (at|that day|after|on)\b", re.I), "a re-run log"),
    (re.compile(r"\bre-?measured\b", re.I), "a re-measurement log"),
    (re.compile(r"\bspeed round\b", re.I), "a speed-round log"),
]
FENCE = re.compile(r"^```.*?^```[ \t]*$", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")


def dated_lines(text: str) -> list[tuple[int, str, str]]:
    """(line number, what, line) of every line of prose that carries dated history. Code blocks
    and code spans are not prose (an error message may quote a trace's timestamp); a stamp line
    is exempt as a whole."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if is_stamp(line):
            continue
        prose = CODE.sub("", line)
        out += [(i, what, line.strip()) for rx, what in DATED if rx.search(prose)]
    return out


def test_no_dated_history_in_readme_or_docs():
    bad = [f"{p.relative_to(ROOT)}:{i}: {what}: {line[:120]}" for p in PAGES for i, what, line in dated_lines(p.read_text())]
    assert not bad, "\n".join(bad)


def test_dated_lines_are_found_and_only_the_stamp_is_exempt():
    log = ("Re-run at 23:35 after the next speed round: 0.4 s.\n"
           "The table of 2026-12-02 01:52, on a slower host.\n"
           "Row re-measured with the quick suite.\n")
    assert [i for i, _, _ in dated_lines(log)] == [1, 1, 1, 2, 3]
    ok = (produced("python -m scripts.prefix_victim", "cf6cbfc", "2026-11-30 14:02") + "\n"
          + generated("python -m scripts.reference docs/reference") + "\n"
          + "An error quotes `t '2024-05-10 12:00:01.5'` in code.\n```\nrun at 01:52\n```\n")
    assert dated_lines(ok) == []
    # a stamp is the whole line: text after it, or a stamp of another shape, is prose
    assert dated_lines(produced("x", "cf6cbfc", "2026-11-30 14:02") + " re-run at 15:00")
    assert dated_lines("> Produced by `x` on 2026-11-30 14:02.")


def test_findings_pages_say_what_produced_each_table():
    from scripts.findings import findings
    pages = {p for p, *_ in findings()}
    for page in sorted((ROOT / "docs" / "findings").glob("*.md")):
        if page.name != "index.md":
            assert page.relative_to(ROOT).as_posix() in pages, f"{page.name}: no stamp line"
    for page, commit, date, command in findings():
        assert (ROOT / page).is_file() and command, page


def test_reference_pages_are_current():
    stale = [name for name, text in reference.pages().items()
             if not (ROOT / "docs" / "reference" / name).is_file()
             or (ROOT / "docs" / "reference" / name).read_text() != text]
    assert not stale, f"not current: {stale}; run {reference.COMMAND}"


def test_every_scenario_key_and_cli_option_is_described():
    import click

    from sim.cli import main
    from sim.config import Scenario
    keys = [key for key, field, _ in reference.scenario_keys(Scenario) if not field.description]
    assert not keys, f"scenario keys without a description=: {keys}"
    opts = [f"{' '.join(path)} {p.opts[0]}" for path, cmd in reference.commands(main) for p in cmd.params
            if isinstance(p, click.Option) and not p.hidden and not p.help]
    assert not opts, f"options without a help=: {opts}"
    assert not [" ".join(path) for path, cmd in reference.commands(main) if not cmd.help]


def test_reference_walks_nested_tables_and_lists():
    from sim.config import Scenario
    keys = {key for key, _, _ in reference.scenario_keys(Scenario)}
    assert {"engine.max_num_seqs", "engine.speculative.k", "classes[].priority", "tenants[].rate_rps",
            "cluster.groups[].replicas", "admission.shed", "streams"} <= keys
    assert "source" not in keys and "base_dir" not in keys  # (bookkeeping, not keys)


def _hook_page(src: str):
    from scripts import mkdocs_hooks
    config = {"docs_dir": str(ROOT / "docs")}
    page = SimpleNamespace(file=SimpleNamespace(src_uri=src, generated_by=None))
    return mkdocs_hooks, config, page


def test_links_out_of_the_docs_become_paths_and_broken_ones_warn(caplog):
    hooks, config, page = _hook_page("replay.md")
    md = "See [the test files](../tests/data/runs/README.md) and [scenarios](scenario.md).\n"
    out = hooks.on_page_markdown(md, page, config, None)
    assert "the test files (`tests/data/runs/README.md`)" in out and "[scenarios](scenario.md)" in out
    with caplog.at_level(logging.WARNING, logger="mkdocs.plugins.priosim"):
        hooks.on_page_markdown("[gone](../no/such/file.md)\n```\n[in code](../nope.md)\n```\n", page, config, None)
    assert [r.getMessage() for r in caplog.records] == ["replay.md: link to ../no/such/file.md, which is not in the repository"]


@pytest.mark.slow
def test_site_builds_strict(tmp_path):
    for mod in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        pytest.importorskip(mod)  # the docs extra, which dev includes
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(tmp_path / "site")], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    site = tmp_path / "site"
    for page in ("index.html", "reference/scenario-keys/index.html", "reference/api/index.html",
                 "findings/preemption/index.html", "changelog/index.html", "search/search_index.json"):
        assert (site / page).is_file(), page
    assert "sim.run.simulate" in (site / "reference" / "api" / "index.html").read_text()


# ---- findings regenerated by one command (scripts.findings --run) ---------------------------

def _outside_blocks(text: str) -> str:
    """The page with every generated block's inside blanked: what --run must leave alone."""
    return re.sub(r"(<!-- generated: [a-z0-9_-]+ -->\n).*?(<!-- end -->)", r"\1\2", text, flags=re.S)


def test_replace_block_changes_only_the_inside_of_its_markers():
    from scripts.findings import FindingsError, replace_block
    page = ("# T\n\nProse 1.\n<!-- generated: a -->\nold a\n<!-- end -->\nProse 2.\n"
            "<!-- generated: b -->\nold b\n<!-- end -->\nProse 3.\n")
    new = replace_block(page, "a", "> stamp\n\n| x |\n")
    assert new == page.replace("old a", "> stamp\n\n| x |")
    assert _outside_blocks(new) == _outside_blocks(page)
    with pytest.raises(FindingsError):
        replace_block(page, "c", "x")  # no such block
    with pytest.raises(FindingsError):
        replace_block("<!-- generated: a -->\nx\n<!-- generated: b -->\n<!-- end -->\n", "a", "y")


def test_every_generated_block_has_its_producer_and_stamp():
    from scripts.findings import PRODUCERS, STAMP_PARTS, blocks
    on_pages = {}
    for page in sorted((ROOT / "docs" / "findings").glob("*.md")):
        text = page.read_text()
        for name in blocks(text):
            assert name not in on_pages, f"block {name} twice"
            on_pages[name] = page.relative_to(ROOT).as_posix()
            inside = text.split(f"<!-- generated: {name} -->\n", 1)[1].split("<!-- end -->", 1)[0]
            stamp = STAMP_PARTS.match(inside)
            assert stamp and stamp.group(1) == PRODUCERS[name].command, f"{page.name}: block {name}: stamp"
    assert on_pages == {n: p.page for n, p in PRODUCERS.items()}


def test_findings_run_regenerates_one_block_in_a_copy(tmp_path):
    """End to end on the cheap producer, in a copy of the checkout: the block gets a fresh stamp
    and the producer's table, every other byte of the page stays, the checkout is untouched."""
    import shutil
    copy = tmp_path / "repo"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "results", "figures")
    for pkg in ("sim", "scripts", "workloads", "policies", "plumbing", "calibrate"):
        shutil.copytree(ROOT / pkg, copy / pkg, ignore=skip)
    shutil.copytree(ROOT / "docs" / "findings", copy / "docs" / "findings")
    page = "docs/findings/preemption.md"
    before = (ROOT / page).read_text()
    (copy / page).write_text(before.replace("| 128 |", "| 999 |"))  # a stale table to replace
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-m", "scripts.findings", "--run", "preemption-costs"], cwd=copy,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    after = (copy / page).read_text()
    assert _outside_blocks(after) == _outside_blocks(before)
    block = after.split("<!-- generated: preemption-costs -->\n", 1)[1].split("<!-- end -->", 1)[0]
    first = block.splitlines()[0]
    assert is_stamp(first) and "`python -m scripts.preemption_costs` at commit" in first
    assert "| 128 |" in block and "| 999 |" not in block and "crossover" in block
    assert (ROOT / page).read_text() == before
    bad = subprocess.run([sys.executable, "-m", "scripts.findings", "--run", "nope"], cwd=copy, env=env,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --run nope: no such producer")


# ---- shipped scenarios' comments quote no measured result -----------------------------------

QUANTITY = re.compile(r"(~|about |≈)?\b(\d[\d,]*(?:\.\d+)?)\s*(?:output\s+)?(ms|s|req/s|requests/s|tok/s|tokens/s)(?![\w/])")
RESULT_WORDS = re.compile(r"\b(gives?|takes?|finish(es)?|reach(es)?|saturates?|measured|delivers?|cuts?|"
                          r"drops?|climbs?|serves?|gets?|shows?|falls? to|rises? to|you should see)\b", re.I)


def _settings(value) -> set[float]:
    """Every number a scenario sets, anywhere in its tables (and in inline strings like '0.5s')."""
    if isinstance(value, dict):
        return set().union(*map(_settings, value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*map(_settings, value)) if value else set()
    if isinstance(value, bool):
        return set()
    if isinstance(value, (int, float)):
        return {float(value)}
    return {float(x) for x in re.findall(r"\d+(?:\.\d+)?", str(value))}


def measured_results(text: str) -> list[str]:
    """The sentences of a scenario file's comments that quote a measured result: a time or a rate
    that is not one of the scenario's own settings, with a word that reports an outcome or a
    tilde. (A result goes stale with the engine's pricing; the findings pages carry them.)"""
    import tomllib
    settings = _settings(tomllib.loads(text))
    comments = " ".join(line.split("#", 1)[1].strip() for line in text.splitlines() if "#" in line)
    out = []
    for sentence in re.split(r"(?<=[.;:])\s+|\s+\*\s+", comments):
        for tilde, num, unit in QUANTITY.findall(sentence):
            v = float(num.replace(",", ""))
            own = v in settings or (unit == "ms" and v / 1000 in settings)
            if not own and (tilde.strip() == "~" or RESULT_WORDS.search(sentence)):
                out.append(f"{num} {unit}: {sentence[:140]}")
    return out


def test_measured_results_are_found_and_settings_are_not():
    toml = ('# With preemption off interactive TTFT p99 ~4.6 s.\n# It finishes about 24 req/s.\n'
            '# Interactive arrives at 15 req/s and must meet 0.5 s; the day is 240 s.\n'
            'horizon_s = 240.0\n[[classes]]\nttft_slo_s = 0.5\n[[streams]]\nrate = 15\n')
    assert [m.split(":")[0] for m in measured_results(toml)] == ["4.6 s", "24 req/s"]


def test_shipped_scenarios_quote_no_measured_result():
    bad = [f"{p.name}: {m}" for p in sorted((ROOT / "workloads" / "scenarios").glob("*.toml"))
           for m in measured_results(p.read_text())]
    assert not bad, "\n".join(bad)


def test_the_printed_default_run_in_the_readme_and_first_run_is_current(tmp_path):
    """README.md and docs/first-run.md show what `priosim run` prints: the same lines, to the digit."""
    from click.testing import CliRunner

    from sim.cli import main

    res = CliRunner().invoke(main, ["run", "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    table = res.output.splitlines()[:5]
    for page in ("README.md", "docs/first-run.md"):
        text = (ROOT / page).read_text()
        assert "\n".join(table) in text, f"{page}: the printed run is stale (rerun `priosim run` and paste its table)"
