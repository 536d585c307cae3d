"""Scale: topic creates, route propagation, restarts and route queries at 1k to 100k topics.

    python bench/scale_bench.py --perfkit ../shared/perfkit [--levels 1000,10000,50000,100000]
        [--sample 200] [--queries 2000] [--zk HOST:PORT]

One nameserver and one broker (4-queue topics), on the embedded registry or, with ``--zk``, on
ZooKeeper. For each level the broker is stopped, its topic table filled to that many topics
(``{store}/config/topics.json``, the table's snapshot) and started again, which measures:

- ``restart_s``: from starting the process to its Broker service answering, and
  ``routable_s``: to the nameserver routing a topic of the table (the broker's first, full,
  registration);
- ``broker_rss_mib`` and ``nameserver_rss_mib`` once it is registered;
- ``create_ms``: ``--sample`` CreateTopic calls one after another; each answers once the
  nameservers route the new topic, so it includes the registration (median and p99);
- ``propagation_ms``: from sending a CreateTopic to the nameserver's QueryRoute finding the
  topic, polling as fast as it answers (median and p99);
- ``route_query_ms``: ``--queries`` QueryRoute calls of random topics, one at a time (p50, p99).

The ceiling beside the route queries is perfkit's unary gRPC round trip (``unary_c1``, an aio
server) measured in the same run. Goals (issue 27): create latency at the largest level at most
twice its value at the smallest; a restart with 100k topics routable within 10 s; route query
p99 within 5 ms. Every line printed is JSON; the last one is the summary.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from typing import Any

import grpc
from common import Process, emit, failure, free_port, perfkit_grpc, stop_all, wait_until

from tidemq.protos import (
    broker_pb2,
    broker_pb2_grpc,
    common_pb2,
    nameserver_pb2,
    nameserver_pb2_grpc,
)

QUEUES = 4
SMALL_STORE = (
    '{"commitlog_file_size_bytes": 4194304, "consume_queue_entries_per_file": 10000,'
    ' "index_slot_num": 10000, "index_max_num": 40000}'
)


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def write_table(store: str, n: int) -> None:
    """The broker's topic snapshot with ``n`` topics, as TopicManager writes it."""
    os.makedirs(os.path.join(store, "config"), exist_ok=True)
    for name in os.listdir(os.path.join(store, "config")):
        if name.startswith("topics"):
            os.unlink(os.path.join(store, "config", name))
    topics = [
        {
            "topic": f"scale-{i:06d}",
            "read_queue_nums": QUEUES,
            "write_queue_nums": QUEUES,
            "perm": 6,
            "order": False,
            "attributes": {},
        }
        for i in range(n)
    ]
    doc = {"topics": topics, "data_version": {"state_version": 0, "counter": n, "timestamp_ms": 0}}
    with open(os.path.join(store, "config", "topics.json"), "w") as f:
        json.dump(doc, f)


class Cluster:
    def __init__(self, scratch: str, zk: str) -> None:
        self.scratch, self.zk = scratch, zk
        self.ns_address = f"127.0.0.1:{free_port()}"
        self.broker_address = f"127.0.0.1:{free_port()}"
        self.store = os.path.join(scratch, "store")
        registry = ["--zk", zk] if zk else []
        self.nameserver = Process(
            "nameserver",
            [
                sys.executable,
                "-m",
                "tidemq.cli",
                "nameserver",
                "--listen",
                self.ns_address,
                *registry,
            ],
            os.path.join(scratch, "nameserver.log"),
        )
        self.broker: Process | None = None
        self.ns_channel = grpc.insecure_channel(self.ns_address)
        self.ns = nameserver_pb2_grpc.NameServerStub(self.ns_channel)

    def start_broker(self) -> float:
        """Start the broker; seconds until its Broker service answers."""
        registry = ["--zk", self.zk] if self.zk else ["--nameserver", self.ns_address]
        t0 = time.monotonic()
        self.broker = Process(
            "broker",
            [
                sys.executable,
                "-m",
                "tidemq.cli",
                "broker",
                "--listen",
                self.broker_address,
                "--store",
                self.store,
                "--store-overrides",
                SMALL_STORE,
                *registry,
            ],
            os.path.join(self.scratch, "broker.log"),
        )
        with grpc.insecure_channel(self.broker_address) as channel:
            stub = broker_pb2_grpc.BrokerStub(channel)
            while True:
                try:
                    stub.GetBrokerStatus(
                        broker_pb2.GetBrokerStatusRequest(), timeout=1, wait_for_ready=True
                    )
                    break
                except grpc.RpcError as e:
                    if e.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                        raise
                    if not self.broker.alive():
                        raise failure("broker start", [self.broker]) from None
        return time.monotonic() - t0

    def stop_broker(self) -> None:
        if self.broker is not None:
            stop_all([self.broker])
            self.broker = None

    def routed(self, topic: str) -> bool:
        try:
            self.ns.QueryRoute(nameserver_pb2.QueryRouteRequest(topic=topic), timeout=5)
        except grpc.RpcError as e:
            if e.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE):
                return False
            raise
        return True

    def procs(self) -> list[Process]:
        return [self.nameserver, *([self.broker] if self.broker else [])]


def level(cluster: Cluster, n: int, args: argparse.Namespace, rng: random.Random) -> dict[str, Any]:
    cluster.stop_broker()
    write_table(cluster.store, n)
    t0 = time.monotonic()
    restart_s = cluster.start_broker()
    last = f"scale-{n - 1:06d}"
    wait_until(lambda: cluster.routed(last), f"{n} topics routable", cluster.procs(), 120, 0.01)
    routable_s = time.monotonic() - t0
    assert cluster.broker is not None
    broker_rss = rss_mib(cluster.broker.proc.pid)
    ns_rss = rss_mib(cluster.nameserver.proc.pid)

    creates: list[float] = []
    propagation: list[float] = []
    with grpc.insecure_channel(cluster.broker_address) as channel:
        broker = broker_pb2_grpc.BrokerStub(channel)
        for i in range(args.sample):
            topic = f"new-{n}-{i}"
            request = broker_pb2.CreateTopicRequest(
                topic=common_pb2.TopicConfig(
                    topic=topic, read_queue_nums=QUEUES, write_queue_nums=QUEUES, perm=6
                )
            )
            t = time.perf_counter()
            if i % 2:
                broker.CreateTopic(request, timeout=30)
                creates.append(time.perf_counter() - t)
            else:
                # Propagation: the nameserver routes it, polled while the create is in flight.
                future = broker.CreateTopic.future(request, timeout=30)
                while not cluster.routed(topic):
                    pass
                propagation.append(time.perf_counter() - t)
                future.result()

    names = [f"scale-{i:06d}" for i in range(n)]
    queries = []
    for _ in range(args.queries):
        topic = rng.choice(names)
        t = time.perf_counter()
        cluster.ns.QueryRoute(nameserver_pb2.QueryRouteRequest(topic=topic), timeout=5)
        queries.append(time.perf_counter() - t)
    return {
        "bench": "scale.level",
        "topics": n,
        "restart_s": round(restart_s, 3),
        "routable_s": round(routable_s, 3),
        "broker_rss_mib": round(broker_rss, 1),
        "nameserver_rss_mib": round(ns_rss, 1),
        "create_ms_median": round(statistics.median(creates) * 1e3, 3),
        "create_ms_p99": round(pct(creates, 99) * 1e3, 3),
        "propagation_ms_median": round(statistics.median(propagation) * 1e3, 3),
        "propagation_ms_p99": round(pct(propagation, 99) * 1e3, 3),
        "route_query_ms_p50": round(statistics.median(queries) * 1e3, 3),
        "route_query_ms_p99": round(pct(queries, 99) * 1e3, 3),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--perfkit", default=os.path.join("..", "shared", "perfkit"))
    p.add_argument("--levels", default="1000,10000,50000,100000")
    p.add_argument("--sample", type=int, default=200, help="creates measured at each level")
    p.add_argument("--queries", type=int, default=2000, help="route queries at each level")
    p.add_argument("--zk", default="", help="ZooKeeper HOST:PORT; default: embedded registry")
    p.add_argument("--no-ceiling", action="store_true", help="skip perfkit's gRPC ceiling")
    args = p.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    rng = random.Random(27)
    results = []
    with tempfile.TemporaryDirectory(prefix="tidemq-scale-") as scratch:
        cluster = Cluster(scratch, args.zk)
        try:
            wait_until(
                lambda: _answers(cluster), "nameserver start", [cluster.nameserver], 60, 0.05
            )
            for n in levels:
                result = level(cluster, n, args, rng)
                emit(result)
                results.append(result)
        finally:
            cluster.ns_channel.close()
            cluster.stop_broker()
            stop_all([cluster.nameserver])
    ceiling: dict[str, Any] = {}
    if not args.no_ceiling:
        unary = perfkit_grpc(args.perfkit, ["unary_c1"]).get("unary_c1", {})
        ceiling = {
            "grpc_unary_ms_p50": round(unary.get("p50_us", 0) / 1e3, 3),
            "grpc_unary_ms_p99": round(unary.get("p99_us", 0) / 1e3, 3),
        }
    first, last = results[0], results[-1]
    create_ratio = last["create_ms_median"] / first["create_ms_median"]
    emit(
        {
            "bench": "summary",
            "registry": "zookeeper" if args.zk else "embedded",
            "levels": levels,
            "create_ms_median": {r["topics"]: r["create_ms_median"] for r in results},
            "create_ratio_last_to_first": round(create_ratio, 2),
            "restart_routable_s_last": last["routable_s"],
            "route_query_ms_p99_last": last["route_query_ms_p99"],
            "ceiling": ceiling,
            "route_query_p99_vs_grpc_p99": (
                round(last["route_query_ms_p99"] / ceiling["grpc_unary_ms_p99"], 2)
                if ceiling.get("grpc_unary_ms_p99")
                else None
            ),
            "goals": {
                "create_at_last_within_2x_first": create_ratio <= 2.0,
                "restart_within_10s": last["routable_s"] <= 10.0,
                "route_query_p99_within_5ms": last["route_query_ms_p99"] <= 5.0,
            },
        }
    )
    return 0


def _answers(cluster: Cluster) -> bool:
    try:
        cluster.ns.GetStatus(nameserver_pb2.GetStatusRequest(), timeout=1)
    except grpc.RpcError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
