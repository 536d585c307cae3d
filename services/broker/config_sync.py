"""Config sync: a slave copies its master's topics, subscription groups (with their consume
model and settings), runtime settings (``runtime_config``) and consumer offsets (RocketMQ's
SlaveSynchronize), so that consumers reading from the slave, or a slave that becomes master,
find the same topics, groups, settings and positions.

Every ``config_sync_interval_ms`` (3 s) the slave asks with the data versions it holds; the
master leaves out tables whose version matches, except on a full sync (at most every
``config_full_sync_interval_ms``, 10 min, and the first after start or after a new master).

Incremental (a slave that sets ``incremental``; what a sync costs is what changed, not what is
held): for a table whose version differs the master answers the topics or groups changed since
the slave's version (``changes_since``) and the slave applies them (``apply_changes``), taking
the master's version as it is. When the master's change log does not reach back to the slave's
version (another state version, a slave far behind, a restarted master) the answer is the
whole table and the slave replaces its own (``replace_all``), as for an older slave.

Offsets go both ways (RocketMQ #1094): the slave sends its offsets with the request and the
master takes every offset whose version is newer than its own, then answers with its own, of
which the slave takes the same. So commits a slave took while its master was away reach the
master once it is back, an old master that returns as a slave takes the new master's offsets
rather than pushing its older ones, and no committed offset moves backwards on either side
(``offsets.supersedes``: versions, no clocks). Incremental, each side sends only the offsets
changed since the last sync that succeeded: the slave those after its own change count at its
last successful request, the master those after the cursor (``OffsetCursor``) it answered last
time. Merging is idempotent, so an offset sent twice (a sync that failed after the master took
it) costs nothing; a full sync, a new master or a restarted one (another cursor instance) sends
whole tables again.

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
from tidemq.services.broker.groups import (
    GroupChanges,
    SubscriptionGroupManager,
    group_of,
    group_proto,
)
from tidemq.services.broker.offsets import CommittedOffset, OffsetManager
from tidemq.services.broker.runtime_config import RuntimeConfig
from tidemq.services.broker.topics import DataVersion, TopicChanges, TopicConfig, TopicManager
from tidemq.storage.clock import now_ms

log = logging.getLogger(__name__)

SYNC_TIMEOUT_S = 10.0
SYNC_MAX_BYTES = 256 << 20


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
    incremental = request.incremental and not request.full
    _answer_table(request, response, "topics", topics, topic_proto, incremental)
    _answer_table(request, response, "groups", groups, group_proto, incremental)
    _answer_offsets(request, response, offsets, incremental)
    if runtime is not None:
        response.runtime_settings_included = True
        response.runtime_settings_json = runtime.to_json()
    return response


def _answer_table(
    request: Any,
    response: Any,
    kind: str,
    table: TopicManager | SubscriptionGroupManager,
    to_proto: Callable[[Any], Any],
    incremental: bool,
) -> None:
    """Put ``kind`` (``topics`` or ``groups``: the message's fields are named alike) in the
    answer when the slave's version differs or the sync is full: the changes since the slave's
    version when the master had that version and still knows them, else the whole table."""
    asked_proto = getattr(request, f"{kind}_version")
    asked = version_of(asked_proto)
    if not request.full and asked == table.data_version:
        return
    setattr(response, f"{kind}_included", True)
    known = incremental and table.had_version(asked)
    changes = table.changes_since(asked) if known else None
    if changes is None:
        getattr(response, kind).extend(to_proto(x) for x in table.all())
        return
    setattr(response, f"{kind}_incremental", True)
    getattr(response, kind).extend(to_proto(x) for x in changes.upserted)
    getattr(response, f"removed_{kind}").extend(changes.removed)
    getattr(response, f"{kind}_version").CopyFrom(version_proto(changes.data_version))
    getattr(response, f"{kind}_since").CopyFrom(asked_proto)


def _answer_offsets(request: Any, response: Any, offsets: OffsetManager, incremental: bool) -> None:
    changed = None
    if incremental and request.HasField("offsets_since"):
        changed = offsets.changes_since(request.offsets_since.instance, request.offsets_since.seq)
    if changed is not None:
        entries, seq = changed
        response.offsets_incremental = True
    else:
        entries, seq = offsets.entries_at()
    response.offsets.extend(offset_protos(entries))
    if request.incremental:  # an older slave has no use for it
        response.offsets_cursor.instance = offsets.instance
        response.offsets_cursor.seq = seq


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
        # Incremental state: the master's offset cursor, this slave's own offset change count
        # at its last request and at its last successful one (None: send every offset).
        self._offsets_cursor: Any = None
        self._asked_seq: int | None = None
        self._sent_seq: int | None = None

    def set_master(self, address: str) -> None:
        if address and address != self.master_address:
            self.master_address = address
            self._last_full_mono = -float("inf")  # a new master: start with a full sync
            self._offsets_cursor = None
            self._sent_seq = None
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
            async with aio_channel(
                address,
                self.tls,
                # A full sync carries whole tables: at the topic and group limits, tens of MB
                # (the master's own max_request_bytes bounds what it sends).
                options=[("grpc.max_receive_message_length", SYNC_MAX_BYTES)],
                credentials=self.credentials,
            ) as channel:
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
        self._sent_seq = self._asked_seq  # the master has the offsets sent with it
        if full:
            self._last_full_mono = now
        self.last_sync_ms = now_ms()
        return True

    def request(self, full: bool) -> Any:
        """What this slave asks with: the versions it holds, and its offsets to hand back (those
        changed since the last sync that succeeded, or all of them)."""
        changed = None
        if not full and self._sent_seq is not None:
            changed = self.offsets.changes_since(self.offsets.instance, self._sent_seq)
        entries, self._asked_seq = changed or self.offsets.entries_at()
        request = broker_pb2.SyncConfigRequest(
            topics_version=version_proto(self.topics.data_version),
            groups_version=version_proto(self.groups.data_version),
            full=full,
            offsets=offset_protos(entries),
            incremental=True,
        )
        if not full and self._offsets_cursor is not None:
            request.offsets_since.CopyFrom(self._offsets_cursor)
        return request

    def apply(self, response: Any) -> bool:
        """Store what the master sent (file writes: called off the event loop); returns whether
        the topics changed."""
        topics_changed = False
        if response.topics_included:
            topics_changed = self._apply_topics(response)
        if response.groups_included:
            self._apply_groups(response)
        if self.runtime is not None and response.runtime_settings_included:
            self.runtime.replace_all(response.runtime_settings_json)
        merged = self.offsets.merge(offsets_of(response.offsets))
        if merged.seq_before == self._asked_seq:
            # Nothing was committed here since the request: what the merge changed came from
            # the master, which need not get it back.
            self._asked_seq = merged.seq_after
        if merged.kept != self._kept:
            # Logged when it changes, not every sync: the master had just taken them with the
            # request, so a count here means a commit on the master raced this sync or the
            # master refused them (an older tidemq).
            log.info(
                "config sync: %d local consumer offsets are newer than the master's and kept",
                merged.kept,
            )
            self._kept = merged.kept
        # A master older than incremental sync sends no cursor: every offset each time.
        self._offsets_cursor = (
            response.offsets_cursor if response.HasField("offsets_cursor") else None
        )
        return topics_changed

    def _apply_topics(self, response: Any) -> bool:
        version = version_of(response.topics_version)
        if not response.topics_incremental:
            changed = self.topics.replace_all([topic_of(t) for t in response.topics], version)
            if changed:
                log.info("config sync: %d topics from the master", len(response.topics))
            return changed
        changes = TopicChanges(
            [topic_of(t) for t in response.topics], list(response.removed_topics), version
        )
        applied = self.topics.apply_changes(changes, version_of(response.topics_since))
        if applied is None:
            # The table moved since the request (a failover's restored topic): the next sync
            # asks from where it is now.
            log.info("config sync: topic changes not applied (the table moved); asking again")
            return False
        if applied:
            log.info(
                "config sync: %d topics changed and %d deleted on the master",
                len(changes.upserted),
                len(changes.removed),
            )
        return applied

    def _apply_groups(self, response: Any) -> None:
        version = version_of(response.groups_version)
        groups = [group_of(g) for g in response.groups]
        if not response.groups_incremental:
            if self.groups.replace_all(groups, version):
                log.info("config sync: %d subscription groups from the master", len(groups))
            return
        changes = GroupChanges(groups, list(response.removed_groups), version)
        applied = self.groups.apply_changes(changes, version_of(response.groups_since))
        if applied is None:
            log.info("config sync: group changes not applied (the table moved); asking again")
        elif applied:
            log.info(
                "config sync: %d subscription groups changed and %d deleted on the master",
                len(groups),
                len(changes.removed),
            )
