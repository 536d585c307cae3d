"""The idempotence table built from a real CommitLog (services/broker/idempotence/log_scan.py):
stamped records are found (and only they), delayed messages count for their own queue, and a
log cut back under the scan rebuilds the table."""

from __future__ import annotations

from pathlib import Path

from tidemq.services.broker.idempotence.log_scan import LogScan
from tidemq.services.broker.idempotence.stamp import PRODUCER_SEQ_PROPERTY, encode_stamp
from tidemq.services.broker.idempotence.table import IdempotenceTable, Original
from tidemq.storage import Message, MessageStore
from tidemq.storage.config import StoreConfig

Q = ("orders", 1)


def stamped(seq: int, pid: int = 7, **props: str) -> Message:
    props[PRODUCER_SEQ_PROPERTY] = encode_stamp(pid, 2, seq)
    return Message(topic="orders", body=b"m%d" % seq, queue_id=1, properties=props)


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
