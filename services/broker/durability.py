"""The durability decision of a send, as RocketMQ keeps it in ``handleDiskFlushAndHA``: whether
the answer waits for the slaves, and what the producer hears once the disk flush and the slaves
have answered, or that this broker may not acknowledge the send at all.

Pure, so every combination is unit-tested without sockets or clocks; the send handler
(``handlers.send``) does the awaiting and asks here.
"""

from __future__ import annotations

from tidemq.services.broker.config import BrokerRole
from tidemq.storage import PutStatus


def waits_for_slaves(role: BrokerRole, replicating: bool) -> bool:
    """Only a SYNC_MASTER with a replication master side holds its answer for the slaves; any
    other broker answers with its flush alone."""
    return role is BrokerRole.SYNC_MASTER and replicating


def send_status(
    flushed: PutStatus, replicated: PutStatus | None, *, may_acknowledge: bool
) -> PutStatus | None:
    """What a stored send answers, from its flush status and its replication status (None: the
    slaves were not waited for); None when it may not be acknowledged at all.

    ``may_acknowledge`` is the lease as checked at the answer, after the waits: a lease that
    lapsed while the send waited for the disk or the slaves means another broker may be master
    by now, so the send is refused whatever the statuses say.
    """
    if not may_acknowledge:
        return None
    # Flush and replication run side by side; a replication failure is what the client hears,
    # as in RocketMQ (FLUSH_SLAVE_TIMEOUT or SLAVE_NOT_AVAILABLE over a disk one).
    if replicated is None or replicated is PutStatus.PUT_OK:
        return flushed
    return replicated
