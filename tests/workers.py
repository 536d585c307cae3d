"""Load threads whose failures reach the test.

A thread that sends in a loop and dies of an unexpected exception would otherwise just stop:
the test then waits for acknowledgements that never come, or worse, checks a shorter history and
passes. A ``Worker`` keeps its exception; ``check()`` (usable inside a ``wait_until`` predicate)
and ``finish()`` re-raise it, so the test fails with the worker's own error.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class WorkerFailed(AssertionError):
    """A load worker ended on an exception it did not expect; the cause is chained."""


class Worker(threading.Thread):
    """Runs ``target()`` (or a subclass's ``work()``) and keeps any exception it ends on."""

    def __init__(self, target: Callable[[], object] | None = None, name: str | None = None):
        super().__init__(name=name, daemon=True)
        self._work = target
        self.error: BaseException | None = None

    def work(self) -> None:
        assert self._work is not None, "give a target or override work()"
        self._work()

    def run(self) -> None:
        try:
            self.work()
        except BaseException as e:  # noqa: BLE001 - kept, and re-raised in the test's thread
            self.error = e

    def check(self) -> bool:
        """True while the worker has not failed; its exception, re-raised, once it has."""
        if self.error is not None:
            raise WorkerFailed(f"load worker {self.name} failed: {self.error!r}") from self.error
        return True

    def finish(self, timeout_s: float = 60) -> None:
        """Join; fail if the worker is still running after ``timeout_s`` or ended on an error."""
        self.join(timeout_s)
        if self.is_alive():
            raise WorkerFailed(f"load worker {self.name} still running after {timeout_s} s")
        self.check()


def finish_all(workers: list[Worker], timeout_s: float = 60) -> None:
    """Join every worker (each within ``timeout_s``), then raise the first failure."""
    for w in workers:
        w.join(timeout_s)
    for w in workers:
        w.finish(0)
