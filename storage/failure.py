"""How a store stops: the first failure that ends its writing, and who is told.

A store fails when the disk fails it (an ``EIO`` on a flush or a write: reason ``disk_io``) or
when one of its threads meets an error it cannot go on after (``dispatch``, ``housekeeping``).
From then on it refuses appends until it is restarted; ``StoreFailure`` says why, and the
listeners (the broker, which steps aside) are told once, from the thread that failed.

A full disk under the ConsumeQueues or the index is not a failure: dispatch waits for space
(``DispatchStall``) and appends are refused meanwhile, but everything resumes by itself.
"""

from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from tidemq.storage.clock import now_ms
from tidemq.storage.errors import DiskFailedError, StoreError

log = logging.getLogger(__name__)

DISK_IO = "disk_io"
DISPATCH = "dispatch"
HOUSEKEEPING = "housekeeping"
FLUSH = "flush"  # the flush thread met an error that is not the disk's
STORE_FAILURE_REASONS = (DISK_IO, FLUSH, DISPATCH, HOUSEKEEPING)


@dataclass(frozen=True)
class StoreFailure:
    reason: str  # one of STORE_FAILURE_REASONS
    error: BaseException
    at_ms: int  # wall clock, for status and logs


FailureListener = Callable[[StoreFailure], None]


def disk_error(what: str, exc: OSError) -> DiskFailedError:
    """The typed error for an I/O error of the disk under ``what``."""
    name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return DiskFailedError(f"{what} failed: {name} ({exc.strerror or exc})")


class FailureSignal:
    """The store's first failure, and the listeners told about it (once each)."""

    def __init__(self) -> None:
        self.failure: StoreFailure | None = None
        self._listeners: list[FailureListener] = []
        self._lock = threading.Lock()

    def fail(self, reason: str, error: BaseException) -> StoreFailure:
        """Record ``error`` as the failure unless one is already recorded; returns the one that
        stands."""
        with self._lock:
            if self.failure is not None:
                return self.failure
            failure = self.failure = StoreFailure(reason, error, now_ms())
            listeners = list(self._listeners)
        # One line for the operator: what failed and what the store does about it. A typed
        # error is its own explanation; anything else is a bug, and its traceback is wanted.
        log.error(
            "store failed (%s): %s; it refuses writes until it is restarted on a repaired disk",
            reason,
            error,
            exc_info=None if isinstance(error, StoreError) else error,
        )
        for listener in listeners:
            _call(listener, failure)
        return failure

    def subscribe(self, listener: FailureListener) -> None:
        """Tell ``listener`` of the failure: at once if the store has failed already."""
        with self._lock:
            self._listeners.append(listener)
            failure = self.failure
        if failure is not None:
            _call(listener, failure)


def _call(listener: FailureListener, failure: StoreFailure) -> None:
    try:
        listener(failure)
    except Exception:  # a listener's bug must not hide the failure from the others
        log.exception("store failure listener %r failed", listener)
