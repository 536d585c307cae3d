"""Points in time as people type and read them on a command line: ISO 8601
(``2026-11-24T21:00:00Z``, ``2026-11-24 22:00+01:00``) or milliseconds since the epoch. A time
without a zone is the local time of the machine running the command, as ``date`` shows it.
Printed times are UTC, to the millisecond, so they sort as text."""

from __future__ import annotations

from datetime import UTC, datetime


def parse_time_ms(text: str) -> int:
    """``text`` as milliseconds since the epoch; ValueError naming the text otherwise."""
    stripped = text.strip()
    if stripped.isdigit():
        return int(stripped)
    try:
        when = datetime.fromisoformat(stripped)
    except ValueError:
        raise ValueError(
            f"{text!r} is not a time (examples: 2026-11-24T21:00:00Z, "
            "2026-11-24 22:00+01:00, or milliseconds since the epoch)"
        ) from None
    return round(when.timestamp() * 1000)


def format_time_ms(ms: int) -> str:
    """``1764018000123`` -> ``2025-11-24T21:00:00.123Z``."""
    when = datetime.fromtimestamp(ms // 1000, tz=UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"
