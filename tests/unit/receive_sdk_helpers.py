"""Shared parts of the receive SDK's unit tests."""

from __future__ import annotations

from tidemq import errors
from tidemq.types import ReceivedMessage

Results = list[errors.TidemqError | None]


def _received(topic: str, broker: str, handle: str) -> ReceivedMessage:
    return ReceivedMessage(
        topic, 0, 0, b"", None, (), {}, "id", 0, 0, broker, receipt_handle=handle
    )
