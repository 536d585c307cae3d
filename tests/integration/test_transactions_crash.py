"""Transactions across a broker's SIGKILL and across an automatic failover: open transactions
survive (they are records in the CommitLog), ends after the fault reach the broker that masters
the group then, a producer that went away is replaced by another of its group answering the
checks, and consumers see each committed message exactly once and never a rolled-back one."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

import tidemq
from tests.integration.conftest import NameServerProcess, StartBroker, StartNameServer
from tests.integration.failover import Group
from tests.integration.receive_cluster import create_topic, port_of, routed_broker
from tests.integration.transaction_helpers import bodies_in
from tests.integration.zookeeper import ZooKeeperServer
from tests.waiting import wait_until
from tidemq import TransactionChecker, TransactionResolution
from tidemq.protos import broker_pb2
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

    def check(self, message: ReceivedMessage) -> TransactionResolution:
        self.asked[message.body] += 1
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


@pytest.fixture
def group(start_broker: StartBroker, zookeeper: ZooKeeperServer, zk_root: str) -> Iterator[Group]:
    g = Group(start_broker, zookeeper, zk_root)
    yield g
    g.thaw_all()


def test_transactions_open_at_a_failover_are_ended_on_the_new_master_exactly_once(
    group: Group, start_nameserver: StartNameServer
) -> None:
    ns = group.routed(start_nameserver, TOPIC, 2, "--config-sync-interval-ms", "500", *FAST_CHECKS)
    with tidemq.Producer(ns.address, group=GROUP, send_timeout_ms=30_000) as producer:
        for i in range(10):
            with producer.begin_transaction() as tx:
                tx.send(TOPIC, f"committed-{i}".encode())
        pending = [producer.begin_transaction() for _ in range(6)]
        for i, tx in enumerate(pending):
            tx.send(TOPIC, f"pending-{i}".encode())
        old = group.master()
        group.kill(old)
        new = group.master(not_id=old)
        # Ends retried until the new master answers.
        for tx in pending[:3]:
            tx.commit()
        for tx in pending[3:]:
            tx.rollback()
        stub = group.brokers[new].stub()
        assert open_count(stub) == 0
    expected = Counter(
        [f"committed-{i}".encode() for i in range(10)] + [f"pending-{i}".encode() for i in range(3)]
    )
    wait_until(lambda: bodies_in(ns.address, TOPIC) == expected, 20, "the committed messages")
