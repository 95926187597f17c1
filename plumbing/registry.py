"""An open registry: name -> lazy ``"module:attr"`` or object, with one-line descriptions.

Used for policies, length predictors, workload pieces, trace formats, routers, preemption modes,
waiting rules and engines, so that every pluggable piece is found the same way: by a registered
name, or by a user's dotted path ``pkg.mod:Class``.
Unknown names get a "did you mean" suggestion; registering a name twice is an error.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable


@dataclass(frozen=True)
class Entry:
    name: str
    target: str | Callable[..., Any]
    description: str


class Registry:
    """A named collection of factories (classes or callables)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, target: str | Callable[..., Any], description: str = "") -> None:
        if name in self._entries:
            raise ValueError(f"{self.kind} '{name}' is already registered")
        self._entries[name] = Entry(name, target, description)

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a test that registered a plug-in puts the registry back; KeyError if
        it is not registered)."""
        if name not in self._entries:
            raise KeyError(f"{self.kind} '{name}' is not registered")
        del self._entries[name]

    def names(self, sort: bool = True) -> list[str]:
        """Registered names, sorted (or in the order they were registered)."""
        return sorted(self._entries) if sort else list(self._entries)

    def entries(self) -> list[Entry]:
        return [self._entries[n] for n in self.names()]

    def resolve(self, name: str) -> Callable[..., Any]:
        """Return the factory for ``name`` (a registered name or ``pkg.mod:Attr``)."""
        if name in self._entries:
            target = self._entries[name].target
            return load_dotted(target) if isinstance(target, str) else target
        if ":" in name:
            return load_dotted(name)
        from plumbing.suggest import did_you_mean

        hint = did_you_mean(name, self.names())
        raise KeyError(
            f"unknown {self.kind} '{name}' (expected one of {', '.join(self.names())}, "
            f"or a dotted path 'package.module:Class'){hint}"
        )

    def create(self, name: str, **params: Any) -> Any:
        return self.resolve(name)(**params)

    def create_checked(self, name: str, **params: Any) -> Any:
        """:meth:`create`, with parameter names the factory does not take refused first by one
        line naming them and the ones it takes (:func:`check_param_names`), rather than
        Python's ``__init__() got an unexpected keyword argument``."""
        factory = self.resolve(name)
        check_param_names(name, factory, params)
        return factory(**params)


def check_param_names(name: str, factory: Callable[..., Any], params: dict) -> None:
    """A ValueError ``<name>: unknown parameter 'k' (expected a, b); did you mean 'a'?`` for the
    first key of ``params`` that ``factory``'s signature does not take (nothing is checked for a
    factory that takes ``**kwargs`` or whose signature cannot be read)."""
    import inspect

    from plumbing.suggest import did_you_mean
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return
    ps = sig.parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in ps):
        return
    known = [p.name for p in ps if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for k in params:
        if k not in known:
            raise ValueError(f"{name}: unknown parameter '{k}' (expected "
                             f"{', '.join(known) if known else 'no parameters'}){did_you_mean(k, known)}")


def load_dotted(path: str) -> Any:
    """Import ``"pkg.mod:Attr"`` or ``"path/to/file.py:Attr"`` and return the attribute, with a
    clear error if it is missing.

    A module is looked up on ``sys.path`` and then in the current folder (so a user's own
    ``mypol.py`` works from that folder without setting ``PYTHONPATH``, while installed packages
    keep precedence). A file path (ending in ``.py``; relative to the current folder) is loaded
    from that file, from any folder."""
    module_name, _, attr = path.rpartition(":")
    if not module_name or not attr:
        raise KeyError(f"'{path}' is not of the form 'package.module:Attr' or 'path/to/file.py:Attr'")
    if module_name.endswith(".py"):
        module = _load_file(module_name, path)
    else:
        try:
            module = _import(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and module_name.split(".")[0] == exc.name.split(".")[0]:
                raise KeyError(f"cannot import module '{module_name}' for '{path}': {exc}") from exc
            raise KeyError(f"cannot import module '{module_name}' for '{path}': {_raised_at(exc)}") from exc
        except Exception as exc:  # noqa: BLE001 - the module's own code failed: where, in one line
            raise KeyError(f"cannot import module '{module_name}' for '{path}': {_raised_at(exc)}") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise KeyError(f"module '{module_name}' has no attribute '{attr}' (from '{path}')") from None


def _import(module_name: str) -> Any:
    """``importlib.import_module``, retried with the current folder at the end of ``sys.path``
    (the ``priosim`` console script, unlike ``python -m``, does not put it there)."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        cwd = os.getcwd()
        top = module_name.split(".")[0]
        if exc.name != top or cwd in sys.path or "" in sys.path:
            raise
        sys.path.append(cwd)
        return importlib.import_module(module_name)


def _load_file(file: str, path: str) -> Any:
    """A module from a ``.py`` file, imported once per resolved path (a second lookup returns the
    same module, so classes compare equal)."""
    p = Path(file).expanduser().resolve()
    if not p.is_file():
        raise KeyError(f"no such file '{file}' for '{path}' (a relative path is relative to the "
                       f"current folder, {os.getcwd()})")
    name = f"_priosim_user_{p.stem}_{hashlib.sha1(str(p).encode()).hexdigest()[:10]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, p)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - the file's own code failed: where, in one line
        del sys.modules[name]
        raise KeyError(f"cannot load '{path}': {_raised_at(exc)}") from exc
    except BaseException:
        del sys.modules[name]
        raise
    return module


def shown_path(path: str) -> str:
    """``path`` as a message shows it: relative to the current folder when it is inside it (as
    a user names a file there), else as it is."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def _raised_at(exc: BaseException) -> str:
    """``file:line: Type: message`` of an exception raised while a user's module loaded: a
    SyntaxError where it says, anything else at the innermost frame of the traceback that is
    not Python's import machinery (the module's line, or the line of a module it imports)."""
    text = " ".join(str(exc.msg if isinstance(exc, SyntaxError) else exc).split())
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f"{shown_path(exc.filename)}:{exc.lineno}" if exc.lineno else shown_path(exc.filename)
    else:
        where = ""
        tb = exc.__traceback__
        while tb is not None:
            f = tb.tb_frame.f_code.co_filename
            if not f.startswith("<frozen"):
                where = f"{shown_path(f)}:{tb.tb_lineno}"
            tb = tb.tb_next
    return f"{where + ': ' if where else ''}{type(exc).__name__}: {text}"
