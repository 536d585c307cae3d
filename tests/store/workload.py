"""The store the crash and corruption tests build, and the messages they write to it: used by the
tests and by their child writer (crash_writer.py) alike.

Every message carries a unique key as its first key, and its body is a pure function of that key
and its length (``make_body``), so any record recovery brings back, acknowledged or not, can be
checked for exact content.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidemq.storage import FlushMode, Message, MessageStore, PutStatus, StoreConfig, StoredMessage
from tidemq.storage.commitlog import AppendResult

FILE_SIZE = 4096
TOPICS = (("crash", 4), ("side", 1))  # topic, number of queues
TAGS = ("a", "b", None)


def store_config(root: str | Path, flush: FlushMode = FlushMode.SYNC, **kw: Any) -> StoreConfig:
    """Tiny files: every few messages roll the CommitLog (blank markers), every 16 entries a
    ConsumeQueue, every 31 keys an index file."""
    return StoreConfig(
        str(root),
        commitlog_file_size_bytes=FILE_SIZE,
        consume_queue_entries_per_file=16,
        index_slot_num=8,
        index_max_num=32,
        flush_mode=flush,
        **kw,
    )


def start_store(cfg: StoreConfig) -> MessageStore:
    """Open with the disk reported empty, so retention never runs on the host's real usage."""
    return MessageStore(cfg, disk_usage_ratio=lambda: 0.0).open()


# ----------------------------------------------------------------------------- the message model
def make_body(key: str, size: int) -> bytes:
    head = key.encode() + b"|"
    assert size >= len(head)
    return head + random.Random(key).randbytes(size - len(head))


def digest(body: bytes) -> str:
    return hashlib.blake2b(body, digest_size=8).hexdigest()


@dataclass(frozen=True)
class Planned:
    topic: str
    queue_id: int
    key: str
    keys: tuple[str, ...]
    tags: str | None
    body: bytes

    def message(self) -> Message:
        return Message(
            self.topic, self.body, queue_id=self.queue_id, tags=self.tags, keys=list(self.keys)
        )


def plan_batch(rng: random.Random, prefix: str, seq: int, max_body: int = 600) -> list[Planned]:
    """1-5 messages of random sizes over several queues; keys ``{prefix}{n}`` are unique."""
    out: list[Planned] = []
    for i in range(rng.randint(1, 5)):
        topic, nq = TOPICS[0] if rng.random() < 0.85 else TOPICS[1]
        key = f"{prefix}{seq + i}"
        keys: tuple[str, ...] = (
            (key,) if rng.random() < 0.5 else (key, f"{prefix}g{rng.randrange(3)}")
        )
        size = rng.randint(len(key) + 1, max_body)
        out.append(
            Planned(topic, rng.randrange(nq), key, keys, rng.choice(TAGS), make_body(key, size))
        )
    return out


@dataclass(frozen=True)
class Ack:
    """One acknowledged message, as the writer reported it."""

    topic: str
    queue_id: int
    queue_offset: int
    phy_offset: int
    size: int  # record size in the CommitLog
    keys: tuple[str, ...]
    tags: str | None
    body_len: int
    digest: str
    msg_id: str

    @property
    def key(self) -> str:
        return self.keys[0]

    @property
    def end(self) -> int:
        return self.phy_offset + self.size

    def line(self) -> str:
        fields = (
            "A",
            self.topic,
            self.queue_id,
            self.queue_offset,
            self.phy_offset,
            self.size,
            ",".join(self.keys),
            self.tags or "-",
            self.body_len,
            self.digest,
            self.msg_id,
        )
        return " ".join(map(str, fields)) + "\n"

    @classmethod
    def parse(cls, line: str) -> Ack:
        f = line.split()
        assert f[0] == "A", line
        assert len(f) == 11, line
        return cls(
            f[1],
            int(f[2]),
            int(f[3]),
            int(f[4]),
            int(f[5]),
            tuple(f[6].split(",")),
            None if f[7] == "-" else f[7],
            int(f[8]),
            f[9],
            f[10],
        )

    @classmethod
    def of(cls, p: Planned, r: AppendResult) -> Ack:
        return cls(
            p.topic,
            p.queue_id,
            r.queue_offset,
            r.phy_offset,
            r.size,
            p.keys,
            p.tags,
            len(p.body),
            digest(p.body),
            r.msg_id,
        )


def ident(m: StoredMessage) -> tuple[int, int, tuple[str, ...], str]:
    return m.phy_offset, m.size, tuple(m.keys), digest(m.body)


def assert_self_consistent(m: StoredMessage) -> None:
    """Any record the store returns must be one a writer produced, byte for byte."""
    assert m.keys, f"record at {m.phy_offset} has no keys"
    assert m.body == make_body(m.keys[0], len(m.body)), f"garbage body at {m.phy_offset}"


def assert_matches(m: StoredMessage, a: Ack) -> None:
    got = (m.topic, m.queue_id, m.queue_offset, m.phy_offset, m.size, tuple(m.keys), m.tags)
    want = (a.topic, a.queue_id, a.queue_offset, a.phy_offset, a.size, a.keys, a.tags)
    assert got == want, f"acknowledged {a} read back as {got}"
    assert (len(m.body), digest(m.body)) == (a.body_len, a.digest), f"body of {a} changed"
    assert m.msg_id == a.msg_id


def put_batches(s: MessageStore, rng: random.Random, prefix: str, count: int) -> list[Ack]:
    """Append ``count`` messages in random batches (in-process); every batch acknowledged."""
    acks: list[Ack] = []
    while len(acks) < count:
        plan = plan_batch(rng, prefix, len(acks))[: count - len(acks)]
        r = s.put_messages([p.message() for p in plan])
        assert r.wait(30) is PutStatus.PUT_OK
        acks += [Ack.of(p, res) for p, res in zip(plan, r.results, strict=True)]
    # Dispatch (queue and index entries) runs in its own thread: wait until it caught up.
    assert s.wait_dispatched(s.commitlog.max_offset, 30)
    return acks
