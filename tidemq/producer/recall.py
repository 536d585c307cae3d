"""Recalling a pending delayed message by its handle (RocketMQ 5's recall): the handle names
the broker group that holds the timer, and the call goes to that group's master, waiting out a
failover within the send timeout (the handle stays valid on the new master: replicas are
byte-identical).

The handle's layout is the broker's (``services/broker/timer/recall_handle.py``); the SDK reads
only its broker group, and the broker checks the rest."""

from __future__ import annotations

import asyncio
import base64
import binascii
import struct
import time

import grpc

from tidemq._runtime import Channels
from tidemq.errors import BrokerUnavailableError, InvalidArgumentError, TidemqError, from_rpc_error
from tidemq.protos import broker_pb2, broker_pb2_grpc
from tidemq.routes import RouteCache

_VERSION = 1
_U16 = struct.Struct(">H")
_RETRY_S = 0.2


def broker_of(handle: str) -> str:
    """The broker group a recall handle names (InvalidArgumentError when it is not one)."""
    bad = InvalidArgumentError("not a recall handle", code="INVALID_ARGUMENT")
    if not isinstance(handle, str) or not handle:
        raise bad
    try:
        raw = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4))
    except (binascii.Error, ValueError):
        raise bad from None
    if len(raw) < 3 or raw[0] != _VERSION:
        raise bad
    (n,) = _U16.unpack_from(raw, 1)
    try:
        return raw[3 : 3 + n].decode()
    except UnicodeDecodeError:
        raise bad from None


async def recall_message(
    routes: RouteCache, channels: Channels, topic: str, handle: str, timeout_ms: int
) -> str:
    """RecallMessage at the handle's group's master; returns the recalled message's id."""
    broker = broker_of(handle)
    deadline = time.monotonic() + timeout_ms / 1000
    request = broker_pb2.RecallMessageRequest(topic=topic, recall_handle=handle)
    while True:
        route = await routes.get(topic)
        group = route.groups.get(broker)
        address = group.master if group is not None else None
        left = deadline - time.monotonic()
        if address is None:
            error: TidemqError = BrokerUnavailableError(
                f"broker group {broker!r} of topic {topic!r} has no master now",
                code="UNAVAILABLE",
                retriable=True,
            )
        else:
            stub = channels.stub(address, broker_pb2_grpc.BrokerStub)
            try:
                resp = await stub.RecallMessage(request, timeout=max(left, 0.1))
            except grpc.aio.AioRpcError as e:
                error = from_rpc_error(e, f"broker {broker} at {address}")
            else:
                return str(resp.msg_id)
        if not error.retriable or time.monotonic() + _RETRY_S >= deadline:
            raise error
        routes.invalidate(topic)
        await asyncio.sleep(_RETRY_S)
