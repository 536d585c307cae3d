"""What becomes of received messages: ack, nack, change of invisibility, dead-lettering (by a
consumer, or by the revive task once a message used up its deliveries) and an operator's
offset reset. Every handle is checked before anything is recorded; a batch call answers one
result per handle, records the valid ones as one event per queue, and answers once the event
is as durable as a send (``ReceiveService.durable``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from tidemq.protos import broker_pb2
from tidemq.services.broker.groups import RECEIVE
from tidemq.services.broker.receive.dead_letter import dead_letter_copy, dlq_topic
from tidemq.services.broker.receive.events import Acked, Changed, Dead, QueueKey, Reset
from tidemq.services.broker.receive.handle import HandleReader, ReceiptHandle
from tidemq.services.broker.receive.queue_state import HandleStatus, QueueInFlight
from tidemq.services.broker.receive.reading import read_one
from tidemq.services.broker.receive.refusals import handle_mismatch, handle_refusal, parse_handle
from tidemq.services.broker.receive.service import ReceiveService
from tidemq.services.broker.topics import TopicConfig
from tidemq.services.errors import ServiceError, detail_of, invalid
from tidemq.storage.clock import now_ms

log = logging.getLogger(__name__)

# Handle readers kept (one per broker group, consumer group and topic acked recently).
MAX_READERS = 1024


class Settlement:
    def __init__(self, service: ReceiveService) -> None:
        self.service = service
        # (queue, offset) being copied to the dead-letter queue right now: copied once.
        self._dying: set[tuple[QueueKey, int]] = set()
        # By (broker, group, topic): the names' text, encoded once rather than per handle.
        self._readers: dict[tuple[str, str, str], HandleReader] = {}

    def _check_call(self, group: str, topic: str, handles: Sequence[str]) -> None:
        if not group or not topic:
            raise invalid("group and topic are required")
        if not handles:
            raise invalid("at least one receipt handle is required")
        if len(handles) > self.service.config.max_handles_per_call:
            raise invalid(
                f"at most {self.service.config.max_handles_per_call} receipt handles per call, "
                f"got {len(handles)}"
            )
        self.service.groups.check_model(group, RECEIVE)

    def _check(self, text: str, group: str, topic: str, now: int) -> tuple[QueueKey, ReceiptHandle]:
        """The handle's queue and fields when it is the current holder's; else the typed error
        (INVALID_RECEIPT_HANDLE, RECEIPT_HANDLE_EXPIRED, MESSAGE_ALREADY_ACKED)."""
        h = parse_handle(text)
        mismatch = handle_mismatch(h, self.service.config.broker_name, group, topic)
        if mismatch is not None:
            raise mismatch
        key = QueueKey(group, topic, h.queue_id)
        q = self.service.states.get(key)
        status = q.check(h.offset, h.lease_id, now) if q is not None else HandleStatus.UNKNOWN
        refusal = handle_refusal(status, h)
        if refusal is not None:
            raise refusal
        return key, h

    def _checked(
        self, group: str, topic: str, handles: Sequence[str], now: int, results: Any
    ) -> list[tuple[QueueKey, ReceiptHandle]]:
        """The valid handles; a result per handle added to ``results`` (a repeated
        HandleResult field)."""
        valid = []
        for text in handles:
            r = results.add(receipt_handle=text)
            try:
                valid.append(self._check(text, group, topic, now))
            except ServiceError as e:
                r.error.CopyFrom(detail_of(e))
        return valid

    async def ack(
        self, group: str, topic: str, handles: Sequence[str]
    ) -> broker_pb2.AckMessageResponse:
        self._check_call(group, topic, handles)
        await self.service.lead()
        now = now_ms()
        answer = broker_pb2.AckMessageResponse()
        results = answer.results
        reader = self._reader(group, topic)
        states = self.service.states
        # One pass: a handle of this call's names has only its numbers decoded; any other
        # (or one the state refuses) takes the checks that say why.
        by_queue: dict[int, tuple[QueueInFlight | None, dict[int, int]]] = {}
        for text in handles:
            numbers = reader.numbers(text)
            if numbers is not None:
                qid, offset, lease_id, _ = numbers
                got = by_queue.get(qid)
                if got is None:
                    got = by_queue[qid] = (states.get(QueueKey(group, topic, qid)), {})
                q, items = got
                if q is not None and q.check(offset, lease_id, now) is HandleStatus.OK:
                    items[offset] = lease_id
                    results.add(receipt_handle=text)
                    continue
            r = results.add(receipt_handle=text)
            try:
                key, h = self._check(text, group, topic, now)
            except ServiceError as e:
                r.error.CopyFrom(detail_of(e))
            else:  # a good handle of another format
                got = by_queue.setdefault(key.queue_id, (states.get(key), {}))
                got[1][h.offset] = h.lease_id
        put = None
        acked = 0
        for qid, (_, items) in by_queue.items():
            if items:
                key = QueueKey(group, topic, qid)
                _, put = self.service.append(Acked(key, tuple(sorted(items.items()))))
                acked += len(items)
        if put is not None:
            await self.service.durable(put, what="ack")
            self.service.counters.acked(group, acked)
        return answer

    def _reader(self, group: str, topic: str) -> HandleReader:
        names = (self.service.config.broker_name, group, topic)
        reader = self._readers.get(names)
        if reader is None:
            if len(self._readers) >= MAX_READERS:
                self._readers.clear()
            reader = self._readers[names] = HandleReader(*names)
        return reader

    async def nack(
        self, group: str, topic: str, handles: Sequence[str]
    ) -> broker_pb2.NackMessageResponse:
        self._check_call(group, topic, handles)
        await self.service.lead()
        now = now_ms()
        answer = broker_pb2.NackMessageResponse()
        valid = self._checked(group, topic, handles, now, answer.results)
        settings = self.service.settings(group)
        by_key: dict[QueueKey, dict[int, tuple[int, int, int]]] = {}
        exhausted: dict[QueueKey, list[int]] = {}
        for key, h in valid:
            q = self.service.states.get(key)
            assert q is not None  # checked
            attempt = q.attempt(h.offset)
            visible = now + settings.retry_policy.delay_ms(max(1, attempt))
            by_key.setdefault(key, {})[h.offset] = (h.offset, h.lease_id, visible)
            if attempt >= settings.max_delivery_attempts:
                exhausted.setdefault(key, []).append(h.offset)
        put = None
        for key, items in by_key.items():
            _, put = self.service.append(Changed(key, now, tuple(sorted(items.values())), True))
        if put is not None:
            await self.service.durable(put, what="nack")
        # Used up its deliveries: to the dead-letter queue now, not at the next revive.
        for key, offsets in exhausted.items():
            await self.dead_letter_offsets(
                key, offsets, f"max delivery attempts ({settings.max_delivery_attempts})"
            )
        return answer

    async def change_invisible_duration(
        self, group: str, topic: str, handle: str, invisible_ms: int
    ) -> tuple[str, int]:
        self._check_call(group, topic, [handle])
        self.service.check_invisible(invisible_ms)
        await self.service.lead()
        now = now_ms()
        key, h = self._check(handle, group, topic, now)
        until = now + invisible_ms
        lease_id, put = self.service.append(
            Changed(key, now, ((h.offset, h.lease_id, until),), False)
        )
        await self.service.durable(put, what="change of invisible duration")
        new = ReceiptHandle(h.broker_name, group, topic, h.queue_id, h.offset, lease_id, until)
        return new.encode(), until

    async def dead_letter(
        self, group: str, topic: str, handle: str, reason: str
    ) -> tuple[str, int]:
        self._check_call(group, topic, [handle])
        await self.service.lead()
        key, h = self._check(handle, group, topic, now_ms())
        offset = await self.dead_letter_offsets(
            key, [h.offset], reason or "dead-lettered by a consumer", held=h.lease_id
        )
        return dlq_topic(group), offset

    async def dead_letter_offsets(
        self, key: QueueKey, offsets: Sequence[int], reason: str, *, held: int | None = None
    ) -> int:
        """Copy the messages at ``offsets`` to the group's dead-letter queue, wait for the
        copies as for a send, then record them done (Dead). ``held``: the lease a consumer's
        DeadLetterMessage holds (else each offset's current lease, which nobody holds). Returns
        the queue offset of the last copy (-1 when none was made)."""
        q = self.service.states.get(key)
        if q is None:
            return -1
        now = now_ms()
        items: list[tuple[int, int]] = []
        copies = []
        for offset in offsets:
            lease = held if held is not None else q.lease_id(offset)
            if lease is None or (key, offset) in self._dying:
                continue
            m = read_one(self.service.store, key.topic, key.queue_id, offset)
            if m is None:
                log.warning(
                    "dead-lettering %s/%d offset %d of group %s: retention deleted it; marked "
                    "done without a copy",
                    key.topic,
                    key.queue_id,
                    offset,
                    key.group,
                )
            else:
                copies.append(
                    dead_letter_copy(
                        m, group=key.group, attempts=q.attempt(offset), reason=reason, now_ms=now
                    )
                )
            items.append((offset, lease))
        if not items:
            return -1
        dying = {(key, o) for o, _ in items}
        self._dying |= dying
        try:
            last = -1
            if copies:
                await self._ensure_dlq_topic(key.group)
                put = self.service.store.put_messages(copies)
                await self.service.durable(put, what="dead-letter copy")
                last = put.results[-1].queue_offset
            _, put = self.service.append(Dead(key, tuple(items)))
            await self.service.durable(put, what="dead-lettering")
        finally:
            self._dying -= dying
        self.service.counters.dead_lettered(key.group, len(items))
        log.info(
            "dead-lettered %d message(s) of %s/%d for group %s: %s",
            len(items),
            key.topic,
            key.queue_id,
            key.group,
            reason,
        )
        return last

    async def _ensure_dlq_topic(self, group: str) -> None:
        name = dlq_topic(group)
        if self.service.topics.get(name) is None:
            self.service.topics.upsert(TopicConfig(name, 1, 1))
            await self.service.publish_topics()

    async def reset(self, group: str, topic: str, queue_id: int, offset: int) -> int:
        """An operator's offset reset of a receive group's queue: everything in flight there is
        forgotten and the group goes on from ``offset`` (committed as a reset too)."""
        if offset < 0:
            raise invalid(f"offset {offset} is negative")
        tcfg = self.service.checks.topic(topic, for_write=False)
        self.service.checks.check_queue(tcfg, queue_id, for_write=False)
        await self.service.lead()
        _, put = self.service.append(Reset(QueueKey(group, topic, queue_id), offset))
        await self.service.durable(put, what="offset reset")
        log.info("receive group %s reset on %s/%d to offset %d", group, topic, queue_id, offset)
        return self.service.offsets.commit(group, topic, queue_id, offset, reset=True)
