"""A user's policy code that raised, said in one line (:class:`PolicyCodeError`), and its use of a
shared random generator, warned about.

An exception the user's own code raises while the run goes on (in ``key()``, ``on_finish``, or
reading ``true_output_tokens`` without being an oracle) becomes a :class:`PolicyCodeError`, one
line naming the policy, the hook, the exception and the line of the user's file
(:func:`policy_code_error`, called where a run ends: :func:`sim.run.simulate`, and where a
scenario's policies are checked: :mod:`sim.tables`). Only exceptions raised in the user's file
are: one raised deeper, in priosim or a library, keeps its traceback. Above the engine core,
which imports only the policies' base (the registry is read here).
"""
from __future__ import annotations

from typing import Any

from sim.core.errors import ScenarioError


class PolicyCodeError(ScenarioError):
    """A user's policy raised an exception of its own while the run went on. One line: the
    policy, the hook the engine called, the exception, and where in the user's file."""


def policy_files(sc: Any) -> dict[str, str]:
    """The source file of each user policy scenario ``sc`` runs (its ``[policy]``, a cluster
    group's), file -> the name it was given by; shipped (registered) policies are not users'."""
    names = [sc.policy.name]
    cluster = getattr(sc, "cluster", None)
    for g in (getattr(cluster, "groups", None) or []) if cluster else []:
        if isinstance(getattr(g, "policy", None), dict) and g.policy.get("name"):
            names.append(g.policy["name"])
    return files_of(names)


def files_of(names: list[str]) -> dict[str, str]:
    """:func:`policy_files` of policy names (those that load; registered ones are left out)."""
    import inspect

    from policies import POLICIES

    out: dict[str, str] = {}
    for name in names:
        if name in POLICIES.names():
            continue
        try:
            out.setdefault(_real(inspect.getsourcefile(POLICIES.resolve(name))), name)
        except Exception:  # noqa: BLE001 - (not loadable: the validation said so; nothing to name)
            continue
    return out


def _real(path: str | None) -> str:
    import os
    return os.path.realpath(path) if path else ""


def policy_code_error(exc: BaseException, files: dict[str, str]) -> PolicyCodeError | None:
    """``exc`` as one line when the user's policy code raised it: its innermost frame is in one
    of ``files`` (file -> policy name, :func:`policy_files`), or it is an
    :class:`~sim.core.errors.OracleAccessError` (raised by the request on the policy's read)
    with a frame there. None otherwise: the engine's (or a library's) exception keeps its
    traceback. The line names the policy, the hook (the outermost function of the user's file
    the engine called), the exception and the innermost line of the user's file."""
    from sim.core.errors import OracleAccessError

    if not files or isinstance(exc, ScenarioError):  # (a ScenarioError is one line already)
        return None
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append((_real(tb.tb_frame.f_code.co_filename), tb.tb_lineno, tb.tb_frame.f_code.co_name))
        tb = tb.tb_next
    mine = [f for f in frames if f[0] in files]
    if not mine or (frames[-1][0] not in files and not isinstance(exc, OracleAccessError)):
        return None
    file, line, _ = mine[-1]
    hook = mine[0][2]
    text = " ".join(str(exc).split()) or "(no message)"
    from plumbing.registry import shown_path

    return PolicyCodeError(f"policy '{files[file]}': {hook}() raised {type(exc).__name__}: {text} "
                           f"(at {shown_path(file)}:{line})")


# ---- the shared random generator ------------------------------------------------------------
# module-level functions that draw from (or seed) no shared generator: making your own is fine
_OWN_GENERATORS = {"Random", "SystemRandom", "default_rng", "Generator", "RandomState", "SeedSequence",
                   "BitGenerator", "PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64", "getstate", "setstate"}


def shared_random_call(path: str) -> tuple[int, str] | None:
    """``(line, "random.choice")``: the first call in Python file ``path`` of a module-level
    function of ``random`` or ``numpy.random`` that draws from the module's shared generator
    (which the scenario's seed does not seed, so runs do not repeat); None when there is none,
    when the file seeds that generator itself (``random.seed``/``np.random.seed``: repeatable),
    or when it does not parse. Names bound by ``import``/``from ... import`` are followed;
    anything subtler (a generator passed around, ``getattr``) is not seen."""
    import ast

    try:
        tree = ast.parse(open(path, encoding="utf-8").read(), path)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None
    modules: dict[str, str] = {}  # local name -> "random" | "numpy" | "numpy.random"
    funcs: dict[str, str] = {}  # local name -> "random.choice"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in ("random", "numpy", "numpy.random"):
                    modules[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module in ("random", "numpy", "numpy.random"):
            for a in node.names:
                if node.module == "numpy" and a.name == "random":
                    modules[a.asname or a.name] = "numpy.random"
                elif node.module != "numpy":
                    funcs[a.asname or a.name] = f"{node.module}.{a.name}"
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _called(node.func, modules, funcs)
            if name is not None:
                calls.append((node.lineno, name))
    if any(n.endswith(".seed") for _, n in calls):
        return None
    drawn = sorted((ln, n) for ln, n in calls if n.rsplit(".", 1)[1] not in _OWN_GENERATORS)
    return drawn[0] if drawn else None


def _called(func: Any, modules: dict, funcs: dict) -> str | None:
    """``"random.x"`` / ``"numpy.random.x"`` for a call of ``x`` of those modules, else None."""
    import ast

    if isinstance(func, ast.Name):
        return funcs.get(func.id)
    if not isinstance(func, ast.Attribute):
        return None
    base = func.value
    if isinstance(base, ast.Name) and modules.get(base.id) in ("random", "numpy.random"):
        return f"{modules[base.id]}.{func.attr}"
    if isinstance(base, ast.Attribute) and base.attr == "random" and isinstance(base.value, ast.Name) \
            and modules.get(base.value.id) == "numpy":
        return f"numpy.random.{func.attr}"
    return None


def warn_shared_random(name: str) -> None:
    """Warn once (:func:`plumbing.notices.warn`) when user policy ``name``'s file draws from the
    shared ``random`` (or ``numpy.random``) generator (:func:`shared_random_call`)."""
    from plumbing.notices import warn
    from plumbing.registry import shown_path

    for file, who in files_of([name]).items():
        hit = shared_random_call(file)
        if hit is not None:
            line, call = hit
            warn(f"policy '{who}': {shown_path(file)}:{line} calls {call}(), which draws from the module's shared generator "
                 f"that the scenario's seed does not seed: runs will not repeat (expected draws from a "
                 f"generator seeded in bind(classes, seed), e.g. self.rng = random.Random(seed))")
