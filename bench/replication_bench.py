"""Replication benchmark: a master and a slave on loopback, beside perfkit's gRPC streaming
ceiling measured in the same run on the same machine.

usage: python bench/replication_bench.py --perfkit ../shared/perfkit [--runs 3]
           [--messages 100000] [--catchup-bytes 1073741824]

Every cluster is one nameserver, a master and a slave of broker group ``bench-a``, each its own
process on 127.0.0.1 (the slave finds its master through the nameserver). Per run:
1. ``catchup``: a master holding at least ``--catchup-bytes`` of CommitLog (16 KiB bodies, written
   once in-process with the storage engine before the first run and reused), then an empty slave
   starts: MB/s from the slave's start until its CommitLog ends where the master's does (also from
   its link coming up, which leaves out its process start). Then perfkit's ``grpc_bench.py`` case
   ``stream_1MiB`` on an aio server: the ratio catch-up / stream ceiling.
2. ``produce_async`` and ``produce_sync``: ``tidemq bench produce`` of ``--messages`` 1 KiB
   messages against an ASYNC_MASTER, then a SYNC_MASTER (fresh stores, slave attached and in
   sync): the ratio SYNC / ASYNC msgs/s, and the sends that came back other than SEND_OK.
3. ``lag``: an ASYNC_MASTER with its slave under ``tidemq bench produce --rate`` at half this run's
   ASYNC msgs/s for about 20 s, the master's ``replication.slaves[0].lag_bytes`` sampled every
   20 ms from a thread of this process while the load runs: p50, p99 and max.

Prints one JSON object per line (each measurement), and last a ``summary`` with medians, the
ratios and one boolean per goal (SYNC >= 80% of ASYNC, lag p99 < 1 MiB). The scratch directory
(``$TMPDIR`` or /tmp, ``tidemq-replication-bench-*``) is deleted at the end, and every process
started is stopped, also on failure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import grpc
from common import (
    REPO,
    TIDEMQ,
    Process,
    emit,
    emit_summary,
    failure,
    free_port,
    perfkit_grpc,
    stop_all,
    tidemq_bench,
    wait_until,
)

from tidemq.protos import broker_pb2, broker_pb2_grpc
from tidemq.storage import Message, MessageStore, StoreConfig

BROKER_NAME = "bench-a"
FILL_TOPIC = "CatchupTopic"
FILL_BODY_BYTES = 16 * 1024
FILL_BATCH = 64  # 1 MiB per put_messages call
PRODUCE_BODY_BYTES = "1024"
LAG_SECONDS = 20.0
LAG_SAMPLE_INTERVAL_S = 0.02
CATCHUP_POLL_INTERVAL_S = 0.02
# A catch-up fails when the slave's CommitLog has not grown for this long.
CATCHUP_STALL_S = 60.0
STATUS_TIMEOUT_S = 10.0
SYNC_VS_ASYNC_GOAL = 0.8
LAG_P99_GOAL_BYTES = 1 << 20


def _percentile(values: Sequence[int], pct: float) -> int:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(pct / 100 * len(s)) - 1))]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _status(stub: broker_pb2_grpc.BrokerStub) -> Any:
    """The broker's GetBrokerStatusResponse, or None while it does not answer."""
    try:
        return stub.GetBrokerStatus(broker_pb2.GetBrokerStatusRequest(), timeout=STATUS_TIMEOUT_S)
    except grpc.RpcError:
        return None


class Cluster:
    """A nameserver, then a master and a slave; leaving ``with`` stops them all, slave first,
    and deletes the cluster's directory (stores and logs)."""

    def __init__(self, scratch: str, name: str) -> None:
        self.dir = os.path.join(scratch, name)
        os.makedirs(self.dir)
        self.procs: list[Process] = []
        self.channels: list[grpc.Channel] = []
        port = free_port()
        self.nameserver = f"127.0.0.1:{port}"
        try:
            self._start("nameserver", "nameserver", "--listen", self.nameserver)
            wait_until(lambda: _listening(port), "nameserver start", self.procs)
        except BaseException:
            self.stop()
            raise

    def __enter__(self) -> Cluster:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _start(self, name: str, *args: str) -> Process:
        proc = Process(name, [*TIDEMQ, *args], os.path.join(self.dir, f"{name}.out"))
        self.procs.append(proc)
        return proc

    def _broker(self, name: str, store: str, *args: str) -> broker_pb2_grpc.BrokerStub:
        listen = f"127.0.0.1:{free_port()}"
        self._start(
            name,
            "broker",
            "--store",
            store,
            "--listen",
            listen,
            "--nameserver",
            self.nameserver,
            "--broker-name",
            BROKER_NAME,
            "--register-interval-ms",
            "1000",
            *args,
        )
        channel = grpc.insecure_channel(listen)
        self.channels.append(channel)
        stub = broker_pb2_grpc.BrokerStub(channel)
        wait_until(lambda: _status(stub) is not None, f"{name} start", self.procs)
        return stub

    def start_master(self, role: str, store: str | None = None) -> broker_pb2_grpc.BrokerStub:
        """A master of ``role`` on ``store`` (default: a new one in the cluster's directory)."""
        store = store or os.path.join(self.dir, "master")
        self.master = self._broker("master", store, "--role", role, "--auto-create-topics")
        return self.master

    def start_slave(self) -> broker_pb2_grpc.BrokerStub:
        """A slave with a new store in the cluster's directory; it finds the master itself."""
        store = os.path.join(self.dir, "slave")
        self.slave = self._broker("slave", store, "--role", "SLAVE", "--broker-id", "1")
        return self.slave

    def wait_in_sync(self) -> None:
        """Until the master reports its slave in sync and holding all the master holds."""

        def caught_up() -> bool:
            s = _status(self.master)
            return s is not None and any(
                r.in_sync and r.lag_bytes == 0 for r in s.replication.slaves
            )

        wait_until(caught_up, "slave in sync", self.procs)

    def stop(self) -> None:
        try:
            stop_all(self.procs[::-1])
        finally:
            for channel in self.channels:
                channel.close()
            shutil.rmtree(self.dir, ignore_errors=True)


def fill_store(path: str, min_bytes: int) -> dict[str, Any]:
    """Write at least ``min_bytes`` of CommitLog into a new store at ``path``, in-process."""
    body = os.urandom(FILL_BODY_BYTES)
    t0 = time.perf_counter()
    store = MessageStore(StoreConfig(path)).open()
    end = messages = 0
    try:
        while end < min_bytes:
            batch = [Message(FILL_TOPIC, body, queue_id=i % 4) for i in range(FILL_BATCH)]
            last = store.put_messages(batch).results[-1]
            end = last.phy_offset + last.size
            messages += FILL_BATCH
    finally:
        store.close()
    secs = time.perf_counter() - t0
    return {
        "bench": "fill",
        "bytes": end,
        "messages": messages,
        "body_bytes": FILL_BODY_BYTES,
        "seconds": round(secs, 3),
        "MBps": round(end / secs / 1e6, 1),
    }


def catchup_run(run: int, scratch: str, fill: str) -> dict[str, Any]:
    """An empty slave against the filled master: seconds until it holds all the master holds."""
    with Cluster(scratch, f"run{run}-catchup") as cluster:
        master = _status(cluster.start_master("ASYNC_MASTER", fill))
        lo, hi = master.store.commitlog_min_offset, master.store.commitlog_max_offset
        t0 = time.perf_counter()
        slave = cluster.start_slave()
        linked: float | None = None
        have, grew = 0, time.perf_counter()
        while have < hi:
            s = _status(slave)
            now = time.perf_counter()
            if s is not None:
                if linked is None and (s.replication.connected or s.store.commitlog_max_offset):
                    linked = now
                if s.store.commitlog_max_offset > have:
                    have, grew = s.store.commitlog_max_offset, now
            if now - grew > CATCHUP_STALL_S or not all(p.alive() for p in cluster.procs):
                raise failure(f"catch-up stalled at {have} of {hi} bytes", cluster.procs)
            time.sleep(CATCHUP_POLL_INTERVAL_S)
        t1 = time.perf_counter()
    assert linked is not None
    mb = (hi - lo) / 1e6
    return {
        "bench": "catchup",
        "run": run,
        "bytes": hi - lo,
        "seconds": round(t1 - t0, 3),
        "MBps": round(mb / (t1 - t0), 1),
        "link_up_s": round(linked - t0, 3),
        "MBps_from_link_up": round(mb / (t1 - linked), 1),
    }


def produce_run(run: int, scratch: str, flavour: str, messages: int) -> dict[str, Any]:
    """``tidemq bench produce`` against an ASYNC_MASTER or SYNC_MASTER (``flavour``) and slave."""
    with Cluster(scratch, f"run{run}-{flavour}") as cluster:
        cluster.start_master(f"{flavour.upper()}_MASTER")
        cluster.start_slave()
        cluster.wait_in_sync()
        p = tidemq_bench(
            cluster.nameserver,
            "produce",
            "--messages",
            str(messages),
            "--body-bytes",
            PRODUCE_BODY_BYTES,
        )
    not_ok = sum(n for status, n in p.get("statuses", {}).items() if status != "SEND_OK")
    return {**p, "bench": f"produce_{flavour}", "run": run, "not_send_ok": not_ok}


class LagSampler(threading.Thread):
    """The master's lag_bytes of its first slave, every LAG_SAMPLE_INTERVAL_S until ``halt``."""

    def __init__(self, master: broker_pb2_grpc.BrokerStub) -> None:
        super().__init__(name="lag-sampler", daemon=True)
        self.master = master
        self.halt = threading.Event()
        self.samples: list[tuple[int, int, bool]] = []  # (master max offset, lag, in sync)
        self.missing = 0  # no answer, or no slave streaming

    def run(self) -> None:
        due = time.perf_counter()
        while not self.halt.is_set():
            s = _status(self.master)
            if s is None or not s.replication.slaves:
                self.missing += 1
            else:
                r = s.replication.slaves[0]
                self.samples.append((s.store.commitlog_max_offset, r.lag_bytes, r.in_sync))
            due += LAG_SAMPLE_INTERVAL_S
            now = time.perf_counter()
            due = max(due, now)  # after a slow answer: go on from now, no burst to catch up
            self.halt.wait(due - now)

    def under_load(self) -> list[tuple[int, int, bool]]:
        """The samples from the first new CommitLog byte on (not the producer's start-up)."""
        base = self.samples[0][0] if self.samples else 0
        return [x for x in self.samples if x[0] > base]


def lag_run(run: int, scratch: str, rate: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """ASYNC_MASTER and slave under a paced load: the produce result and the lag figures."""
    with Cluster(scratch, f"run{run}-lag") as cluster:
        master = cluster.start_master("ASYNC_MASTER")
        cluster.start_slave()
        cluster.wait_in_sync()
        sampler = LagSampler(master)
        sampler.start()
        try:
            p = tidemq_bench(
                cluster.nameserver,
                "produce",
                "--messages",
                str(max(1, round(rate * LAG_SECONDS))),
                "--body-bytes",
                PRODUCE_BODY_BYTES,
                "--rate",
                f"{rate:.1f}",
            )
        finally:
            sampler.halt.set()
            sampler.join()
    samples = sampler.under_load()
    if not samples:
        raise RuntimeError("no lag sample while the load ran")
    lags = [lag for _, lag, _ in samples]
    lag = {
        "bench": "lag",
        "run": run,
        "target_rate": round(rate, 1),
        "msgs_per_s": p["msgs_per_s"],
        "samples": len(lags),
        "missing_samples": sampler.missing,
        "not_in_sync_samples": sum(1 for *_, in_sync in samples if not in_sync),
        "p50_bytes": _percentile(lags, 50),
        "p99_bytes": _percentile(lags, 99),
        "max_bytes": max(lags),
    }
    return {**p, "bench": "produce_paced", "run": run}, lag


def one_run(run: int, args: argparse.Namespace, scratch: str, fill: str) -> dict[str, float]:
    c = catchup_run(run, scratch, fill)
    emit(c)
    ceiling = perfkit_grpc(args.perfkit, ["stream_1MiB"])["stream_1MiB"]
    emit({**ceiling, "bench": "ceiling_stream_1MiB", "run": run})
    a = produce_run(run, scratch, "async", args.messages)
    emit(a)
    s = produce_run(run, scratch, "sync", args.messages)
    emit(s)
    paced, lag = lag_run(run, scratch, a["msgs_per_s"] / 2)
    emit(paced)
    emit(lag)
    return {
        "catchup_MBps": c["MBps"],
        "catchup_MBps_from_link_up": c["MBps_from_link_up"],
        "ceiling_stream_1MiB_MBps": ceiling["MBps"],
        "produce_async_msgs_per_s": a["msgs_per_s"],
        "produce_sync_msgs_per_s": s["msgs_per_s"],
        "produce_async_not_send_ok": a["not_send_ok"],
        "produce_sync_not_send_ok": s["not_send_ok"],
        "lag_load_msgs_per_s": lag["msgs_per_s"],
        "lag_p50_bytes": lag["p50_bytes"],
        "lag_p99_bytes": lag["p99_bytes"],
        "lag_max_bytes": lag["max_bytes"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--perfkit", default=os.path.join(REPO, "..", "shared", "perfkit"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--catchup-bytes", type=int, default=1 << 30)
    args = parser.parse_args()
    if args.runs < 1 or args.messages < 1 or args.catchup_bytes < 1:
        parser.error("--runs, --messages and --catchup-bytes must be >= 1")
    # SIGTERM unwinds like Ctrl-C: every ``with Cluster`` stops its processes, scratch goes.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    scratch = tempfile.mkdtemp(prefix="tidemq-replication-bench-")
    try:
        fill = os.path.join(scratch, "fill")
        emit(fill_store(fill, args.catchup_bytes))
        runs = [one_run(i, args, scratch, fill) for i in range(args.runs)]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    emit_summary(
        runs,
        lambda r: {
            "catchup_vs_stream_ceiling": r["catchup_MBps"] / r["ceiling_stream_1MiB_MBps"],
            "produce_sync_vs_async": r["produce_sync_msgs_per_s"] / r["produce_async_msgs_per_s"],
        },
        lambda med, ratios: {
            "produce_sync_ge_80pct_async": ratios["produce_sync_vs_async"] >= SYNC_VS_ASYNC_GOAL,
            "lag_p99_lt_1MiB": med["lag_p99_bytes"] < LAG_P99_GOAL_BYTES,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
