"""``mypyc_attr``: the compiled build's per-class options (mypyc reads them when it compiles the
engine, :mod:`sim.native`), and a decorator that does nothing where mypy is not installed (pure
Python, where the options mean nothing)."""
from __future__ import annotations

try:  # (mypy_extensions comes with mypy, which carries the compiler)
    from mypy_extensions import mypyc_attr
except ImportError:
    def mypyc_attr(*attrs: str, **kwattrs: object):  # type: ignore[misc]
        return lambda cls: cls

__all__ = ["mypyc_attr"]
