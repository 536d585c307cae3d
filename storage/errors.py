"""Typed errors of the store.

Every error carries ``retriable``: whether the same request may succeed later without anyone
changing it (a full disk that retention will clear: yes; an oversize body: never). The broker maps
``code`` onto its gRPC status and typed error code; the SDK's retry policy keys on ``retriable``.
"""

from __future__ import annotations


class StoreError(Exception):
    """Root of every error the store raises on purpose."""

    code = "STORE_ERROR"
    retriable = False


class MessageIllegalError(StoreError):
    """A message that can never be stored as it is (RocketMQ's MESSAGE_ILLEGAL)."""

    code = "MESSAGE_ILLEGAL"


class BodyTooLargeError(MessageIllegalError):
    code = "BODY_TOO_LARGE"


class InvalidTopicError(MessageIllegalError):
    code = "INVALID_TOPIC"


class PropertiesTooLargeError(MessageIllegalError):
    code = "PROPERTIES_SIZE_EXCEEDED"


class InvalidPropertyError(MessageIllegalError):
    code = "INVALID_PROPERTY"


class InvalidQueueIdError(MessageIllegalError):
    code = "INVALID_QUEUE_ID"


class StoreNotWritableError(StoreError):
    """The store refuses appends for now (disk nearly full, failed flush, slave role)."""

    code = "STORE_NOT_WRITABLE"
    retriable = True


class DiskFullError(StoreNotWritableError):
    code = "DISK_FULL"


class DiskFailedError(StoreNotWritableError):
    """The disk failed an I/O the store depends on (EIO on a flush or a write). The store takes
    no more writes until it is restarted on a repaired disk; retriable, because another broker
    group (or the slave that takes over) can take the same send."""

    code = "DISK_FAILED"


class StoreLockedError(StoreError):
    """Another process holds the store directory."""

    code = "STORE_LOCKED"


class StoreClosedError(StoreError):
    code = "STORE_CLOSED"


class RawAppendOffsetError(StoreError):
    """A raw (replicated) byte range that does not continue the log exactly."""

    code = "RAW_OFFSET_MISMATCH"

    def __init__(self, expected: int, got: int) -> None:
        super().__init__(f"raw append at offset {got}, but the log ends at {expected}")
        self.expected = expected
        self.got = got


class TailNotAlignedError(StoreError):
    """A local append while the log ends inside a partly replicated record."""

    code = "TAIL_NOT_ALIGNED"


class OffsetBelowMinError(StoreError):
    """A read below what retention has kept. ``min_offset`` says where the data starts now."""

    code = "OFFSET_TOO_SMALL"

    def __init__(self, what: str, offset: int, min_offset: int) -> None:
        super().__init__(
            f"{what} {offset} is below the minimum {min_offset} (deleted by retention)"
        )
        self.offset = offset
        self.min_offset = min_offset


class OffsetBeyondMaxError(StoreError):
    """A read past the end of a queue by more than the next offset (RocketMQ's OVERFLOW_BADLY)."""

    code = "OFFSET_OVERFLOW"

    def __init__(self, what: str, offset: int, max_offset: int) -> None:
        super().__init__(f"{what} {offset} is beyond the maximum {max_offset}")
        self.offset = offset
        self.max_offset = max_offset


class MessageNotFoundError(StoreError):
    code = "MESSAGE_NOT_FOUND"


class InvalidMessageIdError(StoreError):
    code = "INVALID_MESSAGE_ID"


class CorruptRecordError(StoreError):
    """A record whose bytes fail validation (CRC, magic, length) where a whole one was expected."""

    code = "CORRUPT_RECORD"

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"corrupt record at offset {offset}: {reason}")
        self.offset = offset
        self.reason = reason


class CorruptStoreError(StoreError):
    """The store on disk cannot be opened safely without an operator's decision."""

    code = "CORRUPT_STORE"


class ConfigError(StoreError, ValueError):
    code = "INVALID_CONFIG"
