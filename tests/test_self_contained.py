"""The project speaks only of itself: no file refers to a folder outside the repository or to
the planning notes and issue numbers it was built from; and the import rules of
docs/architecture.md hold."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".git", ".venv", "results", "build", "__pycache__", ".hypothesis", ".pytest_cache", "LICENSES"}
TEXT = {".py", ".md", ".toml", ".ipynb", ".json", ".txt", ".cfg", ".yml", ".yaml", ""}
# spelled in pieces so that this file does not match itself
FORBIDDEN = [
    (re.compile(r"\.\./" + "shared"), "a folder beside the repository"),
    (re.compile("shared/" + r"(data|seeds|DES" + "IGN|STYLE|vllm)"), "the outside shared folder"),
    (re.compile(r"\bDES" + r"IGN(\.md)?\b"), "the planning notes"),
    (re.compile("steering " + "repo", re.I), "the planning repository"),
    (re.compile(r"\bissues? ?#?\d+\b", re.I), "an issue number"),
    (re.compile("/" + r"work/"), "a machine path"),
]


def _files():
    """The repository's files: tracked and not ignored (git), else a walk without build output."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.splitlines()
        paths = [Path(x) for x in out]
    except (OSError, subprocess.CalledProcessError):
        paths = [p.relative_to(ROOT) for p in ROOT.rglob("*")]
    for rel in paths:
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts[:-1]) or rel.name == ".git":
            continue
        p = ROOT / rel
        if p.is_file() and p.suffix in TEXT and p.stat().st_size < 2_000_000:
            yield rel


def test_no_file_refers_outside_the_repository():
    bad = []
    for rel in _files():
        try:
            text = (ROOT / rel).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for i, line in enumerate(text.splitlines(), 1):
            for rx, what in FORBIDDEN:
                if rx.search(line):
                    bad.append(f"{rel}:{i}: {what}: {line.strip()[:100]}")
    assert not bad, "\n".join(bad)


def test_shipped_scenarios_name_only_bundled_or_inner_paths():
    for p in (ROOT / "workloads" / "scenarios").glob("*.toml"):
        for m in re.finditer(r'path\s*=\s*"([^"]*)"', p.read_text()):
            assert m.group(1).startswith("bundled:") or m.group(1) in ("azure_code", "azure_conv"), (p.name, m.group(1))


def _imports(path: Path) -> set[str]:
    """Top-level project modules a file imports at module level (not inside functions)."""
    tree = ast.parse(path.read_text())
    out = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def _all_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


CORE = sorted(p.stem for p in (ROOT / "sim" / "core").glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("pkg,allowed", [
    ("policies", ("policies", "plumbing")),
    ("workloads", ("workloads", "plumbing")),
    ("plumbing", ("plumbing",)),
])
def test_package_imports_follow_the_layers(pkg, allowed):
    project = ("sim", "policies", "workloads", "calibrate", "plumbing")
    for f in (ROOT / pkg).rglob("*.py"):
        for mod in _all_imports(f):
            if mod.split(".")[0] in project:
                assert any(mod == a or mod.startswith(a + ".") for a in allowed), f"{f.name} imports {mod}"


@pytest.mark.parametrize("name", CORE)
def test_engine_core_imports_only_the_core(name):
    """sim/core is the bottom layer of sim: it imports only itself (and the policies' base),
    never the scenario plumbing, clusters or experiment tools above it."""
    for mod in _all_imports(ROOT / "sim" / "core" / f"{name}.py"):
        top = mod.split(".")[0]
        assert top not in ("pandas", "matplotlib", "workloads", "calibrate", "ray", "torch"), f"sim/core/{name}.py imports {mod}"
        if top == "sim":
            assert mod.startswith("sim.core"), f"sim/core/{name}.py imports {mod}"
        if top == "policies":
            assert mod == "policies.base", f"sim/core/{name}.py imports {mod}"


def test_import_sim_loads_no_optional_extra():
    code = "import sys, sim, sim.cli; print(sorted(m for m in ('matplotlib', 'ray', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_readme_links_the_architecture_page():
    assert "(docs/architecture.md)" in (ROOT / "README.md").read_text()
    assert (ROOT / "docs" / "architecture.md").is_file()
