"""Open transactions from the shell (``tidemq transactions list``), a real process against a
real nameserver and two broker groups, so the listing spans two masters. Half messages are sent
and ended over the wire, as any producer does."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.integration.cli_cluster import TOPIC, Cluster, now_ms, start_cluster
from tests.integration.conftest import BrokerProcess, StartBroker, StartNameServer
from tests.integration.test_cli_client import tidemq
from tests.waiting import wait_until
from tidemq.protos import broker_pb2, common_pb2

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(start_nameserver: StartNameServer, start_broker: StartBroker) -> Cluster:
    # No transaction is checked while a test looks at it (the first check comes after 10 min).
    return start_cluster(
        start_nameserver,
        start_broker,
        ["broker-a", "broker-b"],
        *("--transaction-timeout-ms", "600000"),
    )


def half(broker: BrokerProcess, group: str, body: bytes) -> str:
    resp = broker.stub().SendMessage(
        broker_pb2.SendMessageRequest(
            producer_group=group,
            transactional=True,
            messages=[common_pb2.Message(topic=TOPIC, body=body, queue_id=0)],
        ),
        timeout=10,
    )
    [result] = resp.results
    assert result.transaction_id
    return str(result.transaction_id)


def end(broker: BrokerProcess, group: str, tx: str, how: int) -> None:
    broker.stub().EndTransaction(
        broker_pb2.EndTransactionRequest(producer_group=group, transaction_id=tx, resolution=how),
        timeout=10,
    )


def transactions(ns: str, *flags: str) -> dict[str, Any]:
    return dict(json.loads(tidemq(ns, "transactions", "list", "--json", *flags).stdout))


def test_open_transactions_are_listed_oldest_first_by_group_until_resolved(
    cluster: Cluster,
) -> None:
    ns, a, b = cluster.ns, cluster.brokers["broker-a"], cluster.brokers["broker-b"]
    first = half(a, "payments", b"first")
    second = half(b, "payments", b"second")
    audit = half(a, "audit", b"third")

    listing = transactions(ns)
    assert listing["total"] == 3
    got = listing["transactions"]
    assert [(t["transaction_id"], t["broker"], t["producer_group"]) for t in got] == [
        (first, "broker-a", "payments"),
        (second, "broker-b", "payments"),
        (audit, "broker-a", "audit"),
    ]
    assert [t["stored_at_ms"] for t in got] == sorted(t["stored_at_ms"] for t in got)
    assert {(t["topic"], t["checks"], t["last_check_ms"]) for t in got} == {(TOPIC, 0, None)}
    payments = transactions(ns, "--group", "payments")
    assert payments["total"] == 2
    assert [t["transaction_id"] for t in payments["transactions"]] == [first, second]
    table = tidemq(ns, "transactions", "list", "--group", "payments")
    lines = table.stdout.splitlines()
    assert lines[0].split()[:3] == ["STORED_AT", "PRODUCER_GROUP", "TOPIC"]
    assert len(lines) == 3 and lines[1].split()[-1] == first
    assert table.stderr == "2 of 2 open transaction(s) of payments\n"

    end(a, "payments", first, broker_pb2.COMMIT)
    end(b, "payments", second, broker_pb2.ROLLBACK)
    assert transactions(ns, "--group", "payments") == {"total": 0, "transactions": []}
    assert tidemq(ns, "transactions", "list", "--group", "payments").stdout == (
        "no open transaction(s) of payments\n"
    )
    assert [t["transaction_id"] for t in transactions(ns)["transactions"]] == [audit]


def test_the_listing_shows_each_check_until_the_checks_run_out_and_it_rolls_back(
    start_nameserver: StartNameServer, start_broker: StartBroker
) -> None:
    cluster = start_cluster(
        start_nameserver,
        start_broker,
        ["broker-a"],
        *("--transaction-timeout-ms", "300", "--transaction-check-interval-ms", "1000"),
        *("--transaction-check-max", "3"),
    )
    ns, broker = cluster.ns, cluster.brokers["broker-a"]
    sent_ms = now_ms()
    tx = half(broker, "nobody-answers", b"open")
    seen: list[tuple[int, int | None]] = []

    def checks_seen() -> bool:
        got = transactions(ns, "--group", "nobody-answers")["transactions"]
        if not got:
            return True  # rolled back: the checks ran out
        [t] = got
        assert t["transaction_id"] == tx
        if not seen or seen[-1] != (t["checks"], t["last_check_ms"]):
            seen.append((t["checks"], t["last_check_ms"]))
        return False

    wait_until(checks_seen, 30, "the checks to run out")
    # Checks come one by one (no producer of the group connected to answer), each with its
    # time, and the listing showed them as they came.
    counted = [c for c, _ in seen]
    assert counted == sorted(counted) and counted[-1] >= 2, seen
    times = [at for c, at in seen if c > 0]
    assert times and all(at is not None and at >= sent_ms for at in times), seen
    assert transactions(ns) == {"total": 0, "transactions": []}
