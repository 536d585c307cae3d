"""``tidemq broker-group config show|set`` against a real master and slave: a change applies at
once, survives the master's restart and reaches the slave by the config sync; a bad key or value
is one typed line and changes nothing."""

from __future__ import annotations

import json

import grpc
import pytest

from tests.integration import replicas
from tests.integration.conftest import BrokerProcess, StartBroker, StartNameServer
from tests.integration.test_cli_client import tidemq
from tests.waiting import wait_until
from tidemq.protos import broker_pb2, common_pb2

pytestmark = pytest.mark.integration

GROUP = replicas.GROUP


def settings(ns: str, *flags: str) -> dict[str, dict[str, object]]:
    out = tidemq(ns, "broker-group", "config", "show", GROUP, "--json", *flags).stdout
    return {s["key"]: s for s in json.loads(out)}


def values(b: BrokerProcess) -> dict[str, str]:
    """The broker's settings asked directly (fewer CLI starts keep the test short)."""
    r = b.stub().GetBrokerConfig(broker_pb2.GetBrokerConfigRequest(), timeout=10)
    return {e.key: e.value for e in r.entries}


def send_three(master: BrokerProcess) -> None:
    msgs = [common_pb2.Message(topic="orders", body=b"x", queue_id=0) for _ in range(3)]
    master.stub().SendMessage(broker_pb2.SendMessageRequest(messages=msgs), timeout=10)


def test_set_applies_at_once_persists_and_reaches_the_slave(
    start_nameserver: StartNameServer, start_broker: StartBroker
) -> None:
    nameserver = start_nameserver()
    ns = nameserver.address
    master = replicas.start(start_broker, nameserver, "master")
    replicas.create_topic(master)
    slave = replicas.start_slave(start_broker, nameserver)
    before = settings(ns)
    assert before["max_batch_messages"]["changeable"] is True
    assert before["listen"]["changeable"] is False and "secret_key" not in before

    out = tidemq(ns, "broker-group", "config", "set", GROUP, "max_batch_messages=2",
                 "file_reserved_time_hours=48")  # fmt: skip
    assert "2 setting(s) changed" in out.stdout
    # Applies at once: a send of three messages in one request is now refused.
    with pytest.raises(grpc.RpcError) as refused:
        send_three(master)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "at most 2 messages" in str(refused.value.details())
    assert values(master)["max_batch_messages"] == "2"
    wait_until(
        lambda: values(slave)["file_reserved_time_hours"] == "48.0",
        20,
        "the slave to copy the master's settings",
    )
    text = tidemq(ns, "broker-group", "config", "show", GROUP, "--broker-id", "1").stdout
    # The slave shows the master's value beside its own config file's.
    assert any(
        line.split()[:3] == ["max_batch_messages", "2", "1024"] for line in text.splitlines()
    )

    bad_key = tidemq(ns, "broker-group", "config", "set", GROUP, "max_batch_messages=5",
                     "listen=1.2.3.4:1", check=False)  # fmt: skip
    assert bad_key.returncode == 1 and "Traceback" not in bad_key.stderr
    assert bad_key.stderr.startswith("tidemq: INVALID_ARGUMENT"), bad_key.stderr
    assert "listen cannot change while the broker runs" in bad_key.stderr
    bad_value = tidemq(ns, "broker-group", "config", "set", GROUP,
                       "disk_max_used_space_ratio=0.99", check=False)  # fmt: skip
    assert bad_value.returncode == 1 and "disk ratios" in bad_value.stderr
    assert values(master)["max_batch_messages"] == "2"  # nothing changed

    assert master.terminate() == 0
    master = replicas.start(start_broker, nameserver, "master")
    assert values(master)["max_batch_messages"] == "2"  # kept across the restart
    wait_until(
        lambda: tidemq(ns, "broker-group", "config", "set", GROUP, "max_batch_messages=",
                       check=False).returncode == 0,
        30,
        "the restarted master to be registered and take the change",
    )  # fmt: skip
    assert values(master)["max_batch_messages"] == before["max_batch_messages"]["value"]
    send_three(master)
