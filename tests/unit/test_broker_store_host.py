"""The IP:PORT a broker stamps on what it stores (part of every message id) is an IP address
even when it advertises a host name, as a container's mapped port or a load balancer's name."""

from __future__ import annotations

import pytest

from tidemq.services.broker.config import BrokerConfig
from tidemq.storage.config import parse_host

pytestmark = pytest.mark.unit


def test_an_advertised_ip_is_the_store_host() -> None:
    config = BrokerConfig("store", listen="0.0.0.0:10911", advertise="10.1.2.3:30001")
    assert config.store_host() == "10.1.2.3:30001"


def test_an_advertised_name_is_resolved_keeping_its_port() -> None:
    config = BrokerConfig("store", listen="0.0.0.0:10911", advertise="localhost:32770")
    assert config.store_host() == "127.0.0.1:32770"
    parse_host(config.store_host())  # what the store accepts


def test_a_name_that_does_not_resolve_yet_falls_back_to_the_listen_address() -> None:
    config = BrokerConfig("store", listen="127.0.0.1:10911", advertise="broker-a-0.invalid:10911")
    assert config.store_host() == "127.0.0.1:10911"
