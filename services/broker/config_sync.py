"""Config sync: a slave copies its master's topics, subscription groups (with their consume
model and settings), runtime settings (``runtime_config``) and consumer offsets (RocketMQ's
SlaveSynchronize), so that consumers reading from the slave, or a slave that becomes master,
find the same topics, groups, settings and positions.

Every ``config_sync_interval_ms`` (3 s) the slave asks with the data versions it holds; the
master leaves out tables whose version matches, except on a full sync (at most every
``config_full_sync_interval_ms``, 60 s, and the first after start).

Offsets go both ways, whole, every time (RocketMQ #1094): the slave sends its table with the
request and the master takes every offset whose version is newer than its own, then answers with
its table, of which the slave takes the same. So commits a slave took while its master was away
reach the master once it is back, an old master that returns as a slave takes the new master's
offsets rather than pushing its older ones, and no committed offset moves backwards on either
side (``offsets.supersedes``: versions, no clocks).

``answer`` is the master's side (tables in, message out; it merges the caller's offsets);
``ConfigSync`` the slave's loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import grpc

from tidemq.protos import broker_pb2, broker_pb2_grpc, common_pb2
from tidemq.protos.signing import Credentials
from tidemq.protos.tls import TlsSettings, aio_channel
from tidemq.services.broker.groups import SubscriptionGroupManager, group_of, group_proto
from tidemq.services.broker.offsets import CommittedOffset, OffsetManager
from tidemq.services.broker.runtime_config import RuntimeConfig
from tidemq.services.broker.topics import DataVersion, TopicConfig, TopicManager
from tidemq.storage.clock import now_ms

log = logging.getLogger(__name__)

SYNC_TIMEOUT_S = 10.0


def version_proto(v: DataVersion) -> Any:
    return common_pb2.DataVersion(**asdict(v))


def version_of(m: Any) -> DataVersion:
    return DataVersion(m.state_version, m.counter, m.timestamp_ms)


def topic_of(t: Any) -> TopicConfig:
    return TopicConfig(
        t.topic, t.read_queue_nums, t.write_queue_nums, t.perm, t.order, dict(t.attributes)
    )


def offset_protos(entries: list[CommittedOffset]) -> list[Any]:
    return [
        broker_pb2.ConsumerOffset(
            group=o.group,
            topic=o.topic,
            queue_id=o.queue_id,
            offset=o.offset,
            generation=o.generation,
        )
        for o in entries
    ]


def offsets_of(protos: Any) -> list[CommittedOffset]:
    return [CommittedOffset(o.group, o.topic, o.queue_id, o.offset, o.generation) for o in protos]


def answer(
    request: Any,
    topics: TopicManager,
    groups: SubscriptionGroupManager,
    offsets: OffsetManager,
    topic_proto: Callable[[TopicConfig], Any],
    caller: str = "",
    runtime: RuntimeConfig | None = None,
) -> Any:
    """The master's SyncConfigResponse to ``request``, after taking the caller's newer
    offsets."""
    if request.offsets:
        handed_back = offsets.merge(offsets_of(request.offsets))
        if handed_back.taken:
            log.info(
                "config sync: took %d newer consumer offsets from %s",
                handed_back.taken,
                caller or "a slave",
            )
    response = broker_pb2.SyncConfigResponse(
        topics_version=version_proto(topics.data_version),
        groups_version=version_proto(groups.data_version),
    )
    if request.full or version_of(request.topics_version) != topics.data_version:
        response.topics_included = True
        response.topics.extend(topic_proto(t) for t in topics.all())
    if request.full or version_of(request.groups_version) != groups.data_version:
        response.groups_included = True
        response.groups.extend(group_proto(g) for g in groups.all())
    response.offsets.extend(offset_protos(offsets.entries()))
    if runtime is not None:
        response.runtime_settings_included = True
        response.runtime_settings_json = runtime.to_json()
    return response


class ConfigSync:
    """The slave's side: one sync per interval from the master the registry names."""

    def __init__(
        self,
        topics: TopicManager,
        groups: SubscriptionGroupManager,
        offsets: OffsetManager,
        interval_ms: int,
        full_interval_ms: int,
        on_topics_changed: Callable[[], object],
        tls: TlsSettings | None = None,
        credentials: Credentials | None = None,
        runtime: RuntimeConfig | None = None,
    ) -> None:
        self.tls = tls  # the broker's own certificate, when the cluster speaks TLS
        self.credentials = credentials
        self.topics = topics
        self.groups = groups
        self.offsets = offsets
        self.runtime = runtime
        self.interval_ms = interval_ms
        self.full_interval_ms = full_interval_ms
        self.on_topics_changed = on_topics_changed
        self.master_address = ""
        self.last_sync_ms = 0  # wall clock of the last sync that succeeded
        self._last_full_mono = -float("inf")
        self._failing = False
        self._kept = 0
        self._master_known = asyncio.Event()

    def set_master(self, address: str) -> None:
        if address and address != self.master_address:
            self.master_address = address
            self._last_full_mono = -float("inf")  # a new master: start with a full sync
            self._master_known.set()

    async def run(self) -> None:
        await self._master_known.wait()  # the first sync as soon as the registry names a master
        while True:
            await self.sync_once()
            await asyncio.sleep(self.interval_ms / 1000)

    async def sync_once(self) -> bool:
        """One sync; returns whether it succeeded (failures are logged once per outage)."""
        address = self.master_address
        now = time.monotonic()
        full = (now - self._last_full_mono) * 1000 >= self.full_interval_ms
        request = self.request(full)
        try:
            async with aio_channel(address, self.tls, credentials=self.credentials) as channel:
                stub = broker_pb2_grpc.BrokerStub(channel)
                response = await stub.SyncConfig(request, timeout=SYNC_TIMEOUT_S)
        except grpc.aio.AioRpcError as e:
            if not self._failing:
                log.warning("config sync from %s failed: %s", address, e.details())
            self._failing = True
            return False
        if self._failing:
            log.info("config sync from %s works again", address)
        self._failing = False
        if await asyncio.to_thread(self.apply, response):
            self.on_topics_changed()
        if full:
            self._last_full_mono = now
        self.last_sync_ms = now_ms()
        return True

    def request(self, full: bool) -> Any:
        """What this slave asks with: the versions it holds, and its offsets to hand back."""
        return broker_pb2.SyncConfigRequest(
            topics_version=version_proto(self.topics.data_version),
            groups_version=version_proto(self.groups.data_version),
            full=full,
            offsets=offset_protos(self.offsets.entries()),
        )

    def apply(self, response: Any) -> bool:
        """Store what the master sent (file writes: called off the event loop); returns whether
        the topics changed."""
        topics_changed = response.topics_included and self.topics.replace_all(
            [topic_of(t) for t in response.topics], version_of(response.topics_version)
        )
        if topics_changed:
            log.info("config sync: %d topics from the master", len(response.topics))
        groups = [group_of(g) for g in response.groups]
        if response.groups_included and self.groups.replace_all(
            groups, version_of(response.groups_version)
        ):
            log.info("config sync: %d subscription groups from the master", len(response.groups))
        if self.runtime is not None and response.runtime_settings_included:
            self.runtime.replace_all(response.runtime_settings_json)
        merged = self.offsets.merge(offsets_of(response.offsets))
        if merged.kept != self._kept:
            # Logged when it changes, not every sync: the master had just taken them with the
            # request, so a count here means a commit on the master raced this sync or the
            # master refused them (an older tidemq).
            log.info(
                "config sync: %d local consumer offsets are newer than the master's and kept",
                merged.kept,
            )
            self._kept = merged.kept
        return bool(topics_changed)
