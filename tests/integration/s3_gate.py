"""A gate in front of the test S3 server: a loopback HTTP proxy the broker's archive talks to,
which the test can close (the archive becomes unreachable: connections are refused) and which
can hold chunk uploads after the first few (the broker is then mid-upload, for as long as the
test wants, and can be killed there)."""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade"}


class S3Gate:
    def __init__(self, upstream: str) -> None:
        u = urlparse(upstream)
        self._upstream = (u.hostname or "127.0.0.1", u.port or 80)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port: int = s.getsockname()[1]
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._chunk_puts = 0
        self._hold_after: int | None = None
        self.holding = threading.Event()  # set once an upload is being held
        self._release = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._connections: set[socket.socket] = set()

    @property
    def chunk_puts(self) -> int:
        """Chunk uploads forwarded so far."""
        return self._chunk_puts

    def hold_chunk_uploads_after(self, n: int) -> None:
        """Forward ``n`` more chunk uploads, then hold every later one unanswered."""
        with self._lock:
            self._hold_after = self._chunk_puts + n
        self._release.clear()
        self.holding.clear()

    def release(self) -> None:
        with self._lock:
            self._hold_after = None
        self._release.set()

    def open(self) -> None:
        gate = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                with gate._lock:
                    gate._connections.add(self.connection)

            def finish(self) -> None:
                with gate._lock:
                    gate._connections.discard(self.connection)
                super().finish()

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if self.command == "PUT" and "/chunk-" in self.path and not gate._admit_chunk():
                    gate._release.wait(120)
                    self.close_connection = True
                    return
                conn = http.client.HTTPConnection(*gate._upstream, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS}
                conn.request(self.command, self.path, body=body, headers=headers)
                reply = conn.getresponse()
                data = reply.read()
                self.send_response(reply.status, reply.reason)
                for k, v in reply.getheaders():
                    if k.lower() not in _HOP_HEADERS and k.lower() != "content-length":
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def _admit_chunk(self) -> bool:
        with self._lock:
            if self._hold_after is not None and self._chunk_puts >= self._hold_after:
                self.holding.set()
                return False
            self._chunk_puts += 1
            return True

    def close(self) -> None:
        """Connections are refused from now on (the archive is unreachable)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with self._lock:  # and kept-alive connections are cut
            for conn in self._connections:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
