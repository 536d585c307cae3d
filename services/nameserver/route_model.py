"""What the nameserver's route table takes and answers: broker registrations, routes, cluster
views, and the refusals of a registration. Plain values, no behaviour (``route_table`` has it).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple

MASTER_ID = 0  # as RocketMQ's MixAll.MASTER_ID: broker id 0 is its group's master


class BrokerRole(enum.IntEnum):
    """Same numbers as ``tidemq.v1.BrokerRole`` so the servicer converts by value."""

    ASYNC_MASTER = 1
    SYNC_MASTER = 2
    SLAVE = 3


@dataclass(frozen=True, order=True)
class DataVersion:
    """A broker's topic-config version. Ordered field by field, as RocketMQ compares them."""

    state_version: int = 0
    counter: int = 0
    timestamp_ms: int = 0


@dataclass(frozen=True)
class TopicQueues:
    """One topic as a broker group serves it: RocketMQ's QueueData without the broker name."""

    topic: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int  # bitwise OR of tidemq.v1.Permission (6 = read and write)


@dataclass(frozen=True)
class TopicDelta:
    """Marks a registration as incremental: its ``topics`` are only those created or changed
    since ``base_version``, and ``removed`` those deleted since."""

    base_version: DataVersion
    removed: tuple[str, ...] = ()


@dataclass(frozen=True)
class BrokerRegistration:
    """One heartbeat: who the broker is, where it listens, and (from a master) its topics.

    Without ``delta`` the registration is full: ``topics`` is every topic the broker serves.
    With one it is incremental (see ``TopicDelta``), so a heartbeat costs what changed."""

    cluster: str
    broker_name: str  # the broker group: one master (id 0) and its slaves
    broker_id: int
    address: str  # host:port of the Broker service
    ha_address: str  # host:port slaves replicate from; "" when the broker serves none
    role: BrokerRole
    epoch: int
    data_version: DataVersion = DataVersion()
    topics: tuple[TopicQueues, ...] = ()
    # host:port of the broker's RocketMQ 5 (apache.rocketmq.v2) listener; "" when none.
    rocketmq_address: str = ""
    delta: TopicDelta | None = None


@dataclass(frozen=True)
class BrokerRef:
    """Names one broker in the table, e.g. one that was expired."""

    cluster: str
    broker_name: str
    broker_id: int
    address: str


@dataclass(frozen=True)
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int


@dataclass(frozen=True)
class BrokerData:
    """A broker group as clients see it."""

    cluster: str
    broker_name: str
    addresses: dict[int, str]  # broker id -> Broker service address; 0 is the master
    ha_addresses: dict[int, str]  # broker id -> replication address (only brokers that have one)
    epoch: int
    # broker id -> RocketMQ 5 (v2) address (only brokers that serve one)
    rocketmq_addresses: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TopicRoute:
    topic: str
    queues: list[QueueData]  # sorted by broker name
    brokers: list[BrokerData]  # exactly the groups named in ``queues``, same order


@dataclass(frozen=True)
class BrokerLive:
    registration: BrokerRegistration  # the broker's latest accepted registration, no topics
    last_update_ms: int
    topics: int = 0  # how many topics its latest registrations carried


@dataclass(frozen=True)
class ClusterInfo:
    cluster: str
    groups: list[BrokerData]  # sorted by broker name
    brokers: list[BrokerLive]  # sorted by (broker name, broker id)


class MasterAddresses(NamedTuple):
    """What a registration answers: the group's master, or empty strings when it has none."""

    address: str
    ha_address: str


class RegistrationRejected(Exception):
    """A registration the table refuses; the table is left consistent."""


class StaleEpochError(RegistrationRejected):
    """A broker claimed id 0 with an epoch older than its group's (apache/rocketmq#6316)."""

    def __init__(self, reg: BrokerRegistration, group_epoch: int, master_address: str) -> None:
        super().__init__(
            f"broker {reg.address} claims master of {reg.broker_name!r} with epoch {reg.epoch}, "
            f"but the group is at epoch {group_epoch}"
            + (f" (master {master_address})" if master_address else "")
        )
        self.epoch = reg.epoch
        self.group_epoch = group_epoch
        self.master_address = master_address


class FullRegistrationNeededError(Exception):
    """An incremental registration whose base this table does not hold (the nameserver
    restarted, expired the broker, or missed a registration): nothing was applied, and the
    broker sends a full registration instead."""


class ClusterMismatchError(RegistrationRejected):
    """A broker group name registered under a second cluster: a misconfigured broker."""
