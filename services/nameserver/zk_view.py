"""The nameserver's view of the ZooKeeper registry, kept up to date one znode event at a time.

Pure: no ZooKeeper, no clock, no asyncio. ``zk_registry`` feeds it the events its watches
deliver (a leaf or a shard set or removed) and serves the table;
tests feed it events in any order.

Cost of an event:

- a topic shard set or removed (a topic created, changed or deleted: the common event) is
  applied to the ``RouteTable`` in place, costing the topics of that one shard, old and new
  (``topics_touched`` counts them), whatever the number of topics held;
- a leaf set or removed (a broker joined, left, changed role or epoch: rare) marks the view
  dirty; ``settle`` then rebuilds the table once from every leaf and shard held
  (``zk_routes.table_from``), however many leaf events came in between.

What converges: after ``settle``, the table is exactly the one a rebuild from the znodes held
would give (``zk_routes.table_from``), whatever order the events came in, because a shard only
moves the table when its broker is its group's topic source in that rebuild (the master, or
the lowest slave of a group without one; ``Routes.sources``), and then it moves exactly that
group's queue data for the topics of that shard. So two nameservers holding the same znodes
(the same data of each) answer QueryRoute and GetClusterInfo byte for byte alike; while their
events are in flight they may differ, as reads of a changing tree always could.

A broker's topics are those of its shards owned by the session that owns its leaf: a shard of
another session (a previous process of the broker, whose session has not expired yet) is held
but not served. Invalid leaves and shards are held with the reason (``problems``), never served.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from tidemq.services.nameserver import zk_format
from tidemq.services.nameserver.route_model import TopicQueues
from tidemq.services.nameserver.route_table import RouteTable
from tidemq.services.nameserver.zk_routes import (
    BrokerZnode,
    Candidate,
    Routes,
    decode_leaf,
    table_from,
)

BrokerKey = tuple[str, str, str]  # (cluster, broker name, broker id as its znode is named)


@dataclass(frozen=True)
class ShardZnode:
    """One topic shard as read."""

    cluster: str
    broker_name: str
    broker_id: str
    shard: str  # the znode's name, not yet checked
    data: bytes
    ephemeral_owner: int

    @property
    def broker(self) -> BrokerKey:
        return (self.cluster, self.broker_name, self.broker_id)

    @property
    def path(self) -> str:
        return f"{self.cluster}/{self.broker_name}/{self.broker_id}/{self.shard}"


@dataclass(frozen=True)
class _Shard:
    owner: int
    topics: Mapping[str, TopicQueues]  # empty when invalid


@dataclass(frozen=True)
class _Leaf:
    znode: BrokerZnode
    leaf: zk_format.Leaf | None  # None when invalid (the reason is in ``problems``)


def _path(key: BrokerKey) -> str:
    return "/".join(key)


class RegistryView:
    """Leaves and shards as last seen, and the routes they describe (``table``)."""

    def __init__(self) -> None:
        self._leaves: dict[BrokerKey, _Leaf] = {}
        self._shards: dict[BrokerKey, dict[str, _Shard]] = {}
        self._leaf_problems: dict[str, str] = {}
        self._shard_problems: dict[str, str] = {}
        self._routes: Routes | None = None
        self._dirty = True
        self.topics_touched = 0  # work done applying shards in place (a test's cost measure)
        self.rebuilds = 0

    # -- events ----------------------------------------------------------------------------

    def set_leaf(self, znode: BrokerZnode) -> None:
        key = (znode.cluster, znode.broker_name, znode.broker_id)
        held = self._leaves.get(key)
        if held is not None and held.znode == znode:
            return
        self._leaf_problems.pop(znode.path, None)
        try:
            leaf: zk_format.Leaf | None = decode_leaf(znode)
        except zk_format.ZnodeDataError as e:
            self._leaf_problems[znode.path] = str(e)
            leaf = None
        self._leaves[key] = _Leaf(znode, leaf)
        self._dirty = True

    def remove_leaf(self, key: BrokerKey) -> None:
        if self._leaves.pop(key, None) is not None:
            self._leaf_problems.pop(_path(key), None)
            self._dirty = True

    def set_shard(self, shard: ShardZnode) -> None:
        self._shard_problems.pop(shard.path, None)
        try:
            topics: Mapping[str, TopicQueues] = zk_format.decode_shard(shard.shard, shard.data)
        except zk_format.ZnodeDataError as e:
            self._shard_problems[shard.path] = str(e)
            topics = {}
        self._replace_shard(shard.broker, shard.shard, _Shard(shard.ephemeral_owner, topics))

    def remove_shard(self, key: BrokerKey, shard: str) -> None:
        self._shard_problems.pop(f"{_path(key)}/{shard}", None)
        self._replace_shard(key, shard, None)

    def settle(self) -> bool:
        """Rebuild the table if a leaf changed since the last rebuild; True when it did."""
        if not self._dirty:
            return False
        candidates = []
        for key, held in self._leaves.items():
            if held.leaf is None:
                continue
            reg = held.leaf.registration
            if not held.leaf.inline:
                reg = replace(reg, topics=tuple(self._topics_of(key, held.znode.ephemeral_owner)))
            znode = held.znode
            candidates.append(Candidate(znode.path, znode.czxid, znode.mtime_ms, reg))
        self._routes = table_from(candidates)
        self._dirty = False
        self.rebuilds += 1
        return True

    # -- queries ---------------------------------------------------------------------------

    @property
    def table(self) -> RouteTable | None:
        """The routes as of the last ``settle`` and every shard event since."""
        return None if self._routes is None else self._routes.table

    @property
    def problems(self) -> dict[str, str]:
        """Path (below the layout's top, e.g. ``c/broker-a/0`` or ``c/broker-a/0/3f``) -> why
        that znode is not served."""
        found = dict(self._shard_problems)
        found.update(self._leaf_problems)
        if self._routes is not None:
            found.update(self._routes.problems)
        return found

    # -- internals -------------------------------------------------------------------------

    def _topics_of(self, key: BrokerKey, owner: int) -> Iterable[TopicQueues]:
        for shard in self._shards.get(key, {}).values():
            if shard.owner == owner:
                yield from shard.topics.values()

    def _replace_shard(self, key: BrokerKey, name: str, new: _Shard | None) -> None:
        shards = self._shards.setdefault(key, {})
        old = shards.pop(name, None)
        if new is not None:
            shards[name] = new
        elif not shards:
            del self._shards[key]
        if self._dirty or self._routes is None:
            return  # the coming rebuild takes every shard as it is then
        held = self._leaves.get(key)
        if held is None or held.leaf is None or held.leaf.inline:
            return  # shards of a broker without a leaf, or with its topics inline, serve nothing
        reg = held.leaf.registration
        owner = held.znode.ephemeral_owner
        before = old.topics if old is not None and old.owner == owner else {}
        after = new.topics if new is not None and new.owner == owner else {}
        self.topics_touched += len(before) + len(after)
        upserted = [t for name, t in after.items() if before.get(name) != t]
        removed = [name for name in before if name not in after]
        if not upserted and not removed:
            return
        if self._routes.sources.get(reg.broker_name) == held.znode.path:
            self._routes.table.apply_topic_changes(reg.address, upserted, removed)
        else:
            # Not its group's topic source: the routes hold none of its topics, only its count.
            self._routes.table.note_topic_changes(reg.address, upserted, removed)
