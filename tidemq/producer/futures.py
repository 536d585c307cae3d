"""How a send's answer reaches its caller: ``SendFuture`` (the blocking API's future), the
``Hub`` where blocked callers wait, and ``Unanswered``, which answers every accepted message
exactly once and tells ``flush`` when none is left."""

from __future__ import annotations

import abc
import asyncio
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tidemq.metrics import FAILED
from tidemq.types import SendResult

if TYPE_CHECKING:
    from tidemq.metrics import ClientMetrics
    from tidemq.producer.blocks import Block, BlockAnswer
    from tidemq.producer.pending import Pending

log = logging.getLogger(__name__)


class SendFuture(abc.ABC):
    """The answer to one ``Producer.send_async``: ``result(timeout)`` waits for it.

    ``concurrent.futures.Future``'s reading methods, lighter: no lock per message (which costs
    more than the rest of a send); one condition per producer is notified only while someone
    waits. A message that travels in a record block gets a ``blocks.BlockFuture``, any other a
    ``MessageFuture``.
    """

    __slots__ = ()

    @abc.abstractmethod
    def done(self) -> bool: ...

    def cancelled(self) -> bool:
        return False  # a message handed to the producer cannot be taken back

    @abc.abstractmethod
    def result(self, timeout: float | None = None) -> SendResult: ...

    @abc.abstractmethod
    def exception(self, timeout: float | None = None) -> BaseException | None: ...

    @abc.abstractmethod
    def add_done_callback(self, fn: Callable[[SendFuture], None]) -> None: ...


class MessageFuture(SendFuture):
    """The future of a message sent on its own (not in a record block)."""

    __slots__ = ("_callbacks", "_hub", "_state", "_value")

    def __init__(self, hub: Hub) -> None:
        self._hub = hub
        self._state = 0  # 0 pending, 1 result, 2 exception
        self._value: Any = None
        self._callbacks: list[Callable[[SendFuture], None]] | None = None

    def done(self) -> bool:
        return self._state != 0

    def result(self, timeout: float | None = None) -> SendResult:
        if not self._state:
            self._hub.wait_for(self.done, timeout)
        if self._state == 2:
            raise self._value
        return self._value  # type: ignore[no-any-return]

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self._state:
            self._hub.wait_for(self.done, timeout)
        return self._value if self._state == 2 else None

    def add_done_callback(self, fn: Callable[[SendFuture], None]) -> None:
        if self._state:
            fn(self)
        else:
            if self._callbacks is None:
                self._callbacks = []
            self._callbacks.append(fn)

    def set_result(self, result: SendResult, *, wake: bool = True) -> None:
        """``wake=False``: the caller completes many at once and wakes waiters itself after."""
        self._value, self._state = result, 1
        self._finish(wake)

    def set_exception(self, error: BaseException) -> None:
        self._value, self._state = error, 2
        self._finish(True)

    def _finish(self, wake: bool) -> None:
        callbacks, self._callbacks = self._callbacks, None
        for fn in callbacks or ():
            try:
                fn(self)
            except Exception:
                log.exception("send callback failed")
        self._hub.completed += 1
        if wake:
            self._hub.wake()

    def wake_waiters(self) -> None:
        """Wake callers blocked on this producer (after completions made with ``wake=False``)."""
        self._hub.wake()


class Hub:
    """Where blocked callers of one Producer wait (for a result, or for buffer room)."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.waiters = 0
        self.completed = 0  # written by the producer's loop thread only

    def wait_for(self, predicate: Callable[[], bool], timeout: float | None) -> None:
        with self.cv:
            self.waiters += 1
            try:
                if not self.cv.wait_for(predicate, timeout):
                    raise TimeoutError("no answer from the producer within the timeout")
            finally:
                self.waiters -= 1

    def wake(self) -> None:
        # Read without the lock: a waiter increments ``waiters`` before checking its predicate,
        # so either it sees the new state or this sees it waiting.
        if self.waiters:
            with self.cv:
                self.cv.notify_all()


class Unanswered:
    """The messages a producer accepted and has not answered yet. Whoever accepts messages
    counts them with ``expect``; each is answered once, by ``complete`` or ``fail``; ``idle`` is
    set while none is left. Runs on the producer's loop only."""

    def __init__(self, metrics: ClientMetrics | None = None) -> None:
        self.count = 0
        self.idle = asyncio.Event()
        self.idle.set()
        # Every failure passes here, wherever it happened (no route, refused, timed out,
        # closed); successes are counted by request in the sender.
        self.metrics = metrics

    def expect(self, n: int) -> None:
        self.count += n
        self.idle.clear()

    def complete(self, p: Pending, result: SendResult, *, wake: bool = True) -> None:
        """``wake=False``: blocked callers of the blocking API are woken by the caller."""
        future = p.future
        if not future.done():
            if type(future) is MessageFuture:
                future.set_result(result, wake=wake)
            else:
                future.set_result(result)
        self._finished()

    def fail(self, p: Pending | Block, error: BaseException) -> None:
        p.fail(error)
        if self.metrics is not None:
            self.metrics.sent(p.topic, FAILED, p.count)
        self._finished(p.count)

    def complete_block(self, block: Block, answer: BlockAnswer) -> None:
        """Every message of ``block`` answered at once (its futures derive their results)."""
        block.resolve(answer)
        self._finished(block.count)

    def _finished(self, n: int = 1) -> None:
        self.count -= n
        if self.count <= 0:
            self.count = 0
            self.idle.set()
