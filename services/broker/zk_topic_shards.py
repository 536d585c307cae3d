"""A broker's topics in ZooKeeper: ephemeral shard znodes, written only where topics changed.

Layout and bytes: ``tidemq.services.nameserver.zk_format`` (a topic lives in shard
``shard_of(topic)``; only non-empty shards exist). ``ShardBook`` is the pure part: what each
shard should hold, which shards changed since they were last written (from the topic table's
``changes_since``, or a full comparison when it cannot say), and the znode version written under
the current session. ``sync_shards`` does the ZooKeeper calls:

- fast path (the shards were all written under this session): one pipelined set, create or
  delete per changed shard, at the version last written, so a topic created costs one write of
  one shard whatever the broker holds;
- full path (a new session, a new place after a role change, or a write that found something
  else than expected): list the shard directory, read our shards there, and create, set or
  delete each one that differs, all pipelined: three round trips whatever the shard count.

A shard held by another session (this broker's previous process, whose session has not expired
yet) raises ``ZnodeHeldElsewhereError`` with a watch left on it; a version or existence that is
not what the book expected raises ``ZnodeRaceError`` and the next attempt takes the full path.
The broker's own logs (system topics) are not published, as in its heartbeats.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from tidemq.services.broker.receive.dead_letter import is_system_topic
from tidemq.services.broker.topics import DataVersion, TopicConfig, TopicManager
from tidemq.services.broker.zk_leaf import ZnodeHeldElsewhereError, ZnodeRaceError
from tidemq.services.nameserver import zk_format
from tidemq.services.nameserver.route_model import TopicQueues


def _queues(t: TopicConfig) -> TopicQueues:
    return TopicQueues(t.topic, t.read_queue_nums, t.write_queue_nums, t.perm)


class ShardBook:
    """What the shards should hold and what was written, for one session and directory."""

    def __init__(self) -> None:
        self.content: dict[str, dict[str, TopicQueues]] = {}  # shard -> topic -> queues
        self.version: DataVersion | None = None  # the topic data version ``content`` is at
        self.dirty: set[str] = set()  # shards whose content differs from what was written
        self.session = 0
        self.directory = ""
        self.written: dict[str, int] = {}  # shard -> znode version, when complete
        self.complete = False  # every shard is as ``written`` says, under session/directory
        self.full_reads = 0  # times the whole topic table was compared (tests' cost measure)

    def forget(self, session: int, directory: str) -> None:
        """Nothing is known to be written: a new session, or shards in a new place."""
        self.session, self.directory = session, directory
        self.written = {}
        self.complete = False

    def update(self, topics: TopicManager) -> None:
        """Bring ``content`` to the topic table, marking the shards that changed dirty."""
        changes = None if self.version is None else topics.changes_since(self.version)
        if changes is None:
            self.full_reads += 1
            # The version first: the table read after it is at least as new, and the next
            # update re-applies whatever came in between (upserts and removals are idempotent).
            version = DataVersion(**asdict(topics.data_version))
            wanted: dict[str, dict[str, TopicQueues]] = {}
            for t in topics.all():
                if not is_system_topic(t.topic):
                    wanted.setdefault(zk_format.shard_of(t.topic), {})[t.topic] = _queues(t)
            for shard in wanted.keys() | self.content.keys():
                if wanted.get(shard) != self.content.get(shard):
                    self.dirty.add(shard)
            self.content = wanted
            self.version = version
            return
        for t in changes.upserted:
            if is_system_topic(t.topic):
                continue
            shard = zk_format.shard_of(t.topic)
            queues = _queues(t)
            held = self.content.setdefault(shard, {})
            if held.get(t.topic) != queues:
                held[t.topic] = queues
                self.dirty.add(shard)
        for name in changes.removed:
            shard = zk_format.shard_of(name)
            held = self.content.get(shard, {})
            if held.pop(name, None) is not None:
                self.dirty.add(shard)
                if not held:
                    del self.content[shard]
        self.version = changes.data_version

    def encoded(self, shard: str) -> bytes | None:
        """The bytes ``shard`` should hold; None when it should not exist."""
        topics = self.content.get(shard)
        return None if not topics else zk_format.encode_shard(shard, topics.values())


def sync_shards(
    client: Any,
    book: ShardBook,
    topics: TopicManager,
    directory: str,
    watch: Callable[[Any], None],
    timeout_s: float,
) -> int:
    """Make the shard znodes under ``directory`` hold the broker's topics; returns how many
    were written. Raises ZnodeHeldElsewhereError, ZnodeRaceError, ZnodeDataError (a shard over
    the size limit) or a kazoo error."""
    session = client.client_id[0]
    if (book.session, book.directory) != (session, directory):
        book.forget(session, directory)
    book.update(topics)
    if not book.complete:
        return _full_sync(client, book, directory, watch, timeout_s)
    if not book.dirty:
        return 0
    pending: Pending = []
    for shard in sorted(book.dirty):
        path = zk_format.join(directory, shard)
        data = book.encoded(shard)
        version = book.written.get(shard)
        if data is None:
            if version is not None:
                pending.append((shard, None, client.delete_async(path, version=version)))
        elif version is None:
            pending.append((shard, data, client.create_async(path, data, ephemeral=True)))
        else:
            pending.append((shard, data, client.set_async(path, data, version=version)))
    if _outcomes(book, pending, timeout_s):
        book.complete = False
        raise ZnodeRaceError(f"shards under {directory} changed under this broker's writes")
    book.dirty.clear()
    return len(pending)


Pending = list[tuple[str, bytes | None, Any]]


def _outcomes(book: ShardBook, pending: Pending, timeout_s: float) -> bool:
    """Wait for every write, recording what was written; True when one found the znode
    other than expected (someone else wrote or deleted it, or our earlier answer was lost)."""
    raced = False
    for shard, data, result in pending:
        try:
            answer = result.get(timeout=timeout_s)
        except (BadVersionError, NoNodeError, NodeExistsError):
            raced = True
            continue
        if data is None:
            book.written.pop(shard, None)
        elif isinstance(answer, str):  # a create answers the path: its version is 0
            book.written[shard] = 0
        else:
            book.written[shard] = answer.version
    return raced


def _full_sync(
    client: Any, book: ShardBook, directory: str, watch: Callable[[Any], None], timeout_s: float
) -> int:
    try:
        names = client.get_children_async(directory).get(timeout=timeout_s)
    except NoNodeError:
        client.ensure_path_async(directory).get(timeout=timeout_s)
        names = []
    reads = [(n, client.get_async(zk_format.join(directory, n))) for n in names]
    found: dict[str, tuple[bytes, int]] = {}
    for name, result in reads:
        with contextlib.suppress(NoNodeError):  # deleted meanwhile: nothing to delete
            data, stat = result.get(timeout=timeout_s)
            if stat.ephemeralOwner != book.session:
                path = zk_format.join(directory, name)
                client.exists_async(path, watch=watch).get(timeout=timeout_s)
                raise ZnodeHeldElsewhereError(path, stat.ephemeralOwner)
            found[name] = (data, stat.version)
    book.written = {name: version for name, (_, version) in found.items()}
    pending: Pending = []
    for shard in sorted(found.keys() | book.content.keys()):
        path = zk_format.join(directory, shard)
        data = book.encoded(shard)
        held = found.get(shard)
        if held is not None and held[0] == data:
            continue
        if data is None:
            assert held is not None
            pending.append((shard, None, client.delete_async(path, version=held[1])))
        elif held is None:
            pending.append((shard, data, client.create_async(path, data, ephemeral=True)))
        else:
            pending.append((shard, data, client.set_async(path, data, version=held[1])))
    if _outcomes(book, pending, timeout_s):
        raise ZnodeRaceError(f"shards under {directory} changed under this broker's writes")
    book.dirty.clear()
    book.complete = True
    return len(pending)


def delete_own_shards(client: Any, directory: str, timeout_s: float) -> int:
    """Delete the shards under ``directory`` this session owns (the broker moved); returns
    how many."""
    session = client.client_id[0]
    try:
        names = client.get_children_async(directory).get(timeout=timeout_s)
    except NoNodeError:
        return 0
    paths = [zk_format.join(directory, n) for n in names]
    stats = [(p, client.exists_async(p)) for p in paths]
    deletes = []
    for path, result in stats:
        stat = result.get(timeout=timeout_s)
        if stat is not None and stat.ephemeralOwner == session:
            deletes.append(client.delete_async(path, version=stat.version))
    for result in deletes:
        with contextlib.suppress(NoNodeError, BadVersionError):
            result.get(timeout=timeout_s)
    return len(deletes)
