"""Reading the TOML and JSON a user gives (scenario files, ``--set`` values, grid files,
profiles) so that every way the text can be wrong is a :class:`DocumentError` (a ValueError)
whose message says what was expected, never another exception.

Python's own parsers fail in other ways on hostile but short text: nesting a few hundred levels
deep exhausts the interpreter's stack (``RecursionError``), and an integer of more than 4300
digits is refused with a ValueError that suggests changing an interpreter setting. No input of
priosim nests more than a handful of levels, so documents deeper than :data:`MAX_DEPTH` are
refused as well: the code that reads them (copies, validation, JSON output) recurses too.
Callers add the file or key to the message.
"""
from __future__ import annotations

import codecs
import itertools
import json
import re
import tomllib
from pathlib import Path
from typing import Any, Iterable

#: Levels of tables and arrays a document may nest (a scenario nests about 5).
MAX_DEPTH = 32


class DocumentError(ValueError):
    """The text is not a document priosim reads; the message says why (no file name)."""


def read_text(path: str | Path) -> str:
    """A file's text, decoded as UTF-8 (what every text input of priosim is). Bytes that are not
    UTF-8 raise :class:`DocumentError` naming the first bad byte (:func:`utf8_error`); a missing
    or unreadable file raises the ``OSError`` as ``Path.read_text`` does."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise DocumentError(utf8_error([data]) or "not UTF-8") from None


def utf8_error(chunks: Iterable[bytes]) -> str | None:
    """Why a stream of byte ``chunks`` (a file, in pieces) is not UTF-8, for a message: the
    first bad byte's offset from the start (0-based), its line and its value; None when all of
    it is UTF-8. A parser that reports the position in its own buffer (pandas) is not enough: the
    file is read again with this."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    done = lines = 0  # bytes and newlines before this chunk
    for chunk, final in itertools.chain(((c, False) for c in chunks), [(b"", True)]):
        try:
            decoder.decode(chunk, final=final)
        except UnicodeDecodeError as exc:
            # (exc.object is the bytes of an unfinished character held back from the chunk before,
            # then this chunk: never a newline among the held ones)
            held = len(exc.object) - len(chunk)
            bad = bytes(exc.object[exc.start:exc.end]).hex()
            line = lines + exc.object.count(b"\n", 0, exc.start) + 1
            return (f"not UTF-8 at byte {done - held + exc.start:,} (line {line}: 0x{bad}, {exc.reason}; "
                    f"expected UTF-8 text)")
        done += len(chunk)
        lines += chunk.count(b"\n")
    return None


def loads_toml(text: str) -> dict:
    """``tomllib.loads(text)``; a syntax error stays a ``tomllib.TOMLDecodeError`` (its line and
    column in the message), anything else wrong is a :class:`DocumentError`."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        raise
    except RecursionError:
        raise DocumentError(_too_deep()) from None
    except ValueError as exc:  # (an integer of more than 4300 digits)
        raise DocumentError(_too_long(exc)) from None
    check_depth(data)
    return data


def loads_json(text: str) -> Any:
    """``json.loads(text)``; a syntax error stays a ``json.JSONDecodeError``, anything else
    wrong is a :class:`DocumentError`."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise DocumentError(_too_deep()) from None
    except ValueError as exc:
        raise DocumentError(_too_long(exc)) from None
    check_depth(data)
    return data


def check_depth(data: Any, limit: int = MAX_DEPTH) -> None:
    """Raise :class:`DocumentError` when ``data`` nests dicts and lists more than ``limit``
    levels deep (walked without recursion, so any depth is measured)."""
    stack = [(data, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, (list, tuple)):
            children = node
        else:
            continue
        depth += 1
        if depth > limit:
            raise DocumentError(_too_deep(limit))
        stack.extend((c, depth) for c in children if isinstance(c, (dict, list, tuple)))


def short(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to about ``limit`` characters (a message stays one readable line)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def _too_deep(limit: int = MAX_DEPTH) -> str:
    return f"tables or arrays nested too deeply (expected at most {limit} levels)"


def _too_long(exc: ValueError) -> str:
    digits = re.search(r"value has (\d+) digits", str(exc))
    if digits:
        return f"an integer of {int(digits.group(1)):,} digits (expected at most 4300 digits)"
    return f"not readable ({exc})"
