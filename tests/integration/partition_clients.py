"""The producing clients of a partition test, as a program: the test runs it in the clients'
network namespace (``python -m tests.integration.partition_clients``), where the test process
itself cannot put its threads.

Each of ``--producers`` threads sends its own key's numbered messages (``p<i>:<n>``, sharded by
key), one at a time, until SIGTERM; every answer (SEND_OK or not, with the acknowledging broker
and epoch) is one JSON line in ``--out`` with the fields of ``tests.integration.failover.Answer``
and ``started`` (``time.monotonic()`` when ``send`` was called: a broker's decision comes after
it), written as it arrives so the test can follow along.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
import time
from typing import IO, Any

import tidemq


def produce(
    nameserver: str, topic: str, key: str, out: IO[str], lock: threading.Lock, stop: threading.Event
) -> None:
    i = 0
    with tidemq.Producer(nameserver, send_timeout_ms=5000) as producer:
        while not stop.is_set():
            body = f"{key}:{i}"
            answer: dict[str, Any] = {"body": body, "key": key, "started": time.monotonic()}
            try:
                r = producer.send(topic, body, sharding_key=key)
            except tidemq.errors.TidemqError as e:
                answer |= {"ok": False, "status": type(e).__name__, "epoch": 0, "broker": ""}
                answer |= {"queue_id": -1, "queue_offset": -1}
            else:
                answer |= {
                    "ok": r.status is tidemq.SendStatus.SEND_OK,
                    "status": r.status.name,
                    "epoch": r.epoch,
                    "broker": r.broker_address,
                    "queue_id": r.queue_id,
                    "queue_offset": r.queue_offset,
                }
            answer["at"] = time.monotonic()
            with lock:
                out.write(json.dumps(answer) + "\n")
                out.flush()
            i += 1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--nameserver", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--producers", type=int, default=2)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    lock = threading.Lock()
    failed: list[str] = []

    def worker(key: str) -> None:
        try:
            produce(args.nameserver, args.topic, key, out, lock, stop)
        except BaseException as e:  # a producer that dies must not look like one that idles
            failed.append(f"{key}: {e!r}")
            stop.set()
            raise

    with open(args.out, "a", encoding="utf-8") as out:
        threads = [threading.Thread(target=worker, args=(f"p{i}",)) for i in range(args.producers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if failed:
        raise SystemExit(f"producers failed: {failed}")


if __name__ == "__main__":
    main()
