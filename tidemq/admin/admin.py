"""``Admin``: topics, consumer groups, offsets and cluster status, for scripts and the CLI.
Consumer group settings and receive state are in ``consumer_groups``, dead-letter queues in
``dead_letters``, pending delayed messages in ``delayed``, open transactions in ``transactions``.

Topics live on brokers; a topic "in a cluster" is the same topic config on every master of the
cluster (RocketMQ's ``updateTopic -c``). ``create_topic`` waits until the nameservers route the
topic, so a script can send to it on the next line.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from tidemq._runtime import Channels, LoopThread, nameserver_addresses
from tidemq.admin.broker_config import AsyncBrokerConfig, BrokerSetting
from tidemq.admin.consumer_groups import AsyncConsumerGroups, ConsumerGroups
from tidemq.admin.dead_letters import AsyncDeadLetters, DeadLetters
from tidemq.admin.delayed import AsyncDelayed, Delayed
from tidemq.admin.messages import AsyncMessages, Messages
from tidemq.admin.offset_tables import AsyncOffsetTables, OffsetTable
from tidemq.admin.status import broker_json, broker_status_json, nameserver_json
from tidemq.admin.transactions import AsyncTransactions, Transactions
from tidemq.errors import (
    InvalidArgumentError,
    RouteNotFoundError,
    TidemqError,
    TopicNotFoundError,
    from_rpc_error,
)
from tidemq.protos import broker_pb2, broker_pb2_grpc, common_pb2, nameserver_pb2
from tidemq.protos.signing import Credentials
from tidemq.protos.tls import TlsSettings
from tidemq.routes import AUTO_CREATE_TOPIC, NameServerClient, TopicRoute

CALL_TIMEOUT_S = 10.0
# A switchover waits for its target to catch up (5 s) and then to take over (10 s).
SWITCHOVER_TIMEOUT_S = 20.0
ROUTE_WAIT_S = 10.0
PERMS = {
    "r": common_pb2.PERM_READ,
    "w": common_pb2.PERM_WRITE,
    "rw": common_pb2.PERM_READ | common_pb2.PERM_WRITE,
}


@dataclass(frozen=True)
class QueueStatus:
    broker: str
    queue_id: int
    min_offset: int
    max_offset: int
    committed_offset: int | None = None

    @property
    def lag(self) -> int | None:
        if self.committed_offset is None:
            return None
        return max(0, self.max_offset - self.committed_offset)


class AsyncAdmin(
    AsyncConsumerGroups,
    AsyncDeadLetters,
    AsyncDelayed,
    AsyncTransactions,
    AsyncOffsetTables,
    AsyncMessages,
    AsyncBrokerConfig,
):
    def __init__(
        self,
        nameserver: str | Sequence[str] | None = None,
        *,
        tls: TlsSettings | bool | None = None,
        credentials: Credentials | bool | None = None,
    ) -> None:
        """``tls`` and ``credentials`` as the clients' settings of those names
        (docs/security.md)."""
        self._channels = Channels(tls, credentials)
        self.nameserver = NameServerClient(nameserver_addresses(nameserver), self._channels)

    async def close(self) -> None:
        await self._channels.close()

    async def __aenter__(self) -> AsyncAdmin:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(
        self, address: str, method: str, request: Any, timeout_s: float = CALL_TIMEOUT_S
    ) -> Any:
        stub = self._channels.stub(address, broker_pb2_grpc.BrokerStub)
        try:
            return await getattr(stub, method)(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e, f"broker {address}") from None

    # ------------------------------------------------------------------ cluster
    async def cluster_info(self) -> Any:
        return await self.nameserver.cluster_info()

    async def masters(self, cluster: str | None = None) -> dict[str, str]:
        """broker name -> master address, for one cluster or all."""
        info = await self.cluster_info()
        out: dict[str, str] = {}
        for c in info.clusters:
            if cluster and c.cluster != cluster:
                continue
            for g in c.groups:
                if 0 in g.addresses:
                    out[g.broker_name] = g.addresses[0]
        return out

    async def cluster_status(self, daily_days: int = 0) -> dict[str, Any]:
        """Every broker the nameservers know, with its store figures (JSON-friendly); with
        ``daily_days``, each broker's messages in/out per topic per day of the last days."""
        info = await self.cluster_info()
        status = await self.nameserver.call("GetStatus", nameserver_pb2.GetStatusRequest())
        clusters = []
        for c in info.clusters:
            brokers = []
            for live in sorted(
                c.brokers,
                key=lambda b: (b.broker.identity.broker_name, b.broker.identity.broker_id),
            ):
                entry = broker_json(live)
                try:
                    st = await self._call(
                        live.broker.address,
                        "GetBrokerStatus",
                        broker_pb2.GetBrokerStatusRequest(daily_days=daily_days),
                    )
                    entry.update(broker_status_json(st))
                    entry["reachable"] = True
                except TidemqError as e:
                    entry["reachable"] = False
                    entry["error"] = str(e)
                brokers.append(entry)
            clusters.append({"cluster": c.cluster, "brokers": brokers})
        return {"nameserver": nameserver_json(status), "clusters": clusters}

    async def switchover(self, broker_name: str, target_broker_id: int) -> dict[str, int]:
        """Planned handover of a group's mastership (automatic failover) to an in-sync broker:
        the master stops acknowledging, waits until the target holds every byte, and lets it
        take over at once. Returns the new epoch, the new master and how long sends paused."""
        masters = await self.masters()
        address = masters.get(broker_name)
        if address is None:
            raise RouteNotFoundError(
                f"broker group {broker_name!r} has no master now", code="NOT_MASTER"
            )
        resp = await self._call(
            address,
            "Switchover",
            broker_pb2.SwitchoverRequest(
                broker_name=broker_name, target_broker_id=target_broker_id
            ),
            timeout_s=SWITCHOVER_TIMEOUT_S,
        )
        return {
            "epoch": resp.epoch,
            "master_id": resp.master_id,
            "writes_paused_ms": resp.writes_paused_ms,
        }

    # ------------------------------------------------------------------ topics
    async def create_topic(
        self,
        topic: str,
        *,
        queues: int = 8,
        read_queues: int | None = None,
        write_queues: int | None = None,
        perm: str = "rw",
        order: bool = False,
        cluster: str | None = None,
        wait: bool = True,
        attributes: Mapping[str, str] | None = None,
    ) -> list[str]:
        """Creates (or updates) the topic on every master of ``cluster`` (default: all);
        returns the broker names. With ``wait``, returns once the nameservers route it.
        ``attributes``: the topic's attributes, such as ``retention.policy`` (``archive`` or
        ``delete``, docs/archive.md)."""
        if perm not in PERMS:
            raise InvalidArgumentError(
                f"perm must be one of {sorted(PERMS)}", code="INVALID_ARGUMENT"
            )
        masters = await self.masters(cluster)
        if not masters:
            where = f"cluster {cluster!r}" if cluster else "any cluster"
            raise RouteNotFoundError(f"no master broker in {where}", code="ROUTE_NOT_FOUND")
        config = common_pb2.TopicConfig(
            topic=topic,
            read_queue_nums=read_queues or queues,
            write_queue_nums=write_queues or queues,
            perm=PERMS[perm],
            order=order,
            attributes=dict(attributes or {}),
        )
        request = broker_pb2.CreateTopicRequest(topic=config)
        await asyncio.gather(*(self._call(a, "CreateTopic", request) for a in masters.values()))
        if wait:
            await self._wait_route(topic, lambda r: r is not None and set(masters) <= set(r.groups))
        return sorted(masters)

    async def _wait_route(self, topic: str, ok: Callable[[TopicRoute | None], bool]) -> None:
        deadline = time.monotonic() + ROUTE_WAIT_S
        while True:
            try:
                route: TopicRoute | None = await self.nameserver.query_route(topic)
            except RouteNotFoundError:
                route = None
            if ok(route):
                return
            if time.monotonic() > deadline:
                raise TidemqError(
                    f"the nameservers did not update the route of {topic!r} within "
                    f"{ROUTE_WAIT_S:.0f} s; the brokers may not be registered",
                    code="TIMEOUT",
                    retriable=True,
                )
            await asyncio.sleep(0.1)

    async def delete_topic(self, topic: str, *, wait: bool = True) -> list[str]:
        """Deletes the topic from every broker serving it; returns the broker names."""
        route = await self.route(topic)
        names = []
        for name, g in route.groups.items():
            if g.master is None:
                continue
            try:
                await self._call(
                    g.master, "DeleteTopic", broker_pb2.DeleteTopicRequest(topic=topic)
                )
                names.append(name)
            except TopicNotFoundError:
                pass
        if wait:
            await self._wait_route(topic, _gone)
        return sorted(names)

    async def route(self, topic: str) -> TopicRoute:
        return await self.nameserver.query_route(topic)

    async def list_topics(self) -> dict[str, dict[str, Any]]:
        """topic -> {"brokers": [...], "read_queues": n, "write_queues": n, "perm": p}."""
        masters = await self.masters()
        out: dict[str, dict[str, Any]] = {}
        for name, address in sorted(masters.items()):
            resp = await self._call(address, "ListTopics", broker_pb2.ListTopicsRequest())
            for t in resp.topics:
                if t.topic == AUTO_CREATE_TOPIC:
                    continue
                entry = out.setdefault(
                    t.topic, {"brokers": [], "read_queues": 0, "write_queues": 0, "perm": t.perm}
                )
                entry["brokers"].append(name)
                entry["read_queues"] += t.read_queue_nums
                entry["write_queues"] += t.write_queue_nums
        return out

    async def queue_status(self, topic: str, group: str | None = None) -> list[QueueStatus]:
        """Per queue: min/max offsets, and with ``group`` its committed offset (and lag)."""
        route = await self.route(topic)
        out: list[QueueStatus] = []
        for name in sorted(route.groups):
            address = route.groups[name].read_address()
            if address is None:
                continue
            resp = await self._call(
                address, "GetQueueOffsets", broker_pb2.GetQueueOffsetsRequest(topic=topic)
            )
            for q in resp.queues:
                committed = None
                if group:
                    c = await self._call(
                        address,
                        "QueryConsumerOffset",
                        broker_pb2.QueryConsumerOffsetRequest(
                            group=group, topic=topic, queue_id=q.queue_id
                        ),
                    )
                    committed = int(c.offset) if c.found else None
                out.append(QueueStatus(name, q.queue_id, q.min_offset, q.max_offset, committed))
        return out

    # ------------------------------------------------------------------ groups
    async def group_members(self, group: str, topic: str) -> list[str]:
        route = await self.route(topic)
        for name in sorted(route.groups):
            address = route.groups[name].read_address()
            if address is not None:
                resp = await self._call(
                    address, "GetConsumerList", broker_pb2.GetConsumerListRequest(group=group)
                )
                return sorted(resp.client_ids)
        return []

    async def reset_offsets(
        self,
        group: str,
        topic: str,
        to: str | int | None = None,
        *,
        offset: int | None = None,
        queue_id: int | None = None,
        broker: str | None = None,
    ) -> list[QueueStatus]:
        """Moves the group's committed offsets to ``"first"``, ``"last"``, the first message
        stored at or after a timestamp (``to`` in ms), or an explicit ``offset`` (kept within
        each queue's [min, max], as Kafka's --to-offset). Every queue of the topic, or only
        ``queue_id`` (on every broker group, or only ``broker``). Stop the group's consumers
        first: a running consumer commits its own position over this."""
        if (to is None) == (offset is None):
            raise InvalidArgumentError(
                "reset to 'first', 'last', a timestamp in ms, or an explicit offset",
                code="INVALID_ARGUMENT",
            )
        if offset is not None and offset < 0:
            raise InvalidArgumentError("an offset is >= 0", code="INVALID_ARGUMENT")
        if to is not None and not (to in ("first", "last") or isinstance(to, int)):
            raise InvalidArgumentError(
                "reset to 'first', 'last' or a timestamp in ms", code="INVALID_ARGUMENT"
            )
        route = await self.route(topic)
        chosen = [
            s
            for s in await self.queue_status(topic)
            if (queue_id is None or s.queue_id == queue_id)
            and (broker is None or s.broker == broker)
        ]
        if not chosen:
            where = f" queue {queue_id}" if queue_id is not None else ""
            where += f" on {broker}" if broker else ""
            raise InvalidArgumentError(
                f"topic {topic!r} has no{where or ' readable'} queue", code="INVALID_ARGUMENT"
            )
        out = []
        for status in chosen:
            address = route.groups[status.broker].master
            if address is None:
                raise TidemqError(
                    f"broker group {status.broker} has no master to commit on",
                    code="NOT_MASTER",
                    retriable=True,
                )
            if offset is not None:
                target = min(max(offset, status.min_offset), status.max_offset)
            elif to == "first":
                target = status.min_offset
            elif to == "last":
                target = status.max_offset
            else:
                resp = await self._call(
                    address,
                    "SearchOffset",
                    broker_pb2.SearchOffsetRequest(
                        topic=topic, queue_id=status.queue_id, timestamp_ms=int(to or 0)
                    ),
                )
                target = int(resp.offset)
            await self._call(
                address,
                "CommitOffset",
                broker_pb2.CommitOffsetRequest(
                    group=group, topic=topic, queue_id=status.queue_id, offset=target, reset=True
                ),
            )
            out.append(
                QueueStatus(
                    status.broker, status.queue_id, status.min_offset, status.max_offset, target
                )
            )
        return out


def _gone(route: TopicRoute | None) -> bool:
    return route is None


class Admin(ConsumerGroups, DeadLetters, Delayed, Transactions, Messages):
    """The blocking admin client; every method of ``AsyncAdmin``, waiting for the answer."""

    def __init__(
        self,
        nameserver: str | Sequence[str] | None = None,
        *,
        tls: TlsSettings | bool | None = None,
        credentials: Credentials | bool | None = None,
    ) -> None:
        self._runner = LoopThread("tidemq-admin")
        self._core: AsyncAdmin = AsyncAdmin(nameserver, tls=tls, credentials=credentials)

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._runner.finish(self._core.close)

    def cluster_status(self, daily_days: int = 0) -> dict[str, Any]:
        return self._runner.run(self._core.cluster_status(daily_days))

    def masters(self, cluster: str | None = None) -> dict[str, str]:
        return self._runner.run(self._core.masters(cluster))

    def offset_tables(self) -> tuple[list[OffsetTable], dict[str, str]]:
        return self._runner.run(self._core.offset_tables())

    def broker_config(self, broker_group: str, broker_id: int = 0) -> list[BrokerSetting]:
        return self._runner.run(self._core.broker_config(broker_group, broker_id))

    def update_broker_config(
        self, broker_group: str, changes: Mapping[str, str]
    ) -> tuple[list[str], list[BrokerSetting]]:
        return self._runner.run(self._core.update_broker_config(broker_group, changes))

    def create_topic(self, topic: str, **kwargs: Any) -> list[str]:
        return self._runner.run(self._core.create_topic(topic, **kwargs))

    def delete_topic(self, topic: str, *, wait: bool = True) -> list[str]:
        return self._runner.run(self._core.delete_topic(topic, wait=wait))

    def list_topics(self) -> dict[str, dict[str, Any]]:
        return self._runner.run(self._core.list_topics())

    def route(self, topic: str) -> TopicRoute:
        return self._runner.run(self._core.route(topic))

    def switchover(self, broker_name: str, target_broker_id: int) -> dict[str, int]:
        return self._runner.run(self._core.switchover(broker_name, target_broker_id))

    def queue_status(self, topic: str, group: str | None = None) -> list[QueueStatus]:
        return self._runner.run(self._core.queue_status(topic, group))

    def group_members(self, group: str, topic: str) -> list[str]:
        return self._runner.run(self._core.group_members(group, topic))

    def reset_offsets(
        self, group: str, topic: str, to: str | int | None = None, **where: Any
    ) -> list[QueueStatus]:
        """``AsyncAdmin.reset_offsets``; ``where``: ``offset``, ``queue_id``, ``broker``."""
        return self._runner.run(self._core.reset_offsets(group, topic, to, **where))
