"""CommitLog flushing: the timed async flusher and the group-commit service for sync flush; and,
with a transient store pool, the commit service that copies appended bytes into the files.

Group commit (spec §4.3): a durable put hands over the offset its batch ends at and gets a future.
The flusher takes every waiting request, does one msync that covers all of them, and completes each
future whose offset is now flushed with PUT_OK. A separate watcher completes requests still waiting
at their deadline with FLUSH_DISK_TIMEOUT, so a stalled disk cannot hold a producer forever. No
request thread ever blocks on the disk.

A failed flush is not swallowed: every waiting future fails with the error (the store's flush
function raises a typed ``DiskFailedError`` for an I/O error), as does every later request, and
``on_error`` fails the store, which logs why and tells the broker.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError

from tidemq.storage.errors import StoreClosedError
from tidemq.storage.results import PutStatus

FlushFn = Callable[[int], int]
"""flush(least_pages) -> flushed offset."""
CommitFn = Callable[[int], int]
"""commit(least_pages) -> committed offset."""


def _complete(fut: Future[PutStatus], status: PutStatus) -> None:
    # The watcher and the flusher may race; the first answer stands.
    with contextlib.suppress(InvalidStateError):
        fut.set_result(status)


def _fail(fut: Future[PutStatus], exc: BaseException) -> None:
    with contextlib.suppress(InvalidStateError):
        fut.set_exception(exc)


class FlushService:
    """One thread flushing the CommitLog; in sync mode it also serves group-commit requests."""

    def __init__(
        self,
        flush: FlushFn,
        *,
        sync: bool,
        interval_ms: int,
        least_pages: int,
        thorough_interval_ms: int,
        sync_timeout_ms: int,
        on_flushed: Callable[[int], None],
        on_error: Callable[[BaseException], None],
        clock: Callable[[], float] = time.monotonic,
        flushed_offset: int = 0,
    ) -> None:
        self._flush = flush
        self.sync = sync
        self._interval_s = interval_ms / 1000
        self._least_pages = least_pages
        self._thorough_s = thorough_interval_ms / 1000
        self._timeout_s = sync_timeout_ms / 1000
        self._on_flushed = on_flushed
        self._on_error = on_error
        self._clock = clock
        self._cond = threading.Condition()
        self._requests: collections.deque[tuple[int, float, Future[PutStatus]]] = (
            collections.deque()
        )
        self._stopping = False
        self._failed: BaseException | None = None
        # Flushes of this thread that moved the flushed offset (under sync flush, the group
        # commits), counted from where the log was flushed to as the service started.
        self.flushes = 0
        self._flushed = flushed_offset
        self._thread = threading.Thread(target=self._run, name="commitlog-flush", daemon=True)
        self._watcher = threading.Thread(target=self._watch, name="flush-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()
        if self.sync:
            self._watcher.start()

    def submit(self, next_offset: int) -> Future[PutStatus]:
        """A future completed once everything below ``next_offset`` is flushed (or timed out)."""
        fut: Future[PutStatus] = Future()
        with self._cond:
            if self._failed is not None:
                _fail(fut, self._failed)
                return fut
            self._requests.append((next_offset, self._clock() + self._timeout_s, fut))
            self._cond.notify_all()
        return fut

    def wakeup(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _run(self) -> None:
        last_thorough = self._clock()
        while True:
            with self._cond:
                if self._stopping:
                    break
                if self.sync:
                    # No artificial delay: requests that arrive during one msync form the next
                    # group, which is what makes the group grow with the load.
                    if not self._requests:
                        self._cond.wait(self._interval_s)
                    pending = list(self._requests)
                else:
                    self._cond.wait(self._interval_s)
                    pending = []
                if self._stopping:
                    break
            now = self._clock()
            thorough = now - last_thorough >= self._thorough_s
            if thorough:
                last_thorough = now
            least = 0 if (self.sync or thorough) else self._least_pages
            try:
                flushed = self._flush(least)
            except Exception as e:  # noqa: BLE001 - on_error logs it, where the store fails
                # The store is marked failed before any waiter hears: a producer answered with
                # the error finds every later append refused, never accepted.
                self._on_error(e)
                self._fail_all(e)
                return
            if flushed > self._flushed:
                self.flushes += 1
            self._flushed = flushed
            self._on_flushed(flushed)
            if pending:
                self._complete_upto(flushed)
        # Final flush at shutdown: everything written becomes durable before the store closes.
        try:
            flushed = self._flush(0)
            self._on_flushed(flushed)
            self._complete_upto(flushed)
        except Exception as e:  # noqa: BLE001
            self._on_error(e)
            self._fail_all(e)

    def _complete_upto(self, flushed: int) -> None:
        with self._cond:
            while self._requests and self._requests[0][0] <= flushed:
                _complete(self._requests.popleft()[2], PutStatus.PUT_OK)
            # Requests the watcher already answered can leave the queue too.
            while self._requests and self._requests[0][2].done():
                self._requests.popleft()

    def _fail_all(self, exc: BaseException) -> None:
        with self._cond:
            self._failed = exc
            while self._requests:
                _fail(self._requests.popleft()[2], exc)

    def _watch(self) -> None:
        while True:
            with self._cond:
                if self._stopping and not self._requests:
                    return
                now = self._clock()
                for _, deadline, fut in self._requests:
                    if deadline > now:
                        break
                    _complete(fut, PutStatus.FLUSH_DISK_TIMEOUT)
                nxt = next((d for _, d, f in self._requests if not f.done()), None)
                self._cond.wait(min(max(0.001, nxt - now), 0.1) if nxt is not None else 0.1)

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()
        if self._watcher.is_alive():
            with self._cond:
                for _, _, fut in self._requests:
                    _complete(fut, PutStatus.FLUSH_DISK_TIMEOUT)
                self._requests.clear()
                self._cond.notify_all()
            self._watcher.join()


class CommitService:
    """RocketMQ's CommitRealTimeService, for a store with a transient store pool: one thread
    (``commitlog-commit``) copying what writers appended into the write buffers to the files.

    It commits every ``interval_ms`` (at least ``least_pages`` new pages; everything when the
    interval passed without a commit), and at once when a put waits: ``submit`` hands over the
    offset a put ends at and returns a future completed with PUT_OK once everything below it is
    committed (in the page cache, so it survives the process), which is when an ASYNC-flush put
    is answered with a pool. Commits that arrive during one commit form the next, as the flush
    service's groups do. ``on_committed`` hears every new committed offset (dispatch waits for
    it). A failed commit fails every waiting and later future and calls ``on_error``.

    ``step`` is one commit without the thread (tests drive it by hand); ``end`` answers the
    log's end, where appends go next.
    """

    def __init__(
        self,
        commit: CommitFn,
        end: Callable[[], int],
        *,
        interval_ms: int,
        least_pages: int,
        on_committed: Callable[[int], None],
        on_error: Callable[[BaseException], None],
        clock: Callable[[], float] = time.monotonic,
        committed_offset: int = 0,
    ) -> None:
        self._commit = commit
        self._end = end
        self._interval_s = interval_ms / 1000
        self._least_pages = least_pages
        self._on_committed = on_committed
        self._on_error = on_error
        self._clock = clock
        self._cond = threading.Condition()
        self._requests: collections.deque[tuple[int, Future[PutStatus]]] = collections.deque()
        self._stopping = False
        self._failed: BaseException | None = None
        self.committed = committed_offset
        self.commits = 0  # steps that moved the committed offset
        self._last_full = clock()
        self._answered = 0  # futures the last step answered
        self._thread = threading.Thread(target=self._run, name="commitlog-commit", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, end_offset: int) -> Future[PutStatus]:
        """A future completed once everything below ``end_offset`` is committed; wakes the
        thread (RocketMQ's wakeCommitWhenPutMessage)."""
        fut: Future[PutStatus] = Future()
        with self._cond:
            # Never answered from the last commit's offset alone: a truncation since may have
            # cut the log below it, and these bytes may be new ones in a buffer.
            if self._failed is not None:
                _fail(fut, self._failed)
            else:
                self._requests.append((end_offset, fut))
                self._cond.notify_all()
        return fut

    def step(self, least_pages: int | None = None) -> int:
        """One commit (``least_pages`` None: the service's rule), then answer the futures it
        covers; returns the committed offset. Raises what the commit raised."""
        with self._cond:
            waiting = len(self._requests)
        now = self._clock()
        if least_pages is None:
            least_pages = self._least_pages
            if waiting or now - self._last_full >= self._interval_s:
                least_pages = 0
        committed = self._commit(least_pages)
        if least_pages == 0:
            self._last_full = now
        moved = committed != self.committed
        if committed > self.committed:
            self.commits += 1
        # After a truncation the log may end below an earlier put's end: a request submitted
        # before this commit began is answered once nothing at all is left uncommitted (its
        # bytes were committed before they were cut).
        everything = committed >= self._end()
        with self._cond:
            self.committed = committed  # lower after a truncation
            n = 0
            while self._requests and (
                self._requests[0][0] <= committed or (everything and n < waiting)
            ):
                _complete(self._requests.popleft()[1], PutStatus.PUT_OK)
                n += 1
            self._answered = n
        if moved:
            self._on_committed(committed)
        return committed

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._stopping:
                    break
                if not self._requests:
                    self._cond.wait(self._interval_s)
                if self._stopping:
                    break
                pending = len(self._requests)
            try:
                before = self.committed
                self.step()
            except Exception as e:  # noqa: BLE001 - on_error logs it, where the store fails
                self._on_error(e)
                self._fail_all(e)
                return
            if pending and not self._answered and self.committed == before:
                # Puts wait, but the commit neither moved nor answered any (files closing under
                # it): no spinning on them; a new put or the interval tries again.
                with self._cond:
                    if self._requests and not self._stopping:
                        self._cond.wait(self._interval_s)
        # At shutdown everything appended is committed before the store flushes and closes.
        try:
            self.step(0)
        except Exception as e:  # noqa: BLE001
            self._on_error(e)
            self._fail_all(e)

    def _fail_all(self, exc: BaseException) -> None:
        with self._cond:
            self._failed = exc
            while self._requests:
                _fail(self._requests.popleft()[1], exc)

    def stop(self) -> None:
        """Stop the thread after a last commit of everything."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()
        with self._cond:
            leftover = list(self._requests)
            self._requests.clear()
        for _, fut in leftover:
            _fail(fut, StoreClosedError("the store closed before this put was committed"))
