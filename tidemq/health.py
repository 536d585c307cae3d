"""``tidemq health ADDRESS``: ask a nameserver or broker's gRPC health service whether it serves.

The probe for container HEALTHCHECKs and scripts: exit code 0 for SERVING, 1 for anything else
(NOT_SERVING during a graceful shutdown, an unknown service, no answer within the timeout), with
one line saying which.
"""

from __future__ import annotations

import argparse

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tidemq.cli.common import add_tls
from tidemq.protos.tls import TlsSettings, sync_channel

DEFAULT_TIMEOUT_S = 3.0


def check(
    address: str,
    service: str = "",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    tls: TlsSettings | None = None,
) -> str:
    """The serving status's name (``SERVING``, ``NOT_SERVING``, ...), or ``UNREACHABLE: why``.
    Over TLS with ``tls`` (by default as ``TIDEMQ_TLS_*`` say)."""
    if tls is None:
        tls = TlsSettings.from_env()
    with sync_channel(address, tls) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                return "SERVICE_UNKNOWN"
            return f"UNREACHABLE: {e.code().name} {e.details()}"
    name: str = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return name


def cmd_health(args: argparse.Namespace) -> int:
    status = check(args.address, args.service, args.timeout)
    what = f"{args.address} service {args.service!r}" if args.service else args.address
    print(f"{what}: {status}")
    return 0 if status == "SERVING" else 1


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "health", help="check a nameserver's or broker's gRPC health (exit 0 when SERVING)"
    )
    p.add_argument("address", metavar="HOST:PORT")
    p.add_argument(
        "--service",
        default="",
        help="a service name, e.g. tidemq.v1.Broker (default: the whole server)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help=f"seconds to wait for an answer (default {DEFAULT_TIMEOUT_S})",
    )
    add_tls(p)
    p.set_defaults(func=cmd_health)
