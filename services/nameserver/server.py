"""The nameserver process: a grpc.aio server with the NameServer and gRPC health services over a
registry, running until SIGTERM or SIGINT.

The registry is the embedded one (brokers heartbeat to every nameserver) unless ``--zk`` names
a ZooKeeper ensemble: then brokers keep ephemeral znodes there and this nameserver only reads
them (``zk_registry``).

``tidemq nameserver --listen HOST:PORT [--zk HOSTS] [--zk-root PATH]`` runs it (``tidemq.cli``),
as does ``python -m tidemq.services.nameserver.server``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry, ProcessCollector

from tidemq.protos import nameserver_pb2, nameserver_pb2_grpc
from tidemq.protos.tls import ServerTls, TlsConfigError, add_port
from tidemq.services import tls_flags
from tidemq.services.auth import flags as auth_flags
from tidemq.services.auth.acl import AclFileError
from tidemq.services.auth.on_the_wire import wire_guard
from tidemq.services.dev import die_with_parent
from tidemq.services.errors import add_servicer
from tidemq.services.metrics_endpoint import MetricsEndpoint, auth_refusals_counter
from tidemq.services.nameserver import zk_settings
from tidemq.services.nameserver.metrics import NameServerMetrics
from tidemq.services.nameserver.registry import EmbeddedRegistry, EmbeddedRegistryConfig, Registry
from tidemq.services.nameserver.servicer import NameServerServicer, parse_host_port
from tidemq.services.nameserver.zk_registry import ZooKeeperRegistry, ZooKeeperRegistryConfig

log = logging.getLogger(__name__)

DEFAULT_LISTEN = "127.0.0.1:9876"  # RocketMQ's nameserver port
GRACE_PERIOD_S = 5.0  # in-flight calls get this long to finish at shutdown
SERVICE_NAME: str = nameserver_pb2.DESCRIPTOR.services_by_name["NameServer"].full_name


DESCRIPTION = (
    "run a nameserver: on the embedded registry (brokers register by heartbeat), "
    "or with --zk on ZooKeeper (brokers keep ephemeral znodes, nameservers watch them)"
)


REGISTRATION_MAX_BYTES = 64 * 1024 * 1024


class StartupError(Exception):
    """The nameserver cannot start (bad --listen, port taken); one line for the operator."""


async def serve(
    listen: str = DEFAULT_LISTEN,
    registry_config: EmbeddedRegistryConfig | None = None,
    *,
    zk_config: ZooKeeperRegistryConfig | None = None,
    grace_period_s: float = GRACE_PERIOD_S,
    stop: asyncio.Event | None = None,
    tls: ServerTls | None = None,
    acl_path: str = "",
    max_clock_skew_ms: int = auth_flags.DEFAULT_MAX_CLOCK_SKEW_MS,
    metrics_listen: str = "",
) -> None:
    """Serve until ``stop`` is set; without one, until SIGTERM or SIGINT.

    With ``zk_config`` the routes come from ZooKeeper and ``registry_config`` must be None.
    Port 0 in ``listen`` binds any free port; the bound address is logged either way. With
    ``tls`` the port serves TLS only. With ``acl_path`` (or mutual TLS) calls are checked as
    docs/security.md says. With ``metrics_listen`` (HOST:PORT) Prometheus ``/metrics`` is served
    there: the refused calls (``tidemq_auth_refusals_total``), the registry and route queries
    (``metrics``) and the process's own series.
    """
    try:
        host, _ = parse_host_port(listen, allow_port_zero=True)
    except ValueError as e:
        raise StartupError(f"--listen {e}") from None
    try:
        if metrics_listen:
            parse_host_port(metrics_listen, allow_port_zero=True)
    except ValueError as e:
        raise StartupError(f"--metrics-listen {e}") from None
    tls_flags.warn_if_exposed("the nameserver", listen, tls, acl_path)

    registry: Registry
    if zk_config is not None:
        if registry_config is not None:
            raise StartupError("the embedded registry's settings do not apply with ZooKeeper")
        registry = ZooKeeperRegistry(zk_config)
        described = (
            f"ZooKeeper registry {zk_config.hosts} root {zk_config.root}, "
            f"session timeout {zk_config.session_timeout_ms} ms"
        )
    else:
        embedded = EmbeddedRegistry(registry_config)
        registry = embedded
        described = (
            f"embedded registry, broker expiry {embedded.config.broker_expiry_ms} ms, "
            f"scan every {embedded.config.scan_interval_ms} ms"
        )
    # A full registration carries every topic of a broker: about 40 bytes each, so 8 MB at the
    # 200,000-topic limit. gRPC's 4 MiB default would refuse the largest brokers.
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", REGISTRATION_MAX_BYTES)])
    metrics = CollectorRegistry()
    refusals = auth_refusals_counter(metrics)
    ProcessCollector(registry=metrics)
    served = NameServerMetrics(metrics, registry, asyncio.get_running_loop())
    try:
        guard = wire_guard(
            acl_path=acl_path,
            brokers_by_certificate=tls is not None and tls.client_auth == "require",
            max_clock_skew_ms=max_clock_skew_ms,
            own_group=None,
            on_refused=lambda method, reason: refusals.labels(method, reason).inc(),
        )
    except AclFileError as e:
        raise StartupError(str(e)) from None
    add_servicer(
        nameserver_pb2_grpc.add_NameServerServicer_to_server,
        NameServerServicer(registry, served.route_query, served.registration),
        server,
        guard,
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    try:
        port = add_port(server, listen, tls)
    except TlsConfigError as e:
        await server.stop(None)
        raise StartupError(str(e)) from None
    except RuntimeError as e:  # grpc raises RuntimeError("Failed to bind to address ...")
        await server.stop(None)
        raise StartupError(f"cannot listen on {listen}: {e}") from None

    endpoint = MetricsEndpoint(metrics)
    if metrics_listen:
        try:
            metrics_port = endpoint.serve(metrics_listen)
        except OSError as e:
            await server.stop(None)
            raise StartupError(f"cannot serve metrics on {metrics_listen}: {e}") from None
        log.info("metrics on http://%s/metrics (port %d)", metrics_listen, metrics_port)
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT) if stop is None else ()
    stop = stop or asyncio.Event()
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    try:
        await registry.start()
        await server.start()
        for service in ("", SERVICE_NAME):  # "" is the whole server, as probes ask by default
            await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "nameserver serving on %s:%d%s (%s)", host, port, " over TLS" if tls else "", described
        )
        await stop.wait()
        log.info("nameserver stopping (grace period %.1f s)", grace_period_s)
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
        # NOT_SERVING first, so load balancers and probes move away before the port closes.
        await health_servicer.enter_graceful_shutdown()
        await server.stop(grace_period_s)
        await registry.stop()
        await loop.run_in_executor(None, endpoint.stop)
    log.info("nameserver stopped")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = EmbeddedRegistryConfig()
    parser.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"address to serve on (default {DEFAULT_LISTEN}; port 0 picks a free port)",
    )
    # Defaults of None so that run() can tell a flag given from one left out, and refuse flags
    # of one registry given with the other.
    parser.add_argument(
        "--broker-expiry-ms",
        type=_positive_int,
        metavar="N",
        help=f"embedded: drop a broker silent this long (default {defaults.broker_expiry_ms})",
    )
    parser.add_argument(
        "--scan-interval-ms",
        type=_positive_int,
        metavar="N",
        help=f"embedded: how often to look for silent brokers "
        f"(default {defaults.scan_interval_ms})",
    )
    parser.add_argument(
        "--zk",
        metavar="HOSTS",
        help="read brokers from ZooKeeper, HOST:PORT[,HOST:PORT...][/chroot], instead of "
        "taking heartbeats",
    )
    parser.add_argument(
        "--zk-root",
        metavar="PATH",
        help=f"with --zk: the registry's root znode (default {zk_settings.DEFAULT_ROOT})",
    )
    parser.add_argument(
        "--zk-tls",
        action="store_true",
        help="with --zk: speak TLS to ZooKeeper's secure client port, with this nameserver's "
        "certificate (--tls-cert-file, --tls-key-file) and trusting --tls-ca-file",
    )
    parser.add_argument(
        "--zk-session-timeout-ms",
        type=_positive_int,
        metavar="N",
        help="with --zk: this nameserver's session timeout; a silent connection is noticed "
        f"within 2/3 of it (default {zk_settings.DEFAULT_SESSION_TIMEOUT_MS})",
    )
    parser.add_argument(
        "--metrics-listen",
        default="",
        metavar="HOST:PORT",
        help="serve Prometheus /metrics here: brokers, topics, route queries, refused calls "
        "and the process (default: none)",
    )
    tls_flags.add_arguments(parser)
    auth_flags.add_arguments(parser)


def _configs(
    args: argparse.Namespace, tls: ServerTls | None
) -> tuple[EmbeddedRegistryConfig | None, ZooKeeperRegistryConfig | None]:
    embedded = {
        k: v
        for k, v in (
            ("broker_expiry_ms", args.broker_expiry_ms),
            ("scan_interval_ms", args.scan_interval_ms),
        )
        if v is not None
    }
    zk: dict[str, Any] = {
        k: v
        for k, v in (("root", args.zk_root), ("session_timeout_ms", args.zk_session_timeout_ms))
        if v is not None
    }
    if args.zk_tls:
        if tls is None or not tls.ca_file:
            raise StartupError(
                "--zk-tls needs this nameserver's TLS (--tls-cert-file, --tls-key-file and the "
                "--tls-ca-file ZooKeeper's certificate chains to)"
            )
        zk["tls"] = tls.as_client()
    if args.zk is None:
        if zk:
            raise StartupError("--zk-root, --zk-session-timeout-ms and --zk-tls need --zk")
        return EmbeddedRegistryConfig(**embedded), None
    if embedded:
        raise StartupError(
            "--broker-expiry-ms and --scan-interval-ms are for the embedded registry; with --zk "
            "a broker leaves when its ZooKeeper session expires (the broker's "
            "--zk-session-timeout-ms)"
        )
    try:
        return None, ZooKeeperRegistryConfig(args.zk, **zk)
    except zk_settings.ZooKeeperConfigError as e:
        raise StartupError(str(e)) from None


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``tidemq nameserver`` (the ``tidemq.commands`` entry point)."""
    p = sub.add_parser("nameserver", help=DESCRIPTION)
    add_arguments(p)
    p.set_defaults(func=run, log_level=logging.INFO)


def run(args: argparse.Namespace) -> int:
    """Run with parsed arguments (``add_arguments``); the exit code."""
    die_with_parent()
    try:
        tls = tls_flags.from_args(args)
        registry_config, zk_config = _configs(args, tls)
        skew = args.auth_max_clock_skew_ms or auth_flags.DEFAULT_MAX_CLOCK_SKEW_MS
        if skew <= 0:
            raise StartupError("--auth-max-clock-skew-ms must be > 0")
        asyncio.run(
            serve(
                args.listen,
                registry_config,
                zk_config=zk_config,
                tls=tls,
                acl_path=args.acl_file or "",
                max_clock_skew_ms=skew,
                metrics_listen=args.metrics_listen,
            )
        )
    except (StartupError, TlsConfigError) as e:
        print(f"tidemq nameserver: {e}", file=sys.stderr)
        return 2
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tidemq nameserver", description=DESCRIPTION)
    add_arguments(parser)
    args = parser.parse_args(argv)
    # A server logs its lifecycle by default; a no-op when the CLI has configured logging.
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
