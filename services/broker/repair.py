"""``tidemq broker repair-state``: the fix a broker names when it refuses to start on a damaged
state file (topics, subscription groups, consumer offsets, the epoch file).

On a stopped broker's store (the store lock is taken, so a running broker is never touched):

- no action: check every state file and say what is wrong (exit 1 if anything is);
- ``--from-peer HOST:PORT``: copy from a running broker of the same group, over the config-sync
  RPC, every damaged table among topics, groups and offsets; offsets are merged into a readable
  local table as config sync merges them (the newer version wins, nothing moves backwards);
- ``--reset KIND``: start that table afresh: offsets and groups empty, topics rebuilt from the
  queues in the store (the count is the highest queue id seen plus one, as a failover's
  ``_restore_topics`` does), the epoch file empty.

A file replaced either way is first moved aside as ``<name>.corrupt-<UTC time>`` (its ``.bak``
too); nothing is deleted.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from tidemq.protos import broker_pb2, broker_pb2_grpc
from tidemq.protos.tls import TlsSettings, sync_channel
from tidemq.replication import epochs
from tidemq.services.broker import groups, offsets, topics
from tidemq.services.broker.config_sync import offsets_of, topic_of, version_of
from tidemq.services.broker.journaled_table import journal_path
from tidemq.storage.cli import exits_on_store_error
from tidemq.storage.lock import StoreLock
from tidemq.storage.state_file import StateFileError, move_aside

PEER_TIMEOUT_S = 10.0
KINDS = ("offsets", "topics", "groups", "epochs")


@dataclass(frozen=True)
class Finding:
    kind: str
    path: str
    problem: str  # empty: the file is fine (or absent, which is fine too)


def state_paths(store_dir: str) -> dict[str, str]:
    config = os.path.join(store_dir, "config")
    return {
        "offsets": os.path.join(config, offsets.FILE_NAME),
        "topics": os.path.join(config, topics.FILE_NAME),
        "groups": os.path.join(config, groups.FILE_NAME),
        "epochs": os.path.join(store_dir, epochs.FILE_NAME),
    }


def _move_aside(path: str) -> list[str]:
    """The file, its ``.bak`` and its journal (topics, groups): a reset or a copy from a peer
    starts from none of them."""
    return move_aside(path) + move_aside(journal_path(path))


def _loaders(store_dir: str) -> dict[str, Callable[[], object]]:
    return {
        "offsets": lambda: offsets.load_offsets(store_dir),
        "topics": lambda: topics.load_topics(store_dir),
        "groups": lambda: groups.load_groups(store_dir),
        "epochs": lambda: epochs.EpochFile(store_dir),
    }


def check(store_dir: str) -> list[Finding]:
    """Every state file of the store and what is wrong with it."""
    paths = state_paths(store_dir)
    found = []
    for kind, load in _loaders(store_dir).items():
        try:
            load()
        except StateFileError as e:
            found.append(Finding(kind, paths[kind], e.problem))
        else:
            found.append(Finding(kind, paths[kind], ""))
    return found


def store_topics(store_dir: str) -> list[topics.TopicConfig]:
    """A topic config for every topic with ConsumeQueues in the store."""
    root = os.path.join(store_dir, "consumequeue")
    out = []
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else ():
        queue_ids = [int(q) for q in os.listdir(os.path.join(root, name)) if q.isdigit()]
        if queue_ids and os.path.isdir(os.path.join(root, name)):
            n = max(queue_ids) + 1
            out.append(topics.TopicConfig(name, n, n))
    return out


def reset(store_dir: str, kind: str) -> list[str]:
    """Move ``kind``'s file aside and start it afresh; returns what was done, for people."""
    path = state_paths(store_dir)[kind]
    done = [
        f"moved {os.path.basename(path)} aside as {os.path.basename(m)}" for m in _move_aside(path)
    ]
    if kind == "topics":
        rebuilt = store_topics(store_dir)
        manager = topics.TopicManager(store_dir)
        for cfg in rebuilt:
            manager.upsert(cfg)
        done.append(
            f"rebuilt {len(rebuilt)} topics from the store's queues: "
            + (", ".join(f"{t.topic} ({t.read_queue_nums} queues)" for t in rebuilt) or "none")
        )
    else:
        done.append(f"{kind}: starting empty")
    return done


def fetch_peer(address: str) -> Any:
    """A running broker's whole tables (a full config sync that hands it nothing). Over TLS
    when ``TIDEMQ_TLS_*`` say so (docs/security.md)."""
    with sync_channel(address, TlsSettings.from_env()) as channel:
        return broker_pb2_grpc.BrokerStub(channel).SyncConfig(
            broker_pb2.SyncConfigRequest(full=True), timeout=PEER_TIMEOUT_S
        )


def from_peer(store_dir: str, address: str, damaged: set[str]) -> list[str]:
    """Replace the damaged tables with the peer's and merge its offsets into ours."""
    peer = fetch_peer(address)
    paths = state_paths(store_dir)
    done = []
    for kind in ("topics", "groups", "offsets"):
        if kind in damaged:
            for m in _move_aside(paths[kind]):
                done.append(f"moved {os.path.basename(paths[kind])} aside as {os.path.basename(m)}")
    if "topics" in damaged:
        t = topics.TopicManager(store_dir)
        t.replace_all([topic_of(x) for x in peer.topics], version_of(peer.topics_version))
        done.append(f"topics: {len(peer.topics)} from {address}")
    if "groups" in damaged:
        g = groups.SubscriptionGroupManager(store_dir)
        g.replace_all([groups.group_of(x) for x in peer.groups], version_of(peer.groups_version))
        done.append(f"groups: {len(peer.groups)} from {address}")
    o = offsets.OffsetManager(store_dir)
    merged = o.merge(offsets_of(peer.offsets))
    o.persist()
    done.append(
        f"offsets: {merged.taken} taken from {address}, {merged.kept} local ones newer and kept"
    )
    return done


def run(args: argparse.Namespace) -> int:
    store_dir = args.repair_store
    if not os.path.isdir(store_dir):
        print(f"tidemq: {store_dir} is not a directory", file=sys.stderr)
        return 2
    lock = StoreLock(store_dir)
    lock.acquire()  # a running broker holds it: StoreLockedError, one line, exit 2
    try:
        findings = check(store_dir)
        damaged = {f.kind for f in findings if f.problem}
        for f in findings:
            print(f"{f.kind:8} {f.path}: {f.problem or 'ok'}")
        if not args.reset and not args.from_peer:
            return 1 if damaged else 0
        done: list[str] = []
        for kind in args.reset or ():
            done += reset(store_dir, kind)
        left = damaged - set(args.reset or ())
        if args.from_peer:
            if "epochs" in left:
                print("tidemq: epochs cannot come from a peer; use --reset epochs", file=sys.stderr)
                return 2
            try:
                done += from_peer(store_dir, args.from_peer, left)
            except grpc.RpcError as e:
                print(f"tidemq: {args.from_peer}: {e.details()}; nothing changed", file=sys.stderr)
                return 2
            left = set()
        for line in done:
            print(line)
        if left:
            print(f"still damaged: {', '.join(sorted(left))}", file=sys.stderr)
            return 1
        return 0
    finally:
        lock.release()


def add_parser(broker_sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    r = broker_sub.add_parser(
        "repair-state",
        help="check a stopped broker's state files; restore them from a peer or reset them",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument("--store", dest="repair_store", required=True, help="the broker's store")
    r.add_argument(
        "--from-peer",
        "--from-slave",
        dest="from_peer",
        metavar="HOST:PORT",
        help="a running broker of the same group to copy topics, groups and offsets from",
    )
    r.add_argument(
        "--reset",
        action="append",
        choices=KINDS,
        help="start this table afresh (the old file is kept as <name>.corrupt-<time>); repeatable",
    )
    r.set_defaults(func=exits_on_store_error(run), log_level=logging.WARNING)
