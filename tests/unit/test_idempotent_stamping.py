"""What the send path writes for an idempotent request (services/broker/idempotence/sends.py),
on a real store: a request spread over queues message by message is put grouped by queue, one
stamped record per run and the rest flagged (so they take the put's plain encoding), with the
results handed back in the request's order, and the table the CommitLog rebuilds equals the
one the send path recorded."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

from tidemq.services.broker.idempotence.log_scan import LogScan
from tidemq.services.broker.idempotence.sends import IdempotentSends
from tidemq.services.broker.idempotence.stamp import (
    PRODUCER_SEQ_PROPERTY,
    RUN_MEMBER_SYSFLAG,
    decode_stamp,
)
from tidemq.services.broker.idempotence.table import IdempotenceTable, Original
from tidemq.storage import Message, MessageStore
from tidemq.storage.config import StoreConfig

PID = 0x51


def request(seqs: list[tuple[int, int]]) -> SimpleNamespace:
    """A SendMessageRequest's fields as before_put reads them: (queue, sequence) per message."""
    return SimpleNamespace(
        producer_id=PID,
        producer_epoch=3,
        messages=[SimpleNamespace(topic="t", queue_id=q, sequence=s) for q, s in seqs],
    )


def send(sends: IdempotentSends, seqs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Decide, stamp, put, record as the handler does; (queue, queue offset) per stored message
    in the request's order."""
    batch = [Message(topic="t", body=b"%d-%d" % qs, queue_id=qs[0], properties={}) for qs in seqs]
    kept, plan = asyncio.run(sends.before_put(request(seqs), batch))
    put_batch = sends.stamp(plan, kept)
    put = sends.store.put_messages(put_batch)
    sends.after_put(plan, put_batch, put)
    return [(m.queue_id, r.queue_offset) for m, r in zip(kept, put.results, strict=True)]


def test_a_spread_request_is_put_as_one_stamped_run_per_queue(tmp_path: Path) -> None:
    with MessageStore(StoreConfig(root_dir=str(tmp_path))).open() as store:
        sends = IdempotentSends(store, 8)
        spread = [(i % 3, i // 3) for i in range(12)]  # queues 0 1 2 0 1 2 ...
        assert send(sends, spread) == [(q, s) for q, s in spread]

        store.wait_dispatched(store.log.max_offset, 10)
        heads, members = [], 0
        for q in range(3):
            got = store.get_messages("t", q, 0, 10).messages
            assert [m.body for m in got] == [b"%d-%d" % (q, s) for s in range(4)]
            for m in got:
                if PRODUCER_SEQ_PROPERTY in m.properties:
                    heads.append(decode_stamp(m.properties[PRODUCER_SEQ_PROPERTY]))
                    assert not m.sys_flag & RUN_MEMBER_SYSFLAG
                else:
                    assert m.sys_flag & RUN_MEMBER_SYSFLAG
                    members += 1
        assert sorted(heads) == [(PID, 3, 0, 4)] * 3
        assert members == 9
        # Each queue's records lie back to back in the log: a run per queue.
        offsets = [
            m.phy_offset for q in range(3) for m in store.get_messages("t", q, 0, 10).messages
        ]
        assert offsets == sorted(offsets)

        rebuilt = IdempotenceTable(8)
        scan = LogScan(store, rebuilt)
        while scan.catch_up():
            pass
        for table in (sends.table, rebuilt):
            assert [table.next_seq(PID, ("t", q)) for q in range(3)] == [4, 4, 4]
            assert table.decide(PID, 3, [(("t", 2), 3), (("t", 0), 1)]) == [
                Original("t", 2, 3),
                Original("t", 0, 1),
            ]


def test_a_duplicate_inside_a_request_splits_nothing_it_should_not(tmp_path: Path) -> None:
    """A retry that carries stored sequences and new ones: only the new ones are put, as one
    run per queue, continuing the runs before them."""
    with MessageStore(StoreConfig(root_dir=str(tmp_path))).open() as store:
        sends = IdempotentSends(store, 8)
        send(sends, [(0, 0), (1, 0), (0, 1)])
        assert send(sends, [(0, 1), (1, 1), (0, 2), (1, 2)]) == [(1, 1), (0, 2), (1, 2)]
        rebuilt = IdempotenceTable(8)
        scan = LogScan(store, rebuilt)
        while scan.catch_up():
            pass
        assert [rebuilt.next_seq(PID, ("t", q)) for q in range(2)] == [3, 3]
        assert rebuilt.decide(PID, 3, [(("t", 1), 2)]) == [Original("t", 1, 2)]
