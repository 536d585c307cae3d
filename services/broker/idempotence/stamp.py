"""The property that makes idempotent records known: producer id, epoch, sequence and run
length, carried by the first record of each run.

A run is what one put stores of one producer's consecutive sequences in one queue: records
written back to back, at consecutive queue offsets. Only its first record is stamped; the
others carry nothing, so they are encoded like any plain message (the put's cheap path). The
table is rebuilt from the stamps (``log_scan``), so what makes a send idempotent travels with
its records: replicated as bytes, kept as long as they are.

The value is lowercase hex numbers joined by dots: ``"1f.3.a.100"`` is producer 0x1f, epoch 3,
sequences 10 to 265 (a run of 0x100); the run's other records carry ``RUN_MEMBER_SYSFLAG`` in
their header's SYSFLAG instead of a property. A run of one has three numbers (``"1f.3.a"``),
which is also how every record was stamped before runs: logs written then read the same.
"""

from __future__ import annotations

from typing import NamedTuple

PRODUCER_SEQ_PROPERTY = "PRODUCER_SEQ"
# The SYSFLAG bit of a run's other records (bit 11: RocketMQ uses bits 0-10). It tells them from
# a record that happens to follow a torn run in the same queue (a plain send, a fired timer).
RUN_MEMBER_SYSFLAG = 0x800


class StampFormatError(ValueError):
    """A PRODUCER_SEQ value that is not three or four hex numbers (written by another version)."""


class Stamp(NamedTuple):
    producer_id: int
    epoch: int
    sequence: int  # the run's first
    run_length: int = 1  # this record and the run_length - 1 that follow it


def encode_stamp(producer_id: int, epoch: int, sequence: int, count: int = 1) -> str:
    if count == 1:
        return f"{producer_id:x}.{epoch:x}.{sequence:x}"
    return f"{producer_id:x}.{epoch:x}.{sequence:x}.{count:x}"


def encode_stamp_property(producer_id: int, epoch: int, sequence: int, count: int) -> bytes:
    """The stamp as a record's encoded property (``name 0x01 value 0x02``), for a block's
    head (``storage.record.block``)."""
    value = encode_stamp(producer_id, epoch, sequence, count)
    return f"{PRODUCER_SEQ_PROPERTY}\x01{value}\x02".encode()


def decode_stamp(text: str) -> Stamp:
    parts = text.split(".")
    if len(parts) not in (3, 4):
        raise StampFormatError(f"{PRODUCER_SEQ_PROPERTY} {text!r} is not id.epoch.sequence[.count]")
    try:
        numbers = [int(p, 16) for p in parts]
    except ValueError:
        raise StampFormatError(f"{PRODUCER_SEQ_PROPERTY} {text!r} is not hex") from None
    stamp = Stamp(*numbers)
    if stamp.producer_id <= 0 or stamp.epoch < 0 or stamp.sequence < 0 or stamp.run_length <= 0:
        raise StampFormatError(f"{PRODUCER_SEQ_PROPERTY} {text!r} is out of range")
    return stamp
