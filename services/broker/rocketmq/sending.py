"""SendMessage: each v2 message converted (``messages.to_ours``), its queue chosen here (FIFO:
a stable hash of the message group over the topic's writable queues; otherwise round robin), and
the whole request stored through our own send path, so it is validated, stored, replicated and
acknowledged exactly as tidemq's own sends are."""

from __future__ import annotations

import itertools
import zlib
from typing import Any

import grpc

from tidemq.protos import broker_pb2
from tidemq.protos.rocketmq import definition_pb2, service_pb2
from tidemq.services.broker.handlers.send import SendHandler
from tidemq.services.broker.rocketmq.messages import Outgoing, to_ours
from tidemq.services.broker.rocketmq.status import StatusError, send_status

C = definition_pb2


def fifo_queue(message_group: str, write_queue_nums: int) -> int:
    """The queue of a message group: the same one for as long as the topic's queues stay."""
    return zlib.crc32(message_group.encode("utf-8", "surrogatepass")) % write_queue_nums


def _top_status(entries: list[service_pb2.SendResultEntry]) -> definition_pb2.Status:
    codes = {e.status.code for e in entries}
    if len(codes) == 1:
        return entries[0].status
    return definition_pb2.Status(
        code=C.MULTIPLE_RESULTS, message="the messages of this send had different outcomes"
    )


class V2Sending:
    def __init__(self, send: SendHandler, max_body_bytes: int) -> None:
        self.send = send
        self.max_body_bytes = max_body_bytes
        self._round_robin: dict[str, itertools.count[int]] = {}

    async def send_message(
        self, request: service_pb2.SendMessageRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.SendMessageResponse:
        if not request.messages:
            raise StatusError(C.BAD_REQUEST, "a send carries at least one message")
        # Before the topic is looked up: a slave may not know it yet, and NOT_MASTER is what
        # sends the client to the master.
        self.send.checks.ensure_running()
        self.send.checks.ensure_master("send")
        outgoing = [to_ours(m, self.max_body_bytes) for m in request.messages]
        transactional = {o.message_type == C.TRANSACTION for o in outgoing}
        if len(transactional) > 1:
            raise StatusError(
                C.BAD_REQUEST, "a send's messages are all transactional or none of them is"
            )
        ours = broker_pb2.SendMessageRequest()
        if True in transactional:
            topics = {o.message.topic for o in outgoing}
            if len(topics) > 1:
                raise StatusError(
                    C.BAD_REQUEST, "a transactional send names one topic (its producer group)"
                )
            # As the Apache proxy: the topic is the producer group, the one checks go to.
            ours.transactional = True
            ours.producer_group = topics.pop()
        for o in outgoing:
            await self._choose_queue(o)
            ours.messages.append(o.message)
        # The handler's own function, not its gRPC wrapper: errors come back as exceptions
        # (answered as a Status in the body), not as an aborted call.
        handle: Any = SendHandler.SendMessage.__wrapped__  # type: ignore[attr-defined]
        response = await handle(self.send, ours, context)
        entries = []
        for o, r in zip(outgoing, response.results, strict=True):
            entries.append(
                service_pb2.SendResultEntry(
                    status=send_status(r.status),
                    message_id=o.message_id or r.msg_id,
                    transaction_id=r.transaction_id,
                    offset=r.queue_offset,
                    recall_handle=r.recall_handle,
                )
            )
        return service_pb2.SendMessageResponse(status=_top_status(entries), entries=entries)

    async def _choose_queue(self, o: Outgoing) -> None:
        topic = o.message.topic
        cfg = await self.send.writable_topic(topic)
        n = cfg.write_queue_nums
        if n <= 0:
            raise StatusError(C.FORBIDDEN, f"topic {topic!r} has no writable queue here")
        if o.message_group:
            o.message.queue_id = fifo_queue(o.message_group, n)
        else:
            counter = self._round_robin.setdefault(topic, itertools.count())
            o.message.queue_id = next(counter) % n
