"""ZooKeeper sessions as tidemq's processes hold them: a kazoo client that keeps reconnecting,
the errors that mean "ZooKeeper unavailable", and the hand-over of kazoo's callbacks to the
asyncio loop. Shared by the nameserver's registry (``nameserver.zk_registry``) and the broker's
registration and failover agent (``broker.zk_registration``, ``broker.failover``).

kazoo runs session listeners in its connection thread and watch callbacks in its callback
thread; both only hand the event to the asyncio loop (``call_soon_threadsafe``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry
from kazoo.security import make_acl, make_digest_acl

from tidemq.protos.tls import TlsSettings

# kazoo's own default grows the pause between reconnection rounds up to an hour; a nameserver
# must notice a restarted ZooKeeper within seconds.
RECONNECT_MAX_DELAY_S = 2.0

ZK_ERRORS = (KazooException, KazooTimeoutError)


def new_client(
    hosts: str,
    session_timeout_ms: int,
    digest: tuple[str, str] | None = None,
    tls: TlsSettings | None = None,
) -> Any:
    """A kazoo client that keeps reconnecting, at most ``RECONNECT_MAX_DELAY_S`` apart. With
    ``digest`` (user, password) it authenticates as that identity and creates every znode with
    an ACL that lets only that identity change it, and anyone read it (nameservers read the
    registry without credentials). With ``tls`` it speaks TLS to ZooKeeper's secure client
    port: the server's certificate must chain to ``tls.ca_file`` and name the host dialled, and
    the client presents its own certificate (the process's, when it has one), which a server
    with ``ssl.clientAuth=need`` requires. The files are read at each connection, so a rotated
    certificate is used from the next reconnection on."""
    auth: dict[str, Any] = {}
    if tls is not None:
        auth.update(
            use_ssl=True,
            ca=tls.ca_file or None,
            certfile=tls.cert_file or None,
            keyfile=tls.key_file or None,
            verify_certs=True,
            check_hostname=True,
        )
    if digest is not None:
        user, password = digest
        auth |= {
            "auth_data": [("digest", f"{user}:{password}")],
            "default_acl": [
                make_digest_acl(user, password, all=True),
                make_acl("world", "anyone", read=True),
            ],
        }
    return KazooClient(
        hosts=hosts,
        timeout=session_timeout_ms / 1000,
        connection_retry=KazooRetry(
            max_tries=-1, delay=0.1, backoff=2, max_delay=RECONNECT_MAX_DELAY_S
        ),
        **auth,
    )


class KazooLoopBridge:
    """Hands kazoo's callbacks (its connection and watch threads, which must never block) over
    to the asyncio loop that owns the state. Subclasses set ``_loop`` and ``_wake`` and say what
    a session state change means in ``_session_changed``."""

    _loop: asyncio.AbstractEventLoop | None
    _wake: asyncio.Event

    def _session_changed(self, state: str) -> None:
        raise NotImplementedError

    def _on_session_event(self, state: str) -> None:
        self._post(self._session_changed, state)

    def _on_watch(self, event: Any) -> None:
        self._post(self._wake.set)

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the loop has closed: the process is exiting
            self._loop.call_soon_threadsafe(fn, *args)
