"""The official clients this broker knows, keyed by their ``x-mq-client-id``: the settings each
announced on its Telemetry stream, when it was last heard from, and the open stream the broker
writes commands to (transaction checks). State only; the clock is passed in."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field

import grpc

from tidemq.protos.rocketmq import definition_pb2, service_pb2
from tidemq.services.broker.rocketmq.settings import published_topics
from tidemq.services.broker.rocketmq.status import StatusError

CLIENT_ID_KEY = "x-mq-client-id"
MAX_CLIENT_ID_CHARS = 256
# Commands waiting for a client's stream beyond this are dropped (a client not reading its
# stream must not hold the broker's memory); transaction checks come again.
MAX_QUEUED_COMMANDS = 1024


def client_id_of(context: grpc.aio.ServicerContext) -> str:
    """The calling client's id; StatusError(CLIENT_ID_REQUIRED) when it sent none."""
    for key, value in context.invocation_metadata() or ():
        if key == CLIENT_ID_KEY and isinstance(value, str) and value:
            if len(value) > MAX_CLIENT_ID_CHARS:
                raise StatusError(
                    definition_pb2.BAD_REQUEST,
                    f"{CLIENT_ID_KEY} is longer than {MAX_CLIENT_ID_CHARS} characters",
                )
            return value
    raise StatusError(definition_pb2.CLIENT_ID_REQUIRED, f"metadata {CLIENT_ID_KEY} is required")


@dataclass
class V2Client:
    client_id: str
    last_seen_ms: int
    settings: definition_pb2.Settings | None = None
    # The open Telemetry stream's outbound commands; None while the client has none open.
    outbox: asyncio.Queue[service_pb2.TelemetryCommand] | None = None
    # Set when that stream ends: what feeds it (transaction checks) stops.
    stream_closed: asyncio.Event = field(default_factory=asyncio.Event)
    # Topics whose transaction checks feed the stream (``transactions.V2Transactions``).
    watched: set[str] = field(default_factory=set)

    def send(self, command: service_pb2.TelemetryCommand) -> bool:
        """Queue a command for the client's stream; False when it has none (or it is full)."""
        if self.outbox is None or self.outbox.qsize() >= MAX_QUEUED_COMMANDS:
            return False
        self.outbox.put_nowait(command)
        return True


@dataclass
class V2Clients:
    expiry_ms: int = 120_000
    clients: dict[str, V2Client] = field(default_factory=dict)

    def get(self, client_id: str) -> V2Client | None:
        return self.clients.get(client_id)

    def seen(self, client_id: str, now_ms: int) -> V2Client:
        client = self.clients.get(client_id)
        if client is None:
            client = self.clients[client_id] = V2Client(client_id, now_ms)
        client.last_seen_ms = now_ms
        return client

    def open_stream(self, client_id: str, now_ms: int) -> V2Client:
        client = self.seen(client_id, now_ms)
        # A newer stream replaces an older one: what fed the old one stops (and starts again
        # for the new one when its settings come).
        client.stream_closed.set()
        client.stream_closed = asyncio.Event()
        client.watched = set()
        client.outbox = asyncio.Queue()
        return client

    def close_stream(self, client: V2Client, outbox: object) -> None:
        # A client may have opened a newer stream meanwhile: only its own one is closed.
        if client.outbox is outbox:
            client.outbox = None
            client.stream_closed.set()

    def remove(self, client_id: str) -> None:
        client = self.clients.pop(client_id, None)
        if client is not None:
            client.stream_closed.set()

    def expire(self, now_ms: int) -> list[str]:
        """Drop clients neither heard from within the expiry nor holding a stream open."""
        gone = [
            cid
            for cid, c in self.clients.items()
            if c.outbox is None and now_ms - c.last_seen_ms > self.expiry_ms
        ]
        for cid in gone:
            del self.clients[cid]
        return gone

    def publishers_of(self, topic: str) -> Iterable[V2Client]:
        """Clients with an open stream whose settings publish to ``topic``."""
        for c in self.clients.values():
            if (
                c.outbox is not None
                and c.settings is not None
                and topic in published_topics(c.settings)
            ):
                yield c
