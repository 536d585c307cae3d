"""QueryRoute and QueryAssignment: our nameserver's route of a topic as v2 ``MessageQueue``s,
each naming its broker's v2 endpoint (the address the broker registered beside its own).

A master (broker id 0) gets READ_WRITE queues (WRITE or READ where the topic's write and read
queue counts differ); a slave is named with queues of permission NONE, so that clients know
its endpoint (they open their channel and Telemetry stream to it before it may become the
master) but neither send nor receive there: a slave refuses both, and the Node.js client
(1.0.8) receives from any broker's queue 0 that is readable (it compares the queue id, not the
broker id, with the master's id 0), so readable slave queues made half its receives fail. A
broker that serves no v2 listener is left out. The mapping is pure; ``RouteSource`` asks the
nameservers (or ZooKeeper)."""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable

import grpc

from tidemq.protos import nameserver_pb2, nameserver_pb2_grpc
from tidemq.protos.rocketmq import definition_pb2
from tidemq.protos.signing import Credentials
from tidemq.protos.tls import TlsSettings, aio_channel
from tidemq.services.broker.receive.dead_letter import is_dead_letter_topic
from tidemq.services.broker.rocketmq.status import StatusError
from tidemq.services.broker.topics import PERM_READ, PERM_WRITE
from tidemq.services.nameserver.registry import RegistryUnavailableError
from tidemq.services.nameserver.route_wire import route_to_wire
from tidemq.services.nameserver.zk_registry import ZooKeeperRegistry

log = logging.getLogger(__name__)

C = definition_pb2
MASTER_ID = 0
ACCEPTED_TYPES = (C.NORMAL, C.FIFO, C.DELAY, C.TRANSACTION)
# The whole broker: a receive pops across every queue of the topic there, as the proxy's does.
WHOLE_BROKER_QUEUE_ID = -1
NAMESERVER_TIMEOUT_S = 3.0


def check_topic(topic: str) -> None:
    """Clients may route user topics and dead-letter queues, not the broker's own ones."""
    if not topic:
        raise StatusError(C.ILLEGAL_TOPIC, "topic.name is required")
    if topic.startswith("%") and not is_dead_letter_topic(topic):
        raise StatusError(C.TOPIC_NOT_FOUND, f"topic {topic!r} is a system topic")


def endpoints(address: str) -> definition_pb2.Endpoints:
    """``host:port`` as v2 Endpoints (IPv4, IPv6 or a domain name)."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        scheme = C.IPv4 if ipaddress.ip_address(host).version == 4 else C.IPv6
    except ValueError:
        scheme = C.DOMAIN_NAME
    return C.Endpoints(scheme=scheme, addresses=[C.Address(host=host, port=int(port))])


def _permission(readable: bool, writable: bool) -> int:
    if readable and writable:
        return int(C.READ_WRITE)
    if readable:
        return int(C.READ)
    return int(C.WRITE if writable else C.NONE)


def message_queues(
    topic: definition_pb2.Resource, route: nameserver_pb2.QueryRouteResponse
) -> list[definition_pb2.MessageQueue]:
    """Every queue of ``route`` a client may use, on brokers that serve v2."""
    groups = {b.broker_name: b for b in route.brokers}
    # A dead-letter queue is written by the broker only: clients read it.
    may_write = not is_dead_letter_topic(topic.name)
    out = []
    for q in route.queues:
        group = groups.get(q.broker_name)
        if group is None:
            continue
        for broker_id, address in sorted(group.rocketmq_addresses.items()):
            readable = bool(q.perm & PERM_READ)
            writable = bool(q.perm & PERM_WRITE) and may_write
            reads = q.read_queue_nums if readable else 0
            writes = q.write_queue_nums if writable else 0
            broker = C.Broker(name=q.broker_name, id=broker_id, endpoints=endpoints(address))
            for queue_id in range(max(reads, writes)):
                permission = (
                    _permission(queue_id < reads, queue_id < writes)
                    if broker_id == MASTER_ID
                    else int(C.NONE)
                )
                out.append(
                    C.MessageQueue(
                        topic=topic,
                        id=queue_id,
                        permission=permission,
                        broker=broker,
                        accept_message_types=ACCEPTED_TYPES,
                    )
                )
    return out


def assignments(
    topic: definition_pb2.Resource, route: nameserver_pb2.QueryRouteResponse
) -> list[definition_pb2.Assignment]:
    """A push consumer's share: one whole-broker queue per readable master with a v2 endpoint."""
    groups = {b.broker_name: b for b in route.brokers}
    out = []
    for q in route.queues:
        group = groups.get(q.broker_name)
        address = group.rocketmq_addresses.get(MASTER_ID) if group is not None else None
        if not address or not q.perm & PERM_READ or q.read_queue_nums <= 0:
            continue
        broker = C.Broker(name=q.broker_name, id=MASTER_ID, endpoints=endpoints(address))
        out.append(
            C.Assignment(
                message_queue=C.MessageQueue(
                    topic=topic,
                    id=WHOLE_BROKER_QUEUE_ID,
                    permission=C.READ,
                    broker=broker,
                    accept_message_types=ACCEPTED_TYPES,
                )
            )
        )
    return out


class RouteSource:
    """A topic's route as this broker knows the cluster: from its nameservers (the first that
    answers), else from the ZooKeeper registry it registers in (read as a nameserver reads it),
    else as this broker alone serves it (``own_route``).

    One channel per nameserver for the listener's life (clients ask for routes every 30 s
    each, and a connection per question would cost a TCP and HTTP/2 handshake each time);
    closed at ``stop``."""

    def __init__(
        self,
        nameservers: tuple[str, ...],
        own_route: Callable[[str], nameserver_pb2.QueryRouteResponse | None],
        zookeeper: ZooKeeperRegistry | None = None,
        tls: TlsSettings | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self.tls = tls
        self.credentials = credentials
        self.nameservers = nameservers
        self.own_route = own_route
        self.zookeeper = zookeeper
        self._stubs: dict[str, nameserver_pb2_grpc.NameServerStub] = {}
        self._channels: list[grpc.aio.Channel] = []

    async def start(self) -> None:
        if self.zookeeper is not None:
            await self.zookeeper.start()

    async def stop(self) -> None:
        channels, self._channels, self._stubs = self._channels, [], {}
        for channel in channels:
            await channel.close()
        if self.zookeeper is not None:
            await self.zookeeper.stop()

    def _stub(self, nameserver: str) -> nameserver_pb2_grpc.NameServerStub:
        stub = self._stubs.get(nameserver)
        if stub is None:
            # Made on first use, in the loop that serves the calls (grpc.aio binds a channel
            # to the running loop).
            channel = aio_channel(nameserver, self.tls, credentials=self.credentials)
            self._channels.append(channel)
            stub = self._stubs[nameserver] = nameserver_pb2_grpc.NameServerStub(channel)
        return stub

    async def route(self, topic: str) -> nameserver_pb2.QueryRouteResponse:
        if self.nameservers:
            return await self._ask_nameservers(topic)
        if self.zookeeper is not None:
            try:
                found = await self.zookeeper.route(topic)
            except RegistryUnavailableError as e:
                raise StatusError(C.INTERNAL_SERVER_ERROR, str(e)) from None
            route = route_to_wire(found) if found is not None else None
        else:
            route = self.own_route(topic)
        if route is None:
            raise StatusError(C.TOPIC_NOT_FOUND, f"topic {topic!r} does not exist")
        return route

    async def _ask_nameservers(self, topic: str) -> nameserver_pb2.QueryRouteResponse:
        failures = []
        for nameserver in self.nameservers:
            stub = self._stub(nameserver)
            try:
                answer: nameserver_pb2.QueryRouteResponse = await stub.QueryRoute(
                    nameserver_pb2.QueryRouteRequest(topic=topic), timeout=NAMESERVER_TIMEOUT_S
                )
            except grpc.aio.AioRpcError as e:
                if e.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
                    raise StatusError(
                        C.TOPIC_NOT_FOUND, f"topic {topic!r} does not exist: {e.details()}"
                    ) from None
                failures.append(f"{nameserver}: {e.code().name} {e.details()}")
            else:
                return answer
        log.warning("no nameserver answered the route of %r: %s", topic, "; ".join(failures))
        raise StatusError(
            C.INTERNAL_SERVER_ERROR,
            f"no nameserver answered the route of {topic!r}: {'; '.join(failures)}",
        )
