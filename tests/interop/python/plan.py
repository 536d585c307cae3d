"""What the official Python client's programs share: the plan they are given (JSON, the first
argument; stdin is kept for "stop now": a program that stays runs until stdin closes), the JSON
lines they print, and a received message as JSON.

These modules run in ``.venv-rocketmq`` (``make interop-deps``) as
``python -m tests.interop.python.<program>`` from the repository root, never inside tidemq's
own processes: the client's ``apache.rocketmq.v2`` stubs clash with ours."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from rocketmq import ClientConfiguration, Credentials


def read_plan() -> dict[str, Any]:
    plan: dict[str, Any] = json.loads(sys.argv[1])
    return plan


def emit(event: str, **fields: Any) -> None:
    """One JSON line on stdout, flushed at once: the test reads them while the program runs."""
    print(json.dumps({"event": event, **fields}, sort_keys=True), flush=True)


def configuration(plan: dict[str, Any]) -> Any:
    """The access point (``endpoints``: "host:port[;host:port]"), with the plan's credentials
    (``access_key``/``secret_key``; none without them)."""
    return ClientConfiguration(
        plan["endpoints"],
        Credentials(plan.get("access_key", ""), plan.get("secret_key", "")),
        namespace="",
        request_timeout=plan.get("request_timeout_s", 3),
    )


def tls_enable(plan: dict[str, Any]) -> bool:
    """``tls``: the client's TLS switch; it trusts the CA in GRPC_DEFAULT_SSL_ROOTS_FILE_PATH."""
    return bool(plan.get("tls", False))


def wall_ms() -> int:
    return int(time.time() * 1000)


def message_json(m: Any) -> dict[str, Any]:
    """What an application reads of a received message (a ``rocketmq.Message``)."""
    return {
        "message_id": m.message_id,
        "topic": m.topic,
        "tag": m.tag,
        "keys": sorted(m.keys),
        "properties": dict(m.properties),
        "body": m.body.decode("utf-8", errors="replace"),
        "message_group": m.message_group,
        "delivery_attempt": m.delivery_attempt,
        "delivery_timestamp_ms": m.delivery_timestamp,
        "born_timestamp_ms": m.born_timestamp,
        "corrupted": m.corrupted,
        "received_at_ms": wall_ms(),
    }


def error_json(e: BaseException) -> dict[str, Any]:
    return {"error": type(e).__name__, "message": str(e)}
