"""Broker sessions on a real ZooKeeper: a killed broker leaves the routes when its session expires,
a stopped one at once; a broker whose session expired, or restarted while its old session still
holds its znode, registers again by itself.

Brokers here ask for 4 s sessions (the server's tickTime is 500 ms), so a dead broker leaves the
routes within seconds; every wait is a condition with a deadline.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.integration.conftest import StartBroker, StartNameServer
from tests.integration.zk_registry import (
    EXPIRY_SLACK_S,
    SESSION_MS,
    route_of,
    routed_broker,
    start_zk_broker,
    status,
    znode_owner,
)
from tests.integration.zookeeper import ZooKeeperServer
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def test_killed_broker_leaves_the_routes_within_its_session_timeout(
    zookeeper: ZooKeeperServer,
    zk_root: str,
    start_nameserver: StartNameServer,
    start_broker: StartBroker,
) -> None:
    ns, b = routed_broker(start_nameserver, start_broker, zookeeper, zk_root)

    b.kill()
    killed_at = time.monotonic()
    wait_until(
        lambda: route_of(ns, "orders") is None,
        SESSION_MS / 1000 + EXPIRY_SLACK_S,
        "the SIGKILLed broker's session to expire and its route to go",
    )
    # Nameservers never drop a broker on their own, only ZooKeeper's expiry does: the server
    # heard from the broker at most a ping interval (1/3 of the session) before the kill.
    assert time.monotonic() - killed_at > SESSION_MS / 1000 * 2 / 3 - 0.5
    assert status(ns).brokers == 0
    assert znode_owner(zookeeper, zk_root, "broker-a") == 0


def test_clean_shutdown_leaves_the_routes_at_once(
    zookeeper: ZooKeeperServer,
    zk_root: str,
    start_nameserver: StartNameServer,
    start_broker: StartBroker,
) -> None:
    # The longest session the server grants (20 ticks): only the broker's own delete can take
    # the route away within the deadline below.
    ns, b = routed_broker(start_nameserver, start_broker, zookeeper, zk_root, session_ms=10_000)

    b.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: route_of(ns, "orders") is None, 5, "the route to go at shutdown")
    # Waited for, not signalled again: a second SIGTERM after asyncio has put the default
    # handler back would kill the process on its way out.
    assert b.proc.wait(timeout=10) == 0
    b.terminate()  # only closes the test's channel now
    assert "unregistered from ZooKeeper" in b.log()

    # Nothing of the old process is left in the way: it registers again at once.
    port = int(b.address.rsplit(":", 1)[1])
    again = start_zk_broker(start_broker, zookeeper, zk_root, session_ms=10_000, port=port)
    wait_until(
        lambda: route_of(ns, "orders") == {"broker-a": {0: again.address}},
        10,
        "the restarted broker's route",
    )


def test_broker_registers_again_after_its_session_expired(
    zookeeper: ZooKeeperServer,
    zk_root: str,
    start_nameserver: StartNameServer,
    start_broker: StartBroker,
) -> None:
    ns, b = routed_broker(start_nameserver, start_broker, zookeeper, zk_root)
    first_session = znode_owner(zookeeper, zk_root, "broker-a")
    assert first_session != 0

    # Frozen past its session timeout, the broker cannot ping: ZooKeeper expires the session
    # for real and deletes its znode. Woken up, kazoo finds the session expired (LOST) and opens
    # a new one; the broker must notice and register again by itself.
    os.kill(b.proc.pid, signal.SIGSTOP)
    try:
        wait_until(
            lambda: route_of(ns, "orders") is None,
            SESSION_MS / 1000 + EXPIRY_SLACK_S,
            "ZooKeeper to expire the frozen broker's session",
        )
    finally:
        os.kill(b.proc.pid, signal.SIGCONT)
    wait_until(
        lambda: route_of(ns, "orders") == {"broker-a": {0: b.address}},
        20,
        "the broker to register again under a new session",
    )
    assert znode_owner(zookeeper, zk_root, "broker-a") not in (0, first_session)
    assert "session expired" in b.log()


def test_restarted_broker_waits_for_its_old_session_then_registers(
    zookeeper: ZooKeeperServer,
    zk_root: str,
    start_nameserver: StartNameServer,
    start_broker: StartBroker,
) -> None:
    ns, b = routed_broker(start_nameserver, start_broker, zookeeper, zk_root)
    old_session = znode_owner(zookeeper, zk_root, "broker-a")

    # Restarted at once on the same store and port, the broker finds its znode still held by
    # the dead process's session: it must wait for that session to expire, then take over.
    b.kill()
    port = int(b.address.rsplit(":", 1)[1])
    again = start_zk_broker(start_broker, zookeeper, zk_root, port=port)
    wait_until(
        lambda: znode_owner(zookeeper, zk_root, "broker-a") not in (0, old_session),
        SESSION_MS / 1000 + EXPIRY_SLACK_S + 5,
        "the restarted broker to own the znode",
    )
    wait_until(
        lambda: route_of(ns, "orders") == {"broker-a": {0: again.address}},
        10,
        "the restarted broker's route",
    )
    assert f"held by ZooKeeper session 0x{old_session:x}" in again.log()
