"""One broker for the receive benchmark: a nameserver and an ASYNC-flush master without a
slave, each its own process on 127.0.0.1, with what the benchmark reads of the broker process
(its CPU seconds, its anonymous memory) and of its state (queue offsets, receive state).

The broker can run under ``cProfile`` (``profile_to``): it writes the profile when it stops
(SIGTERM drains and returns, so the profiler's exit path runs).
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import time
from types import TracebackType
from typing import Any

import grpc
from common import TIDEMQ, Process, free_port, stop_all, wait_until

from tidemq.protos import broker_pb2, broker_pb2_grpc
from tidemq.protos.signing import Credentials
from tidemq.protos.tls import TlsSettings, sync_channel

CLK_TCK = os.sysconf("SC_CLK_TCK")
STATUS_TIMEOUT_S = 10.0
BROKER_NAME = "bench-receive"


def cpu_s(pid: int) -> float:
    """CPU seconds process ``pid`` used so far (all its threads, those gone included), to the
    nanosecond: the kernel's per-process CPU clock (MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)).
    /proc's figures count whole clock ticks (10 ms), more than a short window's whole CPU: a
    2,000-message batched send read 0 there."""
    try:
        return time.clock_gettime(((~pid) << 3) | 2)
    except OSError:  # not Linux, or the process is gone: the ticks are what there is
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_bytes(pid: int) -> dict[str, int]:
    """RssAnon (the heap: what state costs; mapped store files are RssFile) and VmRSS."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "VmRSS", "RssFile"):
                out[key] = int(value.split()[0]) * 1024
    return out


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class BenchBroker:
    """Leaving ``with`` stops the broker, then the nameserver; the directory stays (the caller
    may start another broker on the same store)."""

    def __init__(
        self,
        directory: str,
        store: str,
        profile_to: str | None = None,
        broker_name: str = BROKER_NAME,
        extra_args: tuple[str, ...] = (),
        nameserver_args: tuple[str, ...] = (),
        tls: TlsSettings | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        """``nameserver_args``/``extra_args``: more flags of the nameserver/broker (TLS, an ACL
        file); ``tls``/``credentials``: how this process then reaches the broker."""
        self.dir = directory
        os.makedirs(self.dir, exist_ok=True)
        self.procs: list[Process] = []
        ns_port = free_port()
        self.nameserver = f"127.0.0.1:{ns_port}"
        self.listen = f"127.0.0.1:{free_port()}"
        self.channel = sync_channel(self.listen, tls, credentials=credentials)
        self.stub = broker_pb2_grpc.BrokerStub(self.channel)
        try:
            self._start(
                "nameserver", [*TIDEMQ, "nameserver", "--listen", self.nameserver, *nameserver_args]
            )
            wait_until(lambda: _listening(ns_port), "nameserver start", self.procs)
            python = [sys.executable]
            if profile_to:
                python += ["-m", "cProfile", "-o", profile_to]
            broker = self._start(
                "broker",
                [
                    *python,
                    "-m",
                    "tidemq.cli",
                    "broker",
                    "--store",
                    store,
                    "--listen",
                    self.listen,
                    "--nameserver",
                    self.nameserver,
                    "--broker-name",
                    broker_name,
                    "--role",
                    "ASYNC_MASTER",
                    "--flush",
                    "ASYNC",
                    "--auto-create-topics",
                    "--register-interval-ms",
                    "1000",
                    *extra_args,
                ],
            )
            self.pid = broker.proc.pid
            wait_until(self._answers, "broker start", self.procs)
        except BaseException:
            self.stop()
            raise

    def __enter__(self) -> BenchBroker:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _start(self, name: str, cmd: list[str]) -> Process:
        proc = Process(name, cmd, os.path.join(self.dir, f"{name}.out"))
        self.procs.append(proc)
        return proc

    def _answers(self) -> bool:
        try:
            self.stub.GetBrokerStatus(broker_pb2.GetBrokerStatusRequest(), timeout=STATUS_TIMEOUT_S)
        except grpc.RpcError:
            return False
        return True

    def cpu_s(self) -> float:
        return cpu_s(self.pid)

    def rss(self) -> dict[str, int]:
        return rss_bytes(self.pid)

    def topic_messages(self, topic: str) -> int:
        r = self.stub.GetQueueOffsets(
            broker_pb2.GetQueueOffsetsRequest(topic=topic), timeout=STATUS_TIMEOUT_S
        )
        return sum(q.max_offset - q.min_offset for q in r.queues)

    def receive_state(self, group: str, topic: str) -> dict[str, Any]:
        """The group's totals over the topic's queues, and whether all of it is done."""
        r = self.stub.GetReceiveState(
            broker_pb2.GetReceiveStateRequest(group=group, topic=topic), timeout=STATUS_TIMEOUT_S
        )
        return {
            "inflight": sum(q.inflight for q in r.queues),
            "retrying": sum(q.retrying for q in r.queues),
            "all_done": bool(r.queues) and all(q.done_offset >= q.max_offset for q in r.queues),
        }

    def stop(self) -> None:
        try:
            stop_all(self.procs[::-1])
        finally:
            self.channel.close()

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
