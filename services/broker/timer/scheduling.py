"""The send path's side of delayed delivery: which messages of a send are delayed, the
``%SYS%TIMER`` record each is stored as, and what their SendResults say.

A delayed message is stored as a record of ``%SYS%TIMER`` queue 0 carrying where it goes
(``REAL_TOPIC``, ``REAL_QID``) and when (``TIMER_DELIVER_MS``, which dispatch writes as the
ConsumeQueue entry's tags code, so the wheel is rebuilt without reading bodies). Its id for
recall (``timer_id``) is that record's CommitLog offset, the same on every replica. A time that
is not ahead of both now and the last ``Fired`` mark is stored directly in its topic: a timer
record due at or before the mark would count as delivered already. No I/O here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import grpc

from tidemq.protos import common_pb2
from tidemq.services.broker.timer.delay_levels import DelayTooLongError, due_ms
from tidemq.services.broker.timer.recall_handle import RecallHandle
from tidemq.services.errors import ServiceError, invalid
from tidemq.storage import Message
from tidemq.storage.record import PROP_TIMER_DELIVER_MS, TIMER_TOPIC

TIMER_QUEUE = 0
REAL_TOPIC = "REAL_TOPIC"
REAL_QID = "REAL_QID"
# Properties only the broker sets on a timer record: a client setting them would redirect its
# message.
RESERVED = (REAL_TOPIC, REAL_QID, PROP_TIMER_DELIVER_MS)


def delay_too_long(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, common_pb2.DELAY_TOO_LONG, message)


def timer_record(m: Message, deliver_at_ms: int) -> Message:
    """The ``%SYS%TIMER`` record that stands for ``m`` until ``deliver_at_ms``."""
    props = dict(m.properties)
    props[REAL_TOPIC] = m.topic
    props[REAL_QID] = str(m.queue_id)
    props[PROP_TIMER_DELIVER_MS] = str(deliver_at_ms)
    return replace(m, topic=TIMER_TOPIC, queue_id=TIMER_QUEUE, properties=props)


@dataclass(frozen=True)
class Delayed:
    """One message of a send stored as a timer record: its place in the batch, its topic and
    queue, and its delivery time."""

    index: int
    topic: str
    queue_id: int
    deliver_at_ms: int


class Scheduling:
    """Turns a send's messages into what to store (``prepare``), hands the stored timers to
    the wheel (``stored``) and fills the delayed ones' results (``fill``)."""

    def __init__(
        self,
        broker_name: str,
        max_delay_ms: int,
        delivered_up_to_ms: Callable[[], int],
        on_stored: Callable[[Sequence[Delayed], Any], None],
    ) -> None:
        self.broker_name = broker_name
        self.max_delay_ms = max_delay_ms
        self._mark = delivered_up_to_ms
        self._on_stored = on_stored

    def prepare(
        self, wire: Sequence[Any], batch: list[Message], now_ms: int
    ) -> list[Delayed] | None:
        """Replace each delayed message of ``batch`` (built from ``wire``, the request's
        messages) by its timer record; None when none is delayed. Raises before changing
        anything when a message's time is bad (DELAY_TOO_LONG, INVALID_ARGUMENT)."""
        plan: list[tuple[int, int]] = []
        for i, w in enumerate(wire):
            if not (w.deliver_at_ms or w.delay_ms or w.delay_level):
                continue
            try:
                due = due_ms(now_ms, w.deliver_at_ms, w.delay_ms, w.delay_level, self.max_delay_ms)
            except DelayTooLongError as e:
                raise delay_too_long(str(e)) from None
            except ValueError as e:
                raise invalid(str(e)) from None
            if due is None or due <= now_ms or due <= self._mark():
                continue  # due already: stored in its topic
            props = batch[i].properties
            for name in RESERVED if props else ():
                if name in props:
                    raise invalid(
                        f"property {name} is the broker's own on delayed messages",
                        common_pb2.INVALID_PROPERTY,
                    )
            plan.append((i, due))
        if not plan:
            return None
        delayed = []
        for i, due in plan:
            m = batch[i]
            delayed.append(Delayed(i, m.topic, m.queue_id, due))
            batch[i] = timer_record(m, due)
        return delayed

    def stored(self, delayed: Sequence[Delayed], put: Any) -> None:
        """The put of a send with delayed messages (in the step of the put: a ``Fired`` mark
        must not pass a timer the wheel does not hold yet)."""
        self._on_stored(delayed, put)

    def fill(self, delayed: Sequence[Delayed], results: Any, put_results: Sequence[Any]) -> None:
        """A delayed message's result: its topic's queue (its offset there is not known before
        delivery: -1), its recall handle and its delivery time."""
        for d in delayed:
            out = results[d.index]
            timer_id = put_results[d.index].phy_offset
            out.queue_id = d.queue_id
            out.queue_offset = -1
            out.deliver_at_ms = d.deliver_at_ms
            out.recall_handle = RecallHandle(
                self.broker_name, d.topic, timer_id, d.deliver_at_ms
            ).encode()
