"""Pulling: each owned queue has a long-polling pull task filling a bounded buffer, which
``poll`` takes from. A queue's state also holds its positions (what was pulled, returned by
``poll``, handled, committed)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tidemq.consumer.brokers import CALL_TIMEOUT_S, Brokers
from tidemq.consumer.config import ConsumerConfig
from tidemq.consumer.lineage import Lineage
from tidemq.errors import TidemqError
from tidemq.protos import broker_pb2
from tidemq.protos.record_blocks import RecordFormatError, decode_records
from tidemq.routes import MessageQueue
from tidemq.types import ReceivedMessage

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 5.0


@dataclass(eq=False)
class QueueState:
    mq: MessageQueue
    next_pull: int
    delivered: int  # everything below was returned by poll (or filtered out by tags)
    processed: int  # auto-commit: everything below was returned by an earlier poll
    committed: int
    buffer: deque[ReceivedMessage] = field(default_factory=deque)
    space: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    lineage: Lineage = field(default_factory=Lineage)


def pulled_messages(resp: Any, broker: str, address: str) -> list[ReceivedMessage]:
    """A pull's messages: its records decoded in one call, or (a broker older than record
    blocks) its protobuf messages. Malformed records (the broker checked every CRC before
    sending: a bug, or a damaged answer) fail the pull, which is tried again."""
    try:
        return _decoded(resp, broker)
    except RecordFormatError as e:
        raise TidemqError(f"the broker at {address} answered malformed records: {e}") from None


def _decoded(resp: Any, broker: str) -> list[ReceivedMessage]:
    if resp.record_count:
        common = {
            "broker": broker,
            "receipt_handle": "",
            "delivery_attempt": 0,
            "message_group": None,
            "invisible_until_ms": 0,
        }
        got: list[ReceivedMessage] = decode_records(ReceivedMessage, common, resp.records)
        if len(got) != resp.record_count:
            raise RecordFormatError(f"{len(got)} records where {resp.record_count} were sent")
        return got
    return [ReceivedMessage.from_proto(m, broker) for m in resp.messages]


class Puller:
    """Runs the pull task of each owned queue; sets ``data`` whenever a buffer got messages."""

    def __init__(
        self,
        group: str,
        config: ConsumerConfig,
        brokers: Brokers,
        data: asyncio.Event,
        report: Callable[[TidemqError], None],
    ) -> None:
        self.group = group
        self.config = config
        self._brokers = brokers
        self._data = data
        self._report = report

    def start(self, mq: MessageQueue, offset: int) -> QueueState:
        """A queue's state from ``offset``, its pull task running."""
        st = QueueState(mq, offset, offset, offset, offset)
        st.space.set()
        st.task = asyncio.ensure_future(self._pull_loop(st))
        return st

    async def stop(self, st: QueueState) -> None:
        if st.task is not None:
            st.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await st.task
            st.task = None
        st.buffer.clear()

    async def _pull_loop(self, st: QueueState) -> None:
        backoff = 0.05
        cfg = self.config
        while True:
            if len(st.buffer) >= cfg.queue_buffer_messages:
                st.space.clear()
                await st.space.wait()
                continue
            try:
                address, from_master = await self._brokers.read_address(st.mq)
                st.lineage.reading_from(address)
                checking = st.lineage.checking
                request = broker_pb2.PullMessageRequest(
                    group=self.group,
                    topic=st.mq.topic,
                    queue_id=st.mq.queue_id,
                    offset=st.lineage.check_offset() if checking else st.next_pull,
                    max_messages=1 if checking else cfg.pull_batch_size,
                    max_bytes=cfg.pull_max_bytes,
                    tag_expression=cfg.tags,
                    long_poll_timeout_ms=0 if checking else cfg.long_poll_ms,
                    # Records as stored, decoded here in one call; a broker older than record
                    # blocks ignores this and answers messages, which work as well.
                    accept_records=True,
                )
                resp = await self._brokers.invoke(
                    st.mq,
                    address,
                    "PullMessage",
                    request,
                    timeout_s=cfg.long_poll_ms / 1000 + CALL_TIMEOUT_S,
                )
                messages = pulled_messages(resp, st.mq.broker_name, address)
            except TidemqError as e:
                self._report(e)
                log.warning("pulling %s failed: %s", st.mq, e)
                self._brokers.routes.invalidate(st.mq.topic)
                st.lineage.failed()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            if not from_master and (
                resp.status == broker_pb2.OFFSET_OVERFLOW
                or (checking and resp.status == broker_pb2.NO_NEW_MESSAGE)
            ):
                # A slave behind our position (it has not replicated what the master gave us):
                # wait for it, or for the master, rather than step back and deliver twice.
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            backoff = 0.05
            if checking:
                self._check(st, address, resp, messages)
                continue
            if st.lineage.answered_at(resp.log_epoch):
                continue  # the broker's log changed epoch since the last pull: check first
            self._apply_pull(st, resp, messages)
            st.lineage.pulled(address, messages, resp.log_epoch)

    def _check(
        self, st: QueueState, address: str, resp: Any, messages: list[ReceivedMessage]
    ) -> None:
        """A check's answer (``lineage``): go on from where this broker's log and what the
        queue's pulls read still agree, dropping what was buffered beyond."""
        resume = st.lineage.judge(st.next_pull, resp.status, messages, resp.max_offset)
        if resume is None:
            return  # check one record back
        if st.lineage.parted_at is not None:
            log.warning(
                "%s: the broker at %s does not hold what this consumer read at queue offset %d "
                "(a failover took it back); reading again from %d",
                st.mq,
                address,
                st.lineage.parted_at,
                resume,
            )
        if resume < st.next_pull:
            while st.buffer and st.buffer[-1].queue_offset >= resume:
                st.buffer.pop()
            st.next_pull = resume
            st.delivered = min(st.delivered, resume)
            st.processed = min(st.processed, resume)
        st.lineage.pulled(address, (), resp.log_epoch)

    def _apply_pull(self, st: QueueState, resp: Any, messages: list[ReceivedMessage]) -> None:
        status = resp.status
        if status == broker_pb2.FOUND:
            st.buffer.extend(messages)
            st.next_pull = resp.next_offset
            self._data.set()
            return
        if status in (broker_pb2.OFFSET_TOO_SMALL, broker_pb2.OFFSET_OVERFLOW):
            # RocketMQ's correction: jump to the valid range (retention deleted the messages,
            # or the broker lost its tail); nothing below can be delivered any more.
            log.warning(
                "%s: offset %d out of range [%d, %d); continuing at %d",
                st.mq,
                st.next_pull,
                resp.min_offset,
                resp.max_offset,
                resp.next_offset,
            )
        st.next_pull = resp.next_offset
        if not st.buffer:
            st.delivered = max(st.delivered, st.next_pull)
            if status == broker_pb2.OFFSET_OVERFLOW:
                st.delivered = st.next_pull
