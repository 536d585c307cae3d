"""Record blocks: how plain messages travel (docs/sdk.md, "Record blocks on the wire").

A plain message (no message group, no delayed delivery, not transactional) is encoded at once,
in the caller's thread, into its topic's open ``Block`` (one call of the compiled
``BlockBuilder``: no Python object is kept per message) and answered by a ``BlockFuture``, a
reference to the block and the message's index that the garbage collector does not track. A
block is sealed when it is full (``batch_max_messages`` / ``batch_max_bytes``) or when the
producer's loop takes it (with ``linger_ms=0`` as soon as a request could leave, after
``linger_ms`` otherwise), then placed on one queue (round robin by block, as Kafka's sticky
partitioner does by batch), given its sequences as one run when the producer is idempotent,
and sent by the sender like any batch. The broker answers where the block went, and the first
``result()`` of the block derives every message's result from that, in one call too.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from tidemq.errors import ClientClosedError, InvalidArgumentError
from tidemq.producer.config import ProducerConfig
from tidemq.producer.futures import Hub, SendFuture
from tidemq.protos.record_blocks import BlockBuilder, RecordFormatError, RecordRef
from tidemq.routes import MessageQueue
from tidemq.types import SendResult, SendStatus

log = logging.getLogger(__name__)

# SendResult's fields that differ from message to message of a block.
_RESULT_FIELDS = (
    SendResult._fields.index("msg_id"),
    SendResult._fields.index("queue_offset"),
    SendResult._fields.index("commitlog_offset"),
)


class BlockAnswer(NamedTuple):
    """Where the broker put a block (a ``BlockResult`` and its response's fields)."""

    status: SendStatus
    broker: str
    epoch: int
    address: str
    store_host: bytes
    store_port: int
    first_queue_offset: int
    first_commitlog_offset: int
    added_bytes: int
    head_added_bytes: int
    file_start_indexes: Sequence[int]
    file_start_offsets: Sequence[int]
    duplicate: bool


class Block:
    """Plain messages of one topic, sent as one record block to one queue; the unit the
    accumulator and the sender move (as they move a ``Pending``), answered as a whole. Its
    messages are encoded into ``builder`` as they arrive; a block never refers to its futures
    (they are untracked by the garbage collector, ``RecordRef``), except through callbacks,
    which it drops once answered, and every block is answered."""

    __slots__ = (
        "_callbacks",
        "_lock",
        "_results",
        "answer",
        "batch_id",
        "builder",
        "deadline",
        "error",
        "hub",
        "lingering",
        "producer_epoch",
        "queue",
        "sequence",
        "sharding_key",
        "state",
        "topic",
    )

    def __init__(self, topic: str, builder: BlockBuilder, hub: Hub, deadline: float) -> None:
        self.topic = topic
        self.builder = builder
        self.hub = hub
        self.deadline = deadline  # monotonic: its first message's
        self.queue: MessageQueue | None = None
        self.sequence = -1  # the first record's, when idempotent
        self.producer_epoch = -1
        self.batch_id = 0
        self.sharding_key: str | None = None
        self.lingering = False  # its linger timer is set (``BlockCollector``)
        self.state = 0  # 0 on its way, 1 answered, 2 failed
        self.answer: BlockAnswer | None = None
        self.error: BaseException | None = None
        self._results: list[SendResult] | None = None
        self._callbacks: list[tuple[BlockFuture, Callable[[SendFuture], None]]] | None = None
        self._lock = threading.Lock()

    @property
    def count(self) -> int:
        return self.builder.count

    @property
    def size(self) -> int:
        return self.builder.size

    def records(self) -> bytes:
        """The block as CommitLog records for its current queue (the queue id is in every
        record: a block moved to another queue is encoded again)."""
        assert self.queue is not None
        return self.builder.records(self.queue.queue_id)

    # ------------------------------------------------------------------ answering
    def done(self) -> bool:
        return self.state != 0

    def resolve(self, answer: BlockAnswer) -> None:
        self.answer = answer
        self._finish(1)

    def fail(self, error: BaseException) -> None:
        self.error = error
        self._finish(2)

    def _finish(self, state: int) -> None:
        with self._lock:
            if self.state:
                return
            self.state = state
            callbacks, self._callbacks = self._callbacks, None
        self.builder.release()  # the records' bytes; the sizes results need stay
        hub = self.hub
        hub.completed += self.builder.count
        for future, fn in callbacks or ():
            try:
                fn(future)
            except Exception:
                log.exception("send callback failed")
        hub.wake()

    def add_callback(self, future: BlockFuture, fn: Callable[[SendFuture], None]) -> None:
        with self._lock:
            if not self.state:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append((future, fn))
                return
        fn(future)

    def result_at(self, index: int) -> SendResult:
        results = self._results
        if results is None:
            results = self._results = self._derive_results()
        return results[index]

    def _derive_results(self) -> list[SendResult]:
        a = self.answer
        assert a is not None
        assert self.queue is not None
        template = SendResult(
            a.status, "", self.queue.queue_id, 0, a.broker, self.topic, 0, a.epoch, a.address,
            duplicate=a.duplicate,
        )  # fmt: skip
        return self.builder.results(
            SendResult, template, _RESULT_FIELDS, a.first_queue_offset, a.first_commitlog_offset,
            a.added_bytes, a.head_added_bytes, a.file_start_indexes, a.file_start_offsets,
            a.store_host, a.store_port,
        )  # fmt: skip


class BlockFuture(RecordRef, SendFuture):
    """The answer to one message of a block: a ``RecordRef`` (the block and the message's
    index), which the garbage collector does not track, so a million futures held by an
    application cost it nothing; the block answers all of its messages at once."""

    __slots__ = ()

    def done(self) -> bool:
        b: Block = self.owner
        return b.state != 0

    def result(self, timeout: float | None = None) -> SendResult:
        b: Block = self.owner
        if not b.state:
            b.hub.wait_for(b.done, timeout)
        if b.state == 2:
            assert b.error is not None
            raise b.error
        return b.result_at(self.index)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        b: Block = self.owner
        if not b.state:
            b.hub.wait_for(b.done, timeout)
        return b.error if b.state == 2 else None

    def add_done_callback(self, fn: Callable[[SendFuture], None]) -> None:
        self.owner.add_callback(self, fn)


def _body_bytes(body: object) -> bytes:
    if type(body) is bytes:
        return body
    if isinstance(body, str):
        return body.encode()
    if isinstance(body, bytearray | memoryview):
        return bytes(body)
    raise InvalidArgumentError(
        f"body must be bytes or str, not {type(body).__name__}", code="INVALID_ARGUMENT"
    )


class BlockCollector:
    """The open block of each topic, filled from any thread. A message is encoded into its
    block by one call of the compiled builder, which the interpreter runs whole: appending
    takes no lock. Sealing does (it is per block): whoever seals a block (``seal()`` says who)
    hands it over, once. Sealed blocks wait in a queue of the collector's own until the
    producer's loop takes them (``sealed`` is called with each, on the loop): a flush that
    takes them finds every block sealed before it."""

    def __init__(
        self,
        config: ProducerConfig,
        hub: Hub,
        loop: asyncio.AbstractEventLoop,
        sealed: Callable[[Block], None],
        can_send: Callable[[], bool],
    ) -> None:
        self._config = config
        self._can_send = can_send
        self._hub = hub
        self._loop = loop
        self._sealed = sealed
        self._lock = threading.Lock()
        self._open: dict[str, Block] = {}
        self._full: deque[Block] = deque()
        self._wake_scheduled = False
        self.closed = False
        self._timeout_s = config.send_timeout_ms / 1000
        self._linger_s = config.linger_ms / 1000
        self._max_messages = config.batch_max_messages
        self._max_bytes = config.batch_max_bytes

    def add(
        self,
        topic: str,
        body: object,
        tag: str | None,
        keys: Sequence[str] | str,
        properties: Mapping[str, str] | None,
    ) -> BlockFuture:
        """Queue a plain message; raises ``InvalidArgumentError`` for a bad one (it alone)."""
        if type(body) is not bytes:
            body = _body_bytes(body)
        if type(keys) is str:
            keys = (keys,)
        block = self._open.get(topic)
        while True:
            if block is None:
                block = self._open_block(topic)
            builder = block.builder
            try:
                future = builder.add(BlockFuture, block, body, tag, keys, properties)
            except (RecordFormatError, TypeError) as e:
                raise InvalidArgumentError(str(e), code="INVALID_ARGUMENT") from None
            if future is not None:
                break
            block = None  # sealed under us: the topic's next block
        if builder.full:
            self._hand_over(block)
        return future

    def _open_block(self, topic: object) -> Block:
        """The topic's open block, made if it has none (a new one is announced to the loop)."""
        with self._lock:
            if self.closed:
                raise ClientClosedError("producer closed", code="CLOSED")
            if type(topic) is not str or not topic:
                raise InvalidArgumentError("topic must be a non-empty string", code="INVALID_TOPIC")
            block = self._open.get(topic)
            if block is not None and not block.builder.sealed:
                return block
            try:
                builder = BlockBuilder(topic, self._max_messages, self._max_bytes)
            except RecordFormatError as e:
                raise InvalidArgumentError(str(e), code="INVALID_TOPIC") from None
            block = Block(topic, builder, self._hub, time.monotonic() + self._timeout_s)
            self._open[topic] = block
            wake = self._wake_locked()
        if wake:
            self._loop.call_soon_threadsafe(self._on_wake)
        return block

    def _wake_locked(self) -> bool:
        """Whether the caller must schedule ``_on_wake`` (one is not pending already)."""
        if self._wake_scheduled:
            return False
        self._wake_scheduled = True
        return True

    def _hand_over(self, block: Block) -> None:
        """Seal a full block and queue it for the loop, unless someone sealed it first."""
        if not block.builder.seal():
            return
        with self._lock:
            if self._open.get(block.topic) is block:
                del self._open[block.topic]
            self._full.append(block)
            wake = self._wake_locked()
        if wake:
            self._loop.call_soon_threadsafe(self._on_wake)

    def _on_wake(self) -> None:
        """On the loop: hand over the full blocks, and the open ones once they have lingered
        or, with linger_ms=0, while a request could leave now (``can_send``): an open block
        grows while the sender is busy, and is taken when it is not (``take_open``)."""
        linger_s = self._linger_s
        take_open = linger_s <= 0 and self._can_send()
        timed: list[Block] = []
        with self._lock:
            self._wake_scheduled = False
            ready = list(self._full)
            self._full.clear()
            if take_open:
                ready += self._take_open_locked()
            elif linger_s > 0:
                timed = [b for b in self._open.values() if not b.lingering]
                for b in timed:
                    b.lingering = True
        for block in ready:
            self._sealed(block)
        for block in timed:
            self._loop.call_later(linger_s, self._lingered, block)

    def _take_open_locked(self) -> list[Block]:
        """Seal and remove the open blocks; those another thread sealed first it hands over."""
        # A block sealed before its first message went in (the adder moved on to the next
        # one) holds nothing to send: it is dropped.
        taken = [b for b in self._open.values() if b.builder.seal() and b.builder.count]
        self._open.clear()
        return taken

    def _lingered(self, block: Block) -> None:
        if not block.builder.seal():
            return  # sealed full, or taken by a flush, meanwhile
        with self._lock:
            if self._open.get(block.topic) is block:
                del self._open[block.topic]
        if block.builder.count:
            self._sealed(block)

    def take_open(self) -> None:
        """On the loop: hand over every block, full or open, now (a flush)."""
        with self._lock:
            ready = list(self._full)
            self._full.clear()
            ready += self._take_open_locked()
        for block in ready:
            self._sealed(block)

    def close(self) -> None:
        """Refuse further blocks (``take_open`` still hands over what came before)."""
        with self._lock:
            self.closed = True


__all__ = ["Block", "BlockAnswer", "BlockCollector", "BlockFuture"]
