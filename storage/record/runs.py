"""Runs of records by the span: where the records carrying one property are, and the runs of
flagged records that follow them, in one call per span of a CommitLog file (the broker's
idempotence scan follows every record a log holds this way: stamped run heads, and each run's
members, ``services/broker/idempotence/log_scan.py``).

``scan_runs`` walks the whole records of ``buf`` (one file, whose first byte is log offset
``base``) from ``pos`` to ``limit``, at most ``max_records`` (0: no limit), each checked for its
shape and position as ``decode.check_record`` checks it (no CRCs: the scan reads what dispatch
checked), and answers ``RunScan``: how many it scanned, where it stopped and why (as
``block.scan_span``), the last record scanned as (phy offset, size, queue offset, topic), and
``items`` in log order:

- ``(0, phy offset, size, topic, queue id, queue offset, properties)``: a record whose
  properties hold an item named ``name`` (the properties as stored, ``name 0x01 value 0x02``);
- ``(1, topic, queue id, first queue offset, count, last phy offset, last size)``: ``count``
  consecutive records of one queue, at consecutive queue offsets, without ``name`` and with
  ``member_flag`` set in their SYSFLAG;
- ``(2, phy offset)``: the first of consecutive records that are neither.

``py_scan_runs`` is the pure-Python twin of ``_cblock.scan_runs``; ``scan_runs`` is the one in
use (the compiled one unless ``TIDEMQ_PURE_PYTHON=1`` or it is not built).
"""

from __future__ import annotations

import os
import struct
from typing import Any, NamedTuple

from tidemq.storage.record.decode import _layout, _topic_of
from tidemq.storage.record.layout import CORRUPT, OK, Buf

Item = tuple[Any, ...]


class RunScan(NamedTuple):
    scanned: int
    end: int
    status: int
    reason: str | None
    items: list[Item]
    last: tuple[int, int, int, str] | None  # phy offset, size, queue offset, topic


def _has_item(props: bytes, name: bytes) -> bool:
    return any(item.startswith(name + b"\x01") for item in props.split(b"\x02"))


def py_scan_runs(
    buf: Buf, pos: int, limit: int, base: int, max_records: int, name: bytes, member_flag: int
) -> tuple[int, int, int, str | None, list[Item], tuple[int, int, int, str] | None]:
    """See the module docstring; answers the fields of ``RunScan`` as a tuple."""
    if pos < 0 or limit > len(buf):
        raise ValueError(f"span [{pos}, {limit}) outside a buffer of {len(buf)} bytes")
    items: list[Item] = []
    count = 0
    status: int = OK
    reason: str | None = None
    kind = 0  # the open segment: 0 none, 1 members, 2 other records
    seg: list[Any] = []  # an open members segment: topic, queue id, first, count, phy, size
    last: tuple[int, int, int, str] | None = None
    while pos < limit:
        if max_records and count >= max_records:
            break
        try:
            found = _layout(buf, pos, limit, base + pos)
        except struct.error:  # a field past the end of buf: the record claims too little
            found = (CORRUPT, "body length runs past the record")
        if len(found) == 2:
            status, reason = found[0], found[1]
            break
        fields, _, topic_at, props_len_at, _, end = found
        topic = _topic_of(buf, topic_at, props_len_at)
        if topic is None:
            status, reason = CORRUPT, "topic is empty or holds bytes no topic may hold"
            break
        props = bytes(buf[props_len_at + 2 : end])
        qid, qoff, phy, sys_flag, size = fields[3], fields[5], fields[6], fields[7], end - pos
        stamped = bool(props) and _has_item(props, name)
        member = not stamped and bool(sys_flag & member_flag)
        continues = kind == 1 and member and seg[:2] == [topic, qid] and qoff == seg[2] + seg[3]
        if kind == 1 and not continues:
            items.append((1, *seg))
            kind = 0
        if stamped:
            items.append((0, phy, size, topic, qid, qoff, props))
            kind = 0
        elif member:
            if not continues:
                kind, seg = 1, [topic, qid, qoff, 0, 0, 0]
            seg[3] += 1
            seg[4], seg[5] = phy, size
        elif kind != 2:
            items.append((2, phy))
            kind = 2
        last = (phy, size, qoff, topic)
        count += 1
        pos = end
    if kind == 1:
        items.append((1, *seg))
    return count, pos, status, reason, items, last


def _load() -> Any:
    if os.environ.get("TIDEMQ_PURE_PYTHON") == "1":
        return py_scan_runs
    try:
        from tidemq.storage.record import _cblock  # noqa: PLC0415 (optional, built by setup.py)
    except ImportError:
        return py_scan_runs
    return _cblock.scan_runs


_scan = _load()
IMPLEMENTATION = "python" if _scan is py_scan_runs else "c"


def scan_runs(
    buf: Buf, pos: int, limit: int, base: int, max_records: int, name: bytes, member_flag: int
) -> RunScan:
    return RunScan(*_scan(buf, pos, limit, base, max_records, name, member_flag))
