"""Waiting for a put to be as durable as its answer promises: the disk flush future and, for a
SYNC_MASTER, the slaves (side by side), then dispatch.

Shared by every answer that stands for records in the CommitLog: a send, and the receive/ack
calls whose events are records of the receive log. What the waits add up to is
``durability``'s decision.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Protocol

from tidemq.services.broker.config import BrokerRole
from tidemq.services.broker.durability import waits_for_slaves
from tidemq.storage import PutResult, PutStatus


class SyncReplication(Protocol):
    """The master side of replication, as a send waits on it."""

    def replicate(self, end_offset: int) -> Awaitable[PutStatus]: ...


async def wait_durable(
    put: PutResult, replication: SyncReplication | None, role: BrokerRole
) -> tuple[PutStatus, PutStatus | None]:
    """The put's flush status and, when the send waits for the slaves (``waits_for_slaves``),
    its replication status; else None."""
    durable = put.durable
    if not waits_for_slaves(role, replicating=replication is not None):
        return (durable.result() if durable.done() else await asyncio.wrap_future(durable)), None
    assert replication is not None  # waits_for_slaves: only a broker that replicates waits
    last = put.results[-1]
    # Flush and replication run side by side.
    replicated = replication.replicate(last.phy_offset + last.size)
    if durable.done():
        return durable.result(), await replicated
    flushed, status = await asyncio.gather(asyncio.wrap_future(durable), replicated)
    return flushed, status


async def wait_dispatched(put: PutResult) -> None:
    """Until the put's records are dispatched; raises the store's reason when they cannot be."""
    fut = put.dispatched
    if fut.done():
        fut.result()
    else:
        await asyncio.wrap_future(fut)
