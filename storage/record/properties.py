"""Message properties as a record carries them: ``name 0x01 value 0x02`` for each, UTF-8, at most
``PROPERTIES_MAX_BYTES`` in all. Tags and keys travel as the ``TAGS`` and ``KEYS`` properties (keys
joined by spaces), a RocketMQ client's unique id as ``UNIQ_KEY``.

One property changes what dispatch writes: a record of ``TIMER_TOPIC`` (the broker's pending
delayed messages) carries its delivery time, ms since the epoch in decimal, as
``TIMER_DELIVER_MS``, and its ConsumeQueue entry's tag code is that time instead of the hash of
its tags (RocketMQ does the same for its schedule topic). So the broker rebuilds its timer wheel
from the ConsumeQueue alone, never reading a pending message's body. A value that is not a
decimal in [0, 2^63) counts as absent (the tags' hash, as for any record)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from tidemq.storage.errors import InvalidPropertyError, PropertiesTooLargeError
from tidemq.storage.record.layout import (
    PROP_LEGACY_RECORD_CRC,
    PROP_RECORD_CRC,
    PROPERTIES_MAX_BYTES,
)

PROP_TAGS: Final = "TAGS"
PROP_KEYS: Final = "KEYS"
PROP_UNIQ_KEY: Final = "UNIQ_KEY"
TIMER_TOPIC: Final = "%SYS%TIMER"
PROP_TIMER_DELIVER_MS: Final = "TIMER_DELIVER_MS"
NAME_SEP: Final = "\x01"
PROP_SEP: Final = "\x02"

BAD_PROPERTY_CHARS = re.compile("[\x01\x02]")


def encode_properties(props: Mapping[str, str]) -> bytes:
    parts: list[str] = []
    for name, value in props.items():
        if not name or BAD_PROPERTY_CHARS.search(name) or BAD_PROPERTY_CHARS.search(value):
            raise InvalidPropertyError(
                f"property {name!r} must be non-empty and free of \\x01 and \\x02"
            )
        parts.append(f"{name}\x01{value}\x02")
    encoded = "".join(parts).encode("utf-8")
    if len(encoded) > PROPERTIES_MAX_BYTES:
        raise PropertiesTooLargeError(
            f"properties are {len(encoded)} bytes, at most {PROPERTIES_MAX_BYTES} allowed"
        )
    return encoded


def decode_properties(raw: bytes) -> dict[str, str]:
    props: dict[str, str] = {}
    for item in raw.decode("utf-8", "replace").split(PROP_SEP):
        name, sep, value = item.partition(NAME_SEP)
        if sep and name not in (PROP_RECORD_CRC, PROP_LEGACY_RECORD_CRC):
            props[name] = value
    return props


def parse_timer_deliver_ms(value: bytes | None) -> int | None:
    """A ``TIMER_DELIVER_MS`` value as a ConsumeQueue tag code, None when absent or malformed."""
    if value is None or not value.isdigit() or len(value) > 19:
        return None
    ms = int(value)
    return ms if ms < 1 << 63 else None


def find_property(raw: bytes, name: bytes) -> bytes | None:
    """One property's value straight from the encoded bytes, without building a dict."""
    needle = name + b"\x01"
    if raw.startswith(needle):
        start = len(needle)
    else:
        at = raw.find(b"\x02" + needle)
        if at < 0:
            return None
        start = at + 1 + len(needle)
    end = raw.find(b"\x02", start)
    return raw[start:] if end < 0 else raw[start:end]
