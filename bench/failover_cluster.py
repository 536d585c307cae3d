"""The failover benchmark's cluster and probe: one ZooKeeper, one nameserver on it and brokers
1-3 of group ``bench-a`` with ``--failover auto``, each its own process on 127.0.0.1, and a
probe thread that sends one message at a time through the SDK and records every SEND_OK."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

import grpc
from common import TIDEMQ, Process, free_port, stop_all, wait_until

import tidemq
from tests.integration.zookeeper import new_server
from tests.workers import Worker
from tidemq.protos import broker_pb2, broker_pb2_grpc

GROUP = "bench-a"
PROBE_TOPIC = "probe"
LEASE_MS = 1_000


class Stored(NamedTuple):
    """Where an acknowledged message is, by its SEND_OK, and its body."""

    queue_id: int
    queue_offset: int
    body: str


class Probe(Worker):
    """Sends one message at a time until stopped; every SEND_OK's (time, epoch) and where it was
    stored. Any error but a TidemqError ends it, and the next wait on it fails the run."""

    def __init__(self, nameserver: str) -> None:
        super().__init__(name="probe")
        self.nameserver = nameserver
        self.oks: list[tuple[float, int]] = []
        self.acked: list[Stored] = []
        self.errors: list[tuple[float, str]] = []
        self.stopping = threading.Event()
        self._lock = threading.Lock()

    def work(self) -> None:
        with tidemq.Producer(self.nameserver, send_timeout_ms=3_000) as producer:
            i = 0
            while not self.stopping.is_set():
                started = time.monotonic()
                body = f"m{i}"
                try:
                    r = producer.send(PROBE_TOPIC, body)
                except tidemq.errors.TidemqError as e:
                    with self._lock:
                        self.errors.append(
                            (started, f"{str(e)[:160]} after {time.monotonic() - started:.2f}s")
                        )
                    continue
                finally:
                    i += 1
                if r.ok:
                    with self._lock:
                        self.oks.append((time.monotonic(), r.epoch))
                        self.acked.append(Stored(r.queue_id, r.queue_offset, body))

    def acknowledged(self) -> list[Stored]:
        with self._lock:
            return list(self.acked)

    def first_ok_after(self, t: float, epoch_above: int) -> float | None:
        self.check()
        with self._lock:
            return next((at for at, e in self.oks if at > t and e > epoch_above), None)

    def longest_gap(self, start: float, end: float) -> float:
        with self._lock:
            times = [at for at, _ in self.oks if start <= at <= end]
        return max((b - a for a, b in itertools.pairwise(times)), default=end - start)


class Cluster:
    def __init__(self, work: Path, session_ms: int) -> None:
        self.work = work
        self.session_ms = session_ms
        self.zk = new_server(work / "zk")
        self.zk.start()
        self.root = "/bench"
        self.ns_address = f"127.0.0.1:{free_port()}"
        self.nameserver = Process(
            "nameserver",
            [
                *TIDEMQ,
                "nameserver",
                "--listen",
                self.ns_address,
                "--zk",
                self.zk.hosts,
                "--zk-root",
                self.root,
            ],
            str(work / "nameserver.log"),
        )
        self.ports = {i: free_port() for i in (1, 2, 3)}
        self.brokers: dict[int, Process] = {}
        for i in (1, 2, 3):
            self.start(i)

    def start(self, i: int) -> None:
        address = f"127.0.0.1:{self.ports[i]}"
        self.brokers[i] = Process(
            f"broker-{i}",
            [
                *TIDEMQ,
                "broker",
                "--broker-name",
                GROUP,
                "--broker-id",
                str(i),
                "--role",
                "SYNC_MASTER",
                "--failover",
                "auto",
                "--listen",
                address,
                "--store",
                str(self.work / f"broker-{i}"),
                "--zk",
                self.zk.hosts,
                "--zk-root",
                self.root,
                "--zk-session-timeout-ms",
                str(self.session_ms),
                "--failover-lease-ms",
                str(LEASE_MS),
                "--ha-report-interval-ms",
                "1000",
                "--isr-max-lag-ms",
                "4000",
                "--auto-create-topics",
                "--store-overrides",
                '{"commitlog_file_size_bytes": 67108864}',
            ],
            str(self.work / f"broker-{i}.log"),
        )

    def procs(self) -> list[Process]:
        return [self.nameserver, *self.brokers.values()]

    def failover_status(self, i: int) -> Any:
        with grpc.insecure_channel(f"127.0.0.1:{self.ports[i]}") as ch:
            return (
                broker_pb2_grpc.BrokerStub(ch)
                .GetBrokerStatus(broker_pb2.GetBrokerStatusRequest(), timeout=5)
                .failover
            )

    def acknowledging_master(self) -> int | None:
        """The live broker that is master and acknowledging, if exactly one is."""
        found = []
        for i, b in self.brokers.items():
            if not b.alive():
                continue
            try:
                f = self.failover_status(i)
            except grpc.RpcError:
                continue
            if f.role != "SLAVE" and f.acknowledging:
                found.append(i)
        return found[0] if len(found) == 1 else None

    def stored(self, i: int, topic: str) -> set[Stored]:
        """Every message of ``topic`` broker ``i`` serves: (queue, queue offset, body)."""
        out: set[Stored] = set()
        with grpc.insecure_channel(f"127.0.0.1:{self.ports[i]}") as ch:
            stub = broker_pb2_grpc.BrokerStub(ch)
            queues = stub.GetQueueOffsets(broker_pb2.GetQueueOffsetsRequest(topic=topic), timeout=5)
            for q in queues.queues:
                offset = q.min_offset
                while offset < q.max_offset:
                    r = stub.PullMessage(
                        broker_pb2.PullMessageRequest(
                            group="bench-loss-check",
                            topic=topic,
                            queue_id=q.queue_id,
                            offset=offset,
                            max_messages=1024,
                        ),
                        timeout=10,
                    )
                    if r.status != broker_pb2.FOUND:
                        break  # the rest is not readable (yet): counted as missing
                    out.update(
                        Stored(m.queue_id, m.queue_offset, m.body.decode()) for m in r.messages
                    )
                    offset = r.next_offset
        return out

    def master(self) -> tuple[int, int]:
        """(master id, epoch) once all three agree and all are in sync."""
        found: list[tuple[int, int]] = []

        def settled() -> bool:
            try:
                views = {i: self.failover_status(i) for i in self.brokers}
            except grpc.RpcError:
                return False
            masters = [i for i, f in views.items() if f.role != "SLAVE" and f.acknowledging]
            if len(masters) != 1:
                return False
            m = masters[0]
            f = views[m]
            if sorted(f.isr) != [1, 2, 3] or any(v.master_id != m for v in views.values()):
                return False
            found.append((m, f.group_epoch))
            return True

        wait_until(settled, "one master with all three in sync", self.procs(), timeout_s=120)
        return found[-1]

    def stop(self) -> None:
        try:
            stop_all([*self.brokers.values(), self.nameserver])
        finally:
            self.zk.stop()
