"""The threads that run a blocking PushConsumer's listener: answers and errors reach the
awaiting coroutine, at most ``count`` listeners run at once, and stop drops what never ran."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tidemq.consumer.listener_threads import ListenerThreads


def test_each_call_gets_its_own_answer_or_its_listeners_exception() -> None:
    def listener(n: int) -> int:
        if n % 5 == 0:
            raise ValueError(f"bad {n}")
        return n * 2

    async def main() -> list[object]:
        threads = ListenerThreads(4)
        try:
            results: list[object] = await asyncio.gather(
                *(threads.run(listener, n) for n in range(1, 201)), return_exceptions=True
            )
            return results
        finally:
            threads.stop()

    results = asyncio.run(main())
    for n, r in zip(range(1, 201), results, strict=True):
        if n % 5 == 0:
            assert isinstance(r, ValueError) and str(r) == f"bad {n}"
        else:
            assert r == n * 2


def test_no_more_than_count_listeners_run_at_once() -> None:
    lock = threading.Lock()
    running = 0
    most = 0
    calls = 0
    three = threading.Barrier(3, timeout=10)

    def listener(_: int) -> None:
        nonlocal running, most, calls
        with lock:
            running += 1
            most = max(most, running)
            calls += 1
            first_three = calls <= 3
        if first_three:
            three.wait()  # the first three meet: three really run at once
        with lock:
            running -= 1

    async def main() -> None:
        threads = ListenerThreads(3)
        try:
            await asyncio.gather(*(threads.run(listener, n) for n in range(30)))
        finally:
            threads.stop()

    asyncio.run(main())
    assert most == 3


def test_stop_drops_jobs_that_never_started_and_refuses_new_ones() -> None:
    release = threading.Event()
    started = threading.Event()
    ran: list[int] = []

    def listener(n: int) -> None:
        ran.append(n)
        started.set()
        release.wait(10)

    async def main() -> None:
        threads = ListenerThreads(1)
        first = asyncio.ensure_future(threads.run(listener, 1))
        queued = asyncio.ensure_future(threads.run(listener, 2))
        assert await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
        queued.cancel()
        threads.stop()
        release.set()
        await first
        with pytest.raises(RuntimeError, match="stopped"):
            await threads.run(listener, 3)

    asyncio.run(main())
    assert ran == [1]
