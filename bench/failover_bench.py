"""Automatic failover benchmark: how long a broker group takes to acknowledge writes again after
its master dies, and how long a planned switchover refuses sends.

usage: python bench/failover_bench.py [--kills 10] [--switchovers 5] [--session-ms 4000]

One ZooKeeper (Debian's package, standalone, tickTime 500 ms), one nameserver on it, and brokers
1-3 of group ``bench-a`` with ``--failover auto`` (SYNC_MASTER when elected, ZooKeeper session
``--session-ms``, lease 1 s), each its own process on 127.0.0.1. A probe thread sends one message
at a time through the SDK the whole run and records the time of every SEND_OK and its epoch.

- ``kill``, repeated ``--kills`` times: SIGKILL the master; the failover time is from the kill
  to the first SEND_OK at a newer epoch. Then the loss check: every message acknowledged so far
  must be readable from the new master at the queue and offset its SEND_OK named, with its body
  (within 30 s, as the confirm offset catches up); each kill's line reports ``acknowledged`` and
  ``lost``. The killed broker is restarted and the next round waits until all three are in sync
  again.
- ``switchover``, repeated ``--switchovers`` times: ``Admin.switchover`` to another in-sync
  broker; the refused window is the longest gap between two SEND_OKs around the call (what a
  sender saw), beside the master's own ``writes_paused_ms``.

Prints one JSON object per measurement, then a ``summary``: median and max of each, the session
timeout beside them, kills that lost nothing, and the goals (failover median <= session timeout
+ 2 s; switchover window < 1 s; no acknowledged message lost). A lost acknowledged message is a
failure, not a figure: the run says so on stderr and exits 1. Every process started is stopped at
the end, also on failure.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

import grpc
from common import REPO, TIDEMQ, Process, emit, failure, free_port, stop_all, wait_until

sys.path.insert(0, REPO)

import itertools

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


def more_sends(cluster: Cluster, probe: Probe, n: int, what: str) -> None:
    before = len(probe.oks)
    wait_until(
        lambda: probe.check() and len(probe.oks) > before + n, what, cluster.procs(), timeout_s=120
    )


def lost_after_failover(cluster: Cluster, probe: Probe, timeout_s: float = 30) -> list[Stored]:
    """Acknowledged messages the new master does not serve where their SEND_OK said (empty when
    none is lost). Waits up to ``timeout_s`` for them, since what a slave holds becomes readable
    on the new master as its confirm offset catches up."""
    deadline = time.monotonic() + timeout_s
    while True:
        acked = probe.acknowledged()
        m = cluster.acknowledging_master()
        missing = acked
        if m is not None:
            with contextlib.suppress(grpc.RpcError):
                served = cluster.stored(m, PROBE_TOPIC)
                missing = [a for a in acked if a not in served]
        if not missing or time.monotonic() > deadline:
            return missing
        time.sleep(0.2)


def kill_round(cluster: Cluster, probe: Probe, n: int) -> tuple[float, int]:
    """SIGKILL the master; (seconds until the first SEND_OK at a newer epoch, acknowledged
    messages the new master lost)."""
    m, epoch = cluster.master()
    more_sends(cluster, probe, 20, "sends before the kill")
    killed_at = time.monotonic()
    cluster.brokers[m].proc.send_signal(signal.SIGKILL)
    cluster.brokers[m].proc.wait()
    live = [b for i, b in cluster.brokers.items() if i != m]
    wait_until(
        lambda: probe.first_ok_after(killed_at, epoch) is not None,
        "a SEND_OK from the new master",
        [cluster.nameserver, *live],
        timeout_s=120,
    )
    took = probe.first_ok_after(killed_at, epoch)
    assert took is not None
    seconds = took - killed_at
    failed = [f"+{at - killed_at:.2f}s {what}" for at, what in probe.errors if at > killed_at - 5]
    failed = failed[:10] + ([f"... {len(failed) - 10} more"] if len(failed) > 10 else [])
    lost = lost_after_failover(cluster, probe)
    emit(
        {
            "bench": "failover.kill",
            "round": n,
            "killed": m,
            "seconds": round(seconds, 3),
            "acknowledged": len(probe.acknowledged()),
            "lost": len(lost),
            "lost_examples": [list(a) for a in lost[:5]],
            "failed_sends": failed,
        }
    )
    if lost:
        print(
            f"failover benchmark: kill {n} of broker {m} lost {len(lost)} acknowledged "
            f"messages, e.g. {lost[:5]}",
            file=sys.stderr,
        )
    cluster.start(m)
    return seconds, len(lost)


def switch_round(
    cluster: Cluster, probe: Probe, admin: tidemq.Admin, n: int
) -> tuple[float, float]:
    """A switchover; (longest gap between SEND_OKs around it, the master's writes_paused)."""
    m, _ = cluster.master()
    target = min(i for i in cluster.brokers if i != m)
    start = time.monotonic()
    result = admin.switchover(GROUP, target)
    more_sends(cluster, probe, 20, "sends after the switch")
    window = probe.longest_gap(start - 1, time.monotonic())
    emit(
        {
            "bench": "failover.switchover",
            "round": n,
            "to": target,
            "refused_window_s": round(window, 3),
            "writes_paused_ms": result["writes_paused_ms"],
        }
    )
    return window, result["writes_paused_ms"] / 1000


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--switchovers", type=int, default=5)
    p.add_argument("--session-ms", type=int, default=4_000)
    p.add_argument("--keep", action="store_true", help="keep the scratch directory and its logs")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tidemq-failover-bench-"))
    cluster = Cluster(work, args.session_ms)
    probe: Probe | None = None
    failovers: list[float] = []
    losses: list[int] = []  # acknowledged messages lost, per kill
    windows: list[float] = []
    paused: list[float] = []
    try:
        cluster.master()
        probe = Probe(cluster.ns_address)
        probe.start()
        more_sends(cluster, probe, 20, "the probe's first sends")
        for n in range(args.kills):
            seconds, lost = kill_round(cluster, probe, n)
            failovers.append(seconds)
            losses.append(lost)
        with tidemq.Admin(cluster.ns_address) as admin:
            for n in range(args.switchovers):
                window, pause = switch_round(cluster, probe, admin, n)
                windows.append(window)
                paused.append(pause)
    except Exception as e:
        raise failure(f"failover benchmark: {e}", cluster.procs()) from e
    finally:
        if probe is not None:
            probe.stopping.set()
            probe.finish(30)
        cluster.stop()
        if args.keep:
            print(f"logs kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    session_s = args.session_ms / 1000
    summary: dict[str, Any] = {
        "bench": "summary",
        "session_timeout_s": session_s,
        "lease_s": LEASE_MS / 1000,
        "load1": round(os.getloadavg()[0], 2),
    }
    if failovers:
        summary["failover_s"] = {
            "kills": len(failovers),
            "median": round(statistics.median(failovers), 3),
            "max": round(max(failovers), 3),
            "clean_kills": sum(1 for lost in losses if lost == 0),
            "lost_acknowledged": sum(losses),
        }
    if windows:
        summary["switchover_refused_window_s"] = {
            "switchovers": len(windows),
            "median": round(statistics.median(windows), 3),
            "max": round(max(windows), 3),
            "writes_paused_median_s": round(statistics.median(paused), 3),
        }
    summary["goals"] = {
        "failover_median_le_session_plus_2s": bool(failovers)
        and statistics.median(failovers) <= session_s + 2,
        "switchover_window_lt_1s": bool(windows) and max(windows) < 1.0,
        "no_acknowledged_message_lost": not any(losses),
    }
    emit(summary)
    if any(losses):
        print(
            f"failover benchmark: FAILED, {sum(losses)} acknowledged messages lost in "
            f"{sum(1 for lost in losses if lost)} of {len(losses)} kills",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
