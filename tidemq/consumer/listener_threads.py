"""The threads that run a blocking ``PushConsumer``'s listener: a fixed set of threads taking
messages from one queue, their answers handed back to the event loop in batches.

``loop.run_in_executor`` costs a concurrent future chained to an asyncio future and a wake-up
of the loop (a write to its self-pipe) per message; at thousands of messages a second that was
most of the push consumer's CPU. Here a thread that finishes wakes the loop only when no
earlier answer is still waiting to be handed over, so a busy loop collects many per wake-up.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

# Called on the event loop with the listener's result, or None and the exception it raised.
Done = Callable[[Any, "BaseException | None"], None]
_Answer = tuple[Done, Any, "BaseException | None"]
_Job = tuple[Callable[[Any], Any], Any, Done]


class ListenerThreads:
    """``await threads.run(listener, message)`` runs ``listener(message)`` on one of
    ``count`` threads; ``submit`` does the same and calls ``done`` on the loop with the answer.
    Used from one event loop."""

    def __init__(self, count: int, name: str = "tidemq-listener") -> None:
        if count <= 0:
            raise ValueError("count must be > 0")
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._answers: deque[_Answer] = deque()
        self._lock = threading.Lock()
        self._wake_pending = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._threads = [
            # Daemon threads: a listener still stuck after close() never keeps the process up.
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(count)
        ]
        self._started = False
        self._stopped = False

    async def run(self, listener: Callable[[Any], Any], message: Any) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def done(result: Any, error: BaseException | None) -> None:
            if future.done():  # its coroutine was cancelled (close gave up on it)
                return
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)

        self.submit(listener, message, done)
        return await future

    def submit(self, listener: Callable[[Any], Any], message: Any, done: Done) -> None:
        """Queues ``listener(message)``; called from the event loop that hears ``done``."""
        if self._stopped:
            raise RuntimeError("listener threads stopped")
        if not self._started:
            self._loop = asyncio.get_running_loop()
            for t in self._threads:
                t.start()
            self._started = True
        self._jobs.put((listener, message, done))

    def stop(self) -> None:
        """Threads end after the job they run; jobs not started are dropped (their awaiting
        coroutines were cancelled by the consumer's close)."""
        self._stopped = True
        while True:
            try:
                self._jobs.get_nowait()
            except queue.Empty:
                break
        for _ in self._threads:
            self._jobs.put(None)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            listener, message, done = job
            try:
                answer: _Answer = (done, listener(message), None)
            except BaseException as e:  # noqa: BLE001 - the loop's side judges it
                answer = (done, None, e)
            with self._lock:
                self._answers.append(answer)
                wake = not self._wake_pending
                self._wake_pending = True
            if wake:
                assert self._loop is not None
                try:
                    self._loop.call_soon_threadsafe(self._hand_over)
                except RuntimeError:  # the loop closed: nobody waits any more
                    return

    def _hand_over(self) -> None:
        with self._lock:
            answers = list(self._answers)
            self._answers.clear()
            self._wake_pending = False
        for done, result, error in answers:
            try:
                done(result, error)
            except Exception:  # one answer's handling never drops the others
                log.exception("handling a listener's answer failed")
