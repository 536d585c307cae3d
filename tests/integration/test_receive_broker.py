"""Receive/ack consumption on real broker processes over raw gRPC: redelivery with attempt
counts, backoff, changes of invisibility, typed errors for bad handles, dead-lettering, a
SIGKILL and restart, and a slave that rebuilds the master's state from the replicated log."""

from __future__ import annotations

import signal
import time

import grpc
import pytest

from tests.integration import replicas
from tests.integration.conftest import (
    BrokerProcess,
    NameServerProcess,
    StartBroker,
    StartNameServer,
    free_port,
)
from tests.integration.failover import SESSION_MS, Group
from tests.integration.receiving import (
    FAST,
    GROUP,
    TOPIC,
    ack,
    bodies,
    change,
    codes,
    create_topic,
    error_of,
    nack,
    receive,
    receive_until,
    scrape,
    send,
    set_group,
    state,
)
from tests.integration.zookeeper import ZooKeeperServer
from tests.waiting import wait_until
from tidemq.protos import broker_pb2, common_pb2

pytestmark = pytest.mark.integration


def test_an_unacked_message_comes_again_after_its_invisible_time_with_its_attempt_counted(
    start_broker: StartBroker,
) -> None:
    b = start_broker(*FAST)
    create_topic(b)
    set_group(b, delays_ms=[100])
    send(b, [b"a", b"b", b"c"])
    started = time.monotonic()  # the invisibility starts after this, at the broker
    first = receive(b, invisible_ms=400)
    assert bodies(first) == [b"a", b"b", b"c"]
    assert {m.delivery_attempt for m in first} == {1}
    done = next(m for m in first if m.message.body == b"a")
    assert codes(ack(b, [done.receipt_handle])) == ["OK"]
    # Invisible: nobody else gets them meanwhile.
    assert receive(b, wait_ms=150) == []
    again = receive_until(b, 2, invisible_ms=30_000)
    assert time.monotonic() - started >= 0.39
    assert bodies(again) == [b"b", b"c"]
    assert {m.delivery_attempt for m in again} == {2}
    assert {m.message.reconsume_times for m in again} == {1}
    # The acked one never comes back.
    assert codes(ack(b, [m.receipt_handle for m in again])) == ["OK", "OK"]
    assert receive(b, wait_ms=600) == []
    (q,) = state(b).queues
    assert (q.done_offset, q.next_offset, q.inflight, q.retrying) == (3, 3, 0, 0)


def test_a_nacked_message_is_retried_after_the_groups_backoff_for_its_attempt(
    start_broker: StartBroker,
) -> None:
    b = start_broker(*FAST)
    create_topic(b)
    set_group(b, delays_ms=[300, 1200])
    send(b, [b"x"])
    (m,) = receive(b)
    nacked = time.monotonic()
    assert codes(nack(b, [m.receipt_handle])) == ["OK"]
    (m2,) = receive_until(b, 1)
    waited = time.monotonic() - nacked
    assert 0.25 <= waited < 1.2, waited
    assert m2.delivery_attempt == 2
    nacked = time.monotonic()
    assert codes(nack(b, [m2.receipt_handle])) == ["OK"]
    (m3,) = receive_until(b, 1)
    waited = time.monotonic() - nacked
    assert 1.1 <= waited < 2.6, waited
    assert m3.delivery_attempt == 3


def test_change_invisible_duration_extends_and_shortens_and_retires_the_old_handle(
    start_broker: StartBroker,
) -> None:
    b = start_broker(*FAST)
    create_topic(b)
    set_group(b, delays_ms=[50])
    send(b, [b"long-job"])
    (m,) = receive(b, invisible_ms=300)
    longer = change(b, m.receipt_handle, 5_000)
    assert longer.invisible_until_ms >= m.invisible_until_ms + 4_000
    # The old handle is retired; the message stays invisible past its first deadline.
    assert codes(ack(b, [m.receipt_handle])) == ["RECEIPT_HANDLE_EXPIRED"]
    assert receive(b, wait_ms=700) == []
    shorter = change(b, longer.receipt_handle, 100)
    (again,) = receive_until(b, 1)
    assert again.delivery_attempt == 2
    assert codes(ack(b, [shorter.receipt_handle])) == ["RECEIPT_HANDLE_EXPIRED"]
    assert codes(ack(b, [again.receipt_handle])) == ["OK"]


def test_bad_handles_and_arguments_get_typed_errors_and_change_nothing(
    start_broker: StartBroker,
) -> None:
    b = start_broker(*FAST)
    create_topic(b)
    create_topic(b, "other")
    send(b, [b"m1", b"m2"])
    m1, m2 = sorted(receive(b, invisible_ms=60_000), key=lambda m: m.message.body)
    assert codes(ack(b, [m2.receipt_handle])) == ["OK"]
    before = state(b)
    # Handles a client could forge: well formed, with a CRC, naming what is not theirs.
    from tidemq.services.broker.receive.handle import ReceiptHandle  # noqa: PLC0415

    h = ReceiptHandle.decode(m1.receipt_handle)
    forged_lease = ReceiptHandle(
        h.broker_name, h.group, h.topic, h.queue_id, h.offset, h.lease_id + 1, h.invisible_until_ms
    ).encode()
    never_delivered = ReceiptHandle(
        h.broker_name, h.group, h.topic, h.queue_id, 99, h.lease_id, h.invisible_until_ms
    ).encode()
    results = ack(
        b,
        [
            "not a handle",
            m1.receipt_handle[:-3] + "AAA",  # CRC mismatch
            forged_lease,
            never_delivered,
            m2.receipt_handle,  # acked already
        ],
    )
    assert codes(results) == [
        "INVALID_RECEIPT_HANDLE",
        "INVALID_RECEIPT_HANDLE",
        "INVALID_RECEIPT_HANDLE",
        "INVALID_RECEIPT_HANDLE",
        "MESSAGE_ALREADY_ACKED",
    ]
    assert all(not r.error.retriable for r in results)
    # Another group's or another topic's call with this handle.
    (theirs,) = ack(b, [m1.receipt_handle], group="thieves")
    assert codes([theirs]) == ["INVALID_RECEIPT_HANDLE"]
    assert "of consumer group 'workers'" in theirs.error.message
    assert codes(ack(b, [m1.receipt_handle], topic="other")) == ["INVALID_RECEIPT_HANDLE"]
    assert codes(nack(b, [m1.receipt_handle], group="thieves")) == ["INVALID_RECEIPT_HANDLE"]
    assert error_of(lambda: change(b, m1.receipt_handle, 1_000, group="thieves"))[1] == (
        "INVALID_RECEIPT_HANDLE"
    )
    # Absurd arguments: the whole call is refused.
    for bad in (
        lambda: receive(b, invisible_ms=0),
        lambda: receive(b, invisible_ms=-5),
        lambda: receive(b, invisible_ms=13 * 3_600_000),
        lambda: receive(b, max_messages=0),
        lambda: receive(b, max_messages=1025),
        lambda: receive(b, start_from="yesterday"),
        lambda: receive(b, start_from="\u00b2"),  # a digit to str.isdigit, not to int()
        lambda: receive(b, start_from="9" * 40),
        lambda: change(b, m1.receipt_handle, 0),
        lambda: ack(b, []),
        lambda: ack(b, [m1.receipt_handle] * 1025),
    ):
        code, name, retriable = error_of(bad)
        assert (code, name, retriable) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
            False,
        )
    assert state(b) == before
    # The real holder's handle still works after all that.
    assert codes(ack(b, [m1.receipt_handle])) == ["OK"]


def test_an_expired_handle_is_refused_and_the_message_goes_to_the_next_receiver(
    start_broker: StartBroker,
) -> None:
    b = start_broker(*FAST)
    create_topic(b)
    set_group(b, delays_ms=[50])
    send(b, [b"slow"])
    (m,) = receive(b, invisible_ms=200)
    (again,) = receive_until(b, 1)
    assert again.delivery_attempt == 2
    assert codes(ack(b, [m.receipt_handle])) == ["RECEIPT_HANDLE_EXPIRED"]
    assert error_of(lambda: change(b, m.receipt_handle, 5_000))[1] == "RECEIPT_HANDLE_EXPIRED"
    assert codes(ack(b, [again.receipt_handle])) == ["OK"]


def test_a_message_failing_max_attempts_goes_to_the_dead_letter_queue_with_its_origin(
    start_broker: StartBroker,
) -> None:
    metrics = f"127.0.0.1:{free_port()}"
    b = start_broker(*FAST, "--metrics-listen", metrics)
    create_topic(b)
    set_group(b, max_delivery_attempts=2, delays_ms=[100])
    send(b, [b"poison", b"fine"])
    first = receive(b, invisible_ms=60_000)
    poison = next(m for m in first if m.message.body == b"poison")
    fine = next(m for m in first if m.message.body == b"fine")
    assert codes(ack(b, [fine.receipt_handle])) == ["OK"]
    assert codes(nack(b, [poison.receipt_handle])) == ["OK"]
    (second,) = receive_until(b, 1)
    assert second.delivery_attempt == 2
    # Its last attempt expires without an ack: the revive task dead-letters it.
    change(b, second.receipt_handle, 50)
    dlq = f"%DLQ%{GROUP}"
    wait_until(lambda: state(b).dead_letters == 1, 10, "the dead letter")
    r = b.stub().PullMessage(
        broker_pb2.PullMessageRequest(group="inspect", topic=dlq, queue_id=0, offset=0),
        timeout=10,
    )
    (copy,) = r.messages
    assert copy.body == b"poison"
    assert list(copy.keys) == ["poison"]
    assert copy.properties["RETRY_TOPIC"] == TOPIC
    assert copy.properties["ORIGIN_MESSAGE_ID"] == poison.message.msg_id
    assert copy.properties["DLQ_ORIGIN_QUEUE_OFFSET"] == str(poison.message.queue_offset)
    assert copy.properties["DLQ_DELIVERY_ATTEMPTS"] == "2"
    assert copy.properties["DLQ_REASON"] == "max delivery attempts (2)"
    assert copy.reconsume_times == 2
    assert receive(b, wait_ms=400) == []
    (q,) = state(b).queues
    assert (q.done_offset, q.inflight, q.retrying) == (2, 0, 0)
    seen = scrape(metrics)
    by_group = (("group", GROUP),)
    assert seen["tidemq_receive_messages_total", by_group] == 3
    assert seen["tidemq_receive_redeliveries_total", by_group] == 1
    assert seen["tidemq_receive_acks_total", by_group] == 1
    assert seen["tidemq_dead_letters_total", by_group] == 1
    in_topic = (("group", GROUP), ("topic", TOPIC))
    assert seen["tidemq_receive_inflight", in_topic] == 0
    assert seen["tidemq_receive_retrying", in_topic] == 0


def test_a_nack_of_the_last_attempt_and_an_explicit_dead_letter_move_it_at_once(
    start_broker: StartBroker,
) -> None:
    b = start_broker(*FAST)
    create_topic(b)
    set_group(b, max_delivery_attempts=1)
    send(b, [b"one", b"two"])
    one, two = sorted(receive(b, invisible_ms=60_000), key=lambda m: m.message.body)
    assert codes(nack(b, [one.receipt_handle])) == ["OK"]
    assert state(b).dead_letters == 1  # before the nack answered, not at the next revive
    r = b.stub().DeadLetterMessage(
        broker_pb2.DeadLetterMessageRequest(
            group=GROUP, topic=TOPIC, receipt_handle=two.receipt_handle, reason="bad schema"
        ),
        timeout=10,
    )
    assert (r.dlq_topic, r.dlq_queue_offset) == (f"%DLQ%{GROUP}", 1)
    assert state(b).dead_letters == 2
    assert codes(ack(b, [two.receipt_handle])) == ["MESSAGE_ALREADY_ACKED"]
    (q,) = state(b).queues
    assert q.done_offset == 2


def test_in_flight_state_survives_sigkill_and_restart(start_broker: StartBroker) -> None:
    b = start_broker(*FAST, "--receive-snapshot-interval-ms", "200")
    create_topic(b)
    set_group(b, delays_ms=[100])
    send(b, [f"m{i}".encode() for i in range(10)])
    # Long enough for the restart to come well before the deadline.
    got = sorted(receive(b, invisible_ms=8_000), key=lambda m: m.message.body)
    assert len(got) == 10
    acked, held = got[:5], got[5:]
    assert codes(ack(b, [m.receipt_handle for m in acked])) == ["OK"] * 5
    send(b, [b"late"])  # never received before the kill
    b.kill()
    b = start_broker(*FAST, "--receive-snapshot-interval-ms", "200")
    # The held ones are still invisible and their handles still work; the acked ones are done.
    assert codes(ack(b, [held[0].receipt_handle])) == ["OK"]
    assert codes(ack(b, [acked[0].receipt_handle])) == ["MESSAGE_ALREADY_ACKED"]
    (late,) = receive(b)
    assert late.message.body == b"late" and late.delivery_attempt == 1
    back = receive_until(b, 4)
    assert bodies(back) == bodies(held[1:])
    assert {m.delivery_attempt for m in back} == {2}
    assert codes(ack(b, [m.receipt_handle for m in [*back, late]])) == ["OK"] * 5
    # A graceful restart (a snapshot at shutdown) keeps it all too.
    b.terminate()
    b = start_broker(*FAST)
    (q,) = state(b).queues
    assert (q.done_offset, q.next_offset, q.inflight, q.retrying) == (11, 11, 0, 0)
    assert receive(b, wait_ms=300) == []


def test_a_slave_rebuilds_the_masters_receive_state_from_the_replicated_log(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    master = replicas.start(start_broker, nameserver, "master", *FAST)
    create_topic(master, TOPIC, queues=2)
    slave = replicas.start(start_broker, nameserver, "slave", *replicas.SLAVE_FLAGS, *FAST)
    set_group(master, delays_ms=[60_000])
    for q in (0, 1):
        send(master, [f"q{q}-{i}".encode() for i in range(20)], queue_id=q)
    got = receive_until(master, 40, invisible_ms=120_000)
    assert codes(ack(master, [m.receipt_handle for m in got[:25]])) == ["OK"] * 25
    assert codes(nack(master, [m.receipt_handle for m in got[25:30]])) == ["OK"] * 5

    def figures(b: BrokerProcess) -> list[tuple[int, ...]]:
        return [
            (q.queue_id, q.done_offset, q.next_offset, q.inflight, q.retrying)
            for q in state(b).queues
        ]

    want = figures(master)
    assert sum(f[3] for f in want) == 10 and sum(f[4] for f in want) == 5
    wait_until(lambda: figures(slave) == want, 30, "the slave's receive state to match")
    # A slave refuses the calls that change it.
    _, name, retriable = error_of(lambda: receive(slave))
    assert (name, retriable) == ("NOT_MASTER", True)
    # And keeps following.
    assert codes(ack(master, [m.receipt_handle for m in got[30:]])) == ["OK"] * 10
    want = figures(master)
    wait_until(lambda: figures(slave) == want, 30, "the slave to follow the acks")
    # Restarted, the slave rebuilds the same state from its own log.
    slave.kill()
    slave = replicas.start(start_broker, nameserver, "slave", *replicas.SLAVE_FLAGS, *FAST)
    assert figures(slave) == want


def test_an_offset_reset_of_a_receive_group_forgets_what_was_in_flight_and_goes_on_there(
    start_broker: StartBroker,
) -> None:
    b = start_broker(*FAST)
    create_topic(b)
    send(b, [f"r{i}".encode() for i in range(5)])
    first = sorted(receive(b, invisible_ms=60_000), key=lambda m: m.message.queue_offset)
    assert len(first) == 5
    r = b.stub().CommitOffset(
        broker_pb2.CommitOffsetRequest(group=GROUP, topic=TOPIC, queue_id=0, offset=1, reset=True),
        timeout=10,
    )
    assert r.offset == 1
    again = sorted(receive(b), key=lambda m: m.message.queue_offset)
    assert [m.message.queue_offset for m in again] == [1, 2, 3, 4]
    assert {m.delivery_attempt for m in again} == {1}
    assert codes(ack(b, [first[0].receipt_handle, first[3].receipt_handle])) == [
        "MESSAGE_ALREADY_ACKED",
        "RECEIPT_HANDLE_EXPIRED",
    ]
    assert codes(ack(b, [m.receipt_handle for m in again])) == ["OK"] * 4

    def committed() -> int:
        q = b.stub().QueryConsumerOffset(
            broker_pb2.QueryConsumerOffsetRequest(group=GROUP, topic=TOPIC, queue_id=0), timeout=10
        )
        return int(q.offset)

    # The revive task commits the group's floor: lag and retention see receive groups.
    wait_until(lambda: committed() == 5, 10, "the floor committed as the group's offset")


def test_under_sync_master_an_ack_answers_only_once_the_slave_holds_it(
    nameserver: NameServerProcess, start_broker: StartBroker
) -> None:
    master = replicas.start(
        start_broker,
        nameserver,
        "master",
        *FAST,
        "--role",
        "SYNC_MASTER",
        "--ha-sync-timeout-ms",
        "800",
    )
    create_topic(master)
    slave = replicas.start(start_broker, nameserver, "slave", *replicas.SLAVE_FLAGS, *FAST)
    replicas.wait_in_sync(master)
    send(master, [b"a", b"b"])
    a, b = sorted(receive(master, invisible_ms=60_000), key=lambda m: m.message.body)
    assert codes(ack(master, [a.receipt_handle])) == ["OK"]
    slave.proc.send_signal(signal.SIGSTOP)  # connected but silent
    try:
        started = time.monotonic()
        code, name, retriable = error_of(lambda: ack(master, [b.receipt_handle]))
        assert (code, name, retriable) == (
            grpc.StatusCode.UNAVAILABLE,
            "STORE_NOT_WRITABLE",
            True,
        )
        assert time.monotonic() - started >= 0.7
    finally:
        slave.proc.send_signal(signal.SIGCONT)
    # Recorded on the master all the same: the retry finds it acked.
    wait_until(
        lambda: codes(ack(master, [b.receipt_handle])) == ["MESSAGE_ALREADY_ACKED"],
        30,
        "the retried ack",
    )
    wait_until(lambda: state(slave).queues[0].done_offset == 2, 30, "the slave to hold both acks")


def test_fifo_message_groups_keep_their_order_and_a_stuck_group_does_not_hold_up_another(
    start_broker: StartBroker,
) -> None:
    b = start_broker(*FAST)
    create_topic(b)
    set_group(b, fifo=True, delays_ms=[400])
    msgs = [
        common_pb2.Message(
            topic=TOPIC, body=body.encode(), queue_id=0, properties={"__SHARDINGKEY": body[0]}
        )
        for body in ("A1", "B1", "A2", "B2", "A3")
    ]
    b.stub().SendMessage(broker_pb2.SendMessageRequest(messages=msgs), timeout=30)
    first = receive(b, invisible_ms=60_000)
    assert [(m.message.body, m.message_group) for m in first] == [(b"A1", "A"), (b"B1", "B")]
    a1, b1 = first
    # A is stuck (A1 failed and waits for its retry); B goes on.
    assert codes(nack(b, [a1.receipt_handle])) == ["OK"]
    assert codes(ack(b, [b1.receipt_handle])) == ["OK"]
    (b2,) = receive(b, invisible_ms=60_000)
    assert b2.message.body == b"B2"
    assert codes(ack(b, [b2.receipt_handle])) == ["OK"]
    # A1 comes again before anything after it in its group.
    (again,) = receive_until(b, 1, invisible_ms=60_000)
    assert (again.message.body, again.delivery_attempt) == (b"A1", 2)
    assert receive(b, wait_ms=200) == []
    assert codes(ack(b, [again.receipt_handle])) == ["OK"]
    (a2,) = receive_until(b, 1, invisible_ms=60_000)
    assert a2.message.body == b"A2"
    assert codes(ack(b, [a2.receipt_handle])) == ["OK"]
    (a3,) = receive_until(b, 1)
    assert a3.message.body == b"A3"


def test_after_a_failover_the_new_master_knows_what_was_acked_and_what_is_in_flight(
    start_broker: StartBroker,
    start_nameserver: StartNameServer,
    zookeeper: ZooKeeperServer,
    zk_root: str,
) -> None:
    group = Group(start_broker, zookeeper, zk_root, extra=FAST)
    try:
        group.routed(start_nameserver, TOPIC, 1)
        first = group.master()
        old = group.brokers[first]
        send(old, [f"f{i}".encode() for i in range(10)])
        # Long enough to outlast the election: the holders' handles are still good after it.
        got = sorted(receive(old, invisible_ms=10_000), key=lambda m: m.message.queue_offset)
        assert len(got) == 10
        # SYNC_MASTER: each answered ack is on the in-sync slaves.
        assert codes(ack(old, [m.receipt_handle for m in got[:5]])) == ["OK"] * 5
        group.kill(first)
        second = group.master(timeout_s=SESSION_MS / 1000 + 20, not_id=first)
        new = group.brokers[second]
        # SYNC_MASTER: acks answer once an in-sync slave holds them (the third broker, once it
        # follows the new master).
        replicas.wait_in_sync(new)
        # The new master decides on the state its predecessor left: acked ones stay acked, the
        # others are still invisible and their holders' handles still work.
        assert codes(ack(new, [got[0].receipt_handle, got[5].receipt_handle])) == [
            "MESSAGE_ALREADY_ACKED",
            "OK",
        ]
        assert receive(new, wait_ms=300) == []
        back = receive_until(new, 4, timeout_s=30)
        assert sorted(m.message.queue_offset for m in back) == [6, 7, 8, 9]
        assert {m.delivery_attempt for m in back} == {2}
        # The receive log has queues but is no topic: the takeover restored no config for it.
        assert "%SYS%" not in (new.store_dir / "config" / "topics.json").read_text()
    finally:
        group.thaw_all()


def test_a_tag_filter_delivers_only_matching_messages_and_completes_the_others(
    start_broker: StartBroker,
) -> None:
    b = start_broker(*FAST)
    create_topic(b)
    msgs = [
        common_pb2.Message(topic=TOPIC, body=f"{tag}{i}".encode(), queue_id=0, tag=tag)
        for i, tag in enumerate("abbab")
    ]
    b.stub().SendMessage(broker_pb2.SendMessageRequest(messages=msgs), timeout=30)
    got = receive(b, tag_expression="a")
    assert [m.message.body for m in got] == [b"a0", b"a3"]
    assert codes(ack(b, [m.receipt_handle for m in got])) == ["OK", "OK"]
    (q,) = state(b).queues
    assert (q.done_offset, q.next_offset, q.inflight) == (5, 5, 0)


def test_an_offsets_group_and_a_disabled_group_are_refused_with_their_reason(
    start_broker: StartBroker,
) -> None:
    b = start_broker(*FAST)
    create_topic(b)
    send(b, [b"m"])
    b.stub().Heartbeat(
        broker_pb2.HeartbeatRequest(
            client_id="puller-1",
            consumers=[
                broker_pb2.ConsumerGroupMembership(group="pullers", model=broker_pb2.OFFSETS)
            ],
        ),
        timeout=10,
    )
    assert error_of(lambda: receive(b, group="pullers")) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "CONSUME_MODEL_MISMATCH",
        False,
    )
    assert error_of(lambda: ack(b, ["x"], group="pullers"))[1] == "CONSUME_MODEL_MISMATCH"
    set_group(b, consume_enabled=False)
    assert error_of(lambda: receive(b)) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "CONSUME_DISABLED",
        False,
    )
    assert state(b).queues == []  # nothing was recorded for either
    set_group(b, consume_enabled=True)
    (m,) = receive(b)
    assert m.message.body == b"m"
