"""The ZooKeeper registry's znode format and layout (``tidemq.services.nameserver.zk_format``)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.services.nameserver import zk_format, zk_settings
from tidemq.services.nameserver.route_model import (
    BrokerRegistration,
    BrokerRole,
    DataVersion,
    TopicQueues,
)
from tidemq.services.nameserver.zk_format import BrokerNodeName, ZnodeDataError
from tidemq.services.nameserver.zk_settings import ZooKeeperConfigError

pytestmark = pytest.mark.unit

NODE = BrokerNodeName("DefaultCluster", "broker-a", 0)
REG = BrokerRegistration(
    cluster="DefaultCluster",
    broker_name="broker-a",
    broker_id=0,
    address="10.0.0.1:10911",
    ha_address="10.0.0.1:10912",
    role=BrokerRole.SYNC_MASTER,
    epoch=3,
    data_version=DataVersion(3, 7, 1_700_000_000_000),
    topics=(TopicQueues("payments", 8, 8, 6), TopicQueues("orders", 4, 2, 4)),
)
# Pinned: every broker and nameserver version must read these bytes the same way.
GOLDEN = (
    b'{"address":"10.0.0.1:10911","broker_id":0,"broker_name":"broker-a",'
    b'"cluster":"DefaultCluster","data_version":{"counter":7,"state_version":3,'
    b'"timestamp_ms":1700000000000},"epoch":3,"format":1,"ha_address":"10.0.0.1:10912",'
    b'"role":"SYNC_MASTER","topics":[{"perm":4,"read_queue_nums":4,"topic":"orders",'
    b'"write_queue_nums":2},{"perm":6,"read_queue_nums":8,"topic":"payments",'
    b'"write_queue_nums":8}]}'
)


def doc(**changes: Any) -> dict[str, Any]:
    d: dict[str, Any] = json.loads(GOLDEN)
    d.update(changes)
    return d


def topic(name: str, perm: int = 6) -> dict[str, Any]:
    return {"topic": name, "read_queue_nums": 1, "write_queue_nums": 1, "perm": perm}


def encoded(d: dict[str, Any]) -> bytes:
    return json.dumps(d).encode()


def test_encoding_is_pinned() -> None:
    assert zk_format.encode_registration(REG) == GOLDEN


def test_decoding_gives_back_the_registration_with_topics_in_name_order() -> None:
    reg = zk_format.decode_registration(NODE, GOLDEN)
    by_name = tuple(sorted(REG.topics, key=lambda t: t.topic))
    assert reg == dataclasses.replace(REG, topics=by_name)


def test_unknown_keys_are_ignored_within_format_1() -> None:
    reg = zk_format.decode_registration(NODE, encoded(doc(zone="eu-1", weight=3)))
    assert reg.address == REG.address


def test_a_slave_without_ha_address_and_topics_decodes() -> None:
    node = BrokerNodeName("DefaultCluster", "broker-a", 2)
    reg = zk_format.decode_registration(
        node, encoded(doc(broker_id=2, role="SLAVE", ha_address="", topics=[]))
    )
    assert (reg.broker_id, reg.role, reg.ha_address, reg.topics) == (2, BrokerRole.SLAVE, "", ())


@pytest.mark.parametrize(
    ("data", "complaint"),
    [
        (b"\xff\xfe", "not UTF-8"),
        (b"{not json", "not JSON"),
        (b"[" * 100_000, "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (encoded(doc(format=3)), "format 3 is not 1 or 2"),
        (encoded(doc(format="1")), "format '1' is not 1 or 2"),
        (encoded({k: v for k, v in doc().items() if k != "format"}), "format None"),
        (encoded({k: v for k, v in doc().items() if k != "address"}), "address must be a string"),
        (encoded(doc(broker_id=True)), "broker_id must be an integer, got bool"),
        (encoded(doc(epoch=1.0)), "epoch must be an integer, got float"),
        (encoded(doc(epoch=-1)), "epoch must be >= 0"),
        (encoded(doc(epoch=2**70)), "cannot hold"),
        (encoded(doc(role="LEADER")), "role 'LEADER' is not one of"),
        (encoded(doc(role="SLAVE")), "id 0 is the master"),
        (encoded(doc(address="10.0.0.1")), "is not HOST:PORT"),
        (encoded(doc(ha_address="10.0.0.1:0")), "port must be"),
        (encoded(doc(data_version=[1, 2, 3])), "data_version must be an object"),
        (encoded(doc(data_version={"counter": 1})), "data_version.state_version must be"),
        (encoded(doc(topics={"orders": 8})), "topics must be a list"),
        (encoded(doc(topics=["orders"])), "topics[0] is not an object"),
        (encoded(doc(topics=[{"topic": "orders"}])), "topics[0].read_queue_nums must be"),
        (encoded(doc(topics=[topic("o"), topic("o")])), "appears twice"),
        (encoded(doc(topics=[topic("o/x")])), "topics[0].topic"),
        (encoded(doc(topics=[topic("o", perm=99)])), "is not a combination of Permission bits"),
        (encoded(doc(cluster="Default Cluster")), "must be 1-127 letters"),
        (encoded(doc(broker_name="b" * 128)), "must be 1-127 letters"),
        (encoded(doc(cluster="DefaultCluster\n")), "must be 1-127 letters"),
        (encoded(doc(address="10.0.0.1:9876\n")), "port must be"),
        (encoded(doc(address="broker-a\n:9876")), "is not a host name"),
        (encoded(doc(cluster="\ud800")), "surrogates not allowed"),
        (encoded(doc(broker_name="broker-b")), "znode is DefaultCluster/broker-a/0"),
        (b" " * (zk_format.MAX_DATA_BYTES + 1), "over the"),
    ],
)
def test_bad_content_is_refused_with_a_reason(data: bytes, complaint: str) -> None:
    with pytest.raises(ZnodeDataError) as refused:
        zk_format.decode_registration(NODE, data)
    assert complaint in str(refused.value)


def test_a_registration_over_the_znode_limit_is_refused_at_encoding() -> None:
    topics = tuple(TopicQueues(f"topic-{i:06d}-" + "x" * 100, 8, 8, 6) for i in range(10_000))
    with pytest.raises(ZnodeDataError, match="over the 1000000-byte znode limit"):
        zk_format.encode_registration(dataclasses.replace(REG, topics=topics))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_any_bytes_decode_or_are_refused(data: bytes) -> None:
    with contextlib.suppress(ZnodeDataError):
        zk_format.decode_registration(NODE, data)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from([*sorted(doc()), "extra"]), json_values, max_size=len(doc()) + 1
    )
)
def test_any_json_in_place_of_any_field_decodes_or_is_refused(changes: dict[str, Any]) -> None:
    with contextlib.suppress(ZnodeDataError):
        zk_format.decode_registration(NODE, encoded(doc(**changes)))


# -- layout ---------------------------------------------------------------------------------------


def test_node_path_and_name() -> None:
    assert zk_format.node_path("/tidemq", "c1", "broker-a", 1) == "/tidemq/clusters/c1/broker-a/1"
    assert zk_format.node_path("/", "c1", "broker-a", 0) == "/clusters/c1/broker-a/0"
    assert zk_format.parse_node_name("c1", "broker-a", "12") == BrokerNodeName("c1", "broker-a", 12)


@pytest.mark.parametrize("name", ["01", "-1", "+1", "1.0", "x", "", "1" * 20, "٣", "1\n"])
def test_znode_names_that_are_not_canonical_ids_are_refused(name: str) -> None:
    with pytest.raises(ZnodeDataError, match="is not a broker id"):
        zk_format.parse_node_name("c1", "broker-a", name)


@pytest.mark.parametrize(
    ("cluster", "name"), [(".", "b"), ("c", ".."), ("c", "a/b"), ("", "b"), ("c\n", "b")]
)
def test_names_zookeeper_cannot_hold_are_refused(cluster: str, name: str) -> None:
    with pytest.raises(ZooKeeperConfigError, match="is not a znode name"):
        zk_format.node_path("/tidemq", cluster, name, 0)


@pytest.mark.parametrize("root", ["/", "/tidemq", "/a/b.c/d_e-f"])
def test_good_roots(root: str) -> None:
    assert zk_settings.check_root(root) == root


@pytest.mark.parametrize(
    ("root", "complaint"),
    [
        ("tidemq", "absolute path"),
        ("", "absolute path"),
        ("/tidemq/", "is not a znode name"),
        ("//x", "is not a znode name"),
        ("/a/../b", "is not a znode name"),
        ("/a b", "is not a znode name"),
        ("/zookeeper", "ZooKeeper's own"),
        ("/" + "a" * 600, "longer than"),
    ],
)
def test_bad_roots(root: str, complaint: str) -> None:
    with pytest.raises(ZooKeeperConfigError, match=complaint):
        zk_settings.check_root(root)


@pytest.mark.parametrize(
    "hosts",
    [
        "127.0.0.1:2181",
        "zk1:2181,zk2:2181,zk3:2181",
        "zk1,zk2",
        "[::1]:2181",
        "[::1]",
        "zk1:2181,zk2:2181/apps/mq",
    ],
)
def test_good_hosts(hosts: str) -> None:
    assert zk_settings.check_hosts(hosts) == hosts


@pytest.mark.parametrize(
    ("hosts", "complaint"),
    [
        ("", "no HOST:PORT"),
        ("/chroot", "no HOST:PORT"),
        ("zk1:2181,", "an empty entry"),
        ("zk1:2181,,zk2:2181", "an empty entry"),
        ("zk 1:2181", "is not a host name"),
        ("zk1:99999", "port must be"),
        ("::1:2181", "IPv6 host in brackets"),
        ("zk1:2181/a/", "chroot"),
    ],
)
def test_bad_hosts(hosts: str, complaint: str) -> None:
    with pytest.raises(ZooKeeperConfigError, match=complaint):
        zk_settings.check_hosts(hosts)


@pytest.mark.parametrize("timeout_ms", [999, 600_001, 0, -5])
def test_session_timeouts_out_of_range_are_refused(timeout_ms: int) -> None:
    with pytest.raises(ZooKeeperConfigError, match="session timeout"):
        zk_settings.check_session_timeout_ms(timeout_ms)
