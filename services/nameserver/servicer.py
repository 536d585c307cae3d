"""The NameServer gRPC service: decode and validate a request, ask the registry, encode the reply.

Every failure leaves as a gRPC status plus a typed ``ErrorDetail`` (``tidemq.services.errors``):
bad input is INVALID_ARGUMENT, an unknown topic NOT_FOUND/ROUTE_NOT_FOUND, a stale master
FAILED_PRECONDITION/STALE_EPOCH, a heartbeat to a nameserver on ZooKeeper
FAILED_PRECONDITION/INVALID_ARGUMENT, a registry not yet read UNAVAILABLE/ROUTE_NOT_FOUND
(retriable), and a bug INTERNAL. Nothing escapes as UNKNOWN.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from tidemq.protos import common_pb2, nameserver_pb2, nameserver_pb2_grpc
from tidemq.services.errors import ServiceError, abort_with, invalid, not_found
from tidemq.services.nameserver.registry import (
    HeartbeatsRefusedError,
    Registry,
    RegistryUnavailableError,
)
from tidemq.services.nameserver.route_model import (
    MASTER_ID,
    BrokerLive,
    BrokerRegistration,
    BrokerRole,
    ClusterMismatchError,
    DataVersion,
    FullRegistrationNeededError,
    StaleEpochError,
    TopicDelta,
    TopicQueues,
)
from tidemq.services.nameserver.route_wire import broker_data_to_wire, route_to_wire
from tidemq.storage.errors import InvalidTopicError
from tidemq.storage.record import validate_topic

log = logging.getLogger(__name__)

E = common_pb2
T = TypeVar("T")

# How a QueryRoute ended: a route, none for the topic, the registry not read yet (ZooKeeper),
# or a topic name refused.
ROUTE_QUERY_OUTCOMES = ("found", "not_found", "unavailable", "invalid")
NAME_MAX_CHARS = 127  # cluster and broker names; the same bound as a topic name
_NAME_RE = re.compile(r"^[A-Za-z0-9._-]+\Z")
_HOST_LABEL_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\Z")
_PORT_RE = re.compile(r"^[0-9]{1,5}\Z")  # ASCII only: str.isdigit() would accept '²'
HOST_MAX_CHARS = 253
QUEUE_NUMS_MAX = 65_536  # a sanity bound: queue ids are small ints on the wire and on disk
PERM_ALL = E.PERM_INHERIT | E.PERM_WRITE | E.PERM_READ
_MASTER_ROLES = (BrokerRole.ASYNC_MASTER, BrokerRole.SYNC_MASTER)


def parse_host_port(text: str, *, allow_port_zero: bool = False) -> tuple[str, int]:
    """``host:port`` with a DNS name, an IPv4 address or a bracketed IPv6 address; ValueError
    names what is wrong. Port 0 (any free port) only where the caller binds, never on the wire.
    """
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text:
        raise ValueError(f"{text!r} is not HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"{text!r}: {host} is not an IPv6 address") from None
    elif ":" in host:
        raise ValueError(f"{text!r}: write an IPv6 host in brackets, as [::1]:9876")
    elif len(host) > HOST_MAX_CHARS or not all(_HOST_LABEL_RE.match(p) for p in host.split(".")):
        raise ValueError(f"{text!r}: {host!r} is not a host name or IPv4 address")
    lowest = 0 if allow_port_zero else 1
    if not _PORT_RE.match(port_text) or not lowest <= int(port_text) <= 65535:
        raise ValueError(f"{text!r}: port must be a number in [{lowest}, 65535]")
    return host, int(port_text)


def _address(field: str, text: str) -> str:
    try:
        parse_host_port(text)
    except ValueError as e:
        raise invalid(f"{field}: {e}") from None
    return text


def _name(field: str, text: str) -> str:
    if not text:
        raise invalid(f"{field} is empty")
    if len(text) > NAME_MAX_CHARS or not _NAME_RE.match(text):
        raise invalid(
            f"{field} {text!r} must be 1-{NAME_MAX_CHARS} letters, digits, '.', '_' or '-'"
        )
    return text


def _broker_id(value: int) -> int:
    if value < 0:
        raise invalid(f"broker_id must be >= 0, got {value}")
    return value


def _topic(field: str, topic: str) -> str:
    try:
        validate_topic(topic)
    except InvalidTopicError as e:
        raise invalid(f"{field}: {e}", E.INVALID_TOPIC) from None
    return topic


def _topic_queues(i: int, tc: Any) -> TopicQueues:
    field = f"topics[{i}]"
    _topic(f"{field}.topic", tc.topic)
    for what, n in (
        ("read_queue_nums", tc.read_queue_nums),
        ("write_queue_nums", tc.write_queue_nums),
    ):
        if not 0 <= n <= QUEUE_NUMS_MAX:
            raise invalid(f"{field}.{what} must be in [0, {QUEUE_NUMS_MAX}], got {n}")
    if not 0 <= tc.perm <= PERM_ALL:
        raise invalid(f"{field}.perm {tc.perm} is not a combination of Permission bits")
    return TopicQueues(tc.topic, tc.read_queue_nums, tc.write_queue_nums, tc.perm)


def registration_from_wire(request: Any) -> BrokerRegistration:
    """A RegisterBrokerRequest, checked field by field; ServiceError(INVALID_ARGUMENT) if bad."""
    if not request.HasField("broker"):
        raise invalid("broker is required")
    info = request.broker
    cluster = _name("cluster", info.identity.cluster)
    broker_name = _name("broker_name", info.identity.broker_name)
    broker_id = _broker_id(info.identity.broker_id)
    address = _address("broker.address", info.address)
    ha_address = _address("broker.ha_address", info.ha_address) if info.ha_address else ""
    rocketmq_address = (
        _address("broker.rocketmq_address", info.rocketmq_address) if info.rocketmq_address else ""
    )
    try:
        role = BrokerRole(info.role)
    except ValueError:
        raise invalid(f"broker.role {info.role} is not a known BrokerRole") from None
    if (broker_id == MASTER_ID) != (role in _MASTER_ROLES):
        raise invalid(
            f"broker id {broker_id} with role {role.name}: id 0 is the master, slaves are 1, 2, ..."
        )
    if info.epoch < 0:
        raise invalid(f"broker.epoch must be >= 0, got {info.epoch}")
    topics = tuple(_topic_queues(i, tc) for i, tc in enumerate(request.topics))
    seen: set[str] = set()
    for t in topics:
        if t.topic in seen:
            raise invalid(f"topic {t.topic!r} appears twice in one registration")
        seen.add(t.topic)
    delta = None
    if request.HasField("delta"):
        removed = tuple(
            _topic(f"delta.removed_topics[{i}]", name)
            for i, name in enumerate(request.delta.removed_topics)
        )
        for name in removed:
            if name in seen:
                raise invalid(f"topic {name!r} is both changed and removed in one registration")
            seen.add(name)
        b = request.delta.base_version
        delta = TopicDelta(DataVersion(b.state_version, b.counter, b.timestamp_ms), removed)
    dv = info.data_version
    return BrokerRegistration(
        cluster=cluster,
        broker_name=broker_name,
        broker_id=broker_id,
        address=address,
        ha_address=ha_address,
        role=role,
        epoch=info.epoch,
        data_version=DataVersion(dv.state_version, dv.counter, dv.timestamp_ms),
        topics=topics,
        rocketmq_address=rocketmq_address,
        delta=delta,
    )


def _broker_live_to_wire(b: BrokerLive) -> Any:
    reg = b.registration
    return nameserver_pb2.BrokerLiveInfo(
        broker=common_pb2.BrokerInfo(
            identity=common_pb2.BrokerIdentity(
                cluster=reg.cluster, broker_name=reg.broker_name, broker_id=reg.broker_id
            ),
            address=reg.address,
            ha_address=reg.ha_address,
            rocketmq_address=reg.rocketmq_address,
            role=int(reg.role),
            epoch=reg.epoch,
            data_version=common_pb2.DataVersion(
                state_version=reg.data_version.state_version,
                counter=reg.data_version.counter,
                timestamp_ms=reg.data_version.timestamp_ms,
            ),
        ),
        last_update_ms=b.last_update_ms,
        topics=b.topics,
    )


def _wire_error(exc: Exception) -> BaseException:
    """Registry refusals in their wire form; anything else is left to ``abort_with``."""
    if isinstance(exc, StaleEpochError):
        # Not retriable: the broker must learn the new master and come back as a slave.
        return ServiceError(grpc.StatusCode.FAILED_PRECONDITION, E.STALE_EPOCH, str(exc))
    if isinstance(exc, ClusterMismatchError | HeartbeatsRefusedError):
        # Not retriable: the broker is misconfigured, and only its operator can fix that.
        return ServiceError(grpc.StatusCode.FAILED_PRECONDITION, E.INVALID_ARGUMENT, str(exc))
    if isinstance(exc, RegistryUnavailableError):
        # Retriable: another nameserver, or this one once it has read its registry, can answer.
        return ServiceError(
            grpc.StatusCode.UNAVAILABLE, E.ROUTE_NOT_FOUND, str(exc), retriable=True
        )
    if not isinstance(exc, ServiceError):
        log.exception("nameserver request failed unexpectedly")  # INTERNAL on the wire: a bug
    return exc


async def _answer(context: Any, work: Awaitable[T]) -> T:
    try:
        return await work
    except Exception as exc:  # noqa: BLE001 - every failure must leave typed, never UNKNOWN
        # abort_with raises the call's abort; it leaves from here, outside the try.
        await abort_with(context, _wire_error(exc))


# The generated base is untyped (protos/*_pb2_grpc.py are skipped by mypy).
class NameServerServicer(nameserver_pb2_grpc.NameServerServicer):  # type: ignore[misc]
    """grpc.aio handlers over one Registry."""

    def __init__(
        self,
        registry: Registry,
        on_route_query: Callable[[str], None] | None = None,
        on_registration: Callable[[str], None] | None = None,
    ) -> None:
        self._registry = registry
        # Hear each QueryRoute's outcome (ROUTE_QUERY_OUTCOMES) and each registration's kind
        # (REGISTRATION_KINDS), for metrics.
        self._on_route_query = on_route_query or (lambda _outcome: None)
        self._on_registration = on_registration or (lambda _kind: None)

    async def RegisterBroker(self, request: Any, context: Any) -> Any:
        return await _answer(context, self._register(request))

    async def UnregisterBroker(self, request: Any, context: Any) -> Any:
        return await _answer(context, self._unregister(request))

    async def QueryRoute(self, request: Any, context: Any) -> Any:
        return await _answer(context, self._query_route(request))

    async def GetClusterInfo(self, request: Any, context: Any) -> Any:
        return await _answer(context, self._cluster_info())

    async def GetStatus(self, request: Any, context: Any) -> Any:
        return await _answer(context, self._status())

    async def _register(self, request: Any) -> Any:
        reg = registration_from_wire(request)
        try:
            master = await self._registry.register(reg)
        except FullRegistrationNeededError as e:
            log.info("asking for a full registration: %s", e)
            self._on_registration("full_needed")
            return nameserver_pb2.RegisterBrokerResponse(full_registration_needed=True)
        self._on_registration("full" if reg.delta is None else "incremental")
        return nameserver_pb2.RegisterBrokerResponse(
            master_address=master.address, master_ha_address=master.ha_address
        )

    async def _unregister(self, request: Any) -> Any:
        identity = request.identity
        cluster = _name("identity.cluster", identity.cluster)
        broker_name = _name("identity.broker_name", identity.broker_name)
        broker_id = _broker_id(identity.broker_id)
        address = _address("address", request.address)
        # Unknown brokers are fine: a clean shutdown may race the expiry scan, or be retried.
        await self._registry.unregister(cluster, broker_name, broker_id, address)
        return nameserver_pb2.UnregisterBrokerResponse()

    async def _query_route(self, request: Any) -> Any:
        outcome = "invalid"
        try:
            topic = _topic("topic", request.topic)
            outcome = "unavailable"
            route = await self._registry.route(topic)
            if route is None:
                outcome = "not_found"
                raise not_found(f"no broker group serves topic {topic!r}", E.ROUTE_NOT_FOUND)
            outcome = "found"
            return route_to_wire(route)
        finally:
            self._on_route_query(outcome)

    async def _cluster_info(self) -> Any:
        clusters = await self._registry.cluster_info()
        return nameserver_pb2.GetClusterInfoResponse(
            clusters=[
                nameserver_pb2.ClusterData(
                    cluster=c.cluster,
                    groups=[broker_data_to_wire(g) for g in c.groups],
                    brokers=[_broker_live_to_wire(b) for b in c.brokers],
                )
                for c in clusters
            ]
        )

    async def _status(self) -> Any:
        s = await self._registry.status()
        return nameserver_pb2.GetStatusResponse(
            registry=s.registry,
            stale=s.stale,
            last_update_ms=s.last_update_ms,
            brokers=s.brokers,
            detail=s.detail,
        )
