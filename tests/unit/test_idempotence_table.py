"""The idempotence table's rules, without sockets or clocks (services/broker/idempotence)."""

from __future__ import annotations

import pytest

from tidemq.services.broker.idempotence.stamp import (
    StampFormatError,
    decode_stamp,
    encode_stamp,
)
from tidemq.services.broker.idempotence.table import (
    FORGOTTEN,
    RUNS_PER_QUEUE,
    IdempotenceTable,
    Original,
    PartialRunError,
    ProducerFencedError,
    SequenceGapError,
)

Q = ("orders", 3)
P = 0x1F


def table_with(next_seq: int = 5, epoch: int = 1) -> IdempotenceTable:
    """Producer P at ``epoch`` stored sequences 0..next_seq-1 of Q at queue offsets 100..."""
    t = IdempotenceTable(max_producers=8)
    t.record(P, epoch, Q, 0, next_seq, Q, 100)
    return t


@pytest.mark.parametrize(
    ("seqs", "expected"),
    [
        ([5], [None]),  # the next one: stored
        ([5, 6, 7], [None, None, None]),  # a run of them in one request
        ([4], [Original("orders", 3, 104)]),  # a retry: its first store
        ([0], [Original("orders", 3, 100)]),
        ([3, 4, 5], [Original("orders", 3, 103), Original("orders", 3, 104), None]),  # prefix
    ],
)
def test_decide_stores_the_next_sequence_and_answers_earlier_ones_from_their_first_store(
    seqs: list[int], expected: list[Original | None]
) -> None:
    t = table_with()
    assert t.decide(P, 1, [(Q, s) for s in seqs]) == expected


@pytest.mark.parametrize("seqs", [[6], [5, 7], [9]])
def test_a_sequence_past_the_next_is_a_gap_and_nothing_of_the_request_is_decided(
    seqs: list[int],
) -> None:
    t = table_with()
    with pytest.raises(SequenceGapError):
        t.decide(P, 1, [(Q, s) for s in seqs])
    assert t.next_seq(P, Q) == 5


@pytest.mark.parametrize(
    ("runs", "expected"),
    [
        ([(5, 3)], [None]),  # a block of the next three: stored
        ([(5, 3), (8, 2)], [None, None]),  # two blocks of one queue in one request
        ([(2, 3)], [Original("orders", 3, 102)]),  # a retried block: its first store
        ([(0, 5), (5, 1)], [Original("orders", 3, 100), None]),  # a retry, then a new block
    ],
)
def test_decide_runs_stores_a_block_whole_or_answers_it_whole_from_its_first_store(
    runs: list[tuple[int, int]], expected: list[Original | None]
) -> None:
    t = table_with()
    assert t.decide_runs(P, 1, [(Q, seq, n) for seq, n in runs]) == expected


def test_a_block_that_repeats_stored_sequences_only_in_part_is_refused() -> None:
    with pytest.raises(PartialRunError, match=r"sequences 3\.\.6"):
        table_with().decide_runs(P, 1, [(Q, 3, 4)])


def test_a_block_past_the_next_sequence_is_a_gap_and_an_old_epoch_is_fenced() -> None:
    t = table_with()
    with pytest.raises(SequenceGapError):
        t.decide_runs(P, 1, [(Q, 6, 2)])
    with pytest.raises(ProducerFencedError):
        t.decide_runs(P, 0, [(Q, 5, 2)])
    assert t.decide_runs(P, 2, [(Q, 0, 2)]) == [None]  # a newer epoch starts at zero


def test_an_older_epoch_is_fenced() -> None:
    t = table_with(epoch=3)
    with pytest.raises(ProducerFencedError):
        t.decide(P, 2, [(Q, 5)])


def test_a_newer_epoch_restarts_every_queue_at_zero() -> None:
    t = table_with(epoch=1)
    assert t.decide(P, 2, [(Q, 0)]) == [None]
    with pytest.raises(SequenceGapError):
        t.decide(P, 2, [(Q, 5)])
    t.record(P, 2, Q, 0, 1, Q, 105)
    assert t.epoch_of(P) == 2
    assert t.next_seq(P, Q) == 1
    # Once the new epoch is recorded the old one is fenced, and other queues start at 0 too.
    with pytest.raises(ProducerFencedError):
        t.decide(P, 1, [(Q, 5)])
    with pytest.raises(SequenceGapError):
        t.decide(P, 2, [(("orders", 4), 7)])


def test_an_unknown_producer_starts_every_queue_at_zero() -> None:
    """Its second request may overtake its first: it must wait for it, not start the queue."""
    t = IdempotenceTable(max_producers=8)
    with pytest.raises(SequenceGapError):
        t.decide(P, 1, [(Q, 41)])
    assert t.decide(P, 1, [(Q, 0), (Q, 1)]) == [None, None]
    t.record(P, 1, Q, 0, 2, Q, 0)
    with pytest.raises(SequenceGapError):  # a queue it has not sent to yet, too
        t.decide(P, 1, [(("orders", 5), 3)])


def test_recording_the_same_sequences_twice_changes_nothing() -> None:
    """The master records its puts, and the CommitLog scan sees the same records later."""
    t = table_with(next_seq=5)
    t.record(P, 1, Q, 3, 2, Q, 103)
    t.record(P, 1, Q, 4, 1, Q, 104)
    assert t.next_seq(P, Q) == 5
    assert t.decide(P, 1, [(Q, 4)]) == [Original("orders", 3, 104)]


def test_records_of_an_older_epoch_are_ignored() -> None:
    t = table_with(epoch=2)
    t.record(P, 1, Q, 5, 3, Q, 105)
    assert t.next_seq(P, Q) == 5


def test_a_run_older_than_the_remembered_ones_is_answered_as_forgotten() -> None:
    t = IdempotenceTable(max_producers=8)
    # Runs that do not continue each other (queue offsets jump): one run each.
    for i in range(RUNS_PER_QUEUE + 1):
        t.record(P, 1, Q, i, 1, Q, 1000 * i)
    assert t.decide(P, 1, [(Q, 0)]) == [FORGOTTEN]
    assert t.decide(P, 1, [(Q, RUNS_PER_QUEUE)]) == [Original("orders", 3, 1000 * RUNS_PER_QUEUE)]


def test_a_delayed_messages_first_store_is_its_system_queue() -> None:
    t = IdempotenceTable(max_producers=8)
    t.record(P, 1, Q, 0, 1, ("%SYS%TIMER", 0), 77)
    assert t.decide(P, 1, [(Q, 0)]) == [Original("%SYS%TIMER", 0, 77)]


def test_the_least_recently_used_producer_is_forgotten_past_the_bound() -> None:
    t = IdempotenceTable(max_producers=2)
    t.record(1, 0, Q, 0, 1, Q, 0)
    t.record(2, 0, Q, 0, 1, Q, 1)
    t.record(1, 0, Q, 1, 1, Q, 2)  # producer 1 used again: 2 is the oldest
    t.record(3, 0, Q, 0, 1, Q, 3)
    assert len(t) == 2
    assert t.evicted == 1
    assert t.epoch_of(2) is None
    assert t.next_seq(1, Q) == 2
    # Forgotten: it starts again at 0 (documented).
    with pytest.raises(SequenceGapError):
        t.decide(2, 0, [(Q, 1)])
    assert t.decide(2, 0, [(Q, 0)]) == [None]


def test_stamp_golden_form_and_round_trip() -> None:
    assert encode_stamp(0x1F, 3, 10) == "1f.3.a"
    assert decode_stamp("1f.3.a") == (0x1F, 3, 10, 1)
    # A run's head: sequences 10 to 265.
    assert encode_stamp(0x1F, 3, 10, 256) == "1f.3.a.100"
    assert decode_stamp("1f.3.a.100") == (0x1F, 3, 10, 256)
    big = (1 << 63) - 1
    assert decode_stamp(encode_stamp(big, 2**31 - 1, 2**62)) == (big, 2**31 - 1, 2**62, 1)


@pytest.mark.parametrize(
    "text", ["", "1.2", "1.2.3.4.5", "x.1.1", "0.1.1", "1.-1.1", "1.2.3.0", "1.2.3.-4"]
)
def test_a_malformed_stamp_is_a_typed_error(text: str) -> None:
    with pytest.raises(StampFormatError):
        decode_stamp(text)
