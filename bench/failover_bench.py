"""Automatic failover benchmark: how long a broker group takes to acknowledge writes again after
its master dies, and how long a planned switchover refuses sends.

usage: python bench/failover_bench.py [--kills 10] [--switchovers 5] [--session-ms 4000]

One ZooKeeper (Debian's package, standalone, tickTime 500 ms), one nameserver on it, and brokers
1-3 of group ``bench-a`` with ``--failover auto`` (SYNC_MASTER when elected, ZooKeeper session
``--session-ms``, lease 1 s), each its own process on 127.0.0.1. A probe thread sends one message
at a time through the SDK the whole run and records the time of every SEND_OK and its epoch.

- ``kill``, repeated ``--kills`` times: SIGKILL the master; the failover time is from the kill
  to the first SEND_OK at a newer epoch. The killed broker is restarted and the next round waits
  until all three are in sync again.
- ``switchover``, repeated ``--switchovers`` times: ``Admin.switchover`` to another in-sync
  broker; the refused window is the longest gap between two SEND_OKs around the call (what a
  sender saw), beside the master's own ``writes_paused_ms``.

Prints one JSON object per measurement, then a ``summary``: median and max of each, the session
timeout beside them, and the goals (failover median <= session timeout + 2 s; switchover window
< 1 s). Every process started is stopped at the end, also on failure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import grpc
from common import REPO, TIDEMQ, Process, emit, failure, free_port, stop_all, wait_until

sys.path.insert(0, REPO)

import itertools

import tidemq
from tests.integration.zookeeper import new_server
from tidemq.protos import broker_pb2, broker_pb2_grpc

GROUP = "bench-a"
LEASE_MS = 1_000


class Probe(threading.Thread):
    """Sends one message at a time until stopped; every SEND_OK's (time, epoch)."""

    def __init__(self, nameserver: str) -> None:
        super().__init__(daemon=True)
        self.nameserver = nameserver
        self.oks: list[tuple[float, int]] = []
        self.errors: list[tuple[float, str]] = []
        self.stopping = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        with tidemq.Producer(self.nameserver, send_timeout_ms=3_000) as producer:
            i = 0
            while not self.stopping.is_set():
                started = time.monotonic()
                try:
                    r = producer.send("probe", f"m{i}")
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

    def first_ok_after(self, t: float, epoch_above: int) -> float | None:
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
    wait_until(lambda: len(probe.oks) > before + n, what, cluster.procs(), timeout_s=120)


def kill_round(cluster: Cluster, probe: Probe, n: int) -> float:
    """SIGKILL the master; seconds until the first SEND_OK at a newer epoch."""
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
    emit(
        {
            "bench": "failover.kill",
            "round": n,
            "killed": m,
            "seconds": round(seconds, 3),
            "failed_sends": failed,
        }
    )
    cluster.start(m)
    return seconds


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
    windows: list[float] = []
    paused: list[float] = []
    try:
        cluster.master()
        probe = Probe(cluster.ns_address)
        probe.start()
        more_sends(cluster, probe, 20, "the probe's first sends")
        failovers = [kill_round(cluster, probe, n) for n in range(args.kills)]
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
            probe.join(30)
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
    }
    emit(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
