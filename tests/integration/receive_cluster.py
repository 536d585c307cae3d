"""The cluster side of the receive tests: a routed broker, its topic, a consumer group's
settings, and senders of numbered messages (``"<message group>:<n>"``) that keep the bodies the
broker answered SEND_OK for, which is what every check starts from."""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import tidemq
from tests.integration.conftest import BrokerProcess, NameServerProcess, StartBroker
from tests.waiting import wait_until
from tests.workers import Worker, finish_all


def wall_ms() -> float:
    """This machine's wall clock in ms: the clock the broker stamps grants with."""
    return time.time() * 1000


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
