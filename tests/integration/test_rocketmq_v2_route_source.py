"""The RocketMQ 5 listener's QueryRoute asks the nameservers over one connection each, kept for
the listener's life: every official client asks for its topics' routes every 30 s, and a new
connection per question would cost the broker (and the nameserver) a TCP and HTTP/2 handshake
each time. A nameserver in this process, over real gRPC on loopback, says which connection
each question came on."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from tidemq.protos import nameserver_pb2, nameserver_pb2_grpc
from tidemq.services.broker.rocketmq.routes import RouteSource

pytestmark = pytest.mark.integration


class Nameserver(nameserver_pb2_grpc.NameServerServicer):  # type: ignore[misc]
    """Answers every route, and remembers the peer (client address and port) of each question."""

    def __init__(self) -> None:
        self.peers: list[str] = []

    async def QueryRoute(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.peers.append(context.peer())
        return nameserver_pb2.QueryRouteResponse(topic=request.topic)


async def ask_routes(times: int) -> tuple[list[str], list[str]]:
    servicer = Nameserver()
    server = grpc.aio.server()
    nameserver_pb2_grpc.add_NameServerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        source = RouteSource((f"127.0.0.1:{port}",), lambda topic: None)
        await source.start()
        topics = [(await source.route(f"t{i}")).topic for i in range(times)]
        await source.stop()
    finally:
        await server.stop(None)
    return topics, servicer.peers


def test_route_questions_to_a_nameserver_share_one_connection() -> None:
    topics, peers = asyncio.run(ask_routes(5))
    assert topics == [f"t{i}" for i in range(5)]
    assert len(peers) == 5
    assert len(set(peers)) == 1, f"a connection per question: {peers}"
