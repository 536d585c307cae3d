"""The CommitLog record codec: RocketMQ's message layout, byte for byte (spec §1.2-1.4).

Import from here; the modules are the codec's parts:

- ``layout``: the byte layout (drawn in its docstring), the blank marker, the record CRC
  property, and the constants and compiled structs the rest shares;
- ``messages``: ``Message``, ``AppendResult``, ``StoredMessage`` and ``RecordInfo``;
- ``encode``: validating a batch and laying it out as records (the put path), in one place;
- ``decode``: checking the bytes at a position and decoding them (dispatch, recovery, reads), in
  one place;
- ``properties``: the ``name\\x01value\\x02`` properties; ``msg_id``: offset message ids.
"""

from tidemq.storage.record.decode import check_record, decode_record, read_record
from tidemq.storage.record.encode import (
    encode_batch,
    encode_record,
    record_suffix,
    topic_prefix,
    validate_topic,
    write_blank,
)
from tidemq.storage.record.layout import (
    BLANK,
    BLANK_MAGIC,
    BLANK_SIZE,
    CORRUPT,
    END_OF_FILE,
    FIXED_OVERHEAD_V4,
    HEADERS,
    INCOMPLETE,
    MAGIC_V1,
    MAGIC_V2,
    OK,
    PREFIX,
    PROP_LEGACY_RECORD_CRC,
    PROP_RECORD_CRC,
    PROPERTIES_MAX_BYTES,
    RECORD_CRC_SIZE,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
    TOPIC_MAX_BYTES,
    TRANSACTION_MASK,
    TRANSACTION_PREPARED,
    TRANSACTION_ROLLBACK,
    Buf,
    WBuf,
)
from tidemq.storage.record.messages import (
    AppendResult,
    BlockPlacement,
    EncodedBatch,
    Message,
    RecordInfo,
    SentBlock,
    StoredMessage,
)
from tidemq.storage.record.msg_id import make_msg_id, parse_msg_id
from tidemq.storage.record.properties import (
    NAME_SEP,
    PROP_KEYS,
    PROP_SEP,
    PROP_TAGS,
    PROP_TIMER_DELIVER_MS,
    PROP_UNIQ_KEY,
    TIMER_TOPIC,
    decode_properties,
    encode_properties,
    find_property,
    parse_timer_deliver_ms,
)

__all__ = [
    "BLANK",
    "BLANK_MAGIC",
    "BLANK_SIZE",
    "CORRUPT",
    "END_OF_FILE",
    "FIXED_OVERHEAD_V4",
    "HEADERS",
    "INCOMPLETE",
    "MAGIC_V1",
    "MAGIC_V2",
    "NAME_SEP",
    "OK",
    "PREFIX",
    "PROPERTIES_MAX_BYTES",
    "PROP_KEYS",
    "PROP_LEGACY_RECORD_CRC",
    "PROP_RECORD_CRC",
    "PROP_SEP",
    "PROP_TAGS",
    "PROP_TIMER_DELIVER_MS",
    "PROP_UNIQ_KEY",
    "RECORD_CRC_SIZE",
    "SYSFLAG_BORNHOST_V6",
    "SYSFLAG_STOREHOST_V6",
    "TIMER_TOPIC",
    "TOPIC_MAX_BYTES",
    "TRANSACTION_MASK",
    "TRANSACTION_PREPARED",
    "TRANSACTION_ROLLBACK",
    "AppendResult",
    "BlockPlacement",
    "Buf",
    "EncodedBatch",
    "Message",
    "RecordInfo",
    "SentBlock",
    "StoredMessage",
    "WBuf",
    "check_record",
    "decode_properties",
    "decode_record",
    "encode_batch",
    "encode_properties",
    "encode_record",
    "find_property",
    "make_msg_id",
    "parse_msg_id",
    "parse_timer_deliver_ms",
    "read_record",
    "record_suffix",
    "topic_prefix",
    "validate_topic",
    "write_blank",
]
