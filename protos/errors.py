"""How a typed error travels: a gRPC status plus an ``ErrorDetail`` in trailing metadata.

Servers attach ``error_metadata(detail)`` to the status they abort with; clients read it back with
``detail_from_metadata`` and map ``detail.code`` to an exception whose ``retriable`` is
``detail.retriable``. A status without the detail (a proxy, a crash) decodes to None and the
client falls back on the gRPC status code alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tidemq.protos import common_pb2

METADATA_KEY = "tidemq-error-bin"  # "-bin": gRPC carries the value as raw bytes


def error_metadata(detail: Any) -> tuple[tuple[str, bytes]]:
    return ((METADATA_KEY, detail.SerializeToString()),)


def detail_from_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> Any | None:
    """The ErrorDetail in a call's trailing metadata, or None when there is none (or it is
    unreadable)."""
    for key, value in metadata or ():
        if key == METADATA_KEY and isinstance(value, bytes):
            detail = common_pb2.ErrorDetail()
            try:
                detail.ParseFromString(value)
            except Exception:  # noqa: BLE001 - a damaged detail must not hide the status itself
                return None
            return detail
    return None
