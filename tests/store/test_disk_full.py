"""A full disk under the ConsumeQueues (a real one: a small tmpfs mounted at ``consumequeue``):
dispatch waits for space instead of calling the log corrupt, nothing is reported visible that
is not, appends are refused meanwhile, and everything resumes by itself when space returns."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.disk import fill, small_disk
from tests.store.conftest import tiny_config
from tests.waiting import wait_until
from tidemq.storage import Message, MessageStore
from tidemq.storage.errors import DiskFullError

pytestmark = pytest.mark.store


def test_dispatch_on_a_full_disk_refuses_appends_and_resumes_by_itself_when_space_returns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "store"
    with small_disk(root / "consumequeue", 256 << 10) as queues:
        store = MessageStore(tiny_config(root)).open()
        try:
            store.put_messages([Message("t", b"before", queue_id=0)])
            assert store.wait_dispatched(store.commitlog.max_offset, 10)
            filler = fill(queues)
            # Queue 1 needs its first file: there is no room for it.
            stuck = store.put_messages([Message("t", b"stuck", queue_id=1)])
            wait_until(lambda: refused(store), 10, "appends refused while dispatch waits")
            with pytest.raises(DiskFullError, match="disk full"):
                stuck.dispatched.result(10)
            assert store.dispatch_stalled is not None
            assert store.dispatcher.error is None  # a full disk is not corruption
            assert not store.stats().writable
            assert store.max_offset("t", 1) == 0  # nothing claimed visible
            assert "disk full" in caplog.text and "corrupt" not in caplog.text.lower()

            filler.unlink()  # space returns: no restart, no call
            wait_until(lambda: store.dispatch_stalled is None, 10, "dispatch to resume")
            wait_until(lambda: store.max_offset("t", 1) == 1, 10, "the stuck message dispatched")
            assert store.get_messages("t", 1, 0).messages[0].body == b"stuck"
            after = store.put_messages([Message("t", b"after", queue_id=1)])
            after.dispatched.result(10)
            assert [m.body for m in store.get_messages("t", 1, 0).messages] == [b"stuck", b"after"]
        finally:
            store.close()


def refused(store: MessageStore) -> bool:
    """Whether an append (to a queue that has room) is refused as DISK_FULL."""
    try:
        store.put_messages([Message("t", b"refused?", queue_id=0)])
    except DiskFullError:
        return True
    return False
