"""A nameserver and broker groups for the command-line tests of delayed sends and transactions:
the topic ``reminders`` has one queue per group, so round robin alternates between them and a
listing spans every master."""

from __future__ import annotations

import json
import time

from tests.integration.conftest import BrokerProcess, StartBroker, StartNameServer
from tests.integration.test_cli_client import tidemq
from tests.waiting import wait_until

TOPIC = "reminders"


class Cluster:
    def __init__(self, nameserver: str, brokers: dict[str, BrokerProcess]) -> None:
        self.ns = nameserver
        self.brokers = brokers


def start_cluster(
    start_nameserver: StartNameServer, start_broker: StartBroker, names: list[str], *flags: str
) -> Cluster:
    ns = start_nameserver().address
    brokers = {
        name: start_broker(
            *("--nameserver", ns, "--broker-name", name, "--auto-create-topics", *flags),
            store=name,
        )
        for name in names
    }

    def routed_everywhere() -> bool:
        # One queue per group: round robin alternates between the groups.
        if tidemq(ns, "topic", "create", TOPIC, "--queues", "1", check=False).returncode:
            return False
        route = json.loads(tidemq(ns, "topic", "describe", TOPIC, "--json").stdout)
        return set(route["brokers"]) == set(names)

    wait_until(routed_everywhere, 60, "every broker group to be routed and the topic created")
    return Cluster(ns, brokers)


def now_ms() -> int:
    return int(time.time() * 1000)
