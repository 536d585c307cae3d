"""Shared pieces of the crash and corruption tests: the message model both the child writer
(crash_writer.py) and the tests use, a deadline-bound line reader for the child's stdout, and
helpers that read and damage CommitLog bytes by global offset.

Every message carries a unique key as its first key, and its body is a pure function of that key
and its length (``make_body``), so any record recovery brings back, acknowledged or not, can be
checked for exact content.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tidemq.storage import FlushMode, Message, MessageStore, PutStatus, StoreConfig, StoredMessage
from tidemq.storage.commitlog import AppendResult
from tidemq.storage.record import HEADERS

REPO = Path(__file__).resolve().parents[2]
WRITER = Path(__file__).resolve().with_name("crash_writer.py")
FILE_SIZE = 4096
BODY_AT = HEADERS[False, False].size  # 88: where the body starts in an IPv4 record
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


# ----------------------------------------------------------------------------- reading a store
Queues = dict[tuple[str, int], list[StoredMessage]]


def read_queue(s: MessageStore, topic: str, queue_id: int) -> list[StoredMessage]:
    """Every message of a queue from offset 0, asserting there is no gap on the way."""
    out: list[StoredMessage] = []
    hi = s.max_offset(topic, queue_id)
    while len(out) < hi:
        got = s.get_messages(topic, queue_id, len(out), 32)
        assert got.messages, f"{topic}/{queue_id}: nothing at {len(out)} below max {hi}"
        assert got.next_offset == len(out) + len(got.messages)
        out += got.messages
    return out


def read_all(s: MessageStore) -> Queues:
    return {
        (topic, qid): read_queue(s, topic, qid)
        for topic, qids in s.topics().items()
        for qid in qids
    }


def check_queues_contiguous(
    s: MessageStore, queues: dict[tuple[str, int], list[StoredMessage]]
) -> None:
    """Offsets 0..n-1 with no gap, n == max_offset, records in log order, no record twice."""
    seen: set[int] = set()
    for (topic, qid), msgs in queues.items():
        assert s.min_offset(topic, qid) == 0
        assert s.max_offset(topic, qid) == len(msgs)
        assert [m.queue_offset for m in msgs] == list(range(len(msgs))), (topic, qid)
        phys = [m.phy_offset for m in msgs]
        assert phys == sorted(phys), (topic, qid)
        assert len(set(phys)) == len(phys), (topic, qid)
        for m in msgs:
            assert (m.topic, m.queue_id) == (topic, qid)
            assert_self_consistent(m)
        assert not seen & set(phys)
        seen |= set(phys)


def check_ack_lookups(s: MessageStore, a: Ack) -> None:
    """An acknowledged message by offset, by message id and by key."""
    assert_matches(s.look_message(a.phy_offset), a)
    assert_matches(s.get_message_by_id(a.msg_id), a)
    found = s.query_by_key(a.topic, a.key)
    assert [m.phy_offset for m in found] == [a.phy_offset], f"query_by_key({a.key}): {found}"
    assert_matches(found[0], a)


def expected_queues(acks: list[Ack]) -> dict[tuple[str, int], list[Ack]]:
    out: dict[tuple[str, int], list[Ack]] = {}
    for a in sorted(acks, key=lambda a: a.phy_offset):
        out.setdefault((a.topic, a.queue_id), []).append(a)
    return out


def verify_exactly(s: MessageStore, acks: list[Ack]) -> None:
    """The store holds exactly ``acks`` (and nothing else), each readable every way."""
    queues = read_all(s)
    check_queues_contiguous(s, queues)
    want = expected_queues(acks)
    assert {k: len(v) for k, v in queues.items() if v} == {k: len(v) for k, v in want.items()}
    for key, msgs in want.items():
        for a in msgs:
            assert_matches(queues[key][a.queue_offset], a)
            check_ack_lookups(s, a)


# ----------------------------------------------------------------------------- raw CommitLog bytes
def commitlog_dir(root: str | Path) -> Path:
    return Path(root) / "commitlog"


def commitlog_files(root: str | Path) -> list[Path]:
    return sorted(p for p in commitlog_dir(root).iterdir() if p.name.isdigit())


def locate(root: str | Path, offset: int) -> tuple[Path, int]:
    """The CommitLog file holding a global offset (its name is its first byte's offset) and the
    position inside it."""
    base = offset - offset % FILE_SIZE
    path = commitlog_dir(root) / f"{base:020d}"
    assert path.exists(), f"no CommitLog file holds offset {offset}"
    return path, offset - base


def read_log(root: str | Path, offset: int, n: int) -> bytes:
    path, pos = locate(root, offset)
    assert pos + n <= FILE_SIZE
    with open(path, "rb") as f:
        f.seek(pos)
        return f.read(n)


def write_log(root: str | Path, offset: int, data: bytes) -> None:
    path, pos = locate(root, offset)
    assert pos + len(data) <= FILE_SIZE
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def flip_bit(root: str | Path, offset: int, bit: int = 0) -> None:
    (b,) = read_log(root, offset, 1)
    write_log(root, offset, bytes([b ^ (1 << bit)]))


def zero_log(root: str | Path, offset: int, n: int) -> None:
    """Zero ``n`` bytes from a global offset, across file boundaries."""
    while n > 0:
        _, pos = locate(root, offset)
        k = min(n, FILE_SIZE - pos)
        write_log(root, offset, bytes(k))
        offset += k
        n -= k


def snapshot_log(root: str | Path) -> dict[int, bytes]:
    return {int(p.name): p.read_bytes() for p in commitlog_files(root)}


def evidence(root: str | Path) -> list[tuple[dict[str, Any], bytes, Path]]:
    """(note, saved bytes, path of the .bin) of every evidence file, lowest offset first."""
    d = Path(root) / "evidence"
    if not d.is_dir():
        return []
    out = []
    for b in sorted(d.glob("*.bin")):
        note = json.loads(b.with_suffix(".json").read_text())
        out.append((note, b.read_bytes(), b))
    return sorted(out, key=lambda x: (x[0]["offset"], x[2].name))


# ----------------------------------------------------------------------------- the child writer
class LineReader:
    """Whole lines from a pipe, each read bounded by a deadline (never a blind sleep)."""

    def __init__(self, pipe: IO[bytes]) -> None:
        self.fd = pipe.fileno()
        self.buf = b""
        self.eof = False
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.fd, selectors.EVENT_READ)

    def readline(self, timeout_s: float) -> str | None:
        """The next whole line, None at end of file; TimeoutError past the deadline."""
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self.buf:
            if self.eof:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no line from the writer within {timeout_s} s")
            if self.sel.select(left):
                chunk = os.read(self.fd, 1 << 16)
                if chunk:
                    self.buf += chunk
                else:
                    self.eof = True
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode()

    def lines(self, timeout_s: float) -> Iterator[str]:
        """Every remaining whole line until end of file (a torn last line is dropped)."""
        while (line := self.readline(timeout_s)) is not None:
            yield line

    def close(self) -> None:
        self.sel.close()


@dataclass
class Recovered:
    abnormal: bool
    cut_bytes: int
    end_offset: int
    pid: int


class Writer:
    """crash_writer.py in its own session, so SIGKILL of its group leaves nothing behind."""

    def __init__(self, store_dir: str | Path, *args: str, err_path: str | Path) -> None:
        self.err_path = Path(err_path)
        self._err = open(self.err_path, "wb")  # noqa: SIM115 - closed in kill()/finish()
        self.proc = subprocess.Popen(
            [sys.executable, str(WRITER), str(store_dir), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            cwd=str(REPO),
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        self.reader = LineReader(self.proc.stdout)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr(self) -> str:
        self._err.flush()
        return self.err_path.read_text(errors="replace")

    def readline(self, timeout_s: float = 30.0) -> str:
        line = self.reader.readline(timeout_s)
        if line is None:
            rc = self.proc.wait(30)
            raise AssertionError(f"writer exited ({rc}) early; stderr:\n{self.stderr()}")
        return line

    def recovered(self) -> Recovered:
        line = self.readline()
        f = line.split()
        assert f[0] == "R", f"expected the recovery line, got {line!r}; stderr:\n{self.stderr()}"
        return Recovered(f[1] == "1", int(f[2]), int(f[3]), int(f[4]))

    def kill(self, timeout_s: float = 30.0) -> list[str]:
        """SIGKILL the writer's process group; returns the whole lines it printed before dying
        that were not read yet (they were acknowledged too)."""
        with contextlib.suppress(ProcessLookupError):  # it may have killed itself
            os.killpg(self.proc.pid, signal.SIGKILL)
        rc = self.proc.wait(timeout_s)
        assert rc == -signal.SIGKILL, f"writer exited with {rc}, not by SIGKILL:\n{self.stderr()}"
        rest = list(self.reader.lines(timeout_s))
        self.close()
        return rest

    def finish(self, timeout_s: float = 60.0) -> int:
        rc = self.proc.wait(timeout_s)
        self.close()
        return rc

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        self.reader.close()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()
        self._err.close()


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidemq.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=str(REPO),
        check=False,
    )
