"""The console's sampling loop: every interval it reads each broker group's offset table and the
cluster's status, and feeds ``History``. Pages read what the last sample left (a page of 1,000
topics costs no call per topic); a sample that fails is logged and the next one tries again."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from tidemq.admin import AsyncAdmin
from tidemq.console.history import History
from tidemq.errors import TidemqError

log = logging.getLogger(__name__)


def replication_lag(status: dict[str, Any]) -> dict[str, int]:
    """'<broker group>/<slave id>' -> CommitLog bytes the slave lacks, from each master's own
    figures in ``AsyncAdmin.cluster_status``."""
    out: dict[str, int] = {}
    for cluster in status.get("clusters", []):
        for b in cluster["brokers"]:
            for s in b.get("replication", {}).get("slaves", []):
                out[f"{b['broker_name']}/{s['broker_id']}"] = int(s["lag_bytes"])
    return out


class Sampler:
    def __init__(
        self,
        admin: AsyncAdmin,
        history: History,
        interval_s: float,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.admin = admin
        self.history = history
        self.interval_s = interval_s
        self.clock_ms = clock_ms
        self.status: dict[str, Any] = {"clusters": []}
        self.failed: dict[str, str] = {}  # broker group -> why its last sample failed
        self.error: str | None = None  # why the last whole sample failed
        self.samples = 0
        self.sampled = asyncio.Event()  # set after the first sample, good or not

    async def sample_once(self) -> None:
        try:
            status = await self.admin.cluster_status()
            tables, failed = await self.admin.offset_tables()
        except TidemqError as e:
            self.error = str(e)
            log.warning("sampling the cluster failed: %s", e)
            return
        finally:
            self.sampled.set()
        self.status, self.failed, self.error = status, failed, None
        self.history.record(self.clock_ms(), tables, replication_lag(status))
        self.samples += 1

    async def run(self) -> None:
        while True:
            started = time.monotonic()
            await self.sample_once()
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))
