"""The replica floor of the master's retention, pure: the lowest CommitLog offset an in-sync slave
has acknowledged. The master's retention never deletes a byte at or above it, so a slave that
counts for SYNC_MASTER acknowledgement or may succeed the master never finds a hole in what it
still has to copy.

Who counts: under automatic failover, every ISR member (one not heard from since this mastership
began counts as holding the confirm offset, which every ISR member held); in classic
master/slave, every slave this master has heard from, linked or not, whose last acknowledgement
is within ``insync_max_lag_bytes`` of the log's end (the bound that makes a slave in sync at
all). A slave further behind, or one this master process has never heard from, holds nothing
back: if retention then deletes what it would continue from, it resynchronises from the master's
oldest file (``handshake.behind_retention``).
"""

from __future__ import annotations

from tidemq.replication.master import MasterTracker


def replica_floor(
    tracker: MasterTracker, master_max_offset: int, confirmed_offset: int
) -> int | None:
    """The offset every in-sync slave holds; None when no slave counts."""
    # Copies: the tracker is the event loop's, this runs in the store's housekeeping thread.
    acked = dict(tracker.acked_by_broker)
    isr = tracker.isr
    if isr is not None:
        members = [b for b in isr if b != tracker.master_id]
        held = [acked.get(b, confirmed_offset) for b in members]
    else:
        bound = tracker.config.insync_max_lag_bytes
        held = [a for a in acked.values() if master_max_offset - a <= bound]
    return min(held, default=None)
