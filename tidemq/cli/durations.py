"""Durations as people type them on a command line: ``500ms``, ``30s``, ``1.5s``, ``2m``, ``2h``;
a bare number is seconds. Used for invisible times and retry delays."""

from __future__ import annotations

import math
import re

_UNITS_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)?\s*$")


def parse_seconds(text: str) -> float:
    """``text`` in seconds; ValueError naming the text when it is not a positive duration."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration (examples: 500ms, 30s, 2m, 1h)")
    seconds = float(match.group(1)) * _UNITS_S[match.group(2) or "s"]
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{text!r}: a duration must be more than zero")
    return seconds


def parse_seconds_list(text: str) -> list[float]:
    """``"1s,5s,10s"`` -> ``[1.0, 5.0, 10.0]``; at least one."""
    items = [t for t in text.split(",") if t.strip()]
    if not items:
        raise ValueError(f"{text!r}: give at least one delay (e.g. 1s,5s,30s)")
    return [parse_seconds(t) for t in items]


def format_ms(ms: int) -> str:
    """The shortest exact spelling: 1000 -> ``1s``, 120000 -> ``2m``, 1500 -> ``1500ms``."""
    for unit, scale in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms >= scale and ms % scale == 0:
            return f"{ms // scale}{unit}"
    return f"{ms}ms"
