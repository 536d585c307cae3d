"""Idempotent sends against a real broker process (docs/production.md): a resent request is
answered with its first store's result and stored once, a sequence gap and a fenced epoch are
typed errors that store nothing, and all of it holds after a kill -9 (the table is rebuilt from
the CommitLog) and on a slave that takes over."""

from __future__ import annotations

import grpc
import pytest

from tests.integration.conftest import BrokerProcess, NameServerProcess, StartBroker, free_port
from tests.integration.receiving import error_of, scrape
from tests.integration.replicas import start, start_slave
from tests.integration.test_broker import create_topic, pull_all
from tests.waiting import wait_until
from tidemq.protos import broker_pb2, common_pb2

pytestmark = pytest.mark.integration

TOPIC = "orders"
PID = 0x5EED
METRICS: list[str] = []
WAITING = ("tidemq_idempotent_sends_waiting", ())


@pytest.fixture(autouse=True)
def metrics_address() -> None:
    METRICS[:] = [f"127.0.0.1:{free_port()}"]


def request(
    seqs: list[int], *, pid: int = PID, epoch: int = 1, queue_id: int = 0
) -> broker_pb2.SendMessageRequest:
    return broker_pb2.SendMessageRequest(
        producer_id=pid,
        producer_epoch=epoch,
        messages=[
            common_pb2.Message(topic=TOPIC, body=b"m%d" % s, queue_id=queue_id, sequence=s)
            for s in seqs
        ],
    )


def send(b: BrokerProcess, req: broker_pb2.SendMessageRequest) -> list[broker_pb2.SendResult]:
    return list(b.stub().SendMessage(req, timeout=30).results)


def stored(b: BrokerProcess, queue_id: int = 0) -> int:
    r = b.stub().GetQueueOffsets(
        broker_pb2.GetQueueOffsetsRequest(topic=TOPIC, queue_ids=[queue_id]), timeout=10
    )
    return int(r.queues[0].max_offset)


def same_store(a: broker_pb2.SendResult, b: broker_pb2.SendResult) -> bool:
    return (a.msg_id, a.queue_offset, a.commitlog_offset) == (
        b.msg_id,
        b.queue_offset,
        b.commitlog_offset,
    )


@pytest.fixture
def broker(start_broker: StartBroker) -> BrokerProcess:
    b = start_broker("--metrics-listen", METRICS[0])
    create_topic(b, TOPIC)
    return b


def test_a_resent_request_is_answered_with_its_first_results_and_stored_once(
    broker: BrokerProcess,
) -> None:
    first = send(broker, request([0, 1, 2]))
    assert [r.duplicate for r in first] == [False] * 3
    again = send(broker, request([0, 1, 2]))
    assert [r.duplicate for r in again] == [True] * 3
    assert all(same_store(a, b) for a, b in zip(first, again, strict=True))
    assert all(r.status == broker_pb2.SEND_OK for r in again)
    # A retry that carries one new message after stored ones: the new one alone is stored.
    mixed = send(broker, request([1, 2, 3]))
    assert [r.duplicate for r in mixed] == [True, True, False]
    assert same_store(mixed[0], first[1])
    assert mixed[2].queue_offset == first[2].queue_offset + 1
    assert stored(broker) == 4
    assert pull_all(broker, TOPIC, 0, 4) == [b"m0", b"m1", b"m2", b"m3"]
    samples = scrape(METRICS[0])
    assert samples[("tidemq_idempotent_duplicates_total", ())] == 5


def test_a_sequence_gap_is_a_retriable_typed_error_that_stores_nothing(
    broker: BrokerProcess,
) -> None:
    send(broker, request([0, 1]))
    code, name, retriable = error_of(lambda: send(broker, request([3])))
    assert (code, name, retriable) == (grpc.StatusCode.FAILED_PRECONDITION, "SEQUENCE_GAP", True)
    # A request with a gap inside stores none of it, not even its good prefix.
    assert error_of(lambda: send(broker, request([2, 4])))[1] == "SEQUENCE_GAP"
    assert stored(broker) == 2
    assert [r.duplicate for r in send(broker, request([2]))] == [False]


def test_an_older_epoch_is_fenced_and_a_newer_one_restarts_at_zero(broker: BrokerProcess) -> None:
    send(broker, request([0, 1], epoch=5))
    code, name, retriable = error_of(lambda: send(broker, request([2], epoch=4)))
    assert (code, name, retriable) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "PRODUCER_FENCED",
        False,
    )
    assert error_of(lambda: send(broker, request([2], epoch=6)))[1] == "SEQUENCE_GAP"
    assert [r.duplicate for r in send(broker, request([0], epoch=6))] == [False]
    assert error_of(lambda: send(broker, request([2], epoch=5)))[1] == "PRODUCER_FENCED"
    assert stored(broker) == 3


def test_bad_idempotence_input_is_refused_and_changes_nothing(broker: BrokerProcess) -> None:
    assert error_of(lambda: send(broker, request([0], pid=-3)))[1] == "INVALID_ARGUMENT"
    assert error_of(lambda: send(broker, request([-1])))[1] == "INVALID_ARGUMENT"
    forged = broker_pb2.SendMessageRequest(
        messages=[common_pb2.Message(topic=TOPIC, body=b"x", properties={"PRODUCER_SEQ": "1.1.0"})]
    )
    assert error_of(lambda: send(broker, forged))[1] == "INVALID_PROPERTY"
    assert stored(broker) == 0


def test_a_broker_killed_and_restarted_still_knows_what_it_stored(
    start_broker: StartBroker,
) -> None:
    b = start_broker(store="one")
    create_topic(b, TOPIC)
    first = send(b, request([0, 1, 2], queue_id=1))
    send(b, request([0], pid=PID + 1, epoch=7))
    b.kill()
    b = start_broker(store="one", port=int(b.address.rsplit(":", 1)[1]))
    again = send(b, request([1, 2], queue_id=1))
    assert [r.duplicate for r in again] == [True, True]
    assert all(same_store(a, r) for a, r in zip(first[1:], again, strict=True))
    assert error_of(lambda: send(b, request([1], pid=PID + 1, epoch=6)))[1] == "PRODUCER_FENCED"
    assert stored(b, 1) == 3


def test_a_request_spread_over_queues_is_answered_in_its_order_and_known_after_a_kill(
    start_broker: StartBroker,
) -> None:
    """The SDK spreads a batch over the queues message by message; the broker stores it grouped
    by queue (one stamped run each), answers in the request's order, and a restart rebuilt
    from the CommitLog alone knows every message of every run."""
    b = start_broker(store="one")
    create_topic(b, TOPIC)
    spread = broker_pb2.SendMessageRequest(
        producer_id=PID,
        producer_epoch=1,
        messages=[
            common_pb2.Message(topic=TOPIC, body=b"q%d-%d" % (i % 4, i // 4), queue_id=i % 4,
                               sequence=i // 4)
            for i in range(20)
        ],
    )  # fmt: skip
    first = send(b, spread)
    assert [(r.queue_id, r.queue_offset) for r in first] == [(i % 4, i // 4) for i in range(20)]
    for q in range(4):
        assert pull_all(b, TOPIC, q, 5) == [b"q%d-%d" % (q, n) for n in range(5)]
    b.kill()  # before the table's snapshot (every 10 s): rebuilt from the log
    b = start_broker(store="one", port=int(b.address.rsplit(":", 1)[1]))
    again = send(b, spread)
    assert [r.duplicate for r in again] == [True] * 20
    assert all(same_store(a, r) for a, r in zip(first, again, strict=True))
    assert [stored(b, q) for q in range(4)] == [5] * 4


def test_a_slave_restarted_as_master_answers_retries_of_what_its_master_stored(
    start_broker: StartBroker, nameserver: NameServerProcess
) -> None:
    """The table is rebuilt from the replicated CommitLog: the slave's bytes carry it."""
    master = start(start_broker, nameserver, "m", "--role", "SYNC_MASTER")
    create_topic(master, TOPIC)
    slave = start_slave(start_broker, nameserver, topic=TOPIC)
    first = send(master, request([0, 1]))
    wait_until(lambda: stored(slave) == 2, 20, "the slave to hold both messages")
    master.kill()
    slave.kill()
    promoted = start(start_broker, nameserver, "slave", "--role", "ASYNC_MASTER")
    again = send(promoted, request([0, 1, 2]))
    assert [r.duplicate for r in again] == [True, True, False]
    assert all(
        (a.queue_offset, a.commitlog_offset) == (r.queue_offset, r.commitlog_offset)
        for a, r in zip(first, again[:2], strict=True)
    )
    assert stored(promoted) == 3


def test_a_request_that_overtook_the_one_before_it_waits_for_it_instead_of_failing(
    broker: BrokerProcess,
) -> None:
    """Two requests of one producer in flight at once may reach the put in either order: the
    later one, arriving first, waits a moment for the earlier one and both are stored in
    sequence order, without a SEQUENCE_GAP round trip to the producer."""
    send(broker, request([0]))
    later = broker.stub().SendMessage.future(request([2, 3]), timeout=30)
    wait_until(
        lambda: later.done() or scrape(METRICS[0])[WAITING] == 1,
        10,
        "the later request to wait inside the broker behind its gap",
    )
    assert not later.done()
    earlier = send(broker, request([1]))
    assert [r.duplicate for r in earlier] == [False]
    results = later.result()
    assert [r.duplicate for r in results.results] == [False, False]
    offsets = [earlier[0].queue_offset, *(r.queue_offset for r in results.results)]
    assert offsets == [1, 2, 3]
    assert stored(broker) == 4
