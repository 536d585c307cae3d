"""The shapes a record takes on each side of the codec: a ``Message`` a producer hands to the
store, the ``AppendResult`` saying where it went, the ``StoredMessage`` a reader gets back, and the
``RecordInfo`` dispatch and recovery read without decoding the body."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from tidemq.storage.javahash import tag_code_of_bytes
from tidemq.storage.record.msg_id import make_msg_id
from tidemq.storage.record.properties import PROP_KEYS, PROP_TAGS


@dataclass(slots=True)
class Message:
    """A message as a producer hands it to the store."""

    topic: str
    body: bytes
    queue_id: int = 0
    tags: str | None = None
    keys: Sequence[str] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    flag: int = 0
    born_timestamp_ms: int = 0
    born_host: tuple[bytes, int] = (b"\x7f\x00\x00\x01", 0)
    sys_flag: int = 0
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0


class AppendResult(NamedTuple):
    """Where one appended message went. A NamedTuple: one is built per message under the put
    lock, and a frozen dataclass costs four times as much to construct."""

    phy_offset: int
    size: int
    queue_offset: int
    store_timestamp_ms: int
    store_host: tuple[bytes, int]

    @property
    def msg_id(self) -> str:
        """The offset message id; built on demand, outside the append lock."""
        return make_msg_id(self.store_host, self.phy_offset)


class EncodedBatch(NamedTuple):
    """A batch encoded for its place in the log, not yet written anywhere."""

    # (offset, records, fills_file): whole records back to back, or (fills_file, no bytes) the
    # place of a blank marker that ends its file. In log order; each span lies inside one file.
    spans: list[tuple[int, bytes, bool]]
    results: list[AppendResult]
    end: int  # the log's end after the batch
    queue_offsets: dict[tuple[str, int], int]  # next queue offset of every queue the batch used


class SentBlock(NamedTuple):
    """One queue's messages as a producer encoded them (``record.block``), to be put whole."""

    topic: str
    queue_id: int
    records: bytes
    record_count: int
    born_host: tuple[bytes, int]
    # An idempotent run: the stamp property for the first record (encoded ``name 0x01 value
    # 0x02``) and the SYSFLAG bit of the others.
    head_property: bytes = b""
    member_sys_flag: int = 0


class BlockPlacement(NamedTuple):
    """Where a put block went: record i at queue offset ``first_queue_offset + i``, at log
    offset ``first_phy_offset`` plus the stored sizes before it (sent size + ``added_bytes``,
    + ``head_added_bytes`` for the first), or where ``file_starts`` (record index, offset) puts
    it."""

    queue_id: int
    record_count: int
    first_queue_offset: int
    first_phy_offset: int
    added_bytes: int
    head_added_bytes: int
    file_starts: list[tuple[int, int]]
    last_phy_offset: int
    last_size: int
    body_bytes: int


class StoredMessage(NamedTuple):
    """A record decoded for a reader. A NamedTuple, not a frozen dataclass: readers build one
    per message, and a frozen dataclass costs four times as much to construct."""

    topic: str
    queue_id: int
    queue_offset: int
    phy_offset: int
    size: int
    body: bytes
    body_crc: int
    flag: int
    sys_flag: int
    born_timestamp_ms: int
    born_host: tuple[bytes, int]
    store_timestamp_ms: int
    store_host: tuple[bytes, int]
    reconsume_times: int
    prepared_transaction_offset: int
    properties: dict[str, str]

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROP_TAGS)

    @property
    def keys(self) -> list[str]:
        return [k for k in self.properties.get(PROP_KEYS, "").split(" ") if k]

    @property
    def msg_id(self) -> str:
        return make_msg_id(self.store_host, self.phy_offset)


@dataclass(slots=True)
class RecordInfo:
    """What dispatch and recovery need from one record, read without decoding the body."""

    size: int
    topic: str
    queue_id: int
    queue_offset: int
    phy_offset: int
    sys_flag: int
    store_timestamp_ms: int
    tags: bytes | None
    keys: bytes | None
    uniq_key: bytes | None
    # A TIMER_TOPIC record's delivery time (``properties.TIMER_TOPIC``), else None.
    timer_deliver_ms: int | None = None

    def entry_tag_code(self) -> int:
        """The tag code of this record's ConsumeQueue entry: a timer record's delivery time, else
        the Java hash of its tags (0 without tags)."""
        if self.timer_deliver_ms is not None:
            return self.timer_deliver_ms
        return tag_code_of_bytes(self.tags) if self.tags else 0
