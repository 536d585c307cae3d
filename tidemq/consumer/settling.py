"""Settling received messages (ack, nack): the checks before a call, one call per topic and
broker group (at most ``MAX_HANDLES_PER_CALL`` handles each), and the broker's per-handle
results turned into one typed error (or None) per message."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from tidemq.errors import InvalidArgumentError, TidemqError, from_detail
from tidemq.types import ReceivedMessage

# The broker's default limit of handles per ack/nack call (max_handles_per_call).
MAX_HANDLES_PER_CALL = 1024

# ack or nack: (topic, broker group, handles) -> one result per handle.
SettleCall = Callable[[str, str, list[str]], Awaitable[list["TidemqError | None"]]]


def per_handle(results: Any, handles: list[str], target: str) -> list[TidemqError | None]:
    """The broker's per-handle results in the order of ``handles`` (matched by handle; a
    handle the answer does not mention is an error, never silently done)."""
    by_handle = {r.receipt_handle: r for r in results}
    out: list[TidemqError | None] = []
    for h in handles:
        r = by_handle.get(h)
        if r is None:
            out.append(TidemqError(f"no result for a handle ({target})", code="INTERNAL"))
        elif r.HasField("error") and r.error.code:
            out.append(from_detail(r.error, target))
        else:
            out.append(None)
    return out


def check_handle(message: ReceivedMessage) -> None:
    if not isinstance(message, ReceivedMessage) or not message.receipt_handle:
        raise InvalidArgumentError(
            "a message received by a SimpleConsumer or PushConsumer (it has a receipt handle)",
            code="INVALID_RECEIPT_HANDLE",
        )


async def settle_many(
    settle: SettleCall, messages: list[ReceivedMessage]
) -> list[TidemqError | None]:
    """Runs ``settle`` once per (topic, broker group) of ``messages`` (per 1024 of them);
    results in their order.
    A call that failed as a whole (no master within the retries) is each of its messages'
    error: the other groups' results stand."""
    for m in messages:
        check_handle(m)
    groups: dict[tuple[str, str], list[int]] = {}
    for i, m in enumerate(messages):
        groups.setdefault((m.topic, m.broker), []).append(i)
    calls = [
        (topic, broker, indexes[at : at + MAX_HANDLES_PER_CALL])
        for (topic, broker), indexes in groups.items()
        for at in range(0, len(indexes), MAX_HANDLES_PER_CALL)
    ]

    async def one(topic: str, broker: str, indexes: list[int]) -> list[TidemqError | None]:
        try:
            return await settle(topic, broker, [messages[i].receipt_handle for i in indexes])
        except TidemqError as e:
            return [e] * len(indexes)

    results: list[TidemqError | None] = [None] * len(messages)
    outcomes = await asyncio.gather(*(one(*call) for call in calls))
    for (_, _, indexes), errors in zip(calls, outcomes, strict=True):
        for i, e in zip(indexes, errors, strict=True):
            results[i] = e
    return results
