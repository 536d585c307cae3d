"""Running a broker's periodic task: every period, its failure logged and retried next time."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


async def every(period_ms: int, fn: Callable[[], Awaitable[None]]) -> None:
    while True:
        await asyncio.sleep(period_ms / 1000)
        try:
            await fn()
        except Exception:  # a periodic task's failure is logged and retried next period
            log.exception("periodic task %s failed", fn.__name__)
