"""Transactions end to end on a real broker: a committed transaction's messages become visible
once, a rolled-back one's never; a transaction left open is checked with its producer group,
whose checker decides; bad ends get typed errors and change nothing."""

from __future__ import annotations

import asyncio

import grpc
import pytest

import tidemq
from tests.integration.conftest import NameServerProcess, StartBroker, free_port
from tests.integration.receive_cluster import create_topic, routed_broker
from tests.integration.receiving import scrape
from tests.integration.transaction_helpers import ScriptedChecker, bodies_in
from tests.waiting import wait_until
from tidemq import AsyncTransactionChecker, TransactionResolution
from tidemq.errors import InvalidArgumentError, TransactionAlreadyResolved, TransactionNotFound
from tidemq.protos import broker_pb2
from tidemq.services.broker.transactions.ids import TransactionId
from tidemq.types import ReceivedMessage

pytestmark = pytest.mark.integration

TOPIC = "payments"
GROUP = "payments-producer"
ROLLBACK = TransactionResolution.ROLLBACK
OPEN = ("tidemq_transactions_open", ())
FAST_CHECKS = (
    *("--transaction-timeout-ms", "300"),
    *("--transaction-check-interval-ms", "300"),
)


def test_commit_makes_each_message_visible_once_and_rollback_never(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    routed_broker(start_broker, nameserver)
    create_topic(nameserver, TOPIC, queues=2)
    with tidemq.Producer(nameserver.address, group=GROUP) as producer:
        with producer.begin_transaction() as tx:
            first = tx.send(TOPIC, b"committed-1", keys=["order-1"])
            tx.send(TOPIC, b"committed-2")
            assert first.transaction_id
            # Not visible before the commit.
            assert bodies_in(nameserver.address, TOPIC) == {}
        rolled = producer.begin_transaction()
        rolled.send(TOPIC, b"rolled-back")
        rolled.rollback()
        with pytest.raises(RuntimeError):
            _fail_inside(producer)
    assert bodies_in(nameserver.address, TOPIC) == {b"committed-1": 1, b"committed-2": 1}


def test_unknown_outcome_is_checked_and_the_checker_decides(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    metrics = f"127.0.0.1:{free_port()}"
    broker = routed_broker(start_broker, nameserver, *FAST_CHECKS, "--metrics-listen", metrics)
    create_topic(nameserver, TOPIC, queues=1)
    checker = ScriptedChecker(TransactionResolution.UNKNOWN)
    with tidemq.Producer(nameserver.address, group=GROUP, transaction_checker=checker) as p:
        a, b = p.begin_transaction(), p.begin_transaction()
        a.send(TOPIC, b"check-commits")
        b.send(TOPIC, b"check-rolls-back")
        # The producer neither commits nor rolls back: the broker asks, the checker does not
        # know yet, and the broker asks again.
        wait_until(lambda: checker.asked[b"check-commits"] >= 2, 20, "two checks")
        assert bodies_in(nameserver.address, TOPIC) == {}
        listed = broker.stub().ListTransactions(
            broker_pb2.ListTransactionsRequest(producer_group=GROUP)
        )
        assert listed.total == 2
        assert {t.topic for t in listed.transactions} == {TOPIC}
        assert all(t.checks >= 1 for t in listed.transactions)
        assert scrape(metrics)[OPEN] == 2
        checker.answer = TransactionResolution.COMMIT
        wait_until(
            lambda: bodies_in(nameserver.address, TOPIC)[b"check-commits"] == 1, 20, "commit"
        )
    # Both were committed by the check (the checker said COMMIT for each, once each).
    assert bodies_in(nameserver.address, TOPIC) == {b"check-commits": 1, b"check-rolls-back": 1}
    empty = broker.stub().ListTransactions(broker_pb2.ListTransactionsRequest())
    assert empty.total == 0
    samples = scrape(metrics)
    assert samples[OPEN] == 0
    assert samples["tidemq_transaction_checks_total", ()] >= 4  # two each at least
    answered = (("by", "producer"), ("resolution", "commit"))
    assert samples["tidemq_transactions_resolved_total", answered] == 2


def test_async_producer_transactions_and_an_async_checker(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    routed_broker(start_broker, nameserver, *FAST_CHECKS)
    create_topic(nameserver, TOPIC, queues=1)

    class Rollback(AsyncTransactionChecker):
        async def check(self, message: ReceivedMessage) -> TransactionResolution:
            return TransactionResolution.ROLLBACK

    async def run() -> None:
        async with tidemq.AsyncProducer(
            nameserver.address, group=GROUP, transaction_checker=Rollback()
        ) as producer:
            async with producer.begin_transaction() as tx:
                await tx.send(TOPIC, b"async-committed")
            left = producer.begin_transaction()
            txid = (await left.send(TOPIC, b"async-left-open")).transaction_id
            sends = producer._transactions
            deadline = asyncio.get_running_loop().time() + 20
            while True:  # until the check's rollback lands: the end then says so
                try:
                    await sends.end("broker-a", TOPIC, txid, ROLLBACK)
                except TransactionAlreadyResolved:
                    break
                except tidemq.TidemqError:
                    pass
                assert asyncio.get_running_loop().time() < deadline, "no check rolled it back"
                await asyncio.sleep(0.1)

    asyncio.run(run())
    assert bodies_in(nameserver.address, TOPIC) == {b"async-committed": 1}


def test_a_transaction_nobody_answers_for_is_rolled_back_after_its_checks(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    broker = routed_broker(start_broker, nameserver, *FAST_CHECKS, "--transaction-check-max", "2")
    create_topic(nameserver, TOPIC, queues=1)
    with tidemq.Producer(nameserver.address, group=GROUP) as producer:
        tx = producer.begin_transaction()
        result = tx.send(TOPIC, b"abandoned")  # no commit, no checker: the producer "died"
        listed = broker.stub().ListTransactions(broker_pb2.ListTransactionsRequest())
        assert [t.transaction_id for t in listed.transactions] == [result.transaction_id]
        wait_until(
            lambda: broker.stub().ListTransactions(broker_pb2.ListTransactionsRequest()).total == 0,
            20,
            "the exhausted transaction resolved",
        )
        assert _end_error(producer, result.transaction_id) is TransactionAlreadyResolved
    assert bodies_in(nameserver.address, TOPIC) == {}
    assert "no answer after 2 checks; rollback" in broker.log()


def test_bad_ends_get_typed_errors_and_change_nothing(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    broker = routed_broker(start_broker, nameserver)
    create_topic(nameserver, TOPIC, queues=1)
    stub = broker.stub()
    with tidemq.Producer(nameserver.address, group=GROUP) as producer:
        tx = producer.begin_transaction()
        txid = tx.send(TOPIC, b"still-open").transaction_id

        def end(transaction_id: str, **kw: object) -> grpc.RpcError:
            request = broker_pb2.EndTransactionRequest(
                producer_group=GROUP,
                transaction_id=transaction_id,
                resolution=broker_pb2.COMMIT,
            )
            for k, v in kw.items():
                setattr(request, k, v)
            with pytest.raises(grpc.RpcError) as raised:
                stub.EndTransaction(request)
            return raised.value

        tampered = txid[:-2] + ("AA" if txid[-2:] != "AA" else "BB")
        assert end(tampered).code() is grpc.StatusCode.INVALID_ARGUMENT
        assert end("not an id").code() is grpc.StatusCode.INVALID_ARGUMENT
        assert end(txid, producer_group="another-group").code() is (
            grpc.StatusCode.INVALID_ARGUMENT
        )
        assert end(txid, resolution=99).code() is grpc.StatusCode.INVALID_ARGUMENT
        unknown = _other_offset_id(txid)
        assert end(unknown).code() is grpc.StatusCode.NOT_FOUND
        assert bodies_in(nameserver.address, TOPIC) == {}  # nothing of that changed anything
        tx.commit()
        assert _end_error(producer, txid, ROLLBACK) is TransactionAlreadyResolved
        assert _end_error(producer, unknown) is TransactionNotFound
        assert _end_error(producer, "x") is InvalidArgumentError
    assert bodies_in(nameserver.address, TOPIC) == {b"still-open": 1}


def _fail_inside(producer: tidemq.Producer) -> None:
    with producer.begin_transaction() as failing:
        failing.send(TOPIC, b"raised-inside")
        raise RuntimeError("the local transaction failed")


def _other_offset_id(txid: str) -> str:
    parsed = TransactionId.decode(txid)
    return TransactionId(parsed.broker_name, parsed.half_offset + 1_000_000).encode()


def _end_error(
    producer: tidemq.Producer,
    transaction_id: str,
    resolution: TransactionResolution = TransactionResolution.COMMIT,
) -> type | None:
    """The error class ending ``transaction_id`` answers (None: it ended it)."""
    sends = producer._core._transactions
    try:
        producer._runner.run(sends.end("broker-a", TOPIC, transaction_id, resolution))
    except tidemq.TidemqError as e:
        return type(e)
    return None
