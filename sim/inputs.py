"""The files a scenario reads beyond itself, by content: a result kept from an earlier command is
reused only while they are unchanged.

A scenario dict names other files: a policy's ``file.py:Class`` (or ``pkg.mod:Class``, a module
of the user's), trace files (``[[streams]]`` ``path``), a model's ``config.json``
(``engine.model``), a profile JSON (``engine.profile``, a draft profile, a group's profile), a
trace format's or router's module. The scenario's own text names them, not what they hold: edit
the policy's ``key()`` and the scenario is the same. :func:`input_files` finds every file the
scenario names, by the rules the readers use (a path relative to the current folder or to the
scenario's folder; a module found as ``import`` finds it), and gives each one's sha256, so that a
sweep's run, a tune's study and a capacity probe are keyed by what was read.

It errs on the side of more files: a string that happens to name a file is hashed too, which can
only make a result run again, never reuse a stale one.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# ``pkg.mod:Attr`` (a dotted module path and an attribute); ``bundled:name.jsonl`` is not one
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")
_MAX_PATH = 4096  # (longer strings are text, not paths: no lookup)


def input_files(data: Mapping[str, Any], base_dir: str | Path | None, memo: dict | None = None) -> dict[str, str]:
    """Absolute path -> sha256 (hex) of every file scenario dict ``data`` names (see the module
    docstring), sorted by path. ``base_dir``: the scenario's folder (relative paths in it are
    read from there, or from the current folder). ``memo``: path -> sha256 already computed by
    this caller (several specs of one sweep name the same trace: it is read once)."""
    memo = {} if memo is None else memo
    found: set[Path] = set()
    for s in _strings(data):
        found.update(_named_files(s, base_dir))
    out = {}
    for p in sorted(found):
        key = str(p)
        if key not in memo:
            memo[key] = file_sha256(p)
        if memo[key] is not None:
            out[key] = memo[key]
    return out


def file_sha256(path: str | Path) -> str | None:
    """sha256 (hex) of the file's bytes, read in chunks (a trace may be large); None when it
    cannot be read (the run that reads it reports why)."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


def changed_files(old: Mapping[str, str] | None, new: Mapping[str, str]) -> list[str]:
    """The files of ``new`` that ``old`` recorded with other contents (a file ``old`` did not
    record is not said to have changed: nothing is known of it)."""
    if not old:
        return []
    return [p for p, h in new.items() if p in old and old[p] != h]


def _strings(node: Any):
    """Every string in a nested dict/list, values only (keys name settings, not files)."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, Mapping):
        for v in node.values():
            yield from _strings(v)
    elif isinstance(node, (list, tuple)):
        for v in node:
            yield from _strings(v)


def _named_files(s: str, base_dir: str | Path | None) -> list[Path]:
    """The existing files string ``s`` may name: ``file.py:Attr`` (relative to the current
    folder, as the registries load it), a module of ``pkg.mod:Attr``, or a path relative to the
    current folder or to ``base_dir``."""
    if not s or len(s) > _MAX_PATH or "\0" in s:
        return []
    left, sep, _ = s.rpartition(":")
    if sep and left.endswith(".py"):
        return _existing([Path(left).expanduser()])
    if _DOTTED.fullmatch(s):
        return _module_file(left)
    cands = [Path(s).expanduser()]
    if base_dir is not None and not cands[0].is_absolute():
        cands.append(Path(base_dir) / s)
    return _existing(cands)


def _existing(paths: list[Path]) -> list[Path]:
    out = []
    for p in paths:
        try:
            if p.is_file():
                out.append(p.resolve())
        except (OSError, ValueError):  # (a name too long for the file system, ...)
            pass
    return out


def _module_file(module: str) -> list[Path]:
    """The source file of module ``module`` as ``import`` would find it (then the current
    folder, as :func:`plumbing.registry.load_dotted` looks there too); none for a built-in
    module or one that is not found (the run says so)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError, AttributeError):
        spec = None
    if spec is not None and spec.origin and spec.has_location:
        return _existing([Path(spec.origin)])
    here = Path(os.getcwd()) / (module.replace(".", os.sep) + ".py")
    return _existing([here])
