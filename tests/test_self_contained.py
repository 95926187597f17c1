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
    ("policies", ("policies", "plumbing")),    # nothing of sim, calibrate or workloads
    ("workloads", ("workloads", "plumbing")),  # nothing of sim, calibrate or policies
    ("plumbing", ("plumbing",)),               # the leaf: nothing of the project
])
def test_package_imports_follow_the_layers(pkg, allowed):
    project = ("sim", "policies", "workloads", "calibrate", "plumbing")
    for f in (ROOT / pkg).rglob("*.py"):
        for mod in _all_imports(f):
            if mod.split(".")[0] in project:
                assert any(mod == a or mod.startswith(a + ".") for a in allowed), f"{f.name} imports {mod}"


# the priosim commands that measure or compare against real execution: the only place sim/ may
# import calibrate (inside the command, so that `import sim` never loads it or torch)
CALIBRATE_COMMANDS = {"calibrate", "validate", "fidelity", "replay"}


def _function_imports(tree: ast.AST):
    """(enclosing top-level function name or None, imported module) for every import."""
    def walk(node, func):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and func is None:
                yield from walk(child, child.name)
                continue
            if isinstance(child, ast.Import):
                for a in child.names:
                    yield func, a.name
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                yield func, child.module
            yield from walk(child, func)
    yield from walk(tree, None)


def test_sim_imports_calibrate_only_in_the_calibrate_commands():
    for f in sorted((ROOT / "sim").rglob("*.py")):
        for func, mod in _function_imports(ast.parse(f.read_text())):
            if mod.split(".")[0] == "calibrate":
                where = f"{f.relative_to(ROOT)}: {func or 'module level'} imports {mod}"
                assert f == ROOT / "sim" / "cli" / "calibration.py" and func in CALIBRATE_COMMANDS, where


def test_sim_reads_no_file_under_calibrate():
    """No string in sim's code names calibrate's folder (``"calibrate"`` as a path part, or a
    path starting ``calibrate/``); sim owns the profiles and presets it reads."""
    for f in sorted((ROOT / "sim").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                v = node.value
                assert v != "calibrate" and not v.startswith(("calibrate/", "calibrate\\")), \
                    f"{f.relative_to(ROOT)}:{node.lineno}: {v[:60]!r}"


def test_sim_finds_scenarios_through_workloads():
    """sim asks workloads.library for shipped scenarios; no path into workloads' folders in sim."""
    for f in sorted((ROOT / "sim").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                v = node.value  # (a path piece, not prose: docstrings may name the folder)
                assert v not in ("scenarios", "workloads") and not (v.startswith("workloads/") and " " not in v), \
                    f"{f.relative_to(ROOT)}:{node.lineno}: {v[:60]!r}"


def _sys_path_edits(path: Path) -> list[int]:
    """Lines that change ``sys.path`` (a call of its insert/append/extend/..., or an assignment)."""
    def is_sys_path(n):
        return isinstance(n, ast.Attribute) and n.attr == "path" and isinstance(n.value, ast.Name) \
            and n.value.id == "sys"
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_sys_path(node.func.value):
            if node.func.attr in ("insert", "append", "extend", "remove", "pop", "clear"):
                lines.append(node.lineno)
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for t in targets:
            if is_sys_path(t) or (isinstance(t, ast.Subscript) and is_sys_path(t.value)):
                lines.append(node.lineno)
    # code run in a subprocess is a string: look into the strings too
    text = path.read_text()
    for m in re.finditer(r"sys\.path(\.(insert|append|extend)\(|\[[^\]]*\]\s*=|\s*[+]?=)", text):
        lines.append(text[:m.start()].count("\n") + 1)
    return sorted(set(lines))


@pytest.mark.parametrize("folder", ["tests", "scripts", "benchmarks"])
def test_no_sys_path_edits(folder):
    """Tests import their helpers as the ``tests`` package, scripts and benchmarks run as modules
    from the repository root (``python -m scripts.NAME``): none of them edits ``sys.path``."""
    bad = [f"{f.relative_to(ROOT)}:{line}" for f in sorted((ROOT / folder).rglob("*.py"))
           for line in _sys_path_edits(f) if f != Path(__file__)]
    assert not bad, bad


def test_notebooks_import_the_installed_packages():
    """The notebooks import priosim from the install (the README's setup), not by editing sys.path."""
    import json
    bad = [nb.name for nb in sorted((ROOT / "notebooks").glob("*.ipynb"))
           for cell in json.loads(nb.read_text())["cells"]
           if cell["cell_type"] == "code" and "sys.path" in "".join(cell["source"])]
    assert not bad, bad


def test_the_sys_path_check_sees_edits(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("import sys\nsys.path.insert(0, 'a')\nsys.path[:0] = ['b']\nCODE = 'sys.path.append(1)'\n")
    assert _sys_path_edits(f) == [2, 3, 4]


# sim's layers above the core, lowest first: a module may import its own layer and those
# before it in this list, never one after it (docs/architecture.md, "Layers")
SIM_LAYERS = [
    ("core", lambda rel: rel.startswith("sim/core/")),
    ("engines", lambda rel: rel.startswith("sim/engines/")),
    ("models", lambda rel: rel.startswith("sim/models/")),
    ("top", lambda rel: rel.count("/") == 1 and rel not in ("sim/run.py", "sim/__init__.py")),
    ("cluster", lambda rel: rel.startswith("sim/cluster/")),
    ("run", lambda rel: rel in ("sim/run.py", "sim/__init__.py")),
    ("experiments", lambda rel: rel.startswith("sim/experiments/")),
    ("cli", lambda rel: rel.startswith("sim/cli/")),
]


def _sim_layer(rel: str) -> int:
    return next(i for i, (_, inside) in enumerate(SIM_LAYERS) if inside(rel))


def _module_file(mod: str) -> str | None:
    """``sim.a.b`` -> ``sim/a/b.py`` or ``sim/a/b/__init__.py`` (None when neither exists)."""
    base = mod.replace(".", "/")
    for rel in (base + ".py", base + "/__init__.py"):
        if (ROOT / rel).is_file():
            return rel
    return None


def _sim_imports(path: Path) -> set[str]:
    """The sim modules a file imports anywhere; ``from sim import native`` is ``sim.native``."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "sim"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and \
                node.module.split(".")[0] == "sim":
            subs = {f"{node.module}.{a.name}" for a in node.names if _module_file(f"{node.module}.{a.name}")}
            out |= subs or {node.module}
    return out


def test_sim_layers_import_downwards():
    """The experiment tools and the CLI are imported by nothing below them; the cluster does not
    import the driver; the scenario plumbing imports neither (imports inside functions count)."""
    bad = []
    for f in sorted((ROOT / "sim").rglob("*.py")):
        rel = f.relative_to(ROOT).as_posix()
        mine = _sim_layer(rel)
        for mod in _sim_imports(f):
            target = _module_file(mod)
            if target is None:
                continue
            if _sim_layer(target) > mine:
                bad.append(f"{rel} ({SIM_LAYERS[mine][0]}) imports {mod} ({SIM_LAYERS[_sim_layer(target)][0]})")
    assert not bad, "\n".join(bad)


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


def _import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (module -> modules it imports) as a path, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(mod: str) -> list[str] | None:
        state[mod] = 1
        path.append(mod)
        for dep in sorted(graph.get(mod, ())):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep in graph and not state.get(dep) and (found := visit(dep)):
                return found
        path.pop()
        state[mod] = 2
        return None

    return next((c for m in sorted(graph) if not state.get(m) and (c := visit(m))), None)


def test_engine_core_has_no_import_cycle():
    """No module of sim/core imports, directly or through others, one that imports it (imports
    inside functions and under TYPE_CHECKING count): each step module depends on the parts it
    uses, never back on the engine (docs/architecture.md, "Where to add things": the engine's parts)."""
    graph = {}
    for f in sorted((ROOT / "sim" / "core").glob("*.py")):
        rel = f.relative_to(ROOT).as_posix()
        graph[rel] = {t for mod in _sim_imports(f) if (t := _module_file(mod)) and t.startswith("sim/core/")} - {rel}
    cycle = _import_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_the_cycle_check_sees_a_cycle():
    assert _import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _import_cycle({"a": {"b"}, "b": set()}) is None


def test_import_sim_loads_no_optional_extra():
    code = "import sys, sim, sim.cli; print(sorted(m for m in ('matplotlib', 'ray', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_readme_links_the_architecture_page():
    assert "(docs/architecture.md)" in (ROOT / "README.md").read_text()
    assert (ROOT / "docs" / "architecture.md").is_file()
