"""The Telemetry stream's life without sockets: each settings command answered in order on the
stream, commands the broker queues (transaction checks) written between them, the stream ended
by the client closing its side or the broker stopping, and a call without a client id answered
CLIENT_ID_REQUIRED."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tidemq.protos.rocketmq import definition_pb2 as v2
from tidemq.protos.rocketmq import service_pb2
from tidemq.services.broker.rocketmq.clients import V2Client, V2Clients
from tidemq.services.broker.rocketmq.settings import BrokerLimits
from tidemq.services.broker.rocketmq.telemetry import Telemetry
from tidemq.services.errors import invalid

pytestmark = pytest.mark.unit


class Context:
    def __init__(self, client_id: str | None) -> None:
        self.metadata = (("x-mq-client-id", client_id),) if client_id else ()
        self.aborted: tuple[Any, str] | None = None

    def invocation_metadata(self) -> Any:
        return self.metadata

    def set_trailing_metadata(self, _metadata: object) -> None:
        pass

    async def abort(self, code: Any, details: str) -> None:
        self.aborted = (code, details)
        raise RuntimeError("aborted")


def settings_command(topic: str = "orders") -> service_pb2.TelemetryCommand:
    s = v2.Settings(client_type=v2.PRODUCER)
    s.publishing.topics.add(name=topic)
    return service_pb2.TelemetryCommand(settings=s)


class Inbound:
    """The client's side: commands fed by the test, closed on request."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()

    async def __aiter__(self) -> AsyncIterator[Any]:
        while (item := await self.queue.get()) is not None:
            if isinstance(item, Exception):
                raise item
            yield item


def telemetry(clients: V2Clients, seen: list[V2Client]) -> tuple[Telemetry, asyncio.Event]:
    stopping = asyncio.Event()
    t = Telemetry(clients, BrokerLimits(1024), lambda _group: None, stopping, seen.append)
    return t, stopping


def test_settings_are_answered_in_order_with_queued_commands_between_until_the_client_closes() -> (
    None
):
    async def run() -> None:
        clients = V2Clients()
        seen: list[V2Client] = []
        t, _ = telemetry(clients, seen)
        inbound = Inbound()
        stream = t.stream(inbound, Context("c1"))  # type: ignore[arg-type]
        inbound.queue.put_nowait(settings_command())
        first = await anext(stream)
        assert first.status.code == v2.OK
        assert first.settings.publishing.max_body_size == 1024
        client = clients.get("c1")
        assert client is not None and seen == [client]
        assert [c.client_id for c in clients.publishers_of("orders")] == ["c1"]
        check = service_pb2.TelemetryCommand(status=v2.Status(code=v2.OK))
        check.recover_orphaned_transaction_command.transaction_id = "tx1"
        assert client.send(check)
        second = await anext(stream)
        assert second.recover_orphaned_transaction_command.transaction_id == "tx1"
        inbound.queue.put_nowait(service_pb2.TelemetryCommand())
        assert (await anext(stream)).status.code == v2.BAD_REQUEST
        inbound.queue.put_nowait(None)  # the client closes its side
        with pytest.raises(StopAsyncIteration):
            await anext(stream)
        assert client.outbox is None and client.stream_closed.is_set()
        assert not client.send(check)

    asyncio.run(run())


def test_the_broker_stopping_ends_every_stream() -> None:
    async def run() -> None:
        clients = V2Clients()
        t, stopping = telemetry(clients, [])
        inbound = Inbound()
        stream = t.stream(inbound, Context("c1"))  # type: ignore[arg-type]
        inbound.queue.put_nowait(settings_command())
        await anext(stream)
        stopping.set()
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(anext(stream), 5)

    asyncio.run(run())


def test_a_stream_without_a_client_id_is_answered_client_id_required() -> None:
    async def run() -> None:
        t, _ = telemetry(V2Clients(), [])
        answers = [a async for a in t.stream(Inbound(), Context(None))]  # type: ignore[arg-type]
        assert [a.status.code for a in answers] == [v2.CLIENT_ID_REQUIRED]

    asyncio.run(run())


def test_an_undecodable_command_aborts_the_stream_with_invalid_argument() -> None:
    async def run() -> None:
        clients = V2Clients()
        t, _ = telemetry(clients, [])
        inbound = Inbound()
        context = Context("c1")
        stream = t.stream(inbound, context)  # type: ignore[arg-type]
        inbound.queue.put_nowait(invalid("a stream message is not a valid message"))
        with pytest.raises(RuntimeError, match="aborted"):
            await anext(stream)
        assert context.aborted is not None
        assert context.aborted[0].name == "INVALID_ARGUMENT"
        assert clients.get("c1") is not None and clients.get("c1").outbox is None  # type: ignore[union-attr]

    asyncio.run(run())
