"""Small JSON state files read strictly: a damaged or misshapen file is an error that names the
file, what is wrong with it and the fix, never a silent reset or a stray AttributeError.

Each file's shape is a dataclass; ``from_json`` builds it from parsed JSON by the fields' types
(int, str, bool, float, enums by value, lists, tuples, dicts keyed by str or int, nested
dataclasses), naming the
key path of the first value that does not fit. A field's JSON key may differ from its name
(``metadata={"key": ...}``, for RocketMQ's camelCase); keys the dataclass does not know are
ignored, so a file written by a newer version with an extra key still loads.

``load`` reads a file written by ``atomic_file.write_atomic``: the newest version, else its
``.bak`` (logged), else a StateFileError. ``move_aside`` is what an explicit reset does with a
bad file: renamed to ``<name>.corrupt-<UTC time>``, never deleted.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import logging
import os
import time
import types
import typing
from typing import Any, TypeVar

from tidemq.storage.clock import now_ms
from tidemq.storage.errors import StoreError

log = logging.getLogger(__name__)

T = TypeVar("T")


class StateFileError(StoreError):
    """A state file (and its backup) is unreadable or has the wrong shape. The message is one
    line: the file, what is wrong, and how to fix it."""

    code = "CORRUPT_STATE_FILE"
    retriable = False

    def __init__(self, path: str, problem: str, fix: str = "") -> None:
        self.path = path
        self.problem = problem
        self.fix = fix
        super().__init__(f"{path}: {problem}" + (f"; fix: {fix}" if fix else ""))


class ShapeError(ValueError):
    """A value that does not fit the file's shape; ``where`` is its key path."""

    def __init__(self, where: str, expected: str, got: object) -> None:
        self.where = where or "the top level"
        shown = json.dumps(got) if not isinstance(got, dict | list) else type(got).__name__
        if len(shown) > 40:
            shown = shown[:37] + "..."
        super().__init__(f"{self.where}: expected {expected}, got {shown}")


def parse_json(data: bytes) -> Any:
    """The JSON document, or ValueError saying where parsing stopped (line and column)."""
    if not data.strip():
        raise ValueError("empty file")
    try:
        return json.loads(data)
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 text (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None


def _child(where: str, key: object) -> str:
    return f"{where}[{key!r}]" if where else repr(key)


def from_json(cls: type[T], value: Any, where: str = "") -> T:
    """``cls`` (a dataclass) built from a parsed JSON object; ShapeError on the first misfit."""
    return typing.cast(T, _convert(cls, value, where))


def _convert(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _dataclass(tp, value, where)
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            if arg is type(None) and value is None:
                return None
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value, where)
    if tp is bool:
        if not isinstance(value, bool):
            raise ShapeError(where, "true or false", value)
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ShapeError(where, "an integer", value)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ShapeError(where, "a number", value)
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ShapeError(where, "a string", value)
        return value
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if isinstance(value, tp):
            return value
        try:
            return tp(value)
        except ValueError:
            names = ", ".join(str(m.value) for m in tp)
            raise ShapeError(where, f"one of {names}", value) from None
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ShapeError(where, "a list", value)
        item = args[0] if args else Any
        items = [_convert(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise ShapeError(where, "an object", value)
        key_tp, value_tp = args or (str, Any)
        out = {}
        for k, v in value.items():
            here = _child(where, k)
            if key_tp is int:
                try:
                    key: Any = int(k)
                except ValueError:
                    raise ShapeError(here, "an integer key", k) from None
            else:
                key = k
            out[key] = _convert(value_tp, v, here)
        return out
    return value  # a type the schema does not know: the dataclass's own checks judge it


@functools.cache
def _schema(cls: type) -> tuple[tuple[str, str, Any, bool], ...]:
    """(field name, JSON key, type, required) of each init field: resolving the type hints
    costs about 0.1 ms, paid once per class rather than once per object loaded."""
    hints = typing.get_type_hints(cls)
    return tuple(
        (
            f.name,
            f.metadata.get("key", f.name),
            hints[f.name],
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
        )
        for f in dataclasses.fields(cls)
        if f.init
    )


def _dataclass(cls: type, value: Any, where: str) -> Any:
    if not isinstance(value, dict):
        raise ShapeError(where, f"an object ({cls.__name__})", value)
    kwargs = {}
    for name, key, tp, required in _schema(cls):
        if key not in value:
            if required:
                raise ShapeError(_child(where, key), "a value (the key is missing)", None)
            continue
        kwargs[name] = _convert(tp, value[key], _child(where, key))
    return cls(**kwargs)


def _problem(path: str, cls: type, data: bytes) -> tuple[Any, str]:
    try:
        return from_json(cls, parse_json(data)), ""
    except ShapeError as e:
        return None, f"wrong shape: {e}"
    except ValueError as e:  # parse_json, or a dataclass's own check in __post_init__
        return None, str(e)


def load(path: str, cls: type[T], fix: str) -> T | None:
    """The file's content as ``cls``; its ``.bak`` when the newest is damaged (logged); None
    when neither exists. Raises StateFileError (naming ``fix``) when what exists is damaged."""
    problems = []
    for candidate in (path, f"{path}.bak"):
        try:
            with open(candidate, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            problems.append((candidate, ""))
            continue
        parsed, problem = _problem(candidate, cls, data)
        if not problem:
            if candidate != path:
                log.warning(
                    "%s: %s; using its backup %s (one write older)",
                    path,
                    problems[0][1] or "missing",
                    candidate,
                )
            return typing.cast(T, parsed)
        problems.append((candidate, problem))
    if not any(p for _, p in problems):
        return None
    (_, main), (_, backup) = problems
    problem = main or "missing"
    problem += f" (its backup {os.path.basename(path)}.bak: {backup or 'missing'})"
    raise StateFileError(path, problem, fix)


def move_aside(path: str) -> list[str]:
    """Rename ``path`` and its ``.bak`` to ``<name>[.bak].corrupt-<UTC time>``; returns the new
    names. Kept for a post-mortem; nothing is deleted."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now_ms() / 1000))
    moved = []
    for candidate in (path, f"{path}.bak"):
        if os.path.exists(candidate):
            target = f"{candidate}.corrupt-{stamp}"
            n = 1
            while os.path.exists(target):
                n += 1
                target = f"{candidate}.corrupt-{stamp}-{n}"
            os.rename(candidate, target)
            moved.append(target)
    return moved
