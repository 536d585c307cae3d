"""Small real stores and replication copied by hand, for tests of what a follower builds from
its master's CommitLog bytes (the receive log, the transaction logs, the stores themselves)."""

from __future__ import annotations

from pathlib import Path

from tidemq.storage import MessageStore, StoreConfig

# A store of small files: a few records fill one, so tests cross file boundaries.
FILE_BYTES = 4096


def open_store(root: Path) -> MessageStore:
    return MessageStore(
        StoreConfig(
            str(root),
            commitlog_file_size_bytes=FILE_BYTES,
            consume_queue_entries_per_file=16,
            index_slot_num=8,
            index_max_num=32,
        )
    ).open()


def copy_log(master: MessageStore, slave: MessageStore) -> None:
    """Replication's job: the master's CommitLog bytes appended to the slave's, then
    dispatched there."""
    while (at := slave.log.max_offset) < master.log.max_offset:
        slave.append_raw(at, master.read_raw(at, master.log.max_offset - at))
    assert slave.wait_dispatched(slave.log.max_offset, 10)
