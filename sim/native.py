"""The engine's optional compiled build: its hot modules compiled to C extensions by mypyc.

    pip install -e ".[native]"      # mypy, which carries mypyc (and a C compiler on the machine)
    priosim native build            # compile MODULES in place (about a minute)
    priosim native status           # which build `import sim` uses, and why
    priosim native clean            # back to pure Python

The compiled modules are the same source files, compiled: the results are the same bytes
(``tests/test_native.py`` builds them and compares), only faster (about 2x on the benchmark;
``benchmarks/results.md``). mypyc makes the classes native (fixed attribute layout, runtime type
checks on annotated fields), so a compiled module must be type-clean: ``mypy`` on MODULES passes.

Which build runs is decided once, when ``sim`` is imported (:func:`select`):

* the compiled one when every module in MODULES was compiled from the source that is there now
  (the build records each source's sha256 in ``BUILD_RECORD``);
* pure Python when ``PRIOSIM_PURE_PYTHON=1``, when nothing is compiled, when any source
  changed since the build (the compiled file would run the old code), or when the build is
  broken (its shared library is missing or does not load); one warning says which. The
  compiled modules call each other natively, so it is all or none.

The build lives inside the package: one small extension per module beside its source, and
mypyc's shared library (the code of all of them) as ``sim/_native__mypyc.*.so``, which the
modules import as ``sim._native__mypyc``. So an installed ``priosim`` finds it from any folder.

Each run's summary records the build under ``run.engine_build`` ("mypyc" or "python").
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

#: The modules compiled (relative to the project root): the per-step and per-request paths.
MODULES = ("sim/core/apply.py", "sim/core/binding.py", "sim/core/cohort.py", "sim/core/columns.py",
           "sim/core/costs.py", "sim/core/engine.py", "sim/core/fastforward.py", "sim/core/kvpool.py",
           "sim/core/limits.py", "sim/core/loop.py", "sim/core/observe.py", "sim/core/parts.py", "sim/core/plan.py",
           "sim/core/planner.py", "sim/core/preemption.py", "sim/core/prefix_cache.py", "sim/core/queues.py",
           "sim/core/request.py", "sim/core/reserve.py", "sim/core/simpy_adapter.py", "sim/core/source.py", "sim/core/speculation.py",
           "sim/core/stepper.py", "sim/core/telemetry.py", "sim/cluster/replicas.py", "sim/cluster/disagg.py",
           "sim/link.py")

ROOT = Path(__file__).resolve().parent.parent  # (this module itself is never compiled)
BUILD_RECORD = ROOT / "sim" / "native_build.json"  # module -> sha256 of the source compiled
PURE_ENV = "PRIOSIM_PURE_PYTHON"
#: mypyc's group name: its shared library is then the package module ``sim._native__mypyc``
#: (mypyc's default name is a hash at the top level, importable only from the project root).
GROUP = "sim._native"
SHARED_LIB = GROUP + "__mypyc"

#: What ``python -m mypyc MODULES`` runs (build/setup.py, build_ext --inplace), with GROUP.
SETUP = """from setuptools import setup
from mypyc.build import mypycify
setup(name="priosim_native", ext_modules=mypycify(["--config-file", {config!r}, *{modules!r}], group_name={group!r},
                                                  opt_level={opt_level!r}, debug_level="1"))
"""

#: mypy's settings for the build (build/mypy.ini): packages the compiled modules reach only through
#: imports of modules that are not compiled (the cluster's Ray executor, plots, progress, reports)
#: are not analysed, for types mypyc does not use: ray's own annotations would take minutes, and
#: IPython, matplotlib, rich and pydantic (with what they import: 700 modules) two thirds of mypy's time
MYPY_INI = """[mypy]

[mypy-ray,ray.*,torch,torch.*,optuna,optuna.*,IPython,IPython.*,matplotlib,matplotlib.*,rich,rich.*,pydantic,pydantic.*]
follow_imports = skip
"""

BUILD = "python"  # set by select(): "mypyc" or "python"


def _module_name(rel: str) -> str:
    return rel[:-3].replace("/", ".")


def _compiled_file(rel: str) -> Path | None:
    src = ROOT / rel
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        p = src.with_suffix(suffix)
        if p.exists():
            return p
    return None


def _shared_lib() -> Path | None:
    """mypyc's shared library in the package (``sim/_native__mypyc.<abi>.so``), if built."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        p = ROOT / "sim" / f"{SHARED_LIB.split('.')[-1]}{suffix}"
        if p.exists():
            return p
    return None


def _sha256(rel: str) -> str:
    return hashlib.sha256((ROOT / rel).read_bytes()).hexdigest()


def status() -> dict[str, str]:
    """Per module: "compiled", "missing" (no compiled file), "stale" (source changed since) or
    "broken" (compiled, but mypyc's shared library is not in the package, e.g. a build made
    before it was kept there)."""
    try:
        built = json.loads(BUILD_RECORD.read_text())
    except (OSError, ValueError):
        built = {}
    lib = _shared_lib()
    out = {}
    for rel in MODULES:
        if _compiled_file(rel) is None:
            out[rel] = "missing"
        elif built.get(rel) != _sha256(rel):
            out[rel] = "stale"
        else:
            out[rel] = "compiled" if lib is not None else "broken"
    return out


def pure_forced() -> bool:
    """Did the user choose pure Python (``PRIOSIM_PURE_PYTHON=1``)?"""
    return os.environ.get(PURE_ENV, "") == "1"


def _use_compiled(st: dict[str, str]) -> bool:
    return all(s == "compiled" for s in st.values()) and not pure_forced()


class _SourceFirst:
    """A meta-path finder that loads MODULES from their .py sources even where a compiled file
    sits beside them (the import system would otherwise prefer the extension)."""

    def __init__(self) -> None:
        self.paths = {_module_name(rel): str(ROOT / rel) for rel in MODULES}

    def find_spec(self, name, path=None, target=None):
        src = self.paths.get(name)
        return importlib.util.spec_from_file_location(name, src) if src else None


def _load_error() -> str | None:
    """Load mypyc's shared library (the code of every compiled module); why not, or None."""
    try:
        importlib.import_module(SHARED_LIB)
    except Exception as e:  # (an ImportError, or whatever a damaged library raises)
        return f"{type(e).__name__}: {e}"
    return None


def _problem(st: dict[str, str]) -> str | None:
    """Why a compiled build that is there cannot run (one line), or None."""
    stale = [m for m, s in st.items() if s == "stale"]
    if stale:
        return f"{', '.join(stale)} changed since the compiled build"
    if any(s == "broken" for s in st.values()):
        return f"the compiled build's shared library ({SHARED_LIB}) is missing"
    if all(s == "compiled" for s in st.values()):
        err = _load_error()
        return f"the compiled build does not load ({err})" if err else None
    return None if all(s == "missing" for s in st.values()) else "the compiled build is incomplete"


def select() -> str:
    """Decide which build ``import sim`` uses (see module docstring); returns its name."""
    global BUILD
    st = status()
    problem = None if pure_forced() else _problem(st)
    if _use_compiled(st) and problem is None:
        BUILD = "mypyc"
        return BUILD
    if problem:
        warnings.warn(f"priosim: {problem}; running pure Python "
                      f"(rebuild: `priosim native build`; remove it: `priosim native clean`)",
                      RuntimeWarning, stacklevel=3)
    if any(s != "missing" for s in st.values()) and not any(isinstance(f, _SourceFirst) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceFirst())
    BUILD = "python"
    return BUILD


def build(opt_level: str = "3") -> None:
    """Compile MODULES in place with mypyc (needs mypy and a C compiler), then record the
    sources compiled. ``opt_level`` is the C compiler's (mypyc's ``opt_level``): "3" for speed;
    "1" (the tests) or "0" spare the C compiler most or all of its optimiser (code that computes
    the same, slower)."""
    if importlib.util.find_spec("mypyc") is None:
        raise RuntimeError('mypyc is not installed: pip install -e ".[native]" (it comes with mypy)')
    clean()
    record = {rel: _sha256(rel) for rel in MODULES}  # (before compiling: an edit during it is stale)
    setup = ROOT / "build" / "setup.py"
    setup.parent.mkdir(exist_ok=True)
    config = setup.parent / "mypy.ini"
    config.write_text(MYPY_INI)
    setup.write_text(SETUP.format(modules=list(MODULES), group=GROUP, opt_level=opt_level,
                                  config=str(config.relative_to(ROOT))))
    mypyc_home = Path(importlib.util.find_spec("mypyc").origin).parent.parent  # type: ignore[arg-type,union-attr]
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(mypyc_home), os.environ.get("PYTHONPATH", "")])}
    # (--force: mypyc leaves a C file it would write the same untouched, and setuptools then keeps
    # its object file, compiled at whatever level the last build asked for)
    done = subprocess.run([sys.executable, str(setup.relative_to(ROOT)), "build_ext", "--inplace", "--force"],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode:  # (its compiler lines are long: only the end says what went wrong)
        raise RuntimeError(f"mypyc failed (exit {done.returncode}); nothing compiled is in place. "
                           f"Its last messages:\n{(done.stdout + done.stderr)[-3000:]}")
    BUILD_RECORD.write_text(json.dumps(record, indent=1) + "\n")


def clean() -> None:
    """Remove the compiled files (MODULES', mypyc's shared library, and the build record)."""
    for rel in MODULES:
        so = _compiled_file(rel)
        if so is not None:
            so.unlink()
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:  # (an older build left it at the root)
        for p in (*ROOT.glob(f"*__mypyc{suffix}"), *(ROOT / "sim").glob(f"*__mypyc{suffix}")):
            p.unlink()
    BUILD_RECORD.unlink(missing_ok=True)


def describe() -> str:
    """Lines for ``priosim native status``."""
    st = status()
    lines = [f"{rel:20s} {s}" for rel, s in st.items()]
    lib = _shared_lib()
    lines.append(f"{'shared library':20s} {lib.relative_to(ROOT) if lib else 'missing'}")
    problem = None if pure_forced() else _problem(st)
    if _use_compiled(st) and problem is None:
        lines.append("import sim uses: mypyc")
    else:
        why = f"{PURE_ENV}=1" if pure_forced() else problem or "not built"
        lines.append(f"import sim uses: python ({why})")
    return "\n".join(lines)
