"""Appends waiting to become visible: a put's ``dispatched`` future completes once dispatch has
passed the end of its records (its ConsumeQueue entries and index keys are written), and fails
with the reason when dispatch cannot get there (a full disk, a failed store, a closed one).

A broker answers SEND_OK only after it, so it never acknowledges a message that consumers
cannot see; this holds under async flush too, where the send does not wait for the disk.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from concurrent.futures import Future, InvalidStateError


class DispatchWaiters:
    """Futures keyed by the CommitLog offset their records end at, in append order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: collections.deque[tuple[int, Future[None]]] = collections.deque()
        self._failed: BaseException | None = None

    def wait_for(self, end: int, dispatched: int) -> Future[None]:
        """A future for the records ending at ``end``; ``dispatched`` is how far dispatch is."""
        fut: Future[None] = Future()
        with self._lock:
            if end <= dispatched:
                fut.set_result(None)
            elif self._failed is not None:
                fut.set_exception(self._failed)
            else:
                # Registered under the put lock, so ends arrive in increasing order.
                self._waiting.append((end, fut))
        return fut

    def advance(self, dispatched: int) -> None:
        """Dispatch has reached ``dispatched``: complete every future up to it."""
        with self._lock:
            while self._waiting and self._waiting[0][0] <= dispatched:
                with contextlib.suppress(InvalidStateError):
                    self._waiting.popleft()[1].set_result(None)

    def fail_waiting(self, exc: BaseException) -> None:
        """Fail every future waiting now (dispatch is stuck; later ones may still succeed)."""
        with self._lock:
            waiting, self._waiting = self._waiting, collections.deque()
        for _, fut in waiting:
            with contextlib.suppress(InvalidStateError):
                fut.set_exception(exc)

    def fail_for_good(self, exc: BaseException) -> None:
        """Fail every future, now and later (the store failed or closed)."""
        with self._lock:
            self._failed = exc
        self.fail_waiting(exc)

    def __len__(self) -> int:
        return len(self._waiting)
