"""PullMessage: read a queue from an offset, and at the head of the queue wait (long polling)
until dispatch makes a message readable, the poll times out, or the broker shuts down."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import grpc

from tidemq.protos import broker_pb2
from tidemq.services.broker import tracing
from tidemq.services.broker.admission_grpc import stepped_aside
from tidemq.services.broker.convert import parse_tag_expression
from tidemq.services.broker.groups import OFFSETS, SubscriptionGroupManager
from tidemq.services.broker.handlers.checks import BrokerChecks, typed_errors
from tidemq.services.broker.long_polling import PullWaiters
from tidemq.services.broker.metrics import BrokerMetrics
from tidemq.services.broker.pull_answer import (
    PullAnswer,
    PullRange,
    read_answer,
    read_records_answer,
)
from tidemq.services.errors import invalid
from tidemq.storage import MessageStore

MAX_PULL_MESSAGES = 1024
DEFAULT_PULL_MESSAGES = 32


class PullHandler:
    def __init__(
        self,
        checks: BrokerChecks,
        store: MessageStore,
        waiters: PullWaiters,
        confirm_cap: Callable[[], int | None] | None,
        metrics: BrokerMetrics | None,
        groups: SubscriptionGroupManager | None = None,
        log_epoch: Callable[[], int] | None = None,
    ) -> None:
        self.checks = checks
        self.groups = groups
        self.config = checks.config
        self.store = store
        self.waiters = waiters
        # Under confirm_offset, pulls see only what in-sync slaves hold.
        self._confirm_cap = confirm_cap if self.config.replication.confirm_offset else None
        self.metrics = metrics
        self._log_epoch = log_epoch

    @typed_errors
    async def PullMessage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        answer = await self._pull(request)
        tracer = tracing.TRACER
        if tracer is not None and answer.messages:
            tracing.delivered(
                tracer, "pull", request.topic, request.group, answer.parts, answer.messages,
                request.queue_id,
            )  # fmt: skip
        if self.metrics is not None:
            self.metrics.pulled(
                request.topic,
                broker_pb2.PullStatus.Name(answer.status),
                answer.messages,
                answer.message_bytes,
            )
        epoch = self._log_epoch() if self._log_epoch is not None else 0
        if not epoch:
            return answer.encoded()
        # Read after the records, so an answer never pairs an older epoch with records of a
        # log cut back since; appended as its own field (protobuf merges concatenated messages).
        return answer.encoded(broker_pb2.PullMessageResponse(log_epoch=epoch).SerializeToString())

    async def _pull(self, request: Any) -> PullAnswer:
        checks = self.checks
        checks.ensure_running()
        if request.offset < 0:
            raise invalid(f"offset {request.offset} is negative")
        if request.max_messages < 0 or request.max_bytes < 0 or request.long_poll_timeout_ms < 0:
            raise invalid("max_messages, max_bytes and long_poll_timeout_ms must be >= 0")
        cfg = checks.topic(request.topic, for_write=False)
        checks.check_queue(cfg, request.queue_id, for_write=False)
        tags = parse_tag_expression(request.tag_expression)
        if self.groups is not None and request.group:
            self.groups.check_model(request.group, OFFSETS)
        # Whatever the client asks, an answer stays within the broker's cap (a single larger
        # record still comes alone).
        cap_bytes = self.config.max_pull_response_bytes
        wait_ms = min(request.long_poll_timeout_ms, self.config.long_poll_max_ms)
        deadline = time.monotonic() + wait_ms / 1000
        topic, qid = request.topic, request.queue_id
        while True:
            woken = self.waiters.register(topic, qid)
            want = PullRange(
                topic,
                qid,
                request.offset,
                min(request.max_messages or DEFAULT_PULL_MESSAGES, MAX_PULL_MESSAGES),
                min(request.max_bytes or cap_bytes, cap_bytes),
                tags,
                self._confirm_cap() if self._confirm_cap is not None else None,
            )
            if request.accept_records:
                answer = await read_records_answer(self.store, want)
            else:
                answer = await read_answer(self.store, want)
            if answer is not None:
                return answer
            remaining = deadline - time.monotonic()
            if remaining <= 0 or checks.shutting_down:
                no_new = broker_pb2.PullMessageResponse(
                    status=broker_pb2.NO_NEW_MESSAGE,
                    next_offset=request.offset,
                    min_offset=self.store.min_offset(topic, qid),
                    max_offset=self.store.max_offset(topic, qid),
                )
                return PullAnswer(no_new.status, 0, 0, [no_new.SerializeToString()])
            metrics = self.metrics
            waiting = metrics.long_poll() if metrics is not None else contextlib.nullcontext()
            # A parked poll costs nothing: its connection's other calls run meanwhile.
            async with stepped_aside():
                with waiting, contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await woken.wait()
