"""Reading a whole store back, queue by queue, and checking it holds exactly what was acknowledged,
readable every way (by queue offset, CommitLog offset, message id and key)."""

from __future__ import annotations

from tests.store.workload import Ack, assert_matches, assert_self_consistent
from tidemq.storage import MessageStore, StoredMessage

Queues = dict[tuple[str, int], list[StoredMessage]]


def read_queue(s: MessageStore, topic: str, queue_id: int) -> list[StoredMessage]:
    """Every message of a queue from offset 0, asserting there is no gap on the way."""
    out: list[StoredMessage] = []
    hi = s.max_offset(topic, queue_id)
    while len(out) < hi:
        got = s.get_messages(topic, queue_id, len(out), 32)
        assert got.messages, f"{topic}/{queue_id}: nothing at {len(out)} below max {hi}"
        assert got.next_offset == len(out) + len(got.messages)
        out += got.messages
    return out


def read_all(s: MessageStore) -> Queues:
    return {
        (topic, qid): read_queue(s, topic, qid)
        for topic, qids in s.topics().items()
        for qid in qids
    }


def check_queues_contiguous(
    s: MessageStore, queues: dict[tuple[str, int], list[StoredMessage]]
) -> None:
    """Offsets 0..n-1 with no gap, n == max_offset, records in log order, no record twice."""
    seen: set[int] = set()
    for (topic, qid), msgs in queues.items():
        assert s.min_offset(topic, qid) == 0
        assert s.max_offset(topic, qid) == len(msgs)
        assert [m.queue_offset for m in msgs] == list(range(len(msgs))), (topic, qid)
        phys = [m.phy_offset for m in msgs]
        assert phys == sorted(phys), (topic, qid)
        assert len(set(phys)) == len(phys), (topic, qid)
        for m in msgs:
            assert (m.topic, m.queue_id) == (topic, qid)
            assert_self_consistent(m)
        assert not seen & set(phys)
        seen |= set(phys)


def check_ack_lookups(s: MessageStore, a: Ack) -> None:
    """An acknowledged message by offset, by message id and by key."""
    assert_matches(s.look_message(a.phy_offset), a)
    assert_matches(s.get_message_by_id(a.msg_id), a)
    found = s.query_by_key(a.topic, a.key)
    assert [m.phy_offset for m in found] == [a.phy_offset], f"query_by_key({a.key}): {found}"
    assert_matches(found[0], a)


def expected_queues(acks: list[Ack]) -> dict[tuple[str, int], list[Ack]]:
    out: dict[tuple[str, int], list[Ack]] = {}
    for a in sorted(acks, key=lambda a: a.phy_offset):
        out.setdefault((a.topic, a.queue_id), []).append(a)
    return out


def verify_exactly(s: MessageStore, acks: list[Ack]) -> None:
    """The store holds exactly ``acks`` (and nothing else), each readable every way."""
    queues = read_all(s)
    check_queues_contiguous(s, queues)
    want = expected_queues(acks)
    assert {k: len(v) for k, v in queues.items() if v} == {k: len(v) for k, v in want.items()}
    for key, msgs in want.items():
        for a in msgs:
            assert_matches(queues[key][a.queue_offset], a)
            check_ack_lookups(s, a)
