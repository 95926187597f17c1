"""Write the generated reference pages of the documentation site from the code itself.

    python -m scripts.reference docs/reference          # rewrite the pages
    python -m scripts.reference docs/reference --check  # exit 1 if any page is not current

Three pages, never edited by hand (each carries the stamp of :mod:`scripts.stamp`):

* ``scenario-keys.md``: every scenario key, walked from the pydantic models' ``model_fields``
  (``sim.config.Scenario`` and the tables of ``sim.tables`` it nests), with its type, unit,
  default and description;
* ``cli.md``: every ``priosim`` command and option, walked from the click group ``sim.cli.main``;
* ``api.md``: the Python API, as mkdocstrings directives (``::: sim.simulate``) for every name in
  the public ``__all__`` of ``sim`` and ``policies`` (mkdocs renders their docstrings).

The output depends only on the code (no dates, no machine): the same tree writes the same bytes,
which is what the test that the pages are current compares.
"""
from __future__ import annotations

import argparse
import sys
import types
import typing
from pathlib import Path
from typing import Any, Iterator

import click
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from scripts.stamp import generated

COMMAND = "python -m scripts.reference docs/reference"

# A key's unit, read from its name's suffix (the descriptions say it too; this is the column).
SUFFIX_UNITS = [("_ns", "ns"), ("_s", "s"), ("_rps", "requests/s"), ("_tps", "tokens/s"), ("_blocks", "KV blocks"),
                ("_tokens", "tokens"), ("_tokens_per_step", "tokens per step"), ("_fraction", "fraction"),
                ("_utilization", "fraction")]
# Keys whose name does not say their unit.
UNITS = {"engine.block_size": "tokens", "engine.max_batched_tokens": "tokens per step",
         "engine.max_prefill_chunk": "tokens", "engine.prefix_block_tokens": "tokens", "engine.watermark": "fraction",
         "engine.max_num_seqs": "requests", "engine.max_events": "events", "engine.thrash_threshold": "fraction",
         "engine.speculative.k": "tokens per step", "engine.speculative.acceptance": "probability",
         "horizon_s": "s", "admission.memory_budget": "fraction of KV blocks",
         "admission.class_concurrency": "requests", "tenants[].max_concurrency": "requests",
         "fairness.window_s": "s", "cluster.replicas": "replicas", "cluster.groups[].replicas": "replicas",
         "cluster.groups[].gpus": "GPUs per replica"}
# Tables whose keys another page documents (their contents are validated elsewhere).
ELSEWHERE = {"streams": "[workloads](../workloads.md) (arrival processes, length models, traces)",
             "policy": "[policies](../policies.md): `name` plus the policy's own parameters",
             "tune": "[tune](../tune.md): what `priosim tune` searches when the command line gives no `--space`"}


# ---- scenario keys --------------------------------------------------------------------------------
def _models_in(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """The pydantic model an annotation holds (directly, in ``X | None`` or in ``list[X]``) and
    whether it is a list of them."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _models_in(typing.get_args(annotation)[0])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    if origin in (list, tuple):
        inner, _ = _models_in(typing.get_args(annotation)[0])
        return inner, inner is not None
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            model, many = _models_in(arg)
            if model is not None:
                return model, many
    return None, False


def _choices(metadata: Any) -> str:
    """The values a check names (``sim.schema.one_of``: a registry's names, a table's keys), as
    a Literal's are shown; "" when no check names them."""
    for meta in metadata:
        choices = getattr(getattr(meta, "func", None), "choices", None)
        if choices is not None:
            return " / ".join(f'"{a}"' for a in choices())
    return ""


def type_name(annotation: Any) -> str:
    """A TOML reader's name for a Python annotation: integer, number, string, table, ..."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _choices(annotation.__metadata__) or type_name(typing.get_args(annotation)[0])
    if origin is typing.Literal:
        return " / ".join(f'"{a}"' if isinstance(a, str) else str(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        names = [type_name(a) for a in typing.get_args(annotation) if a is not type(None)]
        out = " or ".join(dict.fromkeys(names))
        return out.replace("integer or number", "number")
    if origin in (list, tuple):
        return f"list of {type_name(typing.get_args(annotation)[0])}" if typing.get_args(annotation) else "list"
    if origin is dict or annotation is dict:
        return "table"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "table"
    return {bool: "boolean", int: "integer", float: "number", str: "string", set: "list"}.get(annotation, str(annotation))


def default_text(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default
    if value is None:
        return "absent"
    if isinstance(value, BaseModel):
        return "(table)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if value in ({}, []):
        return "empty"
    return repr(value)


def unit_of(key: str) -> str:
    if key in UNITS:
        return UNITS[key]
    leaf = key.rsplit(".", 1)[-1]
    for suffix, unit in sorted(SUFFIX_UNITS, key=lambda su: -len(su[0])):
        if leaf.endswith(suffix):
            return unit
    return ""


def scenario_keys(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, FieldInfo, type[BaseModel]]]:
    """(dotted key, field, model it belongs to) for every user-facing key, depth first; a list
    of tables is ``name[]``. Fields excluded from the resolved scenario without a description
    are bookkeeping (where the file came from), not keys."""
    for name, field in model.model_fields.items():
        if field.exclude and not field.description and name not in ELSEWHERE:
            continue
        key = f"{prefix}{name}"
        inner, many = _models_in(field.annotation)
        yield key, field, model
        if inner is not None and key not in ELSEWHERE:
            yield from scenario_keys(inner, f"{key}[]." if many else f"{key}.")


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def scenario_page() -> str:
    from sim.config import Scenario

    rows: dict[str, list[str]] = {}
    for key, field, model in scenario_keys(Scenario):
        section = key.split(".")[0].removesuffix("[]")
        meaning = field.description or ""
        if key in ELSEWHERE:
            meaning = (meaning + "; " if meaning else "") + "keys: " + ELSEWHERE[key]
        rows.setdefault(section, []).append(
            f"| `{key}` | {_cell(_choices(field.metadata) or type_name(field.annotation))} | {unit_of(key)} | {_cell(default_text(field))} "
            f"| {_cell(meaning)} |")
    out = ["# Scenario keys", "", generated(COMMAND), "",
           "Every key a scenario file (TOML) or `--set KEY=VALUE` may give, read from the pydantic schema "
           "(`sim/config.py`, `sim/tables.py`). `name[]` is a list of tables (`[[classes]]`): in `--set`, "
           "`classes.0.priority=1` or `classes.batch.priority=1`. How to write a scenario: "
           "[scenario files](../scenario.md).", ""]
    top = [r for s, rs in rows.items() for r in rs if "." not in r.split("`")[1]]
    out += ["## Top level", "", "| key | type | unit | default | meaning |", "|---|---|---|---|---|", *top, ""]
    for section, rs in rows.items():
        nested = [r for r in rs if "." in r.split("`")[1]]
        if nested:
            out += [f"## `{section}`", "", "| key | type | unit | default | meaning |", "|---|---|---|---|---|",
                    *nested, ""]
    return "\n".join(out)


# ---- CLI ------------------------------------------------------------------------------------------
def commands(group: click.Command, path: tuple[str, ...] = ("priosim",)) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    yield path, group
    if isinstance(group, click.Group):
        for name in sorted(group.commands):
            yield from commands(group.commands[name], (*path, name))


_UNSET = getattr(click.core, "UNSET", None)  # (click 8.2+: an option given no default)


def option_default(p: click.Parameter) -> str:
    if p.default is _UNSET or callable(p.default) or p.default is None or p.default == () or getattr(p, "is_flag", False) and not p.default:
        return ""
    if isinstance(p.default, bool):
        return "on"
    return f"`{p.default}`"


def option_type(p: click.Parameter) -> str:
    if getattr(p, "is_flag", False):
        return "flag"
    if isinstance(p.type, click.Choice):
        return " / ".join(f"`{c}`" for c in p.type.choices)
    meta = getattr(p, "metavar", None)
    return f"`{meta}`" if meta else p.type.name.lower()


def cli_page() -> str:
    from sim.cli import main

    out = ["# Command line", "", generated(COMMAND), "",
           "Every `priosim` command and option, read from the click commands (`sim/cli/`); "
           "`priosim COMMAND --help` prints the same. Exit statuses and the one-line errors: "
           "[errors](../errors.md).", ""]
    for path, cmd in commands(main):
        ctx = click.Context(cmd, info_name=" ".join(path))
        name = " ".join(path)
        out += [f"## `{name}`", "", "```text", cmd.get_usage(ctx).replace("Usage: ", ""), "```", ""]
        if cmd.help:
            out += [" ".join(line.strip() for line in cmd.help.strip().split("\n\n")[0].splitlines()), ""]
        args = [p for p in cmd.params if isinstance(p, click.Argument)]
        opts = [p for p in cmd.params if isinstance(p, click.Option) and not p.hidden]
        if args:
            out += ["Arguments: " + ", ".join(f"`{p.human_readable_name}`" + ("" if p.required else " (optional)")
                                              for p in args) + ".", ""]
        if opts:
            out += ["| option | takes | default | meaning |", "|---|---|---|---|"]
            for p in opts:
                flags = ", ".join(f"`{o}`" for o in [*p.opts, *p.secondary_opts])
                out.append(f"| {flags} | {option_type(p)} | {option_default(p)} | {_cell(p.help or '')} |")
            out.append("")
    return "\n".join(out)


# ---- Python API -----------------------------------------------------------------------------------
API_MODULES = ["sim", "policies"]


def api_page() -> str:
    import importlib

    out = ["# Python API", "", generated(COMMAND), "",
           "The names `sim` and `policies` export (their `__all__`), rendered from the docstrings. "
           "The five-line start:", "",
           "```python", "from sim import load_scenario, simulate",
           'res = simulate(load_scenario("chat_vs_batch", overrides=["engine.max_num_seqs=64"]))',
           "res.summary          # per-class DataFrame", "res.requests         # one row per request",
           'res.save("results/what-if")', "```", ""]
    for mod_name in API_MODULES:
        mod = importlib.import_module(mod_name)
        out += [f"## `{mod_name}`", ""]
        for name in mod.__all__:
            obj = getattr(mod, name)
            home = getattr(obj, "__module__", None)
            if not callable(obj) or home is None:  # (a registry instance: documented with its class)
                continue
            out += [f"### `{mod_name}.{name}`", "", f"::: {home}.{obj.__qualname__}", "    options:",
                    "      show_root_heading: false", "      heading_level: 4", ""]
    return "\n".join(out)


PAGES = {"scenario-keys.md": scenario_page, "cli.md": cli_page, "api.md": api_page}


def pages() -> dict[str, str]:
    """File name -> text of every generated page."""
    return {name: make().rstrip("\n") + "\n" for name, make in PAGES.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scripts.reference", description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="folder of the reference pages (docs/reference)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page differs")
    args = ap.parse_args(argv)
    stale = []
    for name, text in pages().items():
        path = args.out / name
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(str(path))
            continue
        args.out.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"not current: {', '.join(stale)} (run {COMMAND})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
