"""Where a consumer group should be in a topic, as the flags of ``consumer-group reset`` and
``consume`` say it: ``first``, ``last``, a time, or an explicit offset (of every queue, or of one
queue with ``--queue``). Turned into the arguments of ``Admin.reset_offsets``; pure, so the
parsing is tested without a broker."""

from __future__ import annotations

from typing import Any

from tidemq.cli.times import parse_time_ms


def reset_arguments(
    *,
    to: str | None = None,
    offset: int | None = None,
    queue: int | None = None,
    broker: str | None = None,
) -> dict[str, Any]:
    """``Admin.reset_offsets`` keyword arguments (``to`` or ``offset``, ``queue_id``,
    ``broker``); ValueError naming the flag when they contradict or a value is bad."""
    if (to is None) == (offset is None):
        raise ValueError("give one position: --to first|last|TIME, or --offset N")
    if offset is not None and offset < 0:
        raise ValueError(f"--offset {offset}: an offset is >= 0")
    if queue is not None and queue < 0:
        raise ValueError(f"--queue {queue}: a queue id is >= 0")
    out: dict[str, Any] = {"queue_id": queue, "broker": broker}
    if offset is not None:
        out["offset"] = offset
    elif to in ("first", "last"):
        out["to"] = to
    else:
        assert to is not None
        out["to"] = parse_time_ms(to)
    return out


def consume_start(args: Any) -> dict[str, Any] | None:
    """The reset ``tidemq consume`` does before it starts (None: start where the group is)."""
    if args.from_offset is None and args.from_time is None:
        if args.queue is not None:
            raise ValueError("--queue goes with --from-offset or --from-time")
        return None
    if args.from_offset is not None and args.from_time is not None:
        raise ValueError("give --from-offset or --from-time, not both")
    if args.from_offset is not None:
        return reset_arguments(offset=args.from_offset, queue=args.queue, broker=args.broker)
    return reset_arguments(to=args.from_time, queue=args.queue, broker=args.broker)
