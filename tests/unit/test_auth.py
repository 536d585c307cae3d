"""Authentication and permissions without sockets or a clock: the signed header (pinned by the
official clients' bytes), the ACL file, the rule of every RPC, and the guard's decisions."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from google.protobuf import message_factory  # type: ignore[import-untyped]
from hypothesis import given
from hypothesis import strategies as st

from tidemq.protos import broker_pb2, common_pb2, nameserver_pb2, replication_pb2, signing
from tidemq.protos.rocketmq import definition_pb2, service_pb2
from tidemq.services.auth import acl
from tidemq.services.auth.guard import Caller, Guard, Refusal, Who
from tidemq.services.auth.rules import RULES, Kind

# What the official Python client (rocketmq.v5.util.signature) and `openssl dgst -sha1 -hmac`
# compute for secret key 12345678 at 2026-12-01 22:30:40 UTC.
DATE = "20261201T223040Z"
DATE_S = 1796164240
SIGNATURE = "e5e2a938603c482d0f219a3bc87df5559b598cf4"
HEADER = f"MQv2-HMAC-SHA1 Credential=RocketMQ, SignedHeaders=x-mq-date-time, Signature={SIGNATURE}"

ACL_FILE = """
globalWhiteRemoteAddresses:
  - 10.10.103.*
accounts:
  - accessKey: RocketMQ
    secretKey: 12345678
    whiteRemoteAddress: 192.168.1.{7,8}
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - orders=PUB|SUB
      - audit=SUB
      - payments=PUB
    groupPerms:
      - fraud=DENY
  - accessKey: ops
    secretKey: opssecret
    admin: true
"""


def test_signed_metadata_is_what_the_official_clients_send() -> None:
    creds = signing.Credentials("RocketMQ", "12345678")
    assert creds.metadata(DATE_S) == (("x-mq-date-time", DATE), ("authorization", HEADER))
    assert signing.parse_date_time(DATE) == DATE_S
    parsed = signing.parse_authorization(HEADER)
    assert parsed.access_key == "RocketMQ" and parsed.signed_headers == ("x-mq-date-time",)
    assert parsed.verifies("12345678", DATE) and not parsed.verifies("12345679", DATE)
    # The Java and Node.js clients write the hex in upper case and the same fields.
    java = signing.parse_authorization(HEADER.replace(SIGNATURE, SIGNATURE.upper()))
    assert java.verifies("12345678", DATE)
    assert "12345678" not in repr(creds)


@pytest.mark.parametrize(
    "header",
    [
        "Basic dXNlcjpwYXNz",
        "MQv2-HMAC-SHA1 Credential=RocketMQ, SignedHeaders=x-mq-date-time",
        "MQv2-HMAC-SHA1 Credential=RocketMQ, SignedHeaders=x-mq-date-time, Signature=zz",
        "MQv2-HMAC-SHA1 Credential=RocketMQ, SignedHeaders=host, Signature=00",
        "MQv2-HMAC-SHA1 Credential=a, junk, SignedHeaders=x-mq-date-time, Signature=00",
        "MQv2-HMAC-SHA1 " + "Credential=" + "a" * 2000,
    ],
)
def test_malformed_authorization_headers_are_refused_as_such(header: str) -> None:
    with pytest.raises(signing.SignatureFormatError):
        signing.parse_authorization(header)


@given(st.text(max_size=300))
def test_any_authorization_header_parses_or_is_refused_typed(header: str) -> None:
    with contextlib.suppress(signing.SignatureFormatError):
        signing.parse_authorization(header)


@given(st.text(max_size=40))
def test_any_date_parses_or_is_refused_typed(value: str) -> None:
    with contextlib.suppress(signing.SignatureFormatError):
        signing.parse_date_time(value)


def test_credentials_refuse_what_cannot_be_signed_and_come_from_the_environment() -> None:
    with pytest.raises(ValueError, match="both an access key and a secret key"):
        signing.Credentials("ak", "")
    with pytest.raises(ValueError, match="cannot hold"):
        signing.Credentials("a, b", "secret")
    assert signing.Credentials.from_env({}) is None
    env = {"TIDEMQ_ACCESS_KEY": "ak", "TIDEMQ_SECRET_KEY": "sk123456"}
    assert signing.Credentials.from_env(env) == signing.Credentials("ak", "sk123456")
    assert signing.resolve(False) is None
    with pytest.raises(TypeError):
        signing.resolve("ak:sk")  # type: ignore[arg-type]


def test_a_rocketmq_acl_file_reads_as_rocketmq_means_it() -> None:
    parsed = acl.parse(ACL_FILE)
    app, ops = parsed.accounts["RocketMQ"], parsed.accounts["ops"]
    assert ops.admin and not app.admin
    assert app.topic_perm("orders") == acl.Perm.PUB | acl.Perm.SUB
    assert app.topic_perm("payments") == acl.Perm.PUB
    assert app.topic_perm("unlisted") == acl.Perm.DENY
    assert app.group_perm("billing") == acl.Perm.SUB  # the default
    assert app.group_perm("fraud") == acl.Perm.DENY
    assert app.topic_perm("%RETRY%billing") == acl.Perm.SUB  # the group's
    assert app.topic_perm("%DLQ%fraud") == acl.Perm.DENY
    assert app.white_listed("192.168.1.7") and not app.white_listed("192.168.1.9")
    assert parsed.globally_white_listed("10.10.103.200")
    assert not parsed.globally_white_listed("10.10.104.1")
    assert "12345678" not in repr(app)


@pytest.mark.parametrize(
    ("pattern", "inside", "outside"),
    [
        ("*", "8.8.8.8", "::1"),
        ("10.1.*", "10.1.200.3", "10.2.0.1"),
        ("192.168.1.10-20", "192.168.1.15", "192.168.1.21"),
        ("10.0.0.0/8", "10.255.0.1", "11.0.0.1"),
        ("127.0.0.1", "127.0.0.1", "127.0.0.2"),
        ("::1", "::1", "127.0.0.1"),
    ],
)
def test_address_patterns(pattern: str, inside: str, outside: str) -> None:
    p = acl.AddressPattern(pattern, "test")
    assert p.matches(inside) and not p.matches(outside)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("accounts: [{accessKey: a, secretKey: 12345678, defaultTopicPerm: WRITE}]", "WRITE"),
        ("accounts: [{accessKey: a}]", "needs accessKey and secretKey"),
        ("accounts: [{accessKey: a, secretKey: short}]", "at least 6"),
        ("accounts: [{accessKey: a, secretKey: 12345678, admin: yes please}]", "admin must be"),
        ("accounts: [{accessKey: a, secretKey: 12345678}, {accessKey: a, secretKey: 87654321}]",
         "appears twice"),
        ("accounts: [{accessKey: a, secretKey: 12345678, topicPerms: [orders]}]", "NAME=PERM"),
        ("globalWhiteRemoteAddresses: [300.1.1.1]", "not an address pattern"),
        ("accounts: {a: b}", "must be a list"),
        ("[unclosed", "not valid YAML"),
    ],
)  # fmt: skip
def test_unusable_acl_files_are_refused_naming_the_problem(text: str, problem: str) -> None:
    with pytest.raises(acl.AclFileError, match=problem):
        acl.parse(text)


def _services() -> list[Any]:
    return [
        s
        for mod in (broker_pb2, nameserver_pb2, replication_pb2, service_pb2)
        for s in mod.DESCRIPTOR.services_by_name.values()
    ]


def _methods() -> list[tuple[str, Any]]:
    return [(f"/{s.full_name}/{m.name}", m) for s in _services() for m in s.methods]


def test_every_rpc_of_every_service_has_a_rule_and_nothing_else_does() -> None:
    methods = dict(_methods())
    assert sorted(RULES) == sorted(methods)
    for name, m in methods.items():
        rule = RULES[name]
        if callable(rule) and not isinstance(rule, Kind):
            # Runs on the request it is for (an empty one) without error.
            request = _message_class(m.input_type)()
            assert all(need.kind in ("topic", "group", "admin") for need in rule(request))


def _message_class(descriptor: Any) -> Any:
    return message_factory.GetMessageClass(descriptor)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _guard(
    text: str | None = ACL_FILE, *, mtls: bool = False, own: str | None = "group-a"
) -> Guard:
    return Guard(
        acl.parse(text) if text is not None else None,
        brokers_by_certificate=mtls,
        max_clock_skew_ms=60_000,
        own_group=own,
        now_s=Clock(DATE_S + 30),
    )


def _signed(ak: str = "RocketMQ", sk: str = "12345678", at: int = DATE_S) -> dict[str, str]:
    return dict(signing.Credentials(ak, sk).metadata(at))


PULL = "/tidemq.v1.Broker/PullMessage"
SEND = "/tidemq.v1.Broker/SendMessage"


def _refusal(guard: Guard, method: str, caller: Caller, request: Any) -> tuple[str, str]:
    with pytest.raises(Refusal) as e:
        guard.check(method, caller, request)
    return e.value.status, e.value.reason


def test_who_a_caller_is_and_why_not() -> None:
    guard = _guard()
    pull = broker_pb2.PullMessageRequest(group="billing", topic="orders")
    ok = guard.check(PULL, Caller("10.0.0.1", _signed()), pull)
    assert ok.account is not None and ok.account.access_key == "RocketMQ"

    def refused(metadata: dict[str, str], ip: str = "10.0.0.1") -> tuple[str, str]:
        return _refusal(guard, PULL, Caller(ip, metadata), pull)

    assert refused({}) == ("UNAUTHENTICATED", "no_credentials")
    assert refused(_signed(sk="wrong-secret")) == ("UNAUTHENTICATED", "bad_signature")
    assert refused(_signed(ak="nobody")) == ("UNAUTHENTICATED", "unknown_key")
    with pytest.raises(Refusal) as e:
        guard.check(PULL, Caller("10.0.0.1", _signed(ak="x" * 900)), pull)
    assert len(str(e.value)) < 120  # a caller's access key is cut, not echoed whole
    assert refused(_signed(at=DATE_S - 3600)) == ("UNAUTHENTICATED", "stale_date")
    assert refused(_signed(at=DATE_S + 3600)) == ("UNAUTHENTICATED", "stale_date")
    assert refused({"authorization": "Basic x"}) == ("UNAUTHENTICATED", "malformed")
    assert refused({**_signed(), "x-mq-date-time": "yesterday"}) == ("UNAUTHENTICATED", "malformed")
    # The Python client sends an empty Credential without credentials configured.
    empty = {"authorization": HEADER.replace("Credential=RocketMQ", "Credential=")}
    assert refused(empty) == ("UNAUTHENTICATED", "no_credentials")

    # White lists: the account's skips the signature, the global one the credentials.
    assert guard.check(PULL, Caller("192.168.1.7", _signed(sk="wrong-secret")), pull).account
    assert guard.check(PULL, Caller("10.10.103.9", {}), pull).white_listed


def test_the_message_names_the_access_key_and_the_resource_never_the_secret() -> None:
    guard = _guard()
    with pytest.raises(Refusal) as e:
        guard.check(
            SEND,
            Caller("10.0.0.1", _signed()),
            broker_pb2.SendMessageRequest(messages=[common_pb2.Message(topic="audit")]),
        )
    assert e.value.status == "PERMISSION_DENIED"
    assert "'RocketMQ'" in str(e.value) and "topic 'audit'" in str(e.value)
    assert "12345678" not in str(e.value)
    with pytest.raises(Refusal) as e:
        guard.check(PULL, Caller("10.0.0.1", _signed(sk="wrong-secret")), None)
    assert "wrong-secret" not in str(e.value) and "12345678" not in str(e.value)


@pytest.mark.parametrize(
    ("method", "request_", "allowed"),
    [
        (SEND, broker_pb2.SendMessageRequest(messages=[common_pb2.Message(topic="orders")]), True),
        (SEND, broker_pb2.SendMessageRequest(block_topic="payments", blocks=[{}]), True),
        (SEND, broker_pb2.SendMessageRequest(messages=[common_pb2.Message(topic="audit")]), False),
        (SEND, broker_pb2.SendMessageRequest(
            messages=[common_pb2.Message(topic="orders"), common_pb2.Message(topic="x")]), False),
        (PULL, broker_pb2.PullMessageRequest(group="billing", topic="audit"), True),
        (PULL, broker_pb2.PullMessageRequest(group="billing", topic="payments"), False),
        (PULL, broker_pb2.PullMessageRequest(group="fraud", topic="orders"), False),
        (PULL, broker_pb2.PullMessageRequest(group="billing", topic="%RETRY%billing"), True),
        ("/tidemq.v1.Broker/CommitOffset",
         broker_pb2.CommitOffsetRequest(group="billing", topic="orders"), True),
        ("/tidemq.v1.Broker/CommitOffset",
         broker_pb2.CommitOffsetRequest(group="billing", topic="orders", reset=True), False),
        ("/tidemq.v1.Broker/CreateTopic", broker_pb2.CreateTopicRequest(), False),
        ("/tidemq.v1.Broker/Switchover", broker_pb2.SwitchoverRequest(), False),
        ("/tidemq.v1.Broker/EndTransaction", broker_pb2.EndTransactionRequest(), True),
        ("/tidemq.v1.NameServer/QueryRoute", nameserver_pb2.QueryRouteRequest(topic="audit"),
         True),
        ("/tidemq.v1.NameServer/QueryRoute", nameserver_pb2.QueryRouteRequest(topic="secret"),
         False),
        ("/apache.rocketmq.v2.MessagingService/SendMessage", service_pb2.SendMessageRequest(
            messages=[definition_pb2.Message(topic=definition_pb2.Resource(name="orders"))]),
         True),
        ("/apache.rocketmq.v2.MessagingService/ReceiveMessage", service_pb2.ReceiveMessageRequest(
            group=definition_pb2.Resource(name="fraud"),
            message_queue=definition_pb2.MessageQueue(
                topic=definition_pb2.Resource(name="orders"))), False),
    ],
)  # fmt: skip
def test_permissions_of_a_plain_account(method: str, request_: Any, allowed: bool) -> None:
    guard = _guard()
    caller = Caller("10.0.0.1", _signed())
    admin = Caller("10.0.0.1", _signed("ops", "opssecret"))
    assert guard.check(method, admin, request_).account is not None  # admins may do anything
    if allowed:
        guard.check(method, caller, request_)
    else:
        assert _refusal(guard, method, caller, request_) == ("PERMISSION_DENIED", "denied")


def _register(name: str, broker_id: int) -> Any:
    identity = common_pb2.BrokerIdentity(broker_name=name, broker_id=broker_id)
    return nameserver_pb2.RegisterBrokerRequest(broker=common_pb2.BrokerInfo(identity=identity))


def test_cluster_calls_come_from_the_broker_the_certificate_names() -> None:
    guard = _guard(mtls=True, own=None)  # a nameserver
    register = "/tidemq.v1.NameServer/RegisterBroker"
    slave = Caller("10.0.0.2", {}, "broker:group-a:1")
    assert guard.check(register, slave, _register("group-a", 1)).broker is not None
    assert guard.check(register, slave, _register("group-a", 0)).broker  # an elected master
    assert _refusal(guard, register, slave, _register("group-a", 2)) == (
        "PERMISSION_DENIED",
        "wrong_identity",
    )
    assert _refusal(guard, register, slave, _register("group-b", 1))[1] == "wrong_identity"
    # A client's certificate, or an admin's credentials, are not a broker's.
    app = Caller("10.0.0.3", {}, "app")
    assert _refusal(guard, register, app, _register("group-a", 1)) == (
        "UNAUTHENTICATED",
        "no_credentials",
    )
    app = Caller("10.0.0.3", _signed(), "app")
    assert _refusal(guard, register, app, _register("group-a", 1)) == (
        "PERMISSION_DENIED",
        "not_a_broker",
    )
    admin = Caller("10.0.0.3", _signed("ops", "opssecret"))
    assert _refusal(guard, register, admin, _register("group-a", 1))[1] == "not_a_broker"
    # Without mutual TLS, brokers sign their cluster calls with an admin account.
    assert _guard(mtls=False, own=None).check(register, admin, _register("group-a", 1)).account

    broker = _guard(mtls=True, own="group-a")
    sync = "/tidemq.v1.Broker/SyncConfig"
    assert broker.check(sync, slave, broker_pb2.SyncConfigRequest()).broker
    other = Caller("10.0.0.4", {}, "broker:group-b:1")
    assert _refusal(broker, sync, other, broker_pb2.SyncConfigRequest())[1] == "wrong_identity"
    stream = "/tidemq.v1.Replication/Stream"
    who = broker.check(stream, slave, None)
    broker.replication_peer(who, "group-a", 1)
    with pytest.raises(Refusal, match="may not replicate as broker:group-a:2"):
        broker.replication_peer(who, "group-a", 2)
    with pytest.raises(Refusal, match="certificate"):
        broker.replication_peer(Who(), "group-a", 1)


def test_mutual_tls_without_an_acl_admits_any_certificate_but_cluster_calls_need_a_brokers() -> (
    None
):
    guard = _guard(None, mtls=True)
    app = Caller("10.0.0.5", {}, "app")
    guard.check("/tidemq.v1.Broker/CreateTopic", app, broker_pb2.CreateTopicRequest())
    assert _refusal(guard, "/tidemq.v1.Broker/SyncConfig", app, broker_pb2.SyncConfigRequest())[
        1
    ] == ("not_a_broker")
