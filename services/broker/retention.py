"""What the broker tells its store's retention (``tidemq.storage.retention``), which knows nothing
of slaves or consumer groups: the replica floor, from the master's replication tracker, and every
group's committed queue offsets, from the OffsetManager, and the receive log's position its
oldest kept snapshot needs (``receive.journal``), and the pinned positions of state still pending
in system topics (the timer's oldest undelivered record, the oldest open transaction's half),
which no pass deletes whatever its age. All are read in the store's housekeeping thread at each
retention pass."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tidemq.replication.master_link import ReplicationServicer
from tidemq.replication.retention_floor import replica_floor
from tidemq.services.broker.offsets import OffsetManager
from tidemq.services.broker.topics import RETENTION_POLICY_ATTRIBUTE, TopicManager
from tidemq.storage import MessageStore
from tidemq.storage.cleaner import QueuePosition


def wire_retention_floors(
    store: MessageStore,
    replication: Callable[[], ReplicationServicer | None],
    offsets: OffsetManager,
    receive_log: Callable[[], QueuePosition] | None = None,
    pinned: Sequence[Callable[[], QueuePosition | None]] = (),
) -> None:
    """``replication`` returns the master's Replication service once the broker has one (before
    the store opens, so no retention pass runs without the floors). Each of ``pinned`` returns
    the position of its oldest pending record, or None when nothing is pending."""

    def replicas() -> int | None:
        master = replication()
        if master is None or not master.active:
            return None  # a slave, or a master an election superseded: no slave waits on it
        return replica_floor(master.tracker, store.log.max_offset, master.confirmed_offset)

    def consumers() -> list[QueuePosition]:
        positions = [(o.topic, o.queue_id, o.offset) for o in offsets.entries()]
        if receive_log is not None:
            positions.append(receive_log())
        return positions

    def pins() -> list[QueuePosition]:
        return [p for p in (pin() for pin in pinned) if p is not None]

    store.set_retention_floors(replicas=replicas, consumers=consumers, pinned=pins)


def wire_archive(
    store: MessageStore,
    replication: Callable[[], ReplicationServicer | None],
    is_master: Callable[[], bool],
    topics: TopicManager,
    owner: str,
) -> None:
    """Only a master archives (a slave follows the manifest its master writes), and only what
    every in-sync slave holds: a failover truncates a deposed master's unreplicated tail, which
    must not be in the archive. A topic's ``retention.policy`` attribute overrides the
    archive's default policy. ``owner`` (CLUSTER/GROUP) claims the archive for this broker
    group; another group's archive is refused."""

    def safe_offset() -> int | None:
        master = replication()
        if master is None or not master.active:
            return None
        return replica_floor(master.tracker, store.log.max_offset, master.confirmed_offset)

    def topic_policy(topic: str) -> str | None:
        t = topics.get(topic)
        return t.attributes.get(RETENTION_POLICY_ATTRIBUTE) if t is not None else None

    store.set_archive_policy(
        enabled=is_master, topic_policy=topic_policy, safe_offset=safe_offset, owner=owner
    )
