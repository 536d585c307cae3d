"""Setting a store's data aside and starting it again empty at a given CommitLog offset: what a
slave does when its log ends below everything its master still holds (retention deleted the
rest while it was away), so it can resynchronise from the master's oldest file by itself.

Nothing is deleted: the CommitLog, ConsumeQueues (with their manifest), index files, the
checkpoint and any names the caller adds (a slave's epoch file) move into
``{root}/behind/<UTC time>/``, renamed on the same file system. The derived files move first
and the CommitLog last, so a kill part-way leaves a store that recovery rebuilds from whatever
CommitLog is still in place; the new, empty first file is named by ``offset``, so a kill right
after still starts at it. ``config/``, ``store.json``, the lock and ``evidence/`` stay.
"""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Sequence

from tidemq.storage.atomic_file import fsync_dir
from tidemq.storage.checkpoint import checkpoint_path
from tidemq.storage.errors import StoreError
from tidemq.storage.parts import StoreParts

log = logging.getLogger(__name__)

BEHIND_DIR = "behind"


def _aside_dir(root: str) -> str:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    path = os.path.join(root, BEHIND_DIR, stamp)
    os.makedirs(path)
    return path


def restart_empty_at(parts: StoreParts, offset: int, extra: Sequence[str] = ()) -> str:
    """Move the store's data aside and continue as an empty store whose log starts at
    ``offset`` (a file boundary past the current end); returns where the data went."""
    p = parts
    cl = p.commitlog
    if offset % cl.file_size:
        raise StoreError(f"a store cannot start at {offset}: not a CommitLog file boundary")
    with p.put_lock, p.dispatch_lock:
        if offset < cl.max_offset:
            raise StoreError(
                f"a store ending at {cl.max_offset} cannot restart empty at {offset}: it holds "
                f"bytes at and past it"
            )
        root = p.root
        with p.flush_lock:  # the flusher must not walk files being closed
            cl.flush(0)
            p.queues.flush()
            p.close_files()
            aside = _aside_dir(root)
            names = [*extra, "index", os.path.basename(checkpoint_path(root)), "consumequeue"]
            for name in [*names, "commitlog"]:
                src = os.path.join(root, name)
                if os.path.lexists(src):
                    os.rename(src, os.path.join(aside, name))
            fsync_dir(aside)
            fsync_dir(root)
            # The same objects, emptied: readers, dispatch listeners and the flusher keep them.
            cl.mfq.files = []
            cl.reset_queue_table()
            cl.last_store_timestamp_ms = 0
            cl.trusted_end = offset
            cl.last_write_raw = False
            p.queues.reset()
            if p.index is not None:
                p.index.load()
            d = p.dispatcher
            d.offset = offset
            d.last_store_timestamp_ms = 0
            d.error = None
            d.stopped_at = None
            cl.mfq.create_file(offset)
            fsync_dir(cl.mfq.directory)
        p.write_checkpoint()
        p.write_manifest(force=True)
    log.info("store %s set aside under %s; it starts again empty at %d", root, aside, offset)
    return aside
