"""An abusive client, run as its own process by ``test_flood.py``: as fast as it can, over one
connection, many calls in flight at once, half of them large send batches and half pulls that
ask for everything (``max_bytes`` 2**40), each sent again the moment it is answered, refusals
included (no backoff). Requests are encoded once and answers are never decoded, so the client
spends its time asking.

``python -m tests.integration.flood_client ADDRESS TOPIC IN_FLIGHT`` prints ``flooding`` once
its first call is answered, stops when its stdin closes, and prints what it got, as JSON: a
count per outcome (``OK`` or the gRPC code and the ErrorDetail code name).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections import Counter

import grpc

from tidemq.protos import broker_pb2, common_pb2
from tidemq.protos.errors import detail_from_metadata

QUEUES = 4
BATCH_MESSAGES = 256
BODY_BYTES = 1024  # 256 KiB batches


def _raw(channel: grpc.aio.Channel, method: str) -> grpc.aio.UnaryUnaryMultiCallable:
    return channel.unary_unary(
        f"/tidemq.v1.Broker/{method}",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )


async def flood(address: str, topic: str, in_flight: int, stop: asyncio.Event) -> Counter[str]:
    options = [("grpc.max_receive_message_length", 1 << 30), ("grpc.max_send_message_length", -1)]
    outcomes: Counter[str] = Counter()
    started = asyncio.Event()
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        send, pull = _raw(channel, "SendMessage"), _raw(channel, "PullMessage")
        batches = [
            broker_pb2.SendMessageRequest(
                messages=[common_pb2.Message(topic=topic, body=b"f" * BODY_BYTES, queue_id=q)]
                * BATCH_MESSAGES
            ).SerializeToString()
            for q in range(QUEUES)
        ]
        pulls = [
            broker_pb2.PullMessageRequest(
                group="flood", topic=topic, queue_id=q, max_messages=2**31 - 1, max_bytes=2**40
            ).SerializeToString()
            for q in range(QUEUES)
        ]

        async def worker(i: int) -> None:
            call, request = (send, batches) if i % 2 else (pull, pulls)
            while not stop.is_set():
                try:
                    await call(request[i % QUEUES], timeout=60)
                    outcome = "OK"
                except grpc.aio.AioRpcError as e:
                    detail = detail_from_metadata(e.trailing_metadata())
                    code = common_pb2.ErrorCode.Name(detail.code) if detail else "-"
                    outcome = f"{e.code().name}/{code}"
                outcomes[outcome] += 1
                started.set()

        workers = [asyncio.create_task(worker(i)) for i in range(in_flight)]
        await started.wait()
        print("flooding", flush=True)
        await stop.wait()
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    return outcomes


async def main(address: str, topic: str, in_flight: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    fd = sys.stdin.fileno()

    def stdin_readable() -> None:
        if not os.read(fd, 4096):  # closed: the test is done (or gone)
            loop.remove_reader(fd)
            stop.set()

    loop.add_reader(fd, stdin_readable)
    outcomes = await flood(address, topic, in_flight, stop)
    print(json.dumps(outcomes), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
