"""The idempotence table built from a real CommitLog (services/broker/idempotence/log_scan.py):
stamped records are found (and only they), delayed messages count for their own queue, and a
log cut back under the scan rebuilds the table."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemq.services.broker.idempotence.log_scan import LogScan
from tidemq.services.broker.idempotence.snapshot import (
    SnapshotFormatError,
    decode_snapshot,
    encode_snapshot,
)
from tidemq.services.broker.idempotence.stamp import (
    PRODUCER_SEQ_PROPERTY,
    RUN_MEMBER_SYSFLAG,
    encode_stamp,
)
from tidemq.services.broker.idempotence.table import IdempotenceTable, Original
from tidemq.storage import Message, MessageStore
from tidemq.storage.config import COMMITLOG_MIN_FILE_SIZE_BYTES, StoreConfig

Q = ("orders", 1)
SMALL_FILE_BYTES = COMMITLOG_MIN_FILE_SIZE_BYTES


def stamped(seq: int, pid: int = 7, **props: str) -> Message:
    props[PRODUCER_SEQ_PROPERTY] = encode_stamp(pid, 2, seq)
    return Message(topic="orders", body=b"m%d" % seq, queue_id=1, properties=props)


def run(first_seq: int, length: int, pid: int = 7) -> list[Message]:
    """A run as the send path stores it: the head stamped, the others flagged."""
    head = Message(
        topic="orders",
        body=b"m%d" % first_seq,
        queue_id=1,
        properties={PRODUCER_SEQ_PROPERTY: encode_stamp(pid, 2, first_seq, length)},
    )
    return [head] + [
        Message(topic="orders", body=b"m%d" % s, queue_id=1, sys_flag=RUN_MEMBER_SYSFLAG)
        for s in range(first_seq + 1, first_seq + length)
    ]


def scan_all(store: MessageStore, table: IdempotenceTable) -> LogScan:
    scan = LogScan(store, table)
    while scan.catch_up():
        pass
    return scan


def test_the_scan_records_stamped_records_and_ignores_the_rest(tmp_path: Path) -> None:
    with MessageStore(StoreConfig(root_dir=str(tmp_path))).open() as store:
        store.put_messages([stamped(0), stamped(1, tags_like="x")])
        # Not stamped, though its body names the property: not an idempotent send.
        body = b"\x02" + PRODUCER_SEQ_PROPERTY.encode() + b"\x011.1.1\x02"
        store.put_messages([Message(topic="orders", body=body, queue_id=1)])
        store.put_messages([stamped(2)])
        delayed = Message(
            topic="%SYS%TIMER",
            body=b"later",
            properties={
                PRODUCER_SEQ_PROPERTY: encode_stamp(7, 2, 3),
                "REAL_TOPIC": "orders",
                "REAL_QID": "1",
            },
        )
        store.put_messages([delayed])
        table = IdempotenceTable(8)
        scan = LogScan(store, table)
        while scan.catch_up():
            pass
        assert scan.caught_up
        assert scan.records_scanned == 5
        assert table.next_seq(7, Q) == 4
        assert table.decide(7, 2, [(Q, 1), (Q, 2), (Q, 3)]) == [
            Original("orders", 1, 1),
            Original("orders", 1, 3),
            Original("%SYS%TIMER", 0, 0),
        ]


def test_a_log_cut_back_under_the_scan_rebuilds_the_table(tmp_path: Path) -> None:
    with MessageStore(StoreConfig(root_dir=str(tmp_path))).open() as store:
        store.put_messages([stamped(0), stamped(1)])
        keep = store.log.max_offset
        store.put_messages([stamped(2)])
        store.wait_dispatched(store.log.max_offset, 10)
        table = IdempotenceTable(8)
        scan = LogScan(store, table)
        scan.catch_up()
        assert table.next_seq(7, Q) == 3
        store.truncate_to(keep, "a demoted master's divergent tail")
        scan.catch_up()
        assert scan.rebuilds == 1
        assert table.next_seq(7, Q) == 2
        # Sequence 2 was cut: its retry is stored again, not answered as a duplicate.
        assert table.decide(7, 2, [(Q, 2)]) == [None]


def test_a_saved_table_is_loaded_and_only_the_log_after_it_is_scanned(tmp_path: Path) -> None:
    path = str(tmp_path / "idempotence" / "table.json")
    with MessageStore(StoreConfig(root_dir=str(tmp_path / "store"))).open() as store:
        store.put_messages([stamped(0), stamped(1), stamped(0, pid=9)])
        first = LogScan(store, IdempotenceTable(8), path)
        first.catch_up()
        saved = first.snapshot_bytes()
        assert saved is not None
        LogScan.write_snapshot(*saved)
        assert first.snapshot_bytes() is None  # nothing moved since
        store.put_messages([stamped(2)])

        table = IdempotenceTable(8)
        again = LogScan(store, table, path)
        assert again.load_snapshot()
        assert table.next_seq(7, Q) == 2 and table.next_seq(9, Q) == 1
        again.catch_up()
        assert again.records_scanned == 1  # the record after the snapshot, alone
        assert table.next_seq(7, Q) == 3
        assert table.decide(7, 2, [(Q, 0)]) == [Original("orders", 1, 0)]


def test_a_saved_table_the_log_no_longer_agrees_with_is_not_used(tmp_path: Path) -> None:
    path = str(tmp_path / "idempotence" / "table.json")
    with MessageStore(StoreConfig(root_dir=str(tmp_path / "store"))).open() as store:
        store.put_messages([stamped(0)])
        keep = store.log.max_offset
        store.put_messages([stamped(1)])
        store.wait_dispatched(store.log.max_offset, 10)
        first = LogScan(store, IdempotenceTable(8), path)
        first.catch_up()
        saved = first.snapshot_bytes()
        assert saved is not None
        LogScan.write_snapshot(*saved)
        store.truncate_to(keep, "lost with the page cache")
        table = IdempotenceTable(8)
        again = LogScan(store, table, path)
        assert not again.load_snapshot()
        again.catch_up()
        assert table.next_seq(7, Q) == 1


def test_snapshot_golden_bytes() -> None:
    t = IdempotenceTable(8)
    t.record(7, 2, Q, 0, 3, Q, 10)
    data = encode_snapshot(40, (30, 10, 12, "orders"), t)
    assert data == (
        b'{"version":1,"position":40,"mark":[30,10,12,"orders"],'
        b'"producers":[[7,2,[["orders",1,3,[[0,3,"orders",1,10]]]]]]}'
    )
    back = IdempotenceTable(8)
    assert decode_snapshot(data, back) == (40, (30, 10, 12, "orders"))
    assert back.decide(7, 2, [(Q, 1)]) == [Original("orders", 1, 11)]
    with pytest.raises(SnapshotFormatError):
        decode_snapshot(b'{"version":2}', back)
    assert len(back) == 0


def test_the_scan_follows_the_log_across_files(tmp_path: Path) -> None:
    cfg = StoreConfig(root_dir=str(tmp_path), commitlog_file_size_bytes=SMALL_FILE_BYTES)
    with MessageStore(cfg).open() as store:
        table = IdempotenceTable(8)
        scan = LogScan(store, table)
        seq = 0
        while len(store.log.file_base_offsets()) < 3:
            store.put_messages([stamped(seq + k) for k in range(4)])
            seq += 4
            while scan.catch_up(1024):  # small steps: some end at a file's blank marker
                pass
            assert scan.caught_up
        assert table.next_seq(7, Q) == seq


def test_a_run_stamped_on_its_first_record_is_recorded_whole(tmp_path: Path) -> None:
    with MessageStore(StoreConfig(root_dir=str(tmp_path))).open() as store:
        store.put_messages(run(0, 5))
        store.put_messages(run(5, 3))
        table = IdempotenceTable(8)
        scan = scan_all(store, table)
        assert scan.run is None
        assert table.next_seq(7, Q) == 8
        # A retry of any of them is answered from where it is, not stored again.
        assert table.decide(7, 2, [(Q, 3), (Q, 6), (Q, 8)]) == [
            Original("orders", 1, 3),
            Original("orders", 1, 6),
            None,
        ]


def test_a_run_the_log_holds_part_of_counts_for_that_part_alone(tmp_path: Path) -> None:
    """A crash mid-put leaves a run's first records: only they are known, and a plain record
    that follows in the same queue at the next offset is not taken for the rest."""
    path = str(tmp_path / "idempotence" / "table.json")
    with MessageStore(StoreConfig(root_dir=str(tmp_path / "store"))).open() as store:
        store.put_messages(run(0, 6)[:3])
        table = IdempotenceTable(8)
        scan = LogScan(store, table, path)
        scan.catch_up()
        assert scan.caught_up and scan.run is not None
        assert scan.snapshot_bytes() is None  # the open run is not a state to keep
        store.put_messages([Message(topic="orders", body=b"plain", queue_id=1)])
        scan.catch_up()
        assert scan.run is None
        assert table.next_seq(7, Q) == 3
        assert table.decide(7, 2, [(Q, 2), (Q, 3)]) == [Original("orders", 1, 2), None]


def test_a_run_scanned_in_steps_is_recorded_as_its_records_arrive(tmp_path: Path) -> None:
    """As on a slave, whose log grows as the master's bytes come in."""
    with MessageStore(StoreConfig(root_dir=str(tmp_path))).open() as store:
        store.put_messages(run(0, 40))
        table = IdempotenceTable(8)
        scan = LogScan(store, table)
        seen: list[int] = []
        while scan.catch_up(256):  # a few records per step
            seen.append(table.next_seq(7, Q) or 0)
        assert len(seen) > 3 and seen == sorted(seen)
        assert 0 < seen[0] < 40
        assert table.next_seq(7, Q) == 40


def test_a_run_across_a_file_boundary_is_recorded_whole(tmp_path: Path) -> None:
    cfg = StoreConfig(root_dir=str(tmp_path), commitlog_file_size_bytes=SMALL_FILE_BYTES)
    with MessageStore(cfg).open() as store:
        seq = 0
        while len(store.log.file_base_offsets()) < 2:
            store.put_messages(run(seq, 50))
            seq += 50
        table = IdempotenceTable(8)
        scan_all(store, table)
        assert table.next_seq(7, Q) == seq
        assert table.decide(7, 2, [(Q, seq - 1)]) == [Original("orders", 1, seq - 1)]
