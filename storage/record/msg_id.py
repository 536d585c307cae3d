"""Offset message ids: store address + store port (int32) + PHYSICALOFFSET (int64), as uppercase
hex: 32 characters for an IPv4 store host, 56 for IPv6."""

from __future__ import annotations

import struct

from tidemq.storage.errors import InvalidMessageIdError

_host_hex: dict[tuple[bytes, int], str] = {}


def make_msg_id(store_host: tuple[bytes, int], phy_offset: int) -> str:
    # One id per sent and per pulled message, from few distinct hosts: the host part is cached.
    prefix = _host_hex.get(store_host)
    if prefix is None:
        prefix = (store_host[0] + struct.pack(">i", store_host[1])).hex().upper()
        if len(_host_hex) >= 4_096:
            _host_hex.clear()
        _host_hex[store_host] = prefix
    return f"{prefix}{phy_offset:016X}"


def parse_msg_id(msg_id: str) -> tuple[tuple[bytes, int], int]:
    """Offset message id -> ((store address, port), physical offset)."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise InvalidMessageIdError(f"message id {msg_id!r} is not hex") from None
    if len(raw) not in (16, 28):
        raise InvalidMessageIdError(
            f"message id {msg_id!r} must be 32 (IPv4) or 56 (IPv6) hex characters"
        )
    addr_len = len(raw) - 12
    port, offset = struct.unpack_from(">iq", raw, addr_len)
    if not 0 <= port <= 65_535 or offset < 0:
        # make_msg_id never writes these: the id was forged or damaged, not merely stale.
        raise InvalidMessageIdError(f"message id {msg_id!r} holds port {port}, offset {offset}")
    return (raw[:addr_len], port), offset
