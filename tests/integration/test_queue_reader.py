"""``tidemq.QueueReader``: reading queues by offset, outside any consumer group."""

from __future__ import annotations

import pytest

import tidemq
from tests.integration.conftest import NameServerProcess, StartBroker, StartNameServer
from tests.waiting import wait_until
from tidemq.errors import DataLossError, InvalidArgumentError

pytestmark = pytest.mark.integration


@pytest.fixture
def ns(start_nameserver: StartNameServer, start_broker: StartBroker) -> NameServerProcess:
    ns = start_nameserver()
    start_broker("--nameserver", ns.address, "--broker-name", "broker-a")
    with tidemq.Admin(ns.address) as admin:
        wait_until(lambda: bool(admin.masters()), 20, "a master broker routed")
        admin.create_topic("log", queues=2)
    with tidemq.Producer(ns.address) as producer:
        # One at a time: each send is a block of its own, and the queues take turns by block,
        # so each queue holds 20 (a burst of send_async would fill one queue's block).
        for i in range(40):
            assert producer.send("log", f"m{i}", tag="ab"[i % 2]).ok
    return ns


def test_pull_and_read_range(ns: NameServerProcess) -> None:
    with tidemq.QueueReader(ns.address) as reader:
        mq0, mq1 = reader.read_queues("log")
        r = reader.pull(mq0, 5, max_messages=3)
        assert r.status is tidemq.PullStatus.FOUND
        assert ([m.queue_offset for m in r.messages], r.next_offset) == ([5, 6, 7], 8)
        assert (r.min_offset, r.max_offset) == (0, 20)
        assert reader.pull(mq0, 20).status is tidemq.PullStatus.NO_NEW_MESSAGE
        assert reader.pull(mq0, 25).status is tidemq.PullStatus.OFFSET_OVERFLOW

        batches = list(reader.read_range(mq1, 3, 17, max_messages=4))
        assert [len(b) for b in batches] == [4, 4, 4, 2]
        assert [m.queue_offset for b in batches for m in b] == list(range(3, 17))
        # Round robin put even messages (tag a) in queue 0: filtering keeps offsets in range.
        tagged = [m for b in reader.read_range(mq0, 0, 20, tags="b") for m in b]
        assert tagged == []
        assert len([m for b in reader.read_range(mq0, 0, 20, tags="a") for m in b]) == 20

        with pytest.raises(InvalidArgumentError):
            reader.pull(tidemq.MessageQueue("log", "broker-a", 9), 0)
        with pytest.raises(ValueError, match="max_messages"):
            reader.pull(mq0, 0, max_messages=5000)


def test_read_range_never_passes_a_gap_silently(ns: NameServerProcess) -> None:
    # Offsets past the end stand for messages the master promised but this broker lacks.
    with tidemq.QueueReader(ns.address, retry_timeout_ms=300) as reader:
        mq0 = reader.read_queues("log")[0]
        with pytest.raises(tidemq.TidemqError, match="not readable"):
            list(reader.read_range(mq0, 18, 25))
    assert issubclass(DataLossError, tidemq.TidemqError)
