"""The HTTP endpoint a server exposes its own Prometheus registry on, at ``/metrics``, and the
series every server has: calls refused by authentication or permissions."""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.exposition import start_http_server


def auth_refusals_counter(registry: CollectorRegistry) -> Counter:
    return Counter(
        "tidemq_auth_refusals",
        "Calls refused by authentication or permissions (docs/security.md), by method and "
        "reason (no_credentials, malformed, unknown_key, stale_date, bad_signature, denied, "
        "not_a_broker, wrong_identity)",
        ["method", "reason"],
        registry=registry,
    )


class MetricsEndpoint:
    """``/metrics`` of one registry, served by a daemon thread."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def serve(self, listen: str) -> int:
        """Expose ``/metrics`` on ``listen`` (HOST:PORT); the bound port."""
        host, _, port = listen.rpartition(":")
        self._server, self._thread = start_http_server(
            int(port), addr=host.strip("[]"), registry=self.registry
        )
        bound: int = self._server.server_address[1]
        return bound

    def stop(self) -> None:
        """Stop serving; blocks until the server thread has left its loop."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join()
