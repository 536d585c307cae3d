"""The ConsumeQueue entry of a ``%SYS%TIMER`` record carries its delivery time as the tag code,
so the broker rebuilds its timer wheel from the queue without reading a pending body."""

import shutil
from pathlib import Path

import pytest

from tests.store.conftest import tiny_config
from tidemq.storage import Message, MessageStore
from tidemq.storage.check import check_store
from tidemq.storage.javahash import tag_code
from tidemq.storage.record import PROP_TIMER_DELIVER_MS, TIMER_TOPIC

pytestmark = pytest.mark.store


def timer(deliver_ms: str, tags: str | None = "real-tag") -> Message:
    return Message(
        TIMER_TOPIC, b"pending", tags=tags, properties={PROP_TIMER_DELIVER_MS: deliver_ms}
    )


def codes(s: MessageStore, topic: str) -> list[int]:
    return [e.tag_code for e in s.queue_entries(topic, 0, 0, 100)]


def test_timer_records_index_their_delivery_time_as_the_tag_code_and_keep_it_on_rebuild(
    tmp_path: Path,
) -> None:
    cfg = tiny_config(tmp_path / "s")
    due = 1_767_225_600_123
    with MessageStore(cfg) as s:
        s.put_messages([timer(str(due)), timer(str(due + 5)), timer("0")])
        # Malformed: the tags' hash, as for any record; other topics ignore the property.
        s.put_messages([timer("soon"), timer(str(1 << 63)), timer("-5", tags=None)])
        s.put_messages([Message("t", b"x", tags="a", properties={PROP_TIMER_DELIVER_MS: "7"})])
        assert s.wait_dispatched(s.commitlog.max_offset, 10)
        want = [due, due + 5, 0, tag_code("real-tag"), tag_code("real-tag"), 0]
        assert codes(s, TIMER_TOPIC) == want
        entries = s.queue_entries(TIMER_TOPIC, 0, 1, 2)
        assert [e.queue_offset for e in entries] == [1, 2]
        assert s.look_message(entries[0].phy_offset).properties[PROP_TIMER_DELIVER_MS] == str(
            due + 5
        )
        assert codes(s, "t") == [tag_code("a")]
        assert s.queue_entries("absent", 0, 0, 10) == []
    assert not check_store(str(tmp_path / "s")).problems
    # The ConsumeQueues are derived: rebuilt from the CommitLog, they carry the same codes.
    shutil.rmtree(tmp_path / "s" / "consumequeue")
    with MessageStore(cfg) as s:
        assert s.wait_dispatched(s.commitlog.max_offset, 10)
        assert codes(s, TIMER_TOPIC) == want
