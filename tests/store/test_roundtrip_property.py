"""Property: whatever batches, file sizes and restarts (clean or crashed), every acknowledged
message reads back exactly, through its queue, its key and its id, and `store check` passes."""

import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemq.storage import Message, MessageStore, PutStatus, StoreConfig
from tidemq.storage.check import check_store

pytestmark = pytest.mark.store

batch = st.lists(
    st.tuples(st.binary(max_size=600), st.integers(0, 2), st.sampled_from([None, "a", "b"])),
    min_size=1,
    max_size=8,
)
step = st.one_of(
    batch.map(lambda b: ("put", b)), st.just(("restart", None)), st.just(("crash", None))
)


def simulate_kill(store: MessageStore) -> None:
    """Leave the files as SIGKILL would: no final flush, checkpoint or abort-file removal (the
    page cache survives a killed process). The real-process version is in test_crash.py."""
    lifecycle = store._lifecycle
    assert lifecycle.flusher is not None
    lifecycle.stop_event.set()
    lifecycle.wake_dispatch()
    for t in lifecycle.threads:
        t.join()
    lifecycle.flusher._stopping = True
    with lifecycle.flusher._cond:
        lifecycle.flusher._cond.notify_all()
    store._parts.close_files()
    lifecycle.lock.release()


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(file_size=st.sampled_from([1024, 1500, 4096]), steps=st.lists(step, min_size=1, max_size=12))
def test_round_trip(
    tmp_path_factory: pytest.TempPathFactory, file_size: int, steps: list[tuple[str, object]]
) -> None:
    root = tmp_path_factory.mktemp("rt")
    cfg = StoreConfig(
        str(root / "s"),
        commitlog_file_size_bytes=file_size,
        consume_queue_entries_per_file=8,
        index_slot_num=4,
        index_max_num=16,
    )
    expected: dict[int, list[tuple[bytes, str | None, str, str]]] = {0: [], 1: [], 2: []}
    s = MessageStore(cfg).open()
    n = 0
    try:
        for kind, arg in steps:
            if kind == "put":
                assert isinstance(arg, list)
                msgs = []
                for body, q, tag in arg:
                    msgs.append(Message("rt", body, queue_id=q, tags=tag, keys=[f"key{n}"]))
                    n += 1
                r = s.put_messages(msgs)
                assert r.wait(30) is PutStatus.PUT_OK
                for m, res in zip(msgs, r.results, strict=True):
                    assert res.queue_offset == len(expected[m.queue_id])
                    expected[m.queue_id].append((m.body, m.tags, m.keys[0], res.msg_id))
            elif kind == "restart":
                s.close()
                s = MessageStore(cfg).open()
            else:
                simulate_kill(s)
                s = MessageStore(cfg).open()
                assert s.recovery is not None and s.recovery.abnormal
        assert s.wait_dispatched(s.commitlog.max_offset, 10)
        for q, want in expected.items():
            got = s.get_messages("rt", q, 0, max_count=10_000, max_bytes=1 << 30).messages
            assert [(m.body, m.tags, m.keys[0], m.msg_id) for m in got] == want
            for body, _tag, key, msg_id in want[-3:]:
                assert s.get_message_by_id(msg_id).body == body
                assert [m.body for m in s.query_by_key("rt", key)] == [body]
    finally:
        s.close()
    report = check_store(str(root / "s"))
    assert report.ok, report.problems
    assert report.records == n
    shutil.rmtree(root)
