"""Receive/ack consumers for integration tests, and the history they record.

Each ``Member`` is a ``tidemq.SimpleConsumer`` of its own (a member of the group, as a process of
a microservice would be) receiving in a loop on a thread (or in a process of its own:
``receive_member``); a ``Plan`` decides, per delivery,
whether it acks, nacks or drops the message (lets its invisible time run out), and how long it
"processes" first. Every delivery goes to a ``DeliveryLog``: who got it, its attempt, when the
broker granted it (``invisible_until_ms`` minus the invisible duration asked for: the broker's
own clock, the same wall clock as ours on this machine), and how it ended. The checks in
``receive_checks`` hold the broker to its promises from that record alone.
"""

from __future__ import annotations

import enum
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import tidemq
from tests.integration.receive_cluster import SendLog, wall_ms
from tests.waiting import wait_until
from tests.workers import Worker, WorkerFailed, finish_all


class Outcome(enum.Enum):
    HELD = "held"  # nothing was done with it (a holder keeps it, or the test ended)
    DROPPED = "dropped"  # left to expire
    ACKED = "acked"
    # MESSAGE_ALREADY_ACKED: done, but not by this ack (another member's, after this delivery
    # expired; or an earlier try of this same ack)
    ACK_ALREADY = "ack-already"
    ACK_REFUSED = "ack-refused"  # expired or superseded: the member no longer held it
    ACK_UNKNOWN = "ack-unknown"  # no answer (the broker died under it): either way
    NACKED = "nacked"
    NACK_REFUSED = "nack-refused"
    NACK_UNKNOWN = "nack-unknown"


DONE = (Outcome.ACKED, Outcome.ACK_ALREADY)


@dataclass
class Delivery:
    body: str
    member: str
    attempt: int
    granted_ms: int  # the broker's wall clock when it handed the message out
    invisible_until_ms: int
    message_group: str | None
    queue: tuple[str, int, int]  # broker group, queue id, queue offset
    received_at_ms: float  # when the answer reached the member
    outcome: Outcome = Outcome.HELD
    ended_at_ms: float | None = None  # when the ack or nack was sent
    error: str = ""

    @property
    def done(self) -> bool:
        return self.outcome in DONE

    def held_until_ms(self) -> float:
        """The latest moment this delivery can still hold the message: its invisible time, or
        the moment its ack or nack was sent, whichever is first. A refused nack counts as one
        that may have worked: the SDK retries a nack whose answer was lost (a failover), and
        the retry finds the handle replaced by the first try's release."""
        ended = (Outcome.ACKED, Outcome.NACKED, Outcome.NACK_REFUSED, Outcome.NACK_UNKNOWN)
        if self.ended_at_ms is not None and self.outcome in ended:
            return min(self.invisible_until_ms, self.ended_at_ms)
        return self.invisible_until_ms

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "outcome": self.outcome.value}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Delivery:
        return cls(**{**d, "queue": tuple(d["queue"]), "outcome": Outcome(d["outcome"])})

    def __str__(self) -> str:
        return (
            f"{self.body}#{self.attempt} to {self.member} granted {self.granted_ms} until "
            f"{self.invisible_until_ms} {self.outcome.value} at {self.ended_at_ms} {self.error}"
        )


class DeliveryLog:
    """Every delivery of every member; appended from several threads."""

    def __init__(self) -> None:
        self._deliveries: list[Delivery] = []
        self._done: set[str] = set()
        self._lock = threading.Lock()

    def record(self, d: Delivery) -> None:
        with self._lock:
            self._deliveries.append(d)

    def ended(self, d: Delivery, outcome: Outcome, at_ms: float, error: str = "") -> None:
        with self._lock:
            d.outcome, d.ended_at_ms, d.error = outcome, at_ms, error
            if d.done:
                self._done.add(d.body)

    def done_bodies(self) -> set[str]:
        with self._lock:
            return set(self._done)

    def deliveries(self) -> list[Delivery]:
        with self._lock:
            return list(self._deliveries)

    def by_body(self) -> dict[str, list[Delivery]]:
        """Each message's deliveries in the order the broker granted them."""
        out: dict[str, list[Delivery]] = {}
        for d in sorted(self.deliveries(), key=lambda d: (d.granted_ms, d.received_at_ms)):
            out.setdefault(d.body, []).append(d)
        return out


class Action(enum.Enum):
    ACK = "ack"
    NACK = "nack"
    DROP = "drop"


# (what to do, seconds of "processing" first)
Plan = Callable[[Any], tuple[Action, float]]


def always_ack(message: Any) -> tuple[Action, float]:
    return Action.ACK, 0.0


MIXED_INVISIBLE_S = 1.0


def mixed_plan(message: Any) -> tuple[Action, float]:
    """Per delivery, from its body and attempt (for 1 s invisible times): ~12% dropped, ~12%
    nacked, ~6% acked at about the end of the invisible time (some in time, some too late),
    the rest acked at once; a few are dropped again on their second delivery."""
    attempt: int = message.delivery_attempt
    roll = zlib.crc32(message.body + b"#%d" % attempt) % 100
    if attempt == 1:
        if roll < 12:
            return Action.DROP, 0.0
        if roll < 24:
            return Action.NACK, 0.0
        if roll < 30:
            return Action.ACK, MIXED_INVISIBLE_S - 0.1 + (roll % 3) * 0.1
    elif attempt == 2 and roll < 10:
        return Action.DROP, 0.0
    return Action.ACK, 0.0


PLANS: dict[str, Plan] = {"ack": always_ack, "mixed": mixed_plan}


def consumer_config(**settings: Any) -> Any:
    """Members start at the first message of a queue the group never received from."""
    return tidemq.SimpleConsumerConfig(start_from="first", **settings)


def simple_consumer(nameserver: str, group: str, topic: str) -> Any:
    return tidemq.SimpleConsumer(group, topic, nameserver=nameserver, config=consumer_config())


def record_delivery(log: DeliveryLog, member: str, m: Any, invisible_ms: int) -> Delivery:
    d = Delivery(
        body=m.body.decode(),
        member=member,
        attempt=m.delivery_attempt,
        granted_ms=m.invisible_until_ms - invisible_ms,
        invisible_until_ms=m.invisible_until_ms,
        message_group=m.message_group,
        queue=(m.broker, m.queue_id, m.queue_offset),
        received_at_ms=wall_ms(),
    )
    log.record(d)
    return d


def settle(consumer: Any, log: DeliveryLog, d: Delivery, m: Any, action: Action) -> None:
    """Ack, nack or drop one delivery, and record how that ended."""
    if action is Action.DROP:
        log.ended(d, Outcome.DROPPED, wall_ms())
        return
    acking = action is Action.ACK
    sent = wall_ms()
    try:
        consumer.ack(m) if acking else consumer.nack(m)
    except tidemq.errors.MessageAlreadyAcked as e:
        log.ended(d, Outcome.ACK_ALREADY if acking else Outcome.NACK_REFUSED, sent, repr(e))
    except tidemq.errors.TidemqError as e:
        if e.retriable:
            outcome = Outcome.ACK_UNKNOWN if acking else Outcome.NACK_UNKNOWN
        else:
            outcome = Outcome.ACK_REFUSED if acking else Outcome.NACK_REFUSED
        log.ended(d, outcome, sent, repr(e))
    else:
        log.ended(d, Outcome.ACKED if acking else Outcome.NACKED, sent)


class Member(Worker):
    """One member of a receive group: receives, follows its plan, records everything.

    Retriable errors (a broker restarting, a failover) are counted and the loop goes on, as an
    application's loop would; anything else fails the test."""

    def __init__(
        self,
        name: str,
        nameserver: str,
        group: str,
        topic: str,
        log: DeliveryLog,
        *,
        plan: Plan = always_ack,
        invisible_s: float = 1.0,
        batch: int = 8,
    ) -> None:
        super().__init__(name=name)
        self.nameserver, self.group, self.topic = nameserver, group, topic
        self.log, self.plan = log, plan
        self.invisible_s, self.batch = invisible_s, batch
        self.stop = threading.Event()
        self.errors: list[str] = []

    def work(self) -> None:
        invisible_ms = round(self.invisible_s * 1000)
        with simple_consumer(self.nameserver, self.group, self.topic) as consumer:
            while not self.stop.is_set():
                try:
                    got = consumer.receive(
                        max_messages=self.batch, invisible_duration_s=self.invisible_s, timeout_s=1
                    )
                except tidemq.errors.TidemqError as e:
                    if not e.retriable:
                        raise
                    self.errors.append(repr(e))
                    self.stop.wait(0.05)  # a retry pause, as an application's loop has
                    continue
                for m in got:
                    d = record_delivery(self.log, self.name, m, invisible_ms)
                    action, work_s = self.plan(m)
                    if work_s:
                        time.sleep(work_s)  # the member's processing time
                    settle(consumer, self.log, d, m, action)


@dataclass
class Members:
    """Several members of one group, started and stopped together."""

    members: list[Member]

    def __enter__(self) -> Members:
        for m in self.members:
            m.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for m in self.members:
            m.stop.set()
        finish_all(list(self.members), 30)

    def healthy(self) -> bool:
        return all(m.check() for m in self.members)

    def errors(self) -> list[str]:
        return [e for m in self.members for e in m.errors]


def members(
    n: int,
    nameserver: str,
    group: str,
    topic: str,
    log: DeliveryLog,
    **kwargs: Any,
) -> Members:
    return Members(
        [Member(f"{group}-m{i}", nameserver, group, topic, log, **kwargs) for i in range(n)]
    )


class Running(Protocol):
    """Members as a whole: healthy (raises a member's failure), and their retried errors."""

    def healthy(self) -> bool: ...
    def errors(self) -> list[str]: ...


def wait_all_done(
    log: DeliveryLog, sent: SendLog, group: Running, timeout_s: float, what: str = ""
) -> None:
    """Until every SEND_OK body was acked by some member (failing with what is missing)."""
    try:
        wait_until(
            lambda: group.healthy() and sent.bodies() <= log.done_bodies(),
            timeout_s,
            f"every SEND_OK message acked{what}",
        )
    except WorkerFailed:
        raise
    except AssertionError as e:
        missing = sorted(sent.bodies() - log.done_bodies())
        by_body = log.by_body()
        detail = [f"{b}: {[str(d) for d in by_body.get(b, [])]}" for b in missing[:5]]
        raise AssertionError(
            f"{e}: {len(missing)} not acked, e.g. {detail}; member errors {group.errors()[-3:]}"
        ) from None
