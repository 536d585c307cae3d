"""``tidemq broker``: flags and a TOML config file, flags winning."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from typing import Any

from tidemq.services import tls_flags
from tidemq.services.allocator import retain_freed_memory
from tidemq.services.auth import flags as auth_flags
from tidemq.services.broker import cli_limits, repair
from tidemq.services.broker import config as broker_config
from tidemq.services.broker.server import serve
from tidemq.services.dev import die_with_parent
from tidemq.storage.cli import exits_on_store_error


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("broker", help="run a broker")
    p.add_argument("--config", help="TOML file with BrokerConfig keys")
    p.add_argument("--cluster")
    p.add_argument("--broker-name")
    p.add_argument("--broker-id", type=int)
    p.add_argument("--role", choices=["ASYNC_MASTER", "SYNC_MASTER", "SLAVE"])
    p.add_argument("--listen", help="HOST:PORT of the Broker service")
    p.add_argument("--advertise", help="HOST:PORT clients are told to use (default --listen)")
    p.add_argument("--store", dest="store_dir", help="store directory")
    p.add_argument("--nameserver", dest="nameservers", help="HOST:PORT[,HOST:PORT...]")
    p.add_argument("--flush", choices=["ASYNC", "SYNC"])
    p.add_argument("--auto-create-topics", action="store_true", default=None)
    p.add_argument("--register-interval-ms", type=int)
    p.add_argument(
        "--metrics-listen", help="HOST:PORT to serve Prometheus /metrics on (default: none)"
    )
    p.add_argument(
        "--rocketmq-listen",
        help="HOST:PORT serving the RocketMQ 5 protocol of the official clients (default: none)",
    )
    p.add_argument(
        "--otel",
        action="store_true",
        default=None,
        help="OpenTelemetry spans for stores and deliveries, the SDK configured from the OTEL_* "
        "variables (OTEL_TRACES_EXPORTER, OTEL_SERVICE_NAME, ...; needs opentelemetry-sdk)",
    )
    p.add_argument(
        "--rocketmq-advertise",
        help="HOST:PORT routes name for the RocketMQ 5 listener (default --rocketmq-listen)",
    )
    p.add_argument(
        "--max-pull-response-bytes",
        type=int,
        metavar="N",
        help="largest pull answer in record bytes; a larger record comes alone (default 4194304)",
    )
    p.add_argument(
        "--max-concurrent-rpcs",
        type=int,
        metavar="N",
        help="requests running or waiting in the broker before BROKER_BUSY (default 4096)",
    )
    p.add_argument(
        "--max-inflight-requests-per-connection",
        type=int,
        metavar="N",
        help="requests a client connection runs at once; the rest wait (default 2)",
    )
    p.add_argument(
        "--max-inflight-bytes-per-connection",
        type=int,
        metavar="N",
        help="request and pull-answer bytes a connection runs at once (default 8388608)",
    )
    p.add_argument(
        "--max-waiting-requests-per-connection",
        type=int,
        metavar="N",
        help="requests a connection may have waiting before BROKER_BUSY (default 1024)",
    )
    p.add_argument(
        "--max-waiting-bytes-per-connection",
        type=int,
        metavar="N",
        help="request bytes a connection may have waiting before BROKER_BUSY (default 134217728)",
    )
    p.add_argument(
        "--max-bytes-per-second-per-connection",
        type=int,
        metavar="N",
        help="while others are active, hold back a connection moving more (default 0: no limit)",
    )
    p.add_argument(
        "--zk",
        dest="zk_hosts",
        metavar="HOSTS",
        help="register in ZooKeeper, HOST:PORT[,HOST:PORT...][/chroot] (default: heartbeats only)",
    )
    p.add_argument("--zk-root", metavar="PATH", help="registry root znode (default /tidemq)")
    p.add_argument(
        "--zk-auth",
        metavar="digest:USER:PASSWORD|@FILE",
        help="write znodes as this ZooKeeper digest identity, which alone may change them "
        "(@FILE: a file holding it, kept out of the process list)",
    )
    p.add_argument(
        "--zk-tls",
        action="store_true",
        default=None,
        help="speak TLS to ZooKeeper's secure client port, with the broker's own certificate "
        "(--tls-cert-file, --tls-key-file) and trusting --tls-ca-file",
    )
    p.add_argument(
        "--zk-session-timeout-ms",
        type=int,
        metavar="N",
        help="ZooKeeper session timeout: how long a killed broker stays routed (default 10000)",
    )
    archive = p.add_argument_group(
        "archive (docs/archive.md)",
        "archive sealed CommitLog files before retention deletes them; reads past local "
        "retention come from the archive ([archive] table in --config)",
    )
    archive.add_argument(
        "--archive-uri",
        dest="archive.uri",
        metavar="URI",
        help="a directory (path or file:///PATH) or s3://BUCKET/PREFIX",
    )
    archive.add_argument(
        "--archive-default-policy",
        dest="archive.default_policy",
        choices=("archive", "delete"),
        help="retention policy of topics without a retention.policy attribute (default archive)",
    )
    archive.add_argument(
        "--archive-compression",
        dest="archive.compression",
        choices=("zstd", "none"),
        help="how archived chunks are stored (default zstd)",
    )
    archive.add_argument(
        "--archive-s3-endpoint",
        dest="archive.s3_endpoint_url",
        metavar="URL",
        help="an S3-compatible endpoint other than AWS (default AWS_ENDPOINT_URL or AWS); "
        "credentials come from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or "
        "AWS_SHARED_CREDENTIALS_FILE",
    )
    archive.add_argument(
        "--archive-cache-bytes",
        dest="archive.cache_bytes",
        type=int,
        metavar="N",
        help="decompressed archived chunks kept for reads past retention (default 256 MiB)",
    )
    archive.add_argument(
        "--archive-interval-ms",
        dest="archive.interval_ms",
        type=int,
        metavar="N",
        help="how often the master archives newly sealed files (default 5000)",
    )
    archive.add_argument(
        "--archive-chunk-bytes",
        dest="archive.chunk_bytes",
        type=int,
        metavar="N",
        help="archived files are cut into chunks about this size (default 8 MiB)",
    )
    p.add_argument(
        "--ha-chunk-bytes",
        dest="replication.chunk_bytes",
        type=int,
        metavar="N",
        help="largest replication chunk",
    )
    p.add_argument(
        "--ha-idle-timeout-ms",
        dest="replication.idle_timeout_ms",
        type=int,
        metavar="N",
        help="drop a replication link silent this long (default 20000)",
    )
    p.add_argument(
        "--ha-report-interval-ms",
        dest="replication.report_interval_ms",
        type=int,
        metavar="N",
        help="a slave reports its offset at least this often (default 5000)",
    )
    p.add_argument(
        "--ha-min-insync-replicas",
        dest="replication.min_insync_replicas",
        type=int,
        metavar="N",
        help="SYNC_MASTER: slaves that must hold a send before SEND_OK (default 1)",
    )
    p.add_argument(
        "--ha-sync-timeout-ms",
        dest="replication.sync_timeout_ms",
        type=int,
        metavar="N",
        help="SYNC_MASTER: wait this long for slaves, then FLUSH_SLAVE_TIMEOUT (default 3000)",
    )
    p.add_argument(
        "--ha-lag-report-interval-ms",
        dest="replication.lag_report_interval_ms",
        type=int,
        metavar="N",
        help="log every slave's lag this often (default 60000)",
    )
    p.add_argument(
        "--ha-slave-flush",
        dest="replication.slave_flush",
        choices=["async", "sync"],
        help="slave: acknowledge replicated bytes once appended (async, default) or fsynced (sync)",
    )
    p.add_argument(
        "--confirm-offset",
        dest="replication.confirm_offset",
        action="store_true",
        default=None,
        help="consumers of this master see only what in-sync slaves hold",
    )
    cli_limits.add_flags(p)
    p.add_argument(
        "--config-sync-interval-ms",
        type=int,
        metavar="N",
        help="slave: copy topics, groups and offsets from the master this often (default 3000)",
    )
    p.add_argument(
        "--failover",
        choices=["classic", "auto"],
        help="auto: the group elects its master through ZooKeeper (needs --zk; default classic)",
    )
    p.add_argument(
        "--election-priority",
        type=int,
        metavar="N",
        help="failover auto: lower wins among equally up-to-date brokers (default 0)",
    )
    p.add_argument(
        "--unclean-election",
        action="store_true",
        default=None,
        help="failover auto: let a broker outside the in-sync set take over (may lose messages)",
    )
    p.add_argument(
        "--isr-max-lag-ms",
        type=int,
        metavar="N",
        help="failover auto: a slave not caught up this long leaves the in-sync set (15000)",
    )
    p.add_argument(
        "--failover-lease-ms",
        type=int,
        metavar="N",
        help="failover auto: a master stops acknowledging this long after losing ZooKeeper (1000)",
    )
    p.add_argument(
        "--receive-min-invisible-ms",
        type=int,
        metavar="N",
        help="shortest invisible duration a receive may ask (default 1000)",
    )
    p.add_argument(
        "--receive-max-invisible-ms",
        type=int,
        metavar="N",
        help="longest invisible duration a receive may ask (default 43200000)",
    )
    p.add_argument(
        "--max-receive-messages",
        type=int,
        metavar="N",
        help="messages one receive may ask for (default 1024)",
    )
    p.add_argument(
        "--max-handles-per-call",
        type=int,
        metavar="N",
        help="receipt handles one ack or nack may carry (default 1024)",
    )
    p.add_argument(
        "--receive-max-held-messages",
        type=int,
        metavar="N",
        help="FIFO: messages a queue holds back behind blocked groups (10000)",
    )
    p.add_argument(
        "--transaction-check-interval-ms",
        type=int,
        metavar="N",
        help="check transactions left open this often (30000)",
    )
    p.add_argument(
        "--transaction-timeout-ms",
        type=int,
        metavar="N",
        help="a transaction open this long is checked with its producer group (6000)",
    )
    p.add_argument(
        "--transaction-check-max",
        type=int,
        metavar="N",
        help="checks before the exhausted resolution applies (15)",
    )
    p.add_argument(
        "--transaction-exhausted-resolution",
        choices=("rollback", "commit"),
        help="what a transaction that used up its checks becomes (rollback)",
    )
    p.add_argument(
        "--max-delay-ms",
        type=int,
        metavar="N",
        help="delayed delivery: the furthest delivery time ahead a send may ask for (40 days)",
    )
    p.add_argument(
        "--timer-tick-ms",
        type=int,
        metavar="N",
        help="delayed delivery: the master fires due messages this often (100)",
    )
    p.add_argument(
        "--revive-interval-ms",
        type=int,
        metavar="N",
        help="dead-letter exhausted messages and commit floors this often (1000)",
    )
    p.add_argument(
        "--receive-snapshot-interval-ms",
        type=int,
        metavar="N",
        help="snapshot the receive state this often when changed (10000)",
    )
    p.add_argument(
        "--idempotence-max-producers",
        type=int,
        metavar="N",
        help="idempotent producers whose sequences are remembered, LRU (100000)",
    )
    tls_flags.add_arguments(p)
    auth_flags.add_arguments(p)
    p.add_argument(
        "--access-key",
        metavar="KEY",
        help="the account this broker signs its calls to nameservers and its master with, where "
        "the cluster has an ACL but no mutual TLS (its secret key: secret_key in --config, or "
        "$TIDEMQ_SECRET_KEY)",
    )
    p.add_argument(
        "--store-overrides",
        help='JSON object of StoreConfig keys, e.g. {"commitlog_file_size_bytes": 1048576}',
    )
    p.set_defaults(func=run, log_level=logging.INFO)
    repair.add_parser(p.add_subparsers(dest="broker_command", metavar="{repair-state}"))


@exits_on_store_error
def run(args: argparse.Namespace) -> int:
    die_with_parent()
    keys = (
        "cluster",
        "broker_name",
        "broker_id",
        "role",
        "listen",
        "advertise",
        "store_dir",
        "nameservers",
        "flush",
        "auto_create_topics",
        "register_interval_ms",
        "max_pull_response_bytes",
        "max_concurrent_rpcs",
        "max_inflight_requests_per_connection",
        "max_inflight_bytes_per_connection",
        "max_waiting_requests_per_connection",
        "max_waiting_bytes_per_connection",
        "max_bytes_per_second_per_connection",
        "zk_hosts",
        "zk_root",
        "zk_session_timeout_ms",
        "zk_auth",
        "zk_tls",
        "metrics_listen",
        "rocketmq_listen",
        "rocketmq_advertise",
        "otel",
        "config_sync_interval_ms",
        "failover",
        "election_priority",
        "unclean_election",
        "isr_max_lag_ms",
        "failover_lease_ms",
        "receive_min_invisible_ms",
        "receive_max_invisible_ms",
        "max_receive_messages",
        "max_handles_per_call",
        "receive_max_held_messages",
        "revive_interval_ms",
        "receive_snapshot_interval_ms",
        "transaction_check_interval_ms",
        "transaction_timeout_ms",
        "transaction_check_max",
        "transaction_exhausted_resolution",
        "max_delay_ms",
        "timer_tick_ms",
        "idempotence_max_producers",
        "tls_cert_file",
        "tls_key_file",
        "tls_ca_file",
        "tls_client_auth",
        "acl_file",
        "auth_max_clock_skew_ms",
        "access_key",
    )
    overrides: dict[str, Any] = {k: getattr(args, k) for k in keys + cli_limits.KEYS}
    # The --ha-* flags and --confirm-offset land in the config's replication table.
    overrides["replication"] = {
        k.removeprefix("replication."): v
        for k, v in vars(args).items()
        if k.startswith("replication.")
    }
    overrides["archive"] = {
        k.removeprefix("archive."): v for k, v in vars(args).items() if k.startswith("archive.")
    }
    if args.store_overrides:
        overrides["store_overrides"] = json.loads(args.store_overrides)
    cfg = broker_config.load(args.config, overrides)
    # The event loop answers sends and streams replication while background threads (dispatch,
    # page warming, config sync) run Python too. A thread woken by I/O waits for the GIL up to
    # the switch interval; at the default 5 ms, several such waits in a row showed up as tens of
    # milliseconds of replication lag.
    sys.setswitchinterval(0.001)
    retain_freed_memory(cfg.allocator_retain_bytes)
    asyncio.run(serve(cfg))
    return 0
