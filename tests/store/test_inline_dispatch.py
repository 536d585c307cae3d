"""A put dispatches its own records when dispatch is idle and caught up (``dispatch_inline``):
its sender's answer, which waits for dispatch, never waits for the dispatch thread to get the
GIL. Anything else is the dispatch thread's, as before."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.store.conftest import StoreFactory
from tidemq.storage import Message, MessageStore

pytestmark = pytest.mark.store


@contextmanager
def dispatch_held_elsewhere(store: MessageStore) -> Iterator[None]:
    """Another thread holds the dispatch lock (as a checkpoint does) until the block ends."""
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with store._parts.dispatch_lock:
            taken.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    taken.wait()
    try:
        yield
    finally:
        release.set()
        holder.join()


def test_a_put_on_a_caught_up_store_is_readable_when_the_put_returns(
    open_store: StoreFactory,
) -> None:
    store = open_store()
    for n in range(1, 40):  # through CommitLog and ConsumeQueue file rolls
        put = store.put_messages([Message("t", b"m%d" % n, queue_id=n % 2)] * 3)
        assert put.dispatched.done(), f"put {n} left to the dispatch thread"
        assert store.max_offset("t", n % 2) == sum(3 for k in range(1, n + 1) if k % 2 == n % 2)
    assert [m.body for m in store.get_messages("t", 1, 0, 4).messages] == [b"m1"] * 3 + [b"m3"]


def test_a_put_while_dispatch_is_busy_elsewhere_is_dispatched_by_the_dispatch_thread(
    open_store: StoreFactory,
) -> None:
    store = open_store()
    with dispatch_held_elsewhere(store):
        put = store.put_messages([Message("t", b"held", queue_id=0)])
        assert not put.dispatched.done()
        assert store.max_offset("t", 0) == 0  # nothing claimed visible yet
    put.dispatched.result(10)
    assert [m.body for m in store.get_messages("t", 0, 0).messages] == [b"held"]
    after = store.put_messages([Message("t", b"after", queue_id=0)])
    after.dispatched.result(10)
    assert store.max_offset("t", 0) == 2


def test_a_put_inside_dispatch_held_stays_undispatched_until_the_block_ends(
    open_store: StoreFactory,
) -> None:
    store = open_store()
    with store.dispatch_held():
        put = store.put_messages([Message("t", b"staged", queue_id=0)])
        assert not put.dispatched.done()
        assert store.max_offset("t", 0) == 0
    put.dispatched.result(10)
    assert store.max_offset("t", 0) == 1
