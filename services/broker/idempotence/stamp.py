"""The property every idempotent record carries: its producer id, epoch and sequence.

The table is rebuilt from these (``log_scan``), so what makes a send idempotent travels with
its record: replicated as bytes, kept as long as the record. The value is three lowercase hex
numbers joined by dots (``"1f.3.a"``: producer 0x1f, epoch 3, sequence 10): a few bytes, no
parsing beyond ``int(x, 16)``.
"""

from __future__ import annotations

from typing import NamedTuple

PRODUCER_SEQ_PROPERTY = "PRODUCER_SEQ"


class StampFormatError(ValueError):
    """A PRODUCER_SEQ value that is not three hex numbers (written by another version)."""


class Stamp(NamedTuple):
    producer_id: int
    epoch: int
    sequence: int


def encode_stamp(producer_id: int, epoch: int, sequence: int) -> str:
    return f"{producer_id:x}.{epoch:x}.{sequence:x}"


def decode_stamp(text: str) -> Stamp:
    parts = text.split(".")
    if len(parts) != 3:
        raise StampFormatError(f"{PRODUCER_SEQ_PROPERTY} {text!r} is not id.epoch.sequence")
    try:
        pid, epoch, seq = (int(p, 16) for p in parts)
    except ValueError:
        raise StampFormatError(f"{PRODUCER_SEQ_PROPERTY} {text!r} is not hex") from None
    if pid <= 0 or epoch < 0 or seq < 0:
        raise StampFormatError(f"{PRODUCER_SEQ_PROPERTY} {text!r} is out of range")
    return Stamp(pid, epoch, seq)
