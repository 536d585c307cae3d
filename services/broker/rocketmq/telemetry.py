"""The Telemetry stream each official client keeps open with every broker it uses: settings in,
the merged settings out (``settings.merge``), and commands the broker pushes (transaction checks,
queued on the client's ``outbox``). It stays open until the client closes it or the broker
stops."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

import grpc

from tidemq.protos.rocketmq import definition_pb2, service_pb2
from tidemq.services.broker.groups import GroupSettings
from tidemq.services.broker.rocketmq.clients import V2Client, V2Clients, client_id_of
from tidemq.services.broker.rocketmq.settings import BrokerLimits, consumer_group, merge
from tidemq.services.broker.rocketmq.status import StatusError, ok, status, status_of_exception
from tidemq.services.errors import ServiceError, abort_with
from tidemq.storage.clock import now_ms

log = logging.getLogger(__name__)

C = definition_pb2
_END = service_pb2.TelemetryCommand()  # the reader's "the client closed its side"


class Telemetry:
    def __init__(
        self,
        clients: V2Clients,
        limits: BrokerLimits,
        group_settings: Callable[[str], GroupSettings | None],
        stopping: asyncio.Event,
        on_settings: Callable[[V2Client], None] = lambda _client: None,
    ) -> None:
        self.clients = clients
        self.limits = limits
        self.group_settings = group_settings
        self.stopping = stopping
        self.on_settings = on_settings  # e.g. start the producer's transaction checks

    def answer(
        self, client: V2Client, command: service_pb2.TelemetryCommand
    ) -> service_pb2.TelemetryCommand | None:
        """The reply to one inbound command (None: nothing to answer)."""
        kind = command.WhichOneof("command")
        if kind == "settings":
            try:
                group = consumer_group(command.settings)
                merged = merge(
                    command.settings, self.limits, self.group_settings(group) if group else None
                )
            except StatusError as e:
                return service_pb2.TelemetryCommand(status=e.status)
            client.settings = merged
            self.on_settings(client)
            return service_pb2.TelemetryCommand(status=ok(), settings=merged)
        if kind in ("thread_stack_trace", "verify_message_result"):
            return None  # replies to commands this broker does not send: nothing to do
        return service_pb2.TelemetryCommand(
            status=status(C.BAD_REQUEST, f"unsupported telemetry command {kind or 'none'}")
        )

    async def stream(
        self,
        requests: AsyncIterator[service_pb2.TelemetryCommand],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[service_pb2.TelemetryCommand]:
        try:
            client_id = client_id_of(context)
        except StatusError as e:
            yield service_pb2.TelemetryCommand(status=e.status)
            return
        client = self.clients.open_stream(client_id, now_ms())
        outbox = client.outbox
        assert outbox is not None
        refused: list[ServiceError] = []
        reader = asyncio.create_task(self._read(client, requests, outbox, refused))
        stopping = asyncio.create_task(self.stopping.wait())
        try:
            while True:
                getting = asyncio.create_task(outbox.get())
                await asyncio.wait((getting, stopping), return_when=asyncio.FIRST_COMPLETED)
                if not getting.done():
                    getting.cancel()
                    return  # the broker stops
                command = getting.result()
                if command is _END:
                    break
                yield command
        finally:
            reader.cancel()
            stopping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            self.clients.close_stream(client, outbox)
        if refused:
            # Bytes that do not decode: INVALID_ARGUMENT, as the unary calls answer them.
            await abort_with(context, refused[0])

    async def _read(
        self,
        client: V2Client,
        requests: AsyncIterator[service_pb2.TelemetryCommand],
        outbox: asyncio.Queue[service_pb2.TelemetryCommand],
        refused: list[ServiceError],
    ) -> None:
        try:
            async for command in requests:
                client.last_seen_ms = now_ms()
                try:
                    reply = self.answer(client, command)
                except Exception as e:
                    log.exception("telemetry command failed")
                    reply = service_pb2.TelemetryCommand(status=status_of_exception(e))
                if reply is not None:
                    outbox.put_nowait(reply)
        except asyncio.CancelledError:
            raise
        except ServiceError as e:  # an inbound message that does not decode
            refused.append(e)
        except Exception as e:  # noqa: BLE001 - the client went away
            log.info("telemetry stream of %s ended: %s", client.client_id, e)
        outbox.put_nowait(_END)
