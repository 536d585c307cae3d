"""Receive/ack consumers for integration tests, and the history they record.

Each ``Member`` is a ``tidemq.SimpleConsumer`` of its own (a member of the group, as a process of
a microservice would be) receiving in a loop on a thread; a ``Plan`` decides, per delivery,
whether it acks, nacks or drops the message (lets its invisible time run out), and how long it
"processes" first. Every delivery goes to a ``DeliveryLog``: who got it, its attempt, when the
broker granted it (``invisible_until_ms`` minus the invisible duration asked for: the broker's
own clock, the same wall clock as ours on this machine), and how it ended. The checks in
``receive_checks`` hold the broker to its promises from that record alone.

``Senders`` produce numbered messages (``"<message group>:<n>"``) and keep the bodies the broker
answered SEND_OK for: what every check starts from.
"""

from __future__ import annotations

import enum
import functools
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import tidemq
from tests.integration.conftest import BrokerProcess, NameServerProcess, StartBroker
from tests.waiting import wait_until
from tests.workers import Worker, WorkerFailed, finish_all

BROKER_GROUP = "broker-a"


def routed_broker(
    start_broker: StartBroker, ns: NameServerProcess, *flags: str, port: int | None = None
) -> BrokerProcess:
    """A master of broker group ``broker-a`` registered with ``ns`` (the same store again, and
    ``port``, restart it)."""
    return start_broker(
        *("--nameserver", ns.address, "--broker-name", BROKER_GROUP),
        *("--register-interval-ms", "500", *flags),
        store=BROKER_GROUP,
        port=port,
    )


def port_of(b: BrokerProcess) -> int:
    return int(b.address.rsplit(":", 1)[1])


def create_topic(ns: NameServerProcess, topic: str, queues: int) -> None:
    with tidemq.Admin(ns.address) as admin:
        wait_until(lambda: bool(admin.masters()), 20, "a master in the routes")
        admin.create_topic(topic, queues=queues)


def configure_group(ns: NameServerProcess, group: str, **settings: Any) -> None:
    """The consumer group's settings (``retry_delays_s``, ``fifo``, ...), before it is used."""
    with tidemq.Admin(ns.address) as admin:
        admin.update_consumer_group(group, **settings)


def wall_ms() -> float:
    """This machine's wall clock in ms: the clock the broker stamps grants with."""
    return time.time() * 1000


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


@dataclass
class SendLog:
    """Bodies the broker answered SEND_OK for, and when (our wall clock)."""

    ok: dict[str, float] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def ok_since(self, at_ms: float) -> int:
        with self._lock:
            return sum(t > at_ms for t in self.ok.values())

    def sent_ok(self, body: str) -> None:
        with self._lock:
            self.ok[body] = wall_ms()

    def bodies(self) -> set[str]:
        with self._lock:
            return set(self.ok)


class Senders:
    """One thread per entry of ``groups``: each sends its message groups' numbered messages in
    turn (``"<group>:<n>"``, the message group as the message's sharding key), ``count`` per
    message group (None: until stopped), ``interval_s`` apart; errors (a broker down) are
    recorded, not raised."""

    def __init__(
        self,
        nameserver: str,
        topic: str,
        groups: Sequence[Sequence[str]],
        count: int | None,
        log: SendLog,
        interval_s: float = 0.0,
    ) -> None:
        self.nameserver, self.topic, self.count, self.log = nameserver, topic, count, log
        self.interval_s = interval_s
        self.stop = threading.Event()
        self.threads = [
            Worker(functools.partial(self._run, tuple(g)), name=f"sender-{i}")
            for i, g in enumerate(groups)
        ]

    def __enter__(self) -> Senders:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        finish_all(self.threads, 60)

    def healthy(self) -> bool:
        return all(t.check() for t in self.threads)

    def finished(self) -> bool:
        return self.healthy() and not any(t.is_alive() for t in self.threads)

    def _run(self, groups: tuple[str, ...]) -> None:
        with tidemq.Producer(self.nameserver, send_timeout_ms=5000) as producer:
            for n in itertools.count() if self.count is None else range(self.count):
                for g in groups:
                    if self.stop.is_set():
                        return
                    body = f"{g}:{n}"
                    try:
                        r = producer.send(self.topic, body, sharding_key=g)
                    except tidemq.errors.TidemqError as e:
                        failure = f"{body}: {e!r}"
                    else:
                        if r.ok:
                            self.log.sent_ok(body)
                            continue
                        failure = f"{body}: {r.status.name}"
                    self.log.failed.append(failure)
                    # An application backs off while its broker group cannot keep promises
                    # (no in-sync slave yet after a failover).
                    self.stop.wait(0.2)
                if self.interval_s:
                    self.stop.wait(self.interval_s)  # the send rate, not a wait for anything


def send_all(nameserver: str, topic: str, bodies_by_group: dict[str, int], log: SendLog) -> None:
    """Send ``n`` numbered messages of each message group, every one must be SEND_OK."""
    with tidemq.Producer(nameserver) as producer:
        for g, n in bodies_by_group.items():
            for i in range(n):
                r = producer.send(topic, f"{g}:{i}", sharding_key=g)
                assert r.ok, f"{g}:{i}: {r.status}"
                log.sent_ok(f"{g}:{i}")


def wait_all_done(
    log: DeliveryLog, sent: SendLog, group: Members, timeout_s: float, what: str = ""
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
