"""What moving a block's bytes costs before tidemq does anything with them, measured beside the
broker in the same run (bench/blocks_bench.py's ``floors`` case):

- ``grpc``: a grpc.aio server answering unary calls that carry one ``bytes`` request of
  ``block_bytes`` (a record block's size), with a generic handler that keeps the bytes as they
  arrive (no protobuf), 4 calls in flight from a client process: the server's CPU per KiB
  received. This is what receiving a block costs a broker in Python gRPC.
- ``pages``: writing ``write_bytes`` of new data into a new preallocated file with ``pwrite``
  in block-sized pieces, as a put does: CPU per KiB (the kernel finds a page-cache page for
  every page written, the copy is most of the rest).

usage: python bench/blocks_floors.py [--block-bytes 1048576] [--seconds 4] [--dir DIR]
Prints one JSON object per measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import tempfile
import time
from typing import Any

import grpc
from common import free_port

METHOD = "/tidemq.bench.Floor/Put"


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _serve(port: int, ready: Any) -> None:
    async def main() -> None:
        async def put(request: bytes, context: object) -> bytes:
            return b"ok"

        handler = grpc.method_handlers_generic_handler(
            "tidemq.bench.Floor", {"Put": grpc.unary_unary_rpc_method_handler(put)}
        )
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        ready.set()
        await server.wait_for_termination()

    asyncio.run(main())


async def _load(port: int, payload: bytes, seconds: float, server_pid: int) -> dict[str, float]:
    async with grpc.aio.insecure_channel(
        f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 64 << 20)]
    ) as channel:
        call = channel.unary_unary(METHOD)
        for _ in range(20):  # warm-up
            await call(payload)
        calls = 0
        stop = time.perf_counter() + seconds
        cpu0, t0 = _cpu_s(server_pid), time.perf_counter()

        async def worker() -> None:
            nonlocal calls
            while time.perf_counter() < stop:
                await call(payload)
                calls += 1

        await asyncio.gather(*(worker() for _ in range(4)))
        wall, cpu = time.perf_counter() - t0, _cpu_s(server_pid) - cpu0
    kib = calls * len(payload) / 1024
    return {
        "calls_per_s": round(calls / wall, 1),
        "MBps": round(calls * len(payload) / wall / 1e6, 1),
        "server_cpu_us_per_kib": round(cpu / kib * 1e6, 3),
    }


def grpc_floor(block_bytes: int, seconds: float) -> dict[str, float]:
    port = free_port()
    ready = mp.Event()
    server = mp.Process(target=_serve, args=(port, ready), daemon=True)
    server.start()
    try:
        if not ready.wait(30):
            raise RuntimeError("the floor's gRPC server did not start")
        assert server.pid is not None
        return asyncio.run(_load(port, b"x" * block_bytes, seconds, server.pid))
    finally:
        server.terminate()
        server.join(10)


def pages_floor(directory: str, block_bytes: int, write_bytes: int) -> dict[str, float]:
    path = os.path.join(directory, "floor.dat")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.posix_fallocate(fd, 0, write_bytes)
        data = os.urandom(block_bytes)
        cpu0, t0 = time.thread_time(), time.perf_counter()
        for pos in range(0, write_bytes - block_bytes + 1, block_bytes):
            os.pwrite(fd, data, pos)
        wall, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
    finally:
        os.close(fd)
        os.unlink(path)
    return {
        "MBps": round(write_bytes / wall / 1e6, 1),
        "cpu_us_per_kib": round(cpu / (write_bytes / 1024) * 1e6, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--block-bytes", type=int, default=1 << 20)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--write-bytes", type=int, default=512 << 20)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    g = grpc_floor(args.block_bytes, args.seconds)
    print(json.dumps({"bench": "floor_grpc_bytes", "block_bytes": args.block_bytes, **g}))
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        p = pages_floor(d, args.block_bytes, args.write_bytes)
    print(json.dumps({"bench": "floor_new_pages", "block_bytes": args.block_bytes, **p}))


if __name__ == "__main__":
    main()
