"""What the SDK's clients share underneath: gRPC channels per address, and for the blocking
API a private event loop on a background thread.

The asyncio classes (``AsyncProducer``, ...) are the implementation; the blocking classes run one
of them on a ``LoopThread``, so both APIs behave the same and are tested together.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import grpc
from tenacity import wait_exponential, wait_random
from tenacity.wait import wait_base

from tidemq.protos.signing import Credentials
from tidemq.protos.signing import resolve as resolve_credentials
from tidemq.protos.tls import TlsSettings, aio_channel
from tidemq.protos.tls import resolve as resolve_tls

T = TypeVar("T")


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch (message born times)."""
    return time.time_ns() // 1_000_000


def monotonic_ms() -> int:
    """Milliseconds of a clock that never goes back: deadlines and intervals."""
    return time.monotonic_ns() // 1_000_000


NAMESERVER_ENV = "TIDEMQ_NAMESERVER"
DEFAULT_NAMESERVER = "127.0.0.1:9876"

CHANNEL_OPTIONS = [
    # Batches of large bodies need more than gRPC's 4 MiB default (the broker allows 64 MiB).
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
    # gRPC waits up to 120 s between reconnects to a broker that was down; a restarted master
    # must be found again within seconds.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
    # Each client its own connections: otherwise gRPC shares one per address across the
    # process, and a new client inherits another's backoff from a broker that just returned.
    ("grpc.use_local_subchannel_pool", 1),
]


def backoff() -> wait_base:
    """Retry waits: 50 ms doubling to 1 s, plus up to 50 ms of jitter so clients that failed
    together do not retry together."""
    return wait_exponential(multiplier=0.05, max=1.0) + wait_random(0, 0.05)


def nameserver_addresses(nameserver: str | Sequence[str] | None) -> tuple[str, ...]:
    """``"h1:p1,h2:p2"``, a list, or None (then $TIDEMQ_NAMESERVER, then 127.0.0.1:9876)."""
    if nameserver is None:
        nameserver = os.environ.get(NAMESERVER_ENV) or DEFAULT_NAMESERVER
    items = nameserver.split(",") if isinstance(nameserver, str) else list(nameserver)
    addresses = tuple(a.strip() for a in items if a.strip())
    if not addresses:
        raise ValueError("at least one nameserver address (HOST:PORT) is required")
    for a in addresses:
        host, sep, port = a.rpartition(":")
        if not (sep and host and port.isdigit()):
            raise ValueError(f"nameserver address {a!r} must be HOST:PORT")
    return addresses


class Channels:
    """One grpc.aio channel per address, created on first use, on the loop that uses them; over
    TLS when ``tls`` is given (docs/security.md). ``tls`` is a client's ``tls=`` argument:
    ``TlsSettings``, True (the system's roots), False (plaintext), or None (``TIDEMQ_TLS_*``
    decide). Every call is signed with ``credentials`` (``Credentials``; False: none; None:
    ``TIDEMQ_ACCESS_KEY``/``TIDEMQ_SECRET_KEY`` decide)."""

    def __init__(
        self,
        tls: TlsSettings | bool | None = None,
        credentials: Credentials | bool | None = None,
    ) -> None:
        self.tls = resolve_tls(tls)
        self.credentials = resolve_credentials(credentials)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[tuple[str, object], Any] = {}

    def stub(self, address: str, stub_class: Callable[[grpc.aio.Channel], T]) -> T:
        key = (address, stub_class)
        stub = self._stubs.get(key)
        if stub is None:
            channel = self._channels.get(address)
            if channel is None:
                channel = aio_channel(address, self.tls, CHANNEL_OPTIONS, self.credentials)
                self._channels[address] = channel
            stub = stub_class(channel)
            self._stubs[key] = stub
        return stub

    async def close(self) -> None:
        channels, self._channels, self._stubs = self._channels, {}, {}
        for channel in channels.values():
            await channel.close()


class LoopThread:
    """An event loop running on a daemon thread, for the blocking API."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        if threading.current_thread() is self._thread:
            raise RuntimeError("a blocking tidemq call was made from inside its own event loop")
        return self.submit(coro).result(timeout_s)

    def finish(self, close: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run a client's ``close`` on the loop, then stop the loop; a second call does nothing."""
        try:
            if not self.loop.is_closed():
                self.run(close())
        finally:
            self.stop()

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()
