"""A TCP proxy in front of ZooKeeper that can cut ZooKeeper's answers to one client at the worst
moment: right after a given write reaches the server. The write is committed, the client never
hears so, and ZooKeeper keeps hearing the client (its pings still pass), so the session lives
on. That is an asymmetric partition no firewall rule can time: the rule would have to land
between a read and the write that follows it a millisecond later.

The proxy reads ZooKeeper's framing only as far as it needs: each packet is a 4-byte big-endian
length and a body; after the connect handshake a request body starts with its xid and opcode
(setData: 5, then the path as a length-prefixed string) and an answer body with the xid it
answers. A multi (opcode 14, a transaction) is matched by the path of its first operation,
after that operation's 9-byte header. Once the armed write's answer comes back, that
connection's answers are dropped until the client gives up on it; a new connection passes
everything.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

SET_DATA = 5
MULTI = 14


def written_path(body: bytes) -> str | None:
    """The path a request body writes (a transaction: its first operation's), or None."""
    if len(body) < 8:
        return None
    opcode = struct.unpack(">i", body[4:8])[0]
    at = {SET_DATA: 8, MULTI: 17}.get(opcode)
    if at is None or len(body) < at + 4:
        return None
    (n,) = struct.unpack(">i", body[at : at + 4])
    return body[at + 4 : at + 4 + n].decode(errors="replace")


def _read_exactly(sock: socket.socket, n: int) -> bytes | None:
    chunks = []
    while n:
        try:
            chunk = sock.recv(n)
        except OSError:
            return None
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _packets(sock: socket.socket) -> Iterator[tuple[bytes, bytes]]:
    """(the packet as it came, its body) until the socket ends."""
    while (head := _read_exactly(sock, 4)) is not None:
        (length,) = struct.unpack(">i", head)
        body = _read_exactly(sock, length)
        if body is None:
            return
        yield head + body, body


def _end(*sockets: socket.socket) -> None:
    """Either side ending ends the connection: the other pump's read returns at once."""
    for s in sockets:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        s.close()


@dataclass
class _Armed:
    client_ips: frozenset[str]
    path: str
    cut: threading.Event = field(default_factory=threading.Event)
    xid: int | None = None  # of the matching write, once it has passed


class ZooKeeperAnswerCut:
    """Listens on ``host`` (a free port) and forwards to ``upstream`` ("host:port")."""

    def __init__(self, host: str, upstream: str) -> None:
        up_host, _, up_port = upstream.rpartition(":")
        self.upstream = (up_host, int(up_port))
        self._listener = socket.create_server((host, 0))
        self.hosts = f"{host}:{self._listener.getsockname()[1]}"
        self._armed: _Armed | None = None
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True, name="zk-answer-cut").start()

    def cut_answers_after_write(self, path: str, *client_ips: str) -> threading.Event:
        """Arm: the next write of ``path`` (a setData, or a transaction that starts with it)
        from one of ``client_ips`` passes; from its answer on, that connection hears nothing
        more. The event is set when the answer is dropped."""
        armed = _Armed(frozenset(client_ips), path)
        with self._lock:
            self._armed = armed
        return armed.cut

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            _end(*self._sockets)

    def _accept(self) -> None:
        while True:
            try:
                client, (ip, _) = self._listener.accept()
            except OSError:
                return  # closed
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            if self._listener.fileno() < 0:  # closed while connecting
                _end(client, server)
                return
            with self._lock:
                self._sockets += [client, server]
            mine: list[_Armed] = []  # the armed write this connection carried, if any
            threading.Thread(
                target=self._requests, args=(client, server, ip, mine), daemon=True
            ).start()
            threading.Thread(target=self._answers, args=(server, client, mine), daemon=True).start()

    def _requests(
        self, client: socket.socket, server: socket.socket, ip: str, mine: list[_Armed]
    ) -> None:
        first = True
        for raw, body in _packets(client):
            path = None if first else written_path(body)
            if path is not None:
                with self._lock:
                    armed = self._armed
                    if armed is not None and ip in armed.client_ips and armed.path == path:
                        armed.xid = struct.unpack(">i", body[:4])[0]
                        mine.append(armed)
                        self._armed = None
            first = False
            try:
                server.sendall(raw)
            except OSError:
                break
        _end(client, server)

    def _answers(self, server: socket.socket, client: socket.socket, mine: list[_Armed]) -> None:
        first = True
        cut = False
        for raw, body in _packets(server):
            if not first and mine and not cut:
                (xid,) = struct.unpack(">i", body[:4])
                if xid == mine[0].xid:
                    cut = True
                    mine[0].cut.set()
            first = False
            if cut:
                continue  # ZooKeeper answered; the client never hears it, or anything after
            try:
                client.sendall(raw)
            except OSError:
                break
        _end(client, server)
