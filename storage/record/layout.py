"""CommitLog record layout: RocketMQ's message layout, byte for byte (spec §1.2-1.4), and the
constants and compiled structs every part of the codec shares.

Every integer is big-endian. With IPv4 hosts and the V1 magic a record is::

    off  size  field
      0     4  TOTALSIZE            whole record, this field included
      4     4  MAGICCODE            V1 0xDAA320A7 | V2 0xDAA320AB (2-byte topic length)
      8     4  BODYCRC              zlib's CRC-32 of the body & 0x7FFFFFFF (storage.crc)
     12     4  QUEUEID
     16     4  FLAG
     20     8  QUEUEOFFSET          entry number in the ConsumeQueue
     28     8  PHYSICALOFFSET       global CommitLog offset of this record
     36     4  SYSFLAG              0x10 born host v6, 0x20 store host v6, 0x4/0xC prepared/rollback
                                 (0x800: the broker flags an idempotent run's later records)
     40     8  BORNTIMESTAMP        ms, producer clock
     48     8  BORNHOST             4-byte address + int32 port (IPv6: 16 + 4)
     56     8  STORETIMESTAMP       ms, broker clock
     64     8  STOREHOSTADDRESS     as BORNHOST
     72     4  RECONSUMETIMES
     76     8  PREPARED TRANSACTION OFFSET
     84     4  BODY LENGTH, then the body at 88
      .     1  TOPIC LENGTH (V1; 2 bytes in V2), then the UTF-8 topic
      .     2  PROPERTIES LENGTH (signed), then "name\\x01value\\x02"...

    fixed overhead: 20 + 8 + 8 + 4 + 8 + 8 + 8 + 8 + 8 + 4 + 8 + 4 + 1 + 2 = 91 bytes
    (each IPv6 host adds 12)

Properties are ``record.properties``'s ``name 0x01 value 0x02`` pairs. One property changes
what dispatch indexes: a record of ``%SYS%TIMER`` (a pending delayed message) carries
``TIMER_DELIVER_MS``, and its ConsumeQueue entry's tag code is that delivery time, not the tags'
hash (``RecordInfo.entry_tag_code``).

End of file: when a record plus 8 bytes does not fit in what is left of a file, an 8-byte blank
marker (int32 remaining bytes, int32 0xCBD43194) is written and the record goes to the next file,
so a record never straddles two files.

Record CRC (``StoreConfig.record_crc``, on by default): the last property is
``__CRC32H`` 0x01, ten decimal digits (most significant first, zero-padded), 0x02; 20 bytes. The
digits are zlib.crc32 & 0x7FFFFFFF of everything after the body up to and including the
property's 0x01, continued over the header (TOTALSIZE through BODY LENGTH). It leaves the body
out because BODYCRC, which it covers, already vouches for the body: every byte is covered, and
a put computes one CRC over the body, not two. The part after the body comes first because it is
the same for many messages (topic and tags), so its CRC is computed once and cached.
RocketMQ's ``__CRC32#`` (enabledAppendPropCRC: the same 20 bytes, digits least significant
first, over every byte before the property) is still checked where a record carries it: earlier
tidemq builds wrote it.
"""

from __future__ import annotations

import mmap
import re
import struct
from typing import Final

MAGIC_V1: Final = 0xDAA320A7
MAGIC_V2: Final = 0xDAA320AB
BLANK_MAGIC: Final = 0xCBD43194
BLANK_SIZE: Final = 8
FIXED_OVERHEAD_V4: Final = 91

SYSFLAG_BORNHOST_V6: Final = 0x10
SYSFLAG_STOREHOST_V6: Final = 0x20
TRANSACTION_MASK: Final = 0xC
TRANSACTION_PREPARED: Final = 0x4
TRANSACTION_ROLLBACK: Final = 0xC

TOPIC_MAX_BYTES: Final = 127
PROPERTIES_MAX_BYTES: Final = 32_767
TOPIC_RE = re.compile(r"^[%|a-zA-Z0-9_-]+\Z")  # \Z, not $: "$" matches before a final "\n"
# Reading keeps "$" (a final "\n" passes): builds before 2026-12 wrote topics with it, and a
# record a reader refused would be cut from the log as damaged.
TOPIC_BYTES_RE = re.compile(rb"^[%|a-zA-Z0-9_-]+$")

Buf = bytes | bytearray | memoryview | mmap.mmap
WBuf = bytearray | memoryview | mmap.mmap

# The record CRC property tidemq writes (see the module docstring) and RocketMQ's whole-record
# one, which earlier tidemq builds wrote and readers still check.
PROP_RECORD_CRC: Final = "__CRC32H"
PROP_LEGACY_RECORD_CRC: Final = "__CRC32#"
RECORD_CRC_SIZE: Final = 20  # name (8), 0x01, ten digits, 0x02
RECORD_CRC_NAME: Final = b"__CRC32H\x01"
LEGACY_RECORD_CRC_NAME: Final = b"__CRC32#\x01"
CRC_DIGITS: Final = b"%010d\x02"
CRC_MASK: Final = 0x7FFFFFFF

# TOTALSIZE .. BORNTIMESTAMP: the part before the first host, identical in every variant.
PREFIX = struct.Struct(">iIiiiqqiq")
BLANK = struct.Struct(">iI")
I16 = struct.Struct(">h")  # a V2 topic length, and PROPERTIES LENGTH
_HOST = {False: "4si", True: "16si"}


def _header(born_v6: bool, store_v6: bool) -> struct.Struct:
    return struct.Struct(">iIiiiqqiq" + _HOST[born_v6] + "q" + _HOST[store_v6] + "iqi")


# Full header up to and including BODY LENGTH, keyed by (born host v6, store host v6).
HEADERS: Final = {(b, s): _header(b, s) for b in (False, True) for s in (False, True)}
HEADER_V4: Final = HEADERS[False, False]

# Outcomes of checking the bytes at one position (spec §1.4).
OK: Final = 0
END_OF_FILE: Final = 1
INCOMPLETE: Final = 2  # fewer bytes than the record claims: a torn or still-arriving tail
CORRUPT: Final = 3
