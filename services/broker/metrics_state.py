"""What a scrape reads from the broker's live state: the store, topics, clients, queues, groups
and replication (``StateCollector``), and the retention counters (``RetentionCollector``).
``metrics`` registers both in the broker's registry."""

from __future__ import annotations

import heapq
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from tidemq.services.broker.clients import ClientRegistry
from tidemq.services.broker.config import BrokerConfig
from tidemq.services.broker.groups import SubscriptionGroupManager
from tidemq.services.broker.offsets import OffsetManager
from tidemq.services.broker.topics import TopicManager
from tidemq.storage import MessageStore
from tidemq.storage.clock import now_ms
from tidemq.storage.failure import STORE_FAILURE_REASONS
from tidemq.storage.retention import Held


class StateCollector:
    """Gauges read from the broker's state at scrape time, in the HTTP server's thread.

    The state it reads is owned by the event loop and the store's threads; it only takes
    copies (``dict.copy`` runs under the GIL without interleaving) and calls the store's read
    methods, which are safe from any thread."""

    def __init__(
        self,
        config: BrokerConfig,
        store: MessageStore,
        topics: TopicManager,
        clients: ClientRegistry,
        offsets: OffsetManager,
        groups: SubscriptionGroupManager,
        replication_status: Callable[[], Any],
    ) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self.clients = clients
        self.offsets = offsets
        self.groups = groups
        self.replication_status = replication_status

    def describe(self) -> Iterable[Metric]:
        # Names only, so the registry can refuse a clash without reading the store.
        return [
            GaugeMetricFamily(name, doc, labels=labels)
            for name, doc, labels in _STATE_METRICS.values()
        ]

    def collect(self) -> Iterable[Metric]:
        fam = {
            key: GaugeMetricFamily(name, doc, labels=labels)
            for key, (name, doc, labels) in _STATE_METRICS.items()
        }
        c = self.config
        fam["info"].add_metric(
            [c.cluster, c.broker_name, str(c.broker_id), c.role.value, c.advertised], 1
        )
        st = self.store.stats()
        fam["cl_min"].add_metric([], st.commitlog_min_offset)
        fam["cl_max"].add_metric([], st.commitlog_max_offset)
        fam["cl_flushed"].add_metric([], st.flushed_offset)
        fam["cl_dispatched"].add_metric([], st.dispatched_offset)
        fam["disk"].add_metric([], st.disk_usage_ratio)
        fam["writable"].add_metric([], 1 if st.writable else 0)
        failure = self.store.failure
        for reason in STORE_FAILURE_REASONS:
            fam["failed"].add_metric([reason], 1 if failure and failure.reason == reason else 0)
        fam["dispatch_disk_full"].add_metric([], 1 if self.store.dispatch_stalled else 0)
        fam["queues"].add_metric([], st.queues)
        fam["topics"].add_metric([], len(self.topics.topics))
        stamp_ms = now_ms()
        live: set[str] = set()
        for members in self.clients.groups.copy().values():
            live.update(
                cid
                for cid, m in members.copy().items()
                if stamp_ms - m.last_seen_ms <= self.clients.expiry_ms
            )
        fam["clients"].add_metric([], len(live))
        room = self.config.metrics_queue_series_max
        # Queues the store holds, not every queue configured: a queue never written to has
        # offsets 0 and no series, so a broker of 100,000 idle topics costs a scrape nothing.
        max_offsets: dict[tuple[str, int], int] = {}
        for topic, queue_ids in self.store.topics().items():
            config = self.topics.get(topic)
            if config is None:
                continue
            for q in queue_ids:
                if q < config.read_queue_nums:
                    max_offsets[topic, q] = self.store.max_offset(topic, q)
        for (topic, q), hi in list(max_offsets.items())[:room]:
            fam["q_max"].add_metric([topic, str(q)], hi)
            fam["q_min"].add_metric([topic, str(q)], self.store.min_offset(topic, q))
        fam["omitted"].add_metric(["queue"], max(len(max_offsets) - room, 0))
        lag: Tally[tuple[str, str]] = Tally()
        behind_by_queue: list[tuple[int, list[str], int]] = []
        for key, queues in self.offsets.table.copy().items():
            topic, _, group = key.partition("@")
            for q, committed in queues.copy().items():
                end = max_offsets.get((topic, q))
                if end is None:  # offsets of deleted topics or vanished queues are history
                    continue
                behind = max(end - committed, 0)
                lag[group, topic] += behind
                behind_by_queue.append((behind, [group, topic, str(q)], committed))
        # Per queue as well: one stuck queue hides in a topic's sum while the others move.
        # Past the limit, the queues furthest behind are the ones shown.
        fam["omitted"].add_metric(["consumer_queue"], max(len(behind_by_queue) - room, 0))
        if len(behind_by_queue) > room:
            behind_by_queue = heapq.nlargest(room, behind_by_queue, key=lambda x: x[0])
        for behind, labels, committed in sorted(behind_by_queue, key=lambda x: x[1]):
            fam["q_committed"].add_metric(labels, committed)
            fam["q_lag"].add_metric(labels, behind)
        for (group, topic), n in sorted(lag.items()):
            fam["lag"].add_metric([group, topic], n)
        fam["groups"].add_metric([], len(self.groups.groups))
        self._replication(fam)
        return list(fam.values())

    def _replication(self, fam: dict[str, GaugeMetricFamily]) -> None:
        rs = self.replication_status()
        if self.config.role.value == "SLAVE":
            fam["slave_connected"].add_metric([], 1 if rs.connected else 0)
            fam["slave_behind"].add_metric([], rs.lag_bytes)
            fam["config_sync"].add_metric([], rs.last_config_sync_ms / 1000)
            return
        fam["confirmed"].add_metric([], rs.confirmed_offset)
        fam["in_sync"].add_metric([], sum(1 for s in rs.slaves if s.in_sync))
        for s in rs.slaves:
            labels = [str(s.broker_id), s.address]
            fam["lag_bytes"].add_metric(labels, s.lag_bytes)
            fam["lag_seconds"].add_metric(labels, s.lag_seconds)
            fam["slave_in_sync"].add_metric(labels, 1 if s.in_sync else 0)


class RetentionCollector:
    """Counters of what retention did that an operator must know about (files a floor kept, files
    a forced pass deleted unread) and of slave resyncs, read from the store at scrape time."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def _families(self) -> list[CounterMetricFamily]:
        return [
            CounterMetricFamily(
                "tidemq_retention_files_kept",
                "CommitLog files retention wanted to delete and kept, each counted once: "
                "unreplicated (an in-sync slave has not acknowledged it), unconsumed (a forced "
                "pass, and a consumer group has not read it), pinned (it holds an undelivered "
                "delayed message or an open transaction) or unarchived (the broker archives and "
                "it is not archived yet)",
                labels=("reason",),
            ),
            CounterMetricFamily(
                "tidemq_retention_unconsumed_files_deleted",
                "Unexpired CommitLog files a forced pass deleted although a consumer group had not "
                "read them (force_delete_unconsumed)",
            ),
            CounterMetricFamily(
                "tidemq_replication_resyncs",
                "Times this slave set its store aside and resynchronised from its master's oldest "
                "file (it had fallen behind the master's retention)",
            ),
        ]

    def collect(self) -> Iterable[Metric]:
        kept, deleted, resyncs = self._families()
        counts = self.store.retention_counts
        for why in Held:
            kept.add_metric([why.value], counts.held[why])
        deleted.add_metric([], counts.unconsumed_deleted)
        resyncs.add_metric([], self.store.set_asides)
        return [kept, deleted, resyncs]


_STATE_METRICS: dict[str, tuple[str, str, Sequence[str]]] = {
    "info": (
        "tidemq_broker_info",
        "Constant 1, labelled with this broker's identity",
        ("cluster", "broker_name", "broker_id", "role", "address"),
    ),
    "cl_min": (
        "tidemq_store_commitlog_min_offset_bytes",
        "First CommitLog byte still kept (retention moves it up)",
        (),
    ),
    "cl_max": (
        "tidemq_store_commitlog_max_offset_bytes",
        "End of the CommitLog: bytes ever appended",
        (),
    ),
    "cl_flushed": (
        "tidemq_store_commitlog_flushed_offset_bytes",
        "CommitLog bytes known durable on disk",
        (),
    ),
    "cl_dispatched": (
        "tidemq_store_commitlog_dispatched_offset_bytes",
        "CommitLog bytes dispatched to ConsumeQueues and index (readable by consumers)",
        (),
    ),
    "disk": ("tidemq_store_disk_usage_ratio", "Used fraction of the store's disk", ()),
    "writable": (
        "tidemq_store_writable",
        "1 while the store accepts appends, 0 when it refuses them (disk full, fatal error)",
        (),
    ),
    "failed": (
        "tidemq_store_failed",
        "1 for the reason the store stopped writing until restarted (disk_io: the disk failed a "
        "flush or a write; flush, dispatch, housekeeping: an error there), 0 for the others",
        ("reason",),
    ),
    "dispatch_disk_full": (
        "tidemq_store_dispatch_disk_full",
        "1 while dispatch waits for space to write ConsumeQueue or index files (sends refused)",
        (),
    ),
    "queues": ("tidemq_store_consume_queues", "ConsumeQueues in the store", ()),
    "topics": ("tidemq_topics", "Topics configured on this broker", ()),
    "clients": (
        "tidemq_consumer_clients",
        "Distinct client ids with a live consumer group membership (heartbeat not expired)",
        (),
    ),
    "q_max": (
        "tidemq_queue_max_offset",
        "Next queue offset to be written (messages ever stored in the queue)",
        ("topic", "queue_id"),
    ),
    "q_min": (
        "tidemq_queue_min_offset",
        "First queue offset still readable (retention moves it up)",
        ("topic", "queue_id"),
    ),
    "lag": (
        "tidemq_consumer_lag_messages",
        "Messages stored but not yet committed by a group, summed over the topic's queues",
        ("group", "topic"),
    ),
    "q_committed": (
        "tidemq_consumer_offset",
        "Offset a group has committed in a queue (the next it will read)",
        ("group", "topic", "queue_id"),
    ),
    "q_lag": (
        "tidemq_consumer_queue_lag_messages",
        "Messages stored in a queue but not yet committed by a group (max offset - committed "
        "offset, never negative)",
        ("group", "topic", "queue_id"),
    ),
    "groups": ("tidemq_subscription_groups", "Subscription groups known to this broker", ()),
    "omitted": (
        "tidemq_metrics_queue_series_omitted",
        "Queues left out of the per-queue series past metrics_queue_series_max, by kind: queue "
        "(tidemq_queue_*_offset) or consumer_queue (tidemq_consumer_offset and "
        "tidemq_consumer_queue_lag_messages, which keep the queues furthest behind)",
        ("kind",),
    ),
    # Master side: one series per connected slave.
    "lag_bytes": (
        "tidemq_replication_slave_lag_bytes",
        "CommitLog bytes the master holds that the slave has not acknowledged",
        ("slave_id", "slave_address"),
    ),
    "lag_seconds": (
        "tidemq_replication_slave_lag_seconds",
        "Store-time distance from the master's newest record to the slave's (-1: unknown yet)",
        ("slave_id", "slave_address"),
    ),
    "slave_in_sync": (
        "tidemq_replication_slave_in_sync",
        "1 while the slave counts towards SYNC_MASTER acknowledgement and the confirm offset",
        ("slave_id", "slave_address"),
    ),
    "in_sync": ("tidemq_replication_slaves_in_sync", "Slaves in sync right now", ()),
    "confirmed": (
        "tidemq_replication_confirmed_offset_bytes",
        "CommitLog offset held by min_insync_replicas in-sync slaves",
        (),
    ),
    # Slave side.
    "slave_connected": (
        "tidemq_replication_connected",
        "1 while this slave's replication link to its master is up",
        (),
    ),
    "slave_behind": (
        "tidemq_replication_behind_bytes",
        "How far this slave is behind its master's log end, as last heard",
        (),
    ),
    "config_sync": (
        "tidemq_config_sync_last_success_timestamp_seconds",
        "When this slave last copied topics, groups and offsets from its master (0: never)",
        (),
    ),
}
