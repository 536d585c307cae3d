"""The receive log scanned for one message's history, over real stores: a receive records its
client (kind 7) and a follower applying the copied log holds the master's state and finds the
same history; the scan starts by time, not at the log's beginning, and says when its bound
stopped it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.replication.copied_logs import copy_log, open_store
from tidemq.protos import broker_pb2
from tidemq.services.broker.receive.events import (
    RECEIVE_LOG_TOPIC,
    Acked,
    Init,
    QueueKey,
    Received,
)
from tidemq.services.broker.receive.history import CLOCK_SLACK_MS, MessageTrail, scan_log
from tidemq.services.broker.receive.journal import ReceiveJournal
from tidemq.storage import MessageStore

pytestmark = pytest.mark.store

KEY = QueueKey("workers", "jobs", 0)
NOW = 1_700_000_000_000


def history(
    store: MessageStore, from_ms: int, max_records: int = 1000
) -> tuple[list[str], bool, int]:
    trail = MessageTrail("jobs", 0, 5)
    result = asyncio.run(scan_log(store, trail, from_ms, max_records, 1 << 20))
    names = [
        f"{broker_pb2.MessageEventKind.Name(e.kind)}:{e.client_id}:{e.attempt}"
        for e in result.events
    ]
    return names, result.truncated, result.records


def test_a_follower_finds_the_masters_history_with_its_clients(tmp_path: Path) -> None:
    with open_store(tmp_path / "m") as m, open_store(tmp_path / "s") as s:
        master = ReceiveJournal(m, str(tmp_path / "m"))
        slave = ReceiveJournal(s, str(tmp_path / "s"))
        master.open()
        slave.open()
        master.append(Init(KEY, 0))
        lease, _ = master.append(
            Received(KEY, NOW, NOW + 1000, ((4, 1, 0), (5, 1, 0)), (), (), 6, "worker-1")
        )
        again, _ = master.append(
            Received(KEY, NOW + 2000, NOW + 3000, ((5, 2, 0),), (), (), 6, "worker-2")
        )
        master.append(Acked(KEY, ((4, lease), (5, again))))
        copy_log(m, s)
        assert slave.catch_up() == 4
        assert slave.states == master.states
        want = ["DELIVERED:worker-1:1", "DELIVERED:worker-2:2", "ACKED::0"]
        assert history(m, 0) == (want, False, 4)
        assert history(s, 0) == (want, False, 4)


def test_the_scan_starts_at_the_messages_time_and_stops_at_its_bound(tmp_path: Path) -> None:
    with open_store(tmp_path / "m") as m:
        journal = ReceiveJournal(m, str(tmp_path / "m"))
        journal.open()
        journal.append(Init(KEY, 0))
        for i in range(40):  # other offsets: records the scan reads past
            journal.append(Received(KEY, NOW, NOW + 1000, ((i + 10, 1, 0),), (), (), i + 11, "w"))
        journal.append(Received(KEY, NOW, NOW + 1000, ((5, 1, 0),), (), (), 51, "w"))
        assert m.wait_dispatched(m.log.max_offset, 10)
        last = m.get_messages(RECEIVE_LOG_TOPIC, 0, 41, 1).messages[0].store_timestamp_ms
        # A message stored after every record: nothing of the log is read.
        assert history(m, last + CLOCK_SLACK_MS + 1) == ([], False, 0)
        assert history(m, 0) == (["DELIVERED:w:1"], False, 42)
        names, truncated, records = history(m, 0, max_records=10)
        assert (names, truncated, records) == ([], True, 10)
