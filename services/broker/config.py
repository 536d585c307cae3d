"""Broker configuration: a TOML file (``--config``) and/or flags, validated once."""

from __future__ import annotations

import dataclasses
import enum
import functools
import ipaddress
import os
import socket
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tidemq.protos.signing import ENV_SECRET_KEY, Credentials
from tidemq.protos.tls import ServerTls, TlsConfigError, TlsSettings
from tidemq.replication import ReplicationConfig
from tidemq.services.auth import acl
from tidemq.services.nameserver import zk_format, zk_settings
from tidemq.storage import state_file
from tidemq.storage.archive.config import ArchiveConfig
from tidemq.storage.config import FlushMode
from tidemq.storage.errors import ConfigError


class BrokerRole(enum.Enum):
    ASYNC_MASTER = "ASYNC_MASTER"
    SYNC_MASTER = "SYNC_MASTER"
    SLAVE = "SLAVE"


@dataclass(frozen=True)
class BrokerConfig:
    store_dir: str
    cluster: str = "DefaultCluster"
    broker_name: str = "broker-a"
    broker_id: int = 0
    role: BrokerRole = BrokerRole.ASYNC_MASTER
    listen: str = "127.0.0.1:10911"
    # The address clients are told to use; defaults to ``listen``.
    advertise: str = ""
    nameservers: tuple[str, ...] = ()
    flush: FlushMode = FlushMode.ASYNC
    auto_create_topics: bool = False
    default_queue_nums: int = 8
    register_interval_ms: int = 30_000
    offset_flush_interval_ms: int = 5_000
    client_expiry_ms: int = 120_000
    long_poll_max_ms: int = 30_000
    max_batch_messages: int = 1024
    max_request_bytes: int = 64 << 20
    # A pull (or a query by key) answers at most this many bytes of records, whatever the
    # client asks; a single record larger than this still comes, alone. At most
    # max_request_bytes, which is also gRPC's limit on what the broker sends.
    max_pull_response_bytes: int = 4 << 20
    # Freed memory the process keeps for reuse (services/allocator.py): large answers and
    # requests then reuse pages instead of faulting fresh ones in. 0: the C library's defaults.
    allocator_retain_bytes: int = 256 << 20
    # Admission (docs/operations.md, "Load limits"). Each client connection runs at most this
    # many requests, and this many bytes of them (request bytes; for a pull, the answer it may
    # get), at once; a request alone always runs. The rest wait their turn, up to the waiting
    # bounds; past them, or past max_concurrent_rpcs requests running or waiting in the whole
    # broker, a request is refused with the retriable BROKER_BUSY. Parked long polls count in
    # none of these.
    max_concurrent_rpcs: int = 4096
    max_inflight_requests_per_connection: int = 2
    max_inflight_bytes_per_connection: int = 8 << 20
    max_waiting_requests_per_connection: int = 1024
    max_waiting_bytes_per_connection: int = 128 << 20
    # While other connections are active, a connection moving more bytes a second than this
    # (requests in, answers out) is held back until it is under it again; alone on the broker
    # it is never held back. 0: no byte rate limit.
    max_bytes_per_second_per_connection: int = 0
    shutdown_grace_ms: int = 5_000
    # HOST:PORT of the Prometheus /metrics endpoint; empty serves none.
    metrics_listen: str = ""
    # HOST:PORT of the RocketMQ 5 protocol (apache.rocketmq.v2.MessagingService) the official
    # clients speak; empty serves none. The address routes name defaults to it.
    rocketmq_listen: str = ""
    rocketmq_advertise: str = ""
    # OpenTelemetry tracing (docs/operations.md, "Tracing"): build the SDK from the OTEL_*
    # variables at start-up. Off, spans are still made under an SDK configured by someone else
    # (opentelemetry-instrument); with none, nothing is traced.
    otel: bool = False
    # ZooKeeper registry: HOST:PORT[,HOST:PORT...][/chroot]. Set, the broker keeps an ephemeral
    # znode under <zk_root> (beside heartbeats to ``nameservers``, if any); empty, heartbeats only.
    zk_hosts: str = ""
    zk_root: str = zk_settings.DEFAULT_ROOT
    # A SIGKILLed broker leaves the routes this long after its death (plus up to 2 server ticks).
    zk_session_timeout_ms: int = zk_settings.DEFAULT_SESSION_TIMEOUT_MS
    # digest:USER:PASSWORD or @FILE holding it (docs/security.md): the broker writes its znodes
    # as this ZooKeeper identity, which alone may change them; empty: open znodes.
    zk_auth: str = field(default="", repr=False)
    # Speak TLS to ZooKeeper's secure client port, as the broker speaks to nameservers: its
    # server must chain to tls_ca_file, and the broker presents its own certificate.
    zk_tls: bool = False
    # Replication (docs/replication.md): chunks, reports, heartbeats and idle links, SYNC_MASTER
    # acknowledgements, the in-sync lag bound and confirm_offset. A [replication] table in TOML.
    replication: ReplicationConfig = field(default_factory=ReplicationConfig)
    # A slave copies topics, subscription groups and consumer offsets from its master this
    # often, and sends every table regardless of data versions at least every full interval.
    config_sync_interval_ms: int = 3_000
    # Whole tables, as a check on the incremental syncs between: 100,000 topics are ~5 MB.
    config_full_sync_interval_ms: int = 600_000
    # Automatic failover (docs/failover.md): "auto" elects the group's master through
    # ZooKeeper (``role`` is then the kind of master this broker acts as when elected, and
    # broker ids are > 0); "classic" keeps fixed roles.
    failover: str = "classic"
    # Election: lower wins among equally up-to-date brokers; unclean lets a broker outside the
    # in-sync set take over when no member is live (it may lose acknowledged messages).
    election_priority: int = 0
    unclean_election: bool = False
    # A slave that has not caught up for this long leaves the in-sync set.
    isr_max_lag_ms: int = 15_000
    # A master acknowledges writes only within this long of its last ZooKeeper round trip that
    # confirmed its mastership; a successor waits as long before acknowledging.
    failover_lease_ms: int = 1_000
    # How long the best candidate gives the others to publish their final offsets.
    election_settle_ms: int = 500
    # Receive/ack consumption (docs/consumption.md). A receive's invisible duration must lie
    # within [min, max]; a receive asks for at most max_receive_messages, and an ack or nack
    # carries at most max_handles_per_call handles. A FIFO queue holds back at most
    # receive_max_held_messages behind blocked message groups. The revive task dead-letters
    # exhausted messages and commits receive groups' floors every revive_interval_ms; the
    # in-flight state is snapshotted every receive_snapshot_interval_ms when it changed.
    receive_min_invisible_ms: int = 1_000
    receive_max_invisible_ms: int = 43_200_000
    max_receive_messages: int = 1024
    max_handles_per_call: int = 1024
    receive_max_held_messages: int = 10_000
    revive_interval_ms: int = 1_000
    receive_snapshot_interval_ms: int = 10_000
    # Transactions (docs/production.md): a half open longer than transaction_timeout_ms is
    # checked with a producer of its group every transaction_check_interval_ms; after
    # transaction_check_max checks, transaction_exhausted_resolution (rollback|commit) applies.
    transaction_check_interval_ms: int = 30_000
    transaction_timeout_ms: int = 6_000
    transaction_check_max: int = 15
    transaction_exhausted_resolution: str = "rollback"
    # Delayed delivery (docs/production.md): a send may ask for a delivery time at most
    # max_delay_ms ahead (40 days; RocketMQ's default is 3); the master fires what is due every
    # timer_tick_ms.
    max_delay_ms: int = 40 * 86_400_000
    timer_tick_ms: int = 100
    # Idempotent sends (docs/production.md): producers whose sequences the broker remembers,
    # least recently used first out; a forgotten producer must start a new epoch (SEQUENCE_GAP).
    idempotence_max_producers: int = 100_000
    # TLS (docs/security.md): set, every listener (Broker service, replication, the RocketMQ 5
    # protocol) serves TLS only, and the broker calls nameservers and its master over TLS with
    # the same certificate, trusting tls_ca_file. tls_client_auth "require" accepts only clients
    # with a certificate tls_ca_file signed.
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_ca_file: str = ""
    tls_client_auth: str = ""
    # Authentication and permissions (docs/security.md): an ACL file in RocketMQ's
    # plain_acl.yml format, re-read when it changes; a signed request's date must be within
    # auth_max_clock_skew_ms of the broker's clock. access_key/secret_key: the account the
    # broker signs its own calls with (to nameservers and its master) where the cluster has an
    # ACL but no mutual TLS; TIDEMQ_ACCESS_KEY/TIDEMQ_SECRET_KEY when left empty.
    acl_file: str = ""
    auth_max_clock_skew_ms: int = 900_000
    access_key: str = ""
    secret_key: str = field(default="", repr=False)
    # Scheduled tasks (docs/operations.md): the committed offsets of a topic deleted this long
    # ago are dropped, and messages in/out per topic per day are kept for daily_stats_days days.
    deleted_topic_offsets_grace_ms: int = 3_600_000
    daily_stats_days: int = 30
    # Limits (docs/operations.md, "Limits"): creating a topic or consumer group past these is
    # refused with RESOURCE_EXHAUSTED / LIMIT_EXCEEDED, naming the setting. A slave copies its
    # master's tables whatever its own limits.
    max_topics: int = 200_000
    max_groups: int = 50_000
    # Per-queue series in /metrics (tidemq_queue_*_offset, and tidemq_consumer_offset and
    # tidemq_consumer_queue_lag_messages per group) at most this many each; the rest are
    # counted in tidemq_metrics_queue_series_omitted. 400,000 queues would make a scrape of
    # tens of MB and seconds of CPU.
    metrics_queue_series_max: int = 20_000
    # Archive instead of only delete (docs/archive.md): an [archive] table (uri, default_policy,
    # compression, ...; ``storage.archive.config``); a topic's own policy is its
    # ``retention.policy`` attribute. None: retention deletes, as RocketMQ does.
    archive: ArchiveConfig | None = None
    # Store layout overrides (tests use tiny files); None keeps the store's defaults.
    store_overrides: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = []
        if not self.store_dir:
            problems.append("store_dir is required")
        if not self.cluster or not self.broker_name:
            problems.append("cluster and broker_name must be non-empty")
        if self.broker_id < 0:
            problems.append("broker_id must be >= 0")
        if self.failover not in ("classic", "auto"):
            problems.append(f"failover must be classic or auto, got {self.failover!r}")
        elif self.automatic:
            problems += self._failover_problems()
        elif (self.broker_id == 0) == (self.role is BrokerRole.SLAVE):
            problems.append("broker_id 0 is the master; a SLAVE needs broker_id > 0")
        addresses = [("listen", self.listen), ("advertise", self.advertise)]
        addresses.append(("metrics_listen", self.metrics_listen))
        addresses.append(("rocketmq_listen", self.rocketmq_listen))
        addresses.append(("rocketmq_advertise", self.rocketmq_advertise))
        if self.rocketmq_advertise and not self.rocketmq_listen:
            problems.append("rocketmq_advertise needs rocketmq_listen")
        addresses += [("nameserver", n) for n in self.nameservers]
        for what, value in addresses:
            if value and not _is_address(value):
                problems.append(f"{what} {value!r} must be HOST:PORT")
        for name in (
            "register_interval_ms",
            "offset_flush_interval_ms",
            "client_expiry_ms",
            "long_poll_max_ms",
            "max_batch_messages",
            "max_request_bytes",
            "max_pull_response_bytes",
            "max_concurrent_rpcs",
            "max_inflight_requests_per_connection",
            "max_inflight_bytes_per_connection",
            "max_waiting_requests_per_connection",
            "max_waiting_bytes_per_connection",
            "default_queue_nums",
            "config_sync_interval_ms",
            "config_full_sync_interval_ms",
            "receive_min_invisible_ms",
            "max_receive_messages",
            "max_handles_per_call",
            "receive_max_held_messages",
            "revive_interval_ms",
            "receive_snapshot_interval_ms",
            "transaction_check_interval_ms",
            "transaction_timeout_ms",
            "transaction_check_max",
            "max_delay_ms",
            "timer_tick_ms",
            "idempotence_max_producers",
            "deleted_topic_offsets_grace_ms",
            "daily_stats_days",
            "max_topics",
            "max_groups",
            "metrics_queue_series_max",
        ):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be > 0")
        if self.max_bytes_per_second_per_connection < 0:
            problems.append("max_bytes_per_second_per_connection must be >= 0")
        if self.allocator_retain_bytes < 0:
            problems.append("allocator_retain_bytes must be >= 0")
        if self.max_pull_response_bytes > self.max_request_bytes:
            problems.append("max_pull_response_bytes must be <= max_request_bytes")
        if self.config_full_sync_interval_ms < self.config_sync_interval_ms:
            problems.append("config_full_sync_interval_ms must be >= config_sync_interval_ms")
        if self.receive_max_invisible_ms < self.receive_min_invisible_ms:
            problems.append("receive_max_invisible_ms must be >= receive_min_invisible_ms")
        if self.transaction_exhausted_resolution not in ("rollback", "commit"):
            problems.append(
                "transaction_exhausted_resolution must be rollback or commit, got "
                f"{self.transaction_exhausted_resolution!r}"
            )
        problems += self._zk_problems()
        try:
            self.tls  # noqa: B018 (checks the files now, not at the first connection)
        except TlsConfigError as e:
            problems.append(str(e))
        if self.acl_file:
            try:
                acl.load(self.acl_file)
            except acl.AclFileError as e:
                problems.append(str(e))
        if self.auth_max_clock_skew_ms <= 0:
            problems.append("auth_max_clock_skew_ms must be > 0")
        if self.secret_key and not self.access_key:
            problems.append("secret_key needs access_key")
        if self.access_key and not (self.secret_key or os.environ.get(ENV_SECRET_KEY)):
            problems.append(f"access_key needs secret_key (or ${ENV_SECRET_KEY})")
        if problems:
            raise ConfigError("invalid broker config: " + "; ".join(problems))

    @functools.cached_property
    def tls(self) -> ServerTls | None:
        """Checked once, with the config: the files are re-read when they change by the
        server's reloader and each new channel, never checked again here (a rotation in
        progress must not fail a registration round)."""
        return ServerTls.from_settings(
            self.tls_cert_file, self.tls_key_file, self.tls_ca_file, self.tls_client_auth
        )

    @property
    def zk_client_tls(self) -> TlsSettings | None:
        """How the broker dials ZooKeeper: over TLS with its own certificate (zk_tls), or not."""
        return self.client_tls if self.zk_tls else None

    @property
    def zk_digest(self) -> tuple[str, str] | None:
        return zk_settings.parse_auth(self.zk_auth) if self.zk_auth else None

    @property
    def mutual_tls(self) -> bool:
        tls = self.tls
        return tls is not None and tls.client_auth == "require"

    @property
    def client_credentials(self) -> Credentials | None:
        """What the broker signs its own calls with (None: it does not sign them)."""
        if self.access_key:
            return Credentials(self.access_key, self.secret_key or os.environ[ENV_SECRET_KEY])
        return Credentials.from_env()

    @functools.cached_property
    def client_tls(self) -> TlsSettings | None:
        """How the broker calls nameservers and its master: with its own certificate."""
        tls = self.tls
        return None if tls is None else tls.as_client()

    @property
    def automatic(self) -> bool:
        return self.failover == "auto"

    def _failover_problems(self) -> list[str]:
        problems = []
        if not self.zk_hosts:
            problems.append("failover auto needs ZooKeeper (zk_hosts)")
        if self.broker_id <= 0:
            problems.append("under failover auto broker ids are > 0 (the master registers as 0)")
        if self.role is BrokerRole.SLAVE:
            problems.append(
                "under failover auto role is the kind of master a broker acts as when elected: "
                "ASYNC_MASTER or SYNC_MASTER"
            )
        for name in ("isr_max_lag_ms", "failover_lease_ms", "election_settle_ms"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be > 0")
        # An idle slave proves it is caught up with its reports; rarer ones would make it
        # leave the in-sync set while it holds everything.
        if self.isr_max_lag_ms < 2 * self.replication.report_interval_ms:
            problems.append("isr_max_lag_ms must be at least twice replication.report_interval_ms")
        return problems

    def _zk_problems(self) -> list[str]:
        checks: list[Callable[[], object]] = [
            lambda: zk_settings.check_root(self.zk_root),
            lambda: zk_settings.check_session_timeout_ms(self.zk_session_timeout_ms),
        ]
        if self.zk_auth:
            checks.append(lambda: zk_settings.parse_auth(self.zk_auth))
        problems = []
        if self.zk_tls and not self.zk_hosts:
            problems.append("zk_tls needs ZooKeeper (zk_hosts)")
        if self.zk_tls and not self.tls_ca_file:
            problems.append(
                "zk_tls needs the broker's TLS (tls_cert_file, tls_key_file and the "
                "tls_ca_file ZooKeeper's certificate chains to)"
            )
        if self.zk_hosts:
            checks.append(lambda: zk_settings.check_hosts(self.zk_hosts))
            checks.append(
                lambda: zk_format.node_path(
                    self.zk_root, self.cluster, self.broker_name, self.broker_id
                )
            )
        for check in checks:
            try:
                check()
            except zk_settings.ZooKeeperConfigError as e:
                problems.append(str(e))
        return problems

    @property
    def advertised(self) -> str:
        return self.advertise or self.listen

    def store_host(self) -> str:
        """``IP:PORT`` stamped on every message this broker stores (part of its message id, as
        RocketMQ's brokerIP1): the advertised address when it is an IP; an advertised host name
        (a load balancer's, ``localhost`` for a container's mapped port) is resolved, or, when
        it cannot be yet, the listen address stands in."""
        host, _, port = self.advertised.rpartition(":")
        bare = host.strip("[]")
        try:
            ipaddress.ip_address(bare)
        except ValueError:
            pass
        else:
            return self.advertised
        try:
            infos = socket.getaddrinfo(bare, None, socket.AF_INET, socket.SOCK_STREAM)
            return f"{infos[0][4][0]}:{port}"
        except OSError:
            return self.listen

    @property
    def rocketmq_advertised(self) -> str:
        """The v2 address routes name: "" when the broker serves no v2 listener."""
        return self.rocketmq_advertise or self.rocketmq_listen


def _is_address(value: str) -> bool:
    host, sep, port = value.rpartition(":")
    return bool(sep and host.strip("[]") and port.isdigit() and 0 < int(port) < 65536)


def load(path: str | None, overrides: dict[str, Any]) -> BrokerConfig:
    """A config from a TOML file (if given) with non-None ``overrides`` on top; replication
    settings come in a ``replication`` table (a dict in ``overrides``). Every problem is a
    ConfigError naming the file and the key."""
    values: dict[str, Any] = {}
    source = f"broker config {path}" if path else "broker config"
    if path:
        try:
            with open(path, "rb") as f:
                values.update(tomllib.load(f))
        except OSError as e:
            raise ConfigError(f"{source}: cannot read it: {e.strerror}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{source}: not valid TOML: {e}; fix the file") from None
    replication = values.pop("replication", None) or {}
    if not isinstance(replication, dict):
        raise ConfigError(f"{source}: 'replication' must be a table ([replication])")
    replication = dict(replication)
    replication.update({k: v for k, v in overrides.pop("replication", {}).items() if v is not None})
    values.update({k: v for k, v in overrides.items() if v is not None and k != "archive"})
    unknown = sorted(set(values) - _field_names(BrokerConfig))
    unknown += sorted(
        f"replication.{k}" for k in set(replication) - _field_names(ReplicationConfig)
    )
    if unknown:
        raise ConfigError(f"{source}: unknown keys: {', '.join(unknown)}")
    for name in ("role", "flush"):
        if isinstance(values.get(name), str):
            values[name] = values[name].upper()
    if isinstance(values.get("nameservers"), str):
        values["nameservers"] = tuple(n for n in values["nameservers"].split(",") if n)
    values["replication"] = replication
    archive = values.pop("archive", None) or {}
    if not isinstance(archive, dict):
        raise ConfigError(f"{source}: 'archive' must be a table ([archive])")
    archive = dict(archive)
    archive.update({k: v for k, v in overrides.get("archive", {}).items() if v is not None})
    values.pop("archive", None)
    unknown_archive = sorted(set(archive) - _field_names(ArchiveConfig))
    if unknown_archive:
        raise ConfigError(
            f"{source}: unknown keys: {', '.join('archive.' + k for k in unknown_archive)}"
        )
    if archive:
        values["archive"] = archive
    try:
        return state_file.from_json(BrokerConfig, values)
    except state_file.ShapeError as e:
        raise ConfigError(f"{source}: {e}") from None
    except ConfigError as e:
        if path:
            raise ConfigError(f"{source}: {e}") from None
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"invalid {source}: {e}") from None


def _field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}
