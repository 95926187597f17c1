"""An open registry: name -> lazy ``"module:attr"`` or object, with one-line descriptions.

Used for policies, length predictors, workload pieces and routers, so that every pluggable piece
is found the same way: by a registered name, or by a user's dotted path ``pkg.mod:Class``.
Unknown names get a "did you mean" suggestion; registering a name twice is an error.
"""
from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass
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

    def names(self) -> list[str]:
        return sorted(self._entries)

    def entries(self) -> list[Entry]:
        return [self._entries[n] for n in self.names()]

    def resolve(self, name: str) -> Callable[..., Any]:
        """Return the factory for ``name`` (a registered name or ``pkg.mod:Attr``)."""
        if name in self._entries:
            target = self._entries[name].target
            return load_dotted(target) if isinstance(target, str) else target
        if ":" in name:
            return load_dotted(name)
        close = difflib.get_close_matches(name, self.names(), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise KeyError(
            f"unknown {self.kind} '{name}' (expected one of {', '.join(self.names())}, "
            f"or a dotted path 'package.module:Class'){hint}"
        )

    def create(self, name: str, **params: Any) -> Any:
        return self.resolve(name)(**params)


def load_dotted(path: str) -> Any:
    """Import ``"pkg.mod:Attr"`` and return the attribute, with a clear error if it is missing."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise KeyError(f"'{path}' is not of the form 'package.module:Attr'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise KeyError(f"cannot import module '{module_name}' for '{path}': {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise KeyError(f"module '{module_name}' has no attribute '{attr}' (from '{path}')") from None
