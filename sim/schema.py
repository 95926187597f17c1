"""The scenario schema's building blocks: strict frozen models, one-line errors, number checks.

Every table of a scenario file is a pydantic model built from these pieces (:mod:`sim.config`
for the run, the engine, classes and policy; :mod:`sim.tables` for admission, tenants, fairness
and the cluster). A validation failure becomes one line, ``<file>: <key>: <what was expected>
(got <value>)``, by :func:`format_error`.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, model_serializer, model_validator

from plumbing.documents import short
from plumbing.suggest import did_you_mean
from plumbing.numbers import bounds_text, in_range

# (allow_inf_nan: an infinite or NaN number is never a meaningful setting)
STRICT = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class FieldError(ValueError):
    """A validator's complaint about the value where it stands: the message says what was
    expected and the value; the error's location (plus ``key``, a key below it, when given)
    names the key. :func:`format_error` joins the two."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


def format_error(source: str, err: ValidationError, prefix: str = "", model: type[BaseModel] | None = None) -> str:
    """The first error of ``err`` as one line: ``<source>: <key>: <message>``. ``prefix`` is the
    key of the validated value inside the scenario (e.g. ``cluster.groups.0.engine``); ``model``
    the validated model, whose fields an unknown key's "did you mean" is chosen from."""
    key, msg = error_parts(err, prefix, model)
    return f"{source}: {key}: {msg}" if key is not None else f"{source}: {msg}"


def error_parts(err: ValidationError, prefix: str = "", model: type[BaseModel] | None = None) -> tuple[str | None, str]:
    """The key and the message of the first error of ``err`` (:func:`format_error`'s line
    without the file; the key None when the message names it)."""
    e = err.errors()[0]
    loc = ".".join([prefix, *(str(x) for x in e["loc"])] if prefix else [str(x) for x in e["loc"]]) or "(top level)"
    msg = e["msg"]
    if e["type"] == "extra_forbidden":
        where = model_at(model, e["loc"][:-1]) if model is not None and e["loc"] else None
        hint = did_you_mean(e["loc"][-1], where.model_fields) if where is not None else ""
        return loc, f"unknown key (check the spelling; see docs/scenario.md){hint}"
    if e["type"] == "missing":
        return loc, "missing required key"
    if e["type"] == "value_error":
        exc = (e.get("ctx") or {}).get("error")
        if isinstance(exc, FieldError):
            return ".".join(x for x in ([] if loc == "(top level)" else [loc]) + [exc.key or ""] if x), str(exc)
        return None, msg.removeprefix("Value error, ")
    return loc, f"{msg} (got {short(e.get('input'), 200)})"  # (a 5,000-character value: cut)


def nested(model: type[BaseModel], value: Any) -> BaseModel:
    """``model`` validated from ``value``: a table held by a key that may also be something else
    (a preset's name, a number). Its first error is a :class:`FieldError` naming the key inside
    the table, so the line names the real key, the value and what was expected, where pydantic's
    union of the two would report the other branch (``link.str: Input should be a valid
    string``)."""
    if isinstance(value, model):
        return value
    try:
        return model.model_validate(value)
    except ValidationError as err:
        key, msg = error_parts(err, model=model)
        raise FieldError(msg, key=None if key in (None, "(top level)") else key) from None


def model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The model class of the value at ``loc`` (keys and list indexes, as a ValidationError
    gives them) inside ``model``; None when no model is there."""
    node: Any = model
    for part in loc:
        if isinstance(part, int):  # a list's item: the list's model, found at its key
            continue
        field = node.model_fields.get(part) if _is_model(node) else None
        if field is None:
            return None
        node = _inner_model(field.annotation)
    return node if _is_model(node) else None


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _inner_model(tp: Any) -> Any:
    """``tp`` when it is a model, else the first model among its arguments (``X | None``,
    ``list[X]``), else None."""
    if _is_model(tp):
        return tp
    for arg in get_args(tp):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def number(*, integer: bool = False, minimum: float | None = None, note: str = "") -> BeforeValidator:
    """A check that the value is a finite number (``integer``: an int), at least ``minimum``, or
    > 0 without one; booleans are not numbers. The value is kept as written (an int stays an
    int). ``note`` follows the expectation in the message, e.g. ``" (GPUs per replica)"``."""
    bound = {"ge": minimum} if minimum is not None else {"gt": 0}

    def check(v: Any) -> Any:
        if not in_range(v, integer=integer, **bound):
            what = "an integer" if integer else "a number"
            raise FieldError(f"expected {what} {bounds_text(**bound)}{note} (got {v!r})")
        return v

    return BeforeValidator(check)


def one_of(*choices: str | Callable[[], Sequence[str]]) -> BeforeValidator:
    """A check that the value is one of ``choices`` (message: ``expected 'a' or 'b' (got 'x')``,
    with a did-you-mean for a near miss). ``one_of(names)``, with a function, reads the allowed
    values where they live (a registry's names, a table's keys) each time it checks, so they
    are never listed a second time; the reference page reads them through ``check.choices``."""
    def allowed() -> list[str]:
        if len(choices) == 1 and callable(choices[0]):
            return list(choices[0]())
        return [c for c in choices if isinstance(c, str)]

    def check(v: Any) -> Any:
        names = allowed()
        if not isinstance(v, str) or v not in names:
            text = " or ".join(repr(c) for c in names) if len(names) < 3 else \
                ", ".join(repr(c) for c in names[:-1]) + f" or {names[-1]!r}"
            hint = did_you_mean(v, names) if isinstance(v, str) else ""
            raise FieldError(f"expected {text} (got {v!r}){hint}")
        return v

    check.choices = allowed  # type: ignore[attr-defined]
    return BeforeValidator(check)


def checked(test: Callable[[Any], bool], expected: str) -> BeforeValidator:
    """A check ``test(value)``; on failure the message is ``expected <expected> (got <value>)``."""

    def check(v: Any) -> Any:
        if not test(v):
            raise FieldError(f"expected {expected} (got {v!r})")
        return v

    return BeforeValidator(check)


class Table(BaseModel):
    """A scenario table that is a plain TOML table as written: a non-table value or an unknown
    key is a one-line error listing the keys it may have; it serialises to the keys the scenario
    wrote (so ``scenario.json`` shows it as written), and it is true when any was written."""

    model_config = STRICT

    @model_validator(mode="before")
    @classmethod
    def _a_table(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise FieldError(f"expected a table (got {data!r})")
        for k in data:
            if k not in cls.model_fields:
                raise FieldError(f"unknown key (expected one of {', '.join(cls.model_fields)})"
                                 f"{did_you_mean(k, cls.model_fields)}", key=str(k))
        cls.check_keys(data)
        return data

    @classmethod
    def check_keys(cls, data: dict) -> None:
        """A subclass's check of the keys given together, before their values are validated."""

    @model_serializer(mode="wrap")
    def _as_written(self, handler) -> dict:
        return {k: v for k, v in handler(self).items() if k in self.model_fields_set}

    def __bool__(self) -> bool:
        return bool(self.model_fields_set)
