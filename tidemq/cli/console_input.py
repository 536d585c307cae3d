"""The lines ``tidemq send`` reads from stdin or ``--file``: one message per line, or with
``--json-lines`` one JSON object per line (Kafka's console producer, RocketMQ's
``sendMessage`` in a loop). Pure parsing: ``parse_line`` turns one line into the keyword
arguments of ``Producer.send_async``, so a bad line is found before it is sent and named by
its number."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from tidemq.cli.durations import parse_seconds

# The fields a JSON line may have; anything else is a typo the user wants to hear about.
JSON_FIELDS = frozenset(
    {"body", "body_base64", "keys", "tag", "properties", "message_group", "delay"}
)


class LineError(ValueError):
    """A line that is not a message: its number (1-based) and what is wrong."""

    def __init__(self, number: int, problem: str) -> None:
        super().__init__(f"line {number}: {problem}")
        self.number = number
        self.problem = problem


@dataclass(frozen=True)
class LineDefaults:
    """What the command's flags give every message; a JSON line's own fields win."""

    tag: str | None = None
    keys: tuple[str, ...] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    message_group: str | None = None


@dataclass(frozen=True)
class Line:
    number: int
    body: bytes
    options: dict[str, Any]  # send_async's keyword arguments besides topic and body


def _text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name!r} must be a string, not {type(value).__name__}")
    return value


def _keys(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(k, str) for k in value):
        return tuple(value)
    raise TypeError("'keys' must be a string or a list of strings")


def _properties(value: object) -> dict[str, str]:
    if isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
        return dict(value)
    raise TypeError("'properties' must be an object of string values")


def _delay(value: object) -> float:
    # A number is seconds, as --delay's bare number; a string is a duration ("30s", "2m").
    if isinstance(value, int | float) and not isinstance(value, bool):
        if value <= 0:
            raise ValueError("'delay' must be more than zero")
        return float(value)
    return parse_seconds(_text(value, "delay"))


def _json_line(text: str, defaults: LineDefaults) -> tuple[bytes, dict[str, Any]]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
        raise TypeError("a JSON line must be an object with a 'body' or 'body_base64'")
    unknown = sorted(set(obj) - JSON_FIELDS)
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(unknown)} (known: {sorted(JSON_FIELDS)})")
    if ("body" in obj) == ("body_base64" in obj):
        raise ValueError("give exactly one of 'body' and 'body_base64'")
    if "body" in obj:
        body = _text(obj["body"], "body").encode()
    else:
        try:
            body = base64.b64decode(_text(obj["body_base64"], "body_base64"), validate=True)
        except binascii.Error:
            raise ValueError("'body_base64' is not base64") from None
    options: dict[str, Any] = {
        "tag": _text(obj["tag"], "tag") if "tag" in obj else defaults.tag,
        "keys": _keys(obj["keys"]) if "keys" in obj else defaults.keys,
        "properties": {**defaults.properties, **_properties(obj.get("properties", {}))},
        "message_group": (
            _text(obj["message_group"], "message_group")
            if "message_group" in obj
            else defaults.message_group
        ),
    }
    if "delay" in obj:
        options["delay"] = _delay(obj["delay"])
    return body, options


def parse_line(number: int, text: str, defaults: LineDefaults, *, json_lines: bool) -> Line:
    """One input line (without its newline) as a message; LineError naming ``number``."""
    try:
        if json_lines:
            body, options = _json_line(text, defaults)
        else:
            body = text.encode()
            options = {
                "tag": defaults.tag,
                "keys": defaults.keys,
                "properties": dict(defaults.properties),
                "message_group": defaults.message_group,
            }
    except (ValueError, TypeError) as e:
        raise LineError(number, str(e)) from None
    if not body:
        raise LineError(number, "the message body is empty")
    return Line(number, body, options)


def read_lines(lines: Iterable[str], defaults: LineDefaults, *, json_lines: bool) -> Iterator[Line]:
    """Each non-blank line as a message, in order; blank lines (a trailing one included) are
    skipped so that ``printf 'a\\nb\\n'`` sends two. The first bad line raises LineError."""
    for number, raw in enumerate(lines, start=1):
        text = raw.rstrip("\r\n")
        if not text.strip():
            continue
        yield parse_line(number, text, defaults, json_lines=json_lines)
