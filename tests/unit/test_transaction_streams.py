"""Producers' check streams on the broker (no sockets): checks go round robin to the group's
connected producers, nowhere when none is connected, and a stream ends when its broker stops or
is no longer the master (so its producer reconnects to the new one)."""

from __future__ import annotations

import asyncio
from typing import Any

from tidemq.services.broker.transactions import streams
from tidemq.services.broker.transactions.streams import CheckStreams


async def _take(it: Any, n: int) -> list[Any]:
    return [await it.__anext__() for _ in range(n)]


def test_checks_go_round_robin_to_the_groups_producers_and_nowhere_without_one() -> None:
    async def run() -> None:
        s, stop = CheckStreams(), asyncio.Event()
        assert not s.push("g", "lost")  # no producer of g connected
        a, b = s.stream("g", stop, lambda: True), s.stream("g", stop, lambda: True)
        first_a, first_b = asyncio.ensure_future(_take(a, 2)), asyncio.ensure_future(_take(b, 2))
        await asyncio.sleep(0)  # both registered
        assert s.connected("g") == 2 and s.connected("other") == 0
        for check in ("c1", "c2", "c3", "c4"):
            assert s.push("g", check)
        assert sorted([*await first_a, *await first_b]) == ["c1", "c2", "c3", "c4"]
        assert len(set(await first_a) & set(await first_b)) == 0
        stop.set()
        for it in (a, b):
            try:
                await it.__anext__()
            except StopAsyncIteration:
                pass
            else:
                raise AssertionError("a stream outlived the broker's stop")
        assert s.connected("g") == 0

    asyncio.run(run())


def test_a_stream_ends_when_its_broker_is_no_longer_master(monkeypatch: Any) -> None:
    monkeypatch.setattr(streams, "ROLE_CHECK_S", 0.01)

    async def run() -> None:
        s, master = CheckStreams(), [True]
        it = s.stream("g", asyncio.Event(), lambda: master[0])
        waiting = asyncio.ensure_future(it.__anext__())
        await asyncio.sleep(0.05)
        assert not waiting.done()
        master[0] = False
        try:
            await asyncio.wait_for(waiting, 5)
        except StopAsyncIteration:
            pass
        else:
            raise AssertionError("the stream went on after the demotion")
        assert s.connected("g") == 0

    asyncio.run(run())
