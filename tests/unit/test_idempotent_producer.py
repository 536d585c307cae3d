"""The SDK's idempotent identity (tidemq/producer/idempotence.py), without sockets or clocks
beyond what it is given: sequences per queue, kept by a message through retries, and the
epoch that starts over after a message fails for good."""

from __future__ import annotations

import asyncio

import pytest

from tidemq.producer.config import ProducerConfig
from tidemq.producer.idempotence import ProducerIdentity, restart_epoch
from tidemq.producer.pending import Pending
from tidemq.routes import MessageQueue

A = MessageQueue("orders", "broker-a", 0)
B = MessageQueue("orders", "broker-a", 1)


def bound(identity: ProducerIdentity, queue: MessageQueue) -> Pending:
    loop = asyncio.new_event_loop()
    try:
        p = Pending("orders", b"x", "", (), None, loop.create_future(), 0.0, None)
    finally:
        loop.close()
    p.queue = queue
    identity.assign(p)
    return p


def test_each_queue_counts_its_own_sequences_from_zero() -> None:
    ident = ProducerIdentity()
    assert 0 < ident.producer_id < 1 << 63
    assert [bound(ident, q).sequence for q in (A, A, B, A, B)] == [0, 1, 0, 2, 1]


def test_a_gap_may_heal_only_while_an_earlier_sequence_is_on_its_way() -> None:
    ident = ProducerIdentity()
    first, second = bound(ident, A), bound(ident, A)
    assert ident.earlier_unresolved(second)
    assert not ident.earlier_unresolved(first)
    ident.settle(first, stored=True)
    assert not ident.earlier_unresolved(second)
    assert ident.settled_since(second, 0.0)


def test_a_message_failed_for_good_starts_a_new_epoch_at_sequence_zero() -> None:
    ident = ProducerIdentity()
    p0, p1 = bound(ident, A), bound(ident, A)
    ident.settle(p0, stored=False)
    assert ident.epoch == 1
    p2 = bound(ident, A)
    assert (p2.sequence, p2.producer_epoch) == (0, 1)
    # A message of the old epoch failing afterwards does not start yet another one.
    ident.settle(p1, stored=False)
    assert ident.epoch == 1


def test_a_configured_producer_id_gets_an_epoch_that_grows_across_restarts() -> None:
    ident = ProducerIdentity(42)
    assert ident.producer_id == 42
    assert restart_epoch(1_800_000_000) > restart_epoch(1_700_000_100) > 0
    assert 0 <= ident.epoch < 1 << 31


@pytest.mark.parametrize(
    "settings",
    [{"producer_id": 0}, {"producer_id": 1 << 63}, {"producer_id": 5, "idempotent": False}],
)
def test_bad_idempotence_settings_are_refused(settings: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="producer_id"):
        ProducerConfig(**settings)  # type: ignore[arg-type]


def test_producers_are_idempotent_by_default() -> None:
    assert ProducerConfig().idempotent
