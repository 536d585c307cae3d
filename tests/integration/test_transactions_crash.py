"""Transactions across a broker's SIGKILL and across an automatic failover: open transactions
survive (they are records in the CommitLog), ends after the fault reach the broker that masters
the group then, a producer that went away is replaced by another of its group answering the
checks, and consumers see each committed message exactly once and never a rolled-back one."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

import tidemq
from tests.integration.conftest import (
    SMALL_STORE,
    NameServerProcess,
    StartBroker,
    StartNameServer,
)
from tests.integration.failover import Group, group_fixture  # noqa: F401 - the group fixture
from tests.integration.receive_cluster import create_topic, port_of, routed_broker
from tests.integration.transaction_helpers import bodies_in
from tests.waiting import wait_until
from tidemq import TransactionChecker, TransactionResolution
from tidemq.errors import TransactionAlreadyResolved
from tidemq.protos import broker_pb2
from tidemq.services.broker.transactions.halves import to_committed
from tidemq.services.broker.transactions.ids import TransactionId
from tidemq.services.broker.transactions.log import TransactionLog
from tidemq.storage import MessageStore, StoreConfig
from tidemq.types import ReceivedMessage

pytestmark = pytest.mark.integration

TOPIC = "payments"
GROUP = "payments-producer"
FAST_CHECKS = (
    *("--transaction-timeout-ms", "500"),
    *("--transaction-check-interval-ms", "500"),
)


class ByBody(TransactionChecker):
    """The local transactions' outcome, as a database would say: bodies starting with "keep"
    committed, every other one rolled back."""

    def __init__(self) -> None:
        self.asked: Counter[bytes] = Counter()
        self.unsure = False

    def check(self, message: ReceivedMessage) -> TransactionResolution:
        self.asked[message.body] += 1
        if self.unsure:
            return TransactionResolution.UNKNOWN
        if message.body.startswith(b"keep"):
            return TransactionResolution.COMMIT
        return TransactionResolution.ROLLBACK


def open_count(stub: Any) -> int:
    return int(stub.ListTransactions(broker_pb2.ListTransactionsRequest()).total)


def test_open_transactions_survive_sigkill_and_are_ended_once_after_the_restart(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    broker = routed_broker(start_broker, nameserver)  # no checks before the restart
    create_topic(nameserver, TOPIC, queues=2)
    with tidemq.Producer(nameserver.address, group=GROUP) as first:
        for i in range(10):
            with first.begin_transaction() as tx:
                tx.send(TOPIC, f"committed-{i}".encode())
            rolled = first.begin_transaction()
            rolled.send(TOPIC, f"rolled-{i}".encode())
            rolled.rollback()
        ended_later = [first.begin_transaction() for _ in range(4)]
        for i, tx in enumerate(ended_later):
            tx.send(TOPIC, f"later-{i}".encode())
        # Left open: their producer goes away; another one of the group answers the checks.
        for i in range(6):
            first.begin_transaction().send(TOPIC, f"{'keep' if i % 2 else 'drop'}-{i}".encode())
        assert open_count(broker.stub()) == 10
        broker.kill()
        assert (broker.store_dir / "abort").exists()
        broker = routed_broker(start_broker, nameserver, *FAST_CHECKS, port=port_of(broker))
        assert open_count(broker.stub()) >= 4  # the checker may have begun on the rest
        # Ends sent after the restart reach the restarted broker.
        ended_later[0].commit()
        ended_later[1].commit()
        ended_later[2].rollback()
        ended_later[3].rollback()
    checker = ByBody()
    with tidemq.Producer(
        nameserver.address, group=GROUP, transaction_checker=checker, transaction_topics=[TOPIC]
    ):
        wait_until(lambda: open_count(broker.stub()) == 0, 30, "every check answered")
    expected = Counter(
        [f"committed-{i}".encode() for i in range(10)]
        + [b"later-0", b"later-1", b"keep-1", b"keep-3", b"keep-5"]
    )
    assert bodies_in(nameserver.address, TOPIC) == expected
    assert set(checker.asked) == {b"drop-0", b"keep-1", b"drop-2", b"keep-3", b"drop-4", b"keep-5"}


def test_a_commit_torn_from_its_outcome_record_is_not_committed_again(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    broker = routed_broker(start_broker, nameserver)
    create_topic(nameserver, TOPIC, queues=1)
    with tidemq.Producer(nameserver.address, group=GROUP) as producer:
        tx = producer.begin_transaction()
        txid = tx.send(TOPIC, b"keep-torn").transaction_id
    broker.terminate()
    # What a crash between the two records of a commit leaves: the committed message, no
    # Resolved record after it (written here with the broker down, as the broker writes it).
    half_offset = TransactionId.decode(txid).half_offset
    layout = json.loads(SMALL_STORE)  # the layout the test brokers' stores are made with
    with MessageStore(StoreConfig(str(broker.store_dir), **layout)) as store:
        half = TransactionLog(store).half(half_offset)
        assert half is not None
        store.put_messages([to_committed(half)])
        assert store.wait_dispatched(store.log.max_offset, 10)
    broker = routed_broker(start_broker, nameserver, *FAST_CHECKS, port=port_of(broker))
    checker = ByBody()  # would commit it a second time if asked
    with tidemq.Producer(
        nameserver.address, group=GROUP, transaction_checker=checker, transaction_topics=[TOPIC]
    ) as producer:
        wait_until(lambda: open_count(broker.stub()) == 0, 20, "the torn commit recognised")
        with pytest.raises(TransactionAlreadyResolved):
            producer._runner.run(
                producer._core._transactions.end(
                    "broker-a", TOPIC, txid, TransactionResolution.COMMIT
                )
            )
    assert bodies_in(nameserver.address, TOPIC) == {b"keep-torn": 1}
    assert not checker.asked
    assert "its op record was lost" in broker.log()


def test_transactions_open_at_a_failover_are_ended_on_the_new_master_exactly_once(
    group: Group, start_nameserver: StartNameServer
) -> None:
    ns = group.routed(start_nameserver, TOPIC, 2, "--config-sync-interval-ms", "500", *FAST_CHECKS)
    checker = ByBody()
    checker.unsure = True  # answers UNKNOWN until after the failover
    answering = tidemq.Producer(
        ns.address, group=GROUP, transaction_checker=checker, transaction_topics=[TOPIC]
    )
    with answering, tidemq.Producer(ns.address, group=GROUP, send_timeout_ms=30_000) as producer:
        for i in range(10):
            with producer.begin_transaction() as tx:
                tx.send(TOPIC, f"committed-{i}".encode())
        pending = [producer.begin_transaction() for _ in range(6)]
        for i, tx in enumerate(pending):
            tx.send(TOPIC, f"pending-{i}".encode())
        for body in (b"keep-checked", b"drop-checked"):
            producer.begin_transaction().send(TOPIC, body)  # left to the checker
        wait_until(lambda: len(checker.asked) == 8, 20, "every open transaction checked")
        old = group.master()
        group.kill(old)
        new = group.master(not_id=old)
        # Ends retried until the new master answers.
        for tx in pending[:3]:
            tx.commit()
        for tx in pending[3:]:
            tx.rollback()
        # The checking producer's stream moves to the new master, which checks what is left.
        checker.unsure = False
        stub = group.brokers[new].stub()
        wait_until(lambda: open_count(stub) == 0, 30, "the checker's answers on the new master")
    expected = Counter(
        [f"committed-{i}".encode() for i in range(10)]
        + [f"pending-{i}".encode() for i in range(3)]
        + [b"keep-checked"]
    )
    wait_until(lambda: bodies_in(ns.address, TOPIC) == expected, 20, "the committed messages")
