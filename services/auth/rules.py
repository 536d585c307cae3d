"""What each RPC needs (docs/security.md, "Permissions"): every method of every service the
servers offer has a rule here; a method without one is refused (tests/unit/test_auth_rules.py
checks that none is missing, from the services' descriptors).

- ``AUTHENTICATED``: any account.
- ``ADMIN``: an admin account (topic and group administration, offset resets, switchover, what
  lists or reads across accounts).
- ``CLUSTER``: a broker of the cluster, proven by its certificate (or an admin account where
  the cluster runs without mutual TLS); the guard checks the identity the call claims.
- a function of the request: the topics and groups it names, each with the permission it needs
  (``PUB`` to write, ``SUB`` to read; ``PUB | SUB``: either will do).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from tidemq.services.auth.acl import Perm


class Kind(enum.Enum):
    AUTHENTICATED = "authenticated"
    ADMIN = "admin"
    CLUSTER = "cluster"


@dataclass(frozen=True)
class Need:
    """A topic or group the call names and the permission it needs on it; ``ADMIN_NEED`` for a
    variant of a call only admins may make (an offset reset)."""

    kind: str  # "topic", "group" or "admin"
    name: str
    perm: Perm


ADMIN_NEED = Need("admin", "", Perm.DENY)
Rule = Kind | Callable[[Any], Iterable[Need]]

BROKER = "/tidemq.v1.Broker/"
NAMESERVER = "/tidemq.v1.NameServer/"
REPLICATION = "/tidemq.v1.Replication/"
V2 = "/apache.rocketmq.v2.MessagingService/"


def topic(name: str, perm: Perm) -> Need:
    return Need("topic", name, perm)


def group(name: str, perm: Perm) -> Need:
    return Need("group", name, perm)


def _reads(r: Any) -> list[Need]:
    """A consumer's call: the group and the topic it names, both SUB."""
    return [group(r.group, Perm.SUB), topic(r.topic, Perm.SUB)]


def _topic_sub(r: Any) -> list[Need]:
    return [topic(r.topic, Perm.SUB)]


def _topic_pub(r: Any) -> list[Need]:
    return [topic(r.topic, Perm.PUB)]


def _group_sub(r: Any) -> list[Need]:
    return [group(r.group, Perm.SUB)]


def _send(r: Any) -> list[Need]:
    names = {m.topic for m in r.messages}
    if r.block_topic or r.blocks:
        names.add(r.block_topic)
    return [topic(t, Perm.PUB) for t in sorted(names)]


def _heartbeat(r: Any) -> list[Need]:
    return [group(c.group, Perm.SUB) for c in r.consumers]


def _commit(r: Any) -> list[Need]:
    return [*_reads(r), ADMIN_NEED] if r.reset else _reads(r)


def _v2_reads(r: Any) -> list[Need]:
    return [group(r.group.name, Perm.SUB), topic(r.topic.name, Perm.SUB)]


def _v2_queue_reads(r: Any) -> list[Need]:
    return [group(r.group.name, Perm.SUB), topic(r.message_queue.topic.name, Perm.SUB)]


def _v2_heartbeat(r: Any) -> list[Need]:
    return [group(r.group.name, Perm.SUB)] if r.group.name else []


def _v2_send(r: Any) -> list[Need]:
    return [topic(t, Perm.PUB) for t in sorted({m.topic.name for m in r.messages})]


RULES: dict[str, Rule] = {
    # tidemq.v1.Broker
    BROKER + "SendMessage": _send,
    BROKER + "PullMessage": _reads,
    BROKER + "QueryMessage": _topic_sub,
    BROKER + "ViewMessage": Kind.ADMIN,  # by id alone: any topic's message
    BROKER + "GetQueueOffsets": _topic_sub,
    BROKER + "SearchOffset": _topic_sub,
    BROKER + "Heartbeat": _heartbeat,
    BROKER + "UnregisterClient": Kind.AUTHENTICATED,
    BROKER + "GetConsumerList": _group_sub,
    BROKER + "CommitOffset": _commit,
    BROKER + "QueryConsumerOffset": _reads,
    BROKER + "CreateTopic": Kind.ADMIN,
    BROKER + "DeleteTopic": Kind.ADMIN,
    BROKER + "ListTopics": Kind.ADMIN,
    BROKER + "GetBrokerStatus": Kind.ADMIN,
    BROKER + "GetOffsetTable": Kind.ADMIN,  # every topic's and group's offsets
    BROKER + "SyncConfig": Kind.CLUSTER,  # every table and every group's offsets
    BROKER + "Switchover": Kind.ADMIN,
    BROKER + "GetBrokerConfig": Kind.ADMIN,
    BROKER + "UpdateBrokerConfig": Kind.ADMIN,
    BROKER + "ReceiveMessage": _reads,
    BROKER + "AckMessage": _reads,
    BROKER + "NackMessage": _reads,
    BROKER + "ChangeInvisibleDuration": _reads,
    BROKER + "DeadLetterMessage": _reads,
    BROKER + "GetConsumerGroup": _group_sub,
    BROKER + "UpdateConsumerGroup": Kind.ADMIN,
    BROKER + "ListConsumerGroups": Kind.ADMIN,
    BROKER + "DeleteConsumerGroup": Kind.ADMIN,
    BROKER + "GetReceiveState": Kind.ADMIN,
    # Names every group that consumed the message and the clients it went to, whoever's.
    BROKER + "GetMessageHistory": Kind.ADMIN,
    BROKER + "RecallMessage": _topic_pub,
    BROKER + "ListDelayedMessages": Kind.ADMIN,
    # A transaction is named by its id (random, known to its producer) and producer group.
    BROKER + "EndTransaction": Kind.AUTHENTICATED,
    BROKER + "WatchTransactionChecks": Kind.AUTHENTICATED,
    BROKER + "ListTransactions": Kind.ADMIN,
    # tidemq.v1.NameServer
    NAMESERVER + "RegisterBroker": Kind.CLUSTER,
    NAMESERVER + "UnregisterBroker": Kind.CLUSTER,
    NAMESERVER + "QueryRoute": lambda r: [topic(r.topic, Perm.PUB | Perm.SUB)],
    NAMESERVER + "GetClusterInfo": Kind.AUTHENTICATED,
    NAMESERVER + "GetStatus": Kind.AUTHENTICATED,
    # tidemq.v1.Replication
    REPLICATION + "Stream": Kind.CLUSTER,
    # apache.rocketmq.v2.MessagingService (the official clients)
    V2 + "QueryRoute": lambda r: [topic(r.topic.name, Perm.PUB | Perm.SUB)],
    V2 + "Heartbeat": _v2_heartbeat,
    V2 + "SendMessage": _v2_send,
    V2 + "QueryAssignment": _v2_reads,
    V2 + "ReceiveMessage": _v2_queue_reads,
    V2 + "AckMessage": _v2_reads,
    V2 + "ForwardMessageToDeadLetterQueue": _v2_reads,
    V2 + "PullMessage": _v2_queue_reads,
    V2 + "UpdateOffset": _v2_queue_reads,
    V2 + "GetOffset": _v2_queue_reads,
    V2 + "QueryOffset": lambda r: [topic(r.message_queue.topic.name, Perm.SUB)],
    V2 + "EndTransaction": lambda r: [topic(r.topic.name, Perm.PUB)],
    V2 + "Telemetry": Kind.AUTHENTICATED,
    V2 + "NotifyClientTermination": Kind.AUTHENTICATED,
    V2 + "ChangeInvisibleDuration": _v2_reads,
    V2 + "RecallMessage": lambda r: [topic(r.topic.name, Perm.PUB)],
    V2 + "SyncLiteSubscription": _v2_reads,
}
