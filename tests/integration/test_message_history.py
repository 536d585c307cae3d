"""Messages looked up and their lives told, against real nameserver and broker processes: a
message received by a named client, not acked, received again and acked shows both deliveries
to that client, the lapse between them and the ack; a dead-lettered message shows its move to
%DLQ%<group>; lookups by id, by key and by time range merge both broker groups; bad input gets
typed errors and leaves the broker serving."""

from __future__ import annotations

import dataclasses

import pytest

import tidemq
from tests.integration.conftest import StartBroker, StartNameServer
from tests.integration.receive_sdk_helpers import FAST, _receive_n, _send
from tests.integration.test_sdk import Cluster, _routable, broker_flags
from tests.waiting import wait_until
from tidemq.admin import MessageEventKind as K
from tidemq.admin import MessageHistory
from tidemq.cli import main as cli_main
from tidemq.errors import InvalidArgumentError, MessageNotFoundError, TopicNotFoundError
from tidemq.protos import broker_pb2

pytestmark = pytest.mark.integration


@pytest.fixture(name="cluster")
def two_groups(start_nameserver: StartNameServer, start_broker: StartBroker) -> Cluster:
    ns = start_nameserver()
    brokers = {
        name: start_broker(*broker_flags(ns, name), store=name) for name in ("broker-a", "broker-b")
    }
    c = Cluster(ns, brokers, start_broker)
    _routable(c.address)
    with tidemq.Admin(c.address) as admin:
        wait_until(lambda: len(admin.masters()) == 2, 20, "both masters routed")
    return c


def _history_until(admin: tidemq.Admin, msg_id: str, last: K, group: str) -> MessageHistory:
    """The history once its last event for ``group`` is ``last`` (its record is dispatched
    by the time the call that made it answered; the wait only bounds a slow machine)."""
    seen: list[MessageHistory] = []

    def ready() -> bool:
        h = admin.message_history(msg_id)
        seen.append(h)
        mine = [e for e in h.events if e.group == group]
        return bool(mine) and mine[-1].kind is last

    wait_until(ready, 10, f"{last.value} in the history of {msg_id}")
    return seen[-1]


def test_a_redelivered_then_acked_message_shows_two_deliveries_to_its_client_and_the_ack(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    with tidemq.Admin(cluster.address) as admin:
        admin.create_topic("hist", queues=1)
        admin.update_consumer_group("g-hist", retry_delays_s=[0.2])
        [sent] = _send(cluster, "hist", ["job-1"], keys=["order-1"])
        config = dataclasses.replace(FAST, client_id="worker-7")
        with tidemq.SimpleConsumer(
            "g-hist", "hist", nameserver=cluster.address, config=config
        ) as c:
            [first] = _receive_n(c, 1, invisible_s=1.0)  # not acked: it lapses after 1 s
            [second] = _receive_n(c, 1, invisible_s=30.0, timeout_s=15)
            assert (second.msg_id, second.delivery_attempt) == (sent.msg_id, 2)
            c.ack(second)
        h = _history_until(admin, sent.msg_id, K.ACKED, "g-hist")
    assert h.message.msg_id == sent.msg_id and h.message.body == b"job-1"
    assert [(e.kind, e.group, e.client_id, e.attempt) for e in h.events] == [
        (K.STORED, None, None, None),
        (K.DELIVERED, "g-hist", "worker-7", 1),
        (K.INVISIBILITY_ENDED, "g-hist", "worker-7", 1),
        (K.REDELIVERED, "g-hist", "worker-7", 2),
        (K.ACKED, "g-hist", "worker-7", 2),
    ]
    times = [e.time_ms for e in h.events]
    assert times == sorted(times)  # type: ignore[type-var]
    assert h.events[1].invisible_until_ms == first.invisible_until_ms
    [g] = [g for g in h.groups if g.group == "g-hist"]
    assert (g.model, g.state, g.deliveries) == ("receive", "acked", 2)
    assert not h.truncated and h.scanned_records > 0
    # The command line tells the same life.
    assert cli_main(["message", "history", sent.msg_id, "--nameserver", cluster.address]) == 0
    out = capsys.readouterr().out
    assert "redelivered" in out and "worker-7" in out and "acked" in out


def test_a_dead_lettered_message_shows_its_move_to_the_dead_letter_queue(
    cluster: Cluster,
) -> None:
    with tidemq.Admin(cluster.address) as admin:
        admin.create_topic("poison", queues=1)
        [sent] = _send(cluster, "poison", ["bad"])
        config = dataclasses.replace(FAST, client_id="worker-9")
        with tidemq.SimpleConsumer(
            "g-dlq", "poison", nameserver=cluster.address, config=config
        ) as c:
            [m] = _receive_n(c, 1, invisible_s=30.0)
            c.dead_letter(m, "cannot parse")
        h = _history_until(admin, sent.msg_id, K.DEAD_LETTERED, "g-dlq")
    mine = [(e.kind, e.client_id, e.dead_letter_topic) for e in h.events if e.group == "g-dlq"]
    assert mine == [
        (K.DELIVERED, "worker-9", None),
        (K.DEAD_LETTERED, "worker-9", "%DLQ%g-dlq"),
    ]
    assert [g.state for g in h.groups if g.group == "g-dlq"] == ["dead_lettered"]


def test_lookups_by_id_key_and_time_range_merge_both_broker_groups(cluster: Cluster) -> None:
    with tidemq.Admin(cluster.address) as admin:
        admin.create_topic("lookups", queues=2)
        sent = _send(cluster, "lookups", [f"m{i}" for i in range(12)], keys=["k-even"])
        sent += _send(cluster, "lookups", [f"n{i}" for i in range(6)], keys=["k-odd"])
        viewed = {r.msg_id: admin.view_message(r.msg_id) for r in sent}
        assert {m.broker for m in viewed.values()} == {"broker-a", "broker-b"}
        assert [viewed[r.msg_id].body for r in sent[:2]] == [b"m0", b"m1"]

        by_key = admin.find_messages("lookups", key="k-odd")
        assert sorted(m.msg_id for m in by_key) == sorted(r.msg_id for r in sent[12:])
        assert all(m.keys == ("k-odd",) for m in by_key)

        stamps = sorted(m.store_timestamp_ms for m in viewed.values())
        begin, end = stamps[4], stamps[-3]
        in_range = admin.find_messages("lookups", begin_ms=begin, end_ms=end, limit=1000)
        want = {i for i, m in viewed.items() if begin <= m.store_timestamp_ms < end}
        assert {m.msg_id for m in in_range} == want and len(in_range) == len(want)
        order = [(m.store_timestamp_ms, m.broker, m.queue_id, m.queue_offset) for m in in_range]
        assert order == sorted(order)
        first_two = admin.find_messages("lookups", begin_ms=begin, end_ms=end, limit=2)
        assert [m.msg_id for m in first_two] == [m.msg_id for m in in_range[:2]]


def test_bad_lookups_get_typed_errors_and_the_broker_keeps_serving(cluster: Cluster) -> None:
    with tidemq.Admin(cluster.address) as admin:
        admin.create_topic("typed", queues=1)
        [sent] = _send(cluster, "typed", ["x"])
        with pytest.raises(InvalidArgumentError) as bad_id:
            admin.view_message("not-an-id")
        assert bad_id.value.code == "INVALID_MESSAGE_ID"
        unknown = sent.msg_id[:-8] + "7FFFFFFF"  # well formed, past every store's end
        with pytest.raises(MessageNotFoundError):
            admin.view_message(unknown)
        with pytest.raises(InvalidArgumentError):
            admin.find_messages("typed", key="k", limit=0)
        address = admin.masters()[admin.view_message(sent.msg_id).broker]
        core = admin._core
        call = admin._runner.run
        with pytest.raises(TopicNotFoundError):
            call(
                core._call(
                    address,
                    "GetMessageHistory",
                    broker_pb2.GetMessageHistoryRequest(
                        topic="no-such-topic", queue_id=0, queue_offset=0
                    ),
                )
            )
        with pytest.raises(InvalidArgumentError) as past_end:
            call(
                core._call(
                    address,
                    "GetMessageHistory",
                    broker_pb2.GetMessageHistoryRequest(topic="typed", queue_id=0, queue_offset=5),
                )
            )
        assert past_end.value.max_offset == 1
        with pytest.raises(InvalidArgumentError):
            call(
                core._call(
                    address,
                    "GetMessageHistory",
                    broker_pb2.GetMessageHistoryRequest(
                        topic="typed", queue_id=0, queue_offset=0, max_records=-1
                    ),
                )
            )
        h = admin.message_history(sent.msg_id)  # still serving
        assert [e.kind for e in h.events] == [K.STORED]
