"""Waiting for a put to be as durable as its answer promises: the disk flush future and, for a
SYNC_MASTER, the slaves (side by side), then dispatch.

Shared by every answer that stands for records in the CommitLog: a send, the receive/ack calls
whose events are records of the receive log, the timer's and the transactions' records
(``wait_answerable``). What the waits add up to is ``durability``'s decision.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Protocol

from tidemq.services.broker.config import BrokerRole
from tidemq.services.broker.durability import send_status, waits_for_slaves
from tidemq.storage import PutStatus

if TYPE_CHECKING:
    from tidemq.services.broker.handlers.checks import BrokerChecks


class StoredPut(Protocol):
    """A put as its answer waits on it: ``MessageStore.put_messages``' and ``put_blocks``'."""

    @property
    def durable(self) -> Future[PutStatus]: ...
    @property
    def dispatched(self) -> Future[None]: ...
    @property
    def end(self) -> int: ...


class SyncReplication(Protocol):
    """The master side of replication, as a send waits on it."""

    def replicate(self, end_offset: int) -> Awaitable[PutStatus]: ...


class MasterReplication(SyncReplication, Protocol):
    """Replication as the master's writers use it: told of new records, then waited on."""

    def notify_appended(self) -> None: ...


async def wait_durable(
    put: StoredPut, replication: SyncReplication | None, role: BrokerRole
) -> tuple[PutStatus, PutStatus | None]:
    """The put's flush status and, when the send waits for the slaves (``waits_for_slaves``),
    its replication status; else None."""
    durable = put.durable
    if not waits_for_slaves(role, replicating=replication is not None):
        return (durable.result() if durable.done() else await asyncio.wrap_future(durable)), None
    assert replication is not None  # waits_for_slaves: only a broker that replicates waits
    # Flush and replication run side by side.
    replicated = replication.replicate(put.end)
    if durable.done():
        return durable.result(), await replicated
    flushed, status = await asyncio.gather(asyncio.wrap_future(durable), replicated)
    return flushed, status


async def wait_dispatched(put: StoredPut) -> None:
    """Until the put's records are dispatched; raises the store's reason when they cannot be."""
    fut = put.dispatched
    if fut.done():
        fut.result()
    else:
        await asyncio.wrap_future(fut)


async def wait_answerable(
    put: StoredPut, replication: MasterReplication | None, checks: BrokerChecks
) -> PutStatus:
    """Wait for ``put`` as a send waits (the slaves told of it; flushed, replicated, then
    dispatched when those went well) and return what its answer carries: PUT_OK, or the status
    it fell short with. Raises the refusal of a broker that may not acknowledge now."""
    if replication is not None:
        replication.notify_appended()
    flushed, replicated = await wait_durable(put, replication, checks.role.role)
    if flushed is PutStatus.PUT_OK and replicated in (None, PutStatus.PUT_OK):
        # An answer promises records consumers can see: it waits for dispatch, which raises
        # DISK_FULL when the ConsumeQueues or the index cannot be written.
        await wait_dispatched(put)
    return answer_status(flushed, replicated, checks)


def answer_status(
    flushed: PutStatus, replicated: PutStatus | None, checks: BrokerChecks
) -> PutStatus:
    """``send_status`` with the lease checked now, after the waits; raises the refusal when
    this broker may not acknowledge."""
    status = send_status(flushed, replicated, may_acknowledge=checks.role.may_acknowledge())
    if status is None:
        raise checks.not_acknowledging()
    return status
