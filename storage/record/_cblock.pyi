"""Types of the compiled twin (``_cblock.c``): the signatures of ``block.py_fill_block``,
``block.py_scan_span`` and ``gather.py_gather_records``, and zlib's ``crc32``."""

from collections.abc import Collection
from typing import Any, Final

from tidemq.storage.record.block import FilledBlock, SpanScan
from tidemq.storage.record.gather import GatherResult
from tidemq.storage.record.layout import Buf, WBuf

CRC32_IMPLEMENTATION: Final[str]  # "vpclmulqdq", "pclmul" or "slice-by-8", chosen at import

def setup(
    corrupt_block: type[Exception],
    invalid_property: type[Exception],
    properties_too_large: type[Exception],
    body_too_large: type[Exception],
    corrupt_record: type[Exception],
    filled_block: type[FilledBlock],
    span_scan: type[SpanScan],
    gather_result: type[GatherResult],
    /,
) -> None: ...
def crc32(data: Buf, start: int = 0, /) -> int: ...
def _crc32_each(data: Buf, start: int, /) -> list[int]: ...
def fill_block(
    records: Buf,
    count: int,
    topic: str,
    queue_id: int,
    start: int,
    file_size: int,
    first_queue_offset: int,
    now_ms: int,
    born_host: tuple[bytes, int],
    store_host: tuple[bytes, int],
    max_body_bytes: int,
    record_crc: bool,
    out: WBuf,
    out_pos: int,
    head_property: bytes = b"",
    member_sys_flag: int = 0,
) -> FilledBlock: ...
def scan_span(
    buf: Buf,
    pos: int,
    limit: int,
    base: int,
    verify_from: int,
    require_record_crc: bool,
    max_records: int,
) -> SpanScan: ...
def gather_records(
    buf: Buf,
    base: int,
    written: int,
    readable: int,
    visible: int,
    entries: Buf,
    tag_codes: Collection[int] | None,
    tags: Collection[str] | None,
    max_records: int,
    max_bytes: int,
    out: bytearray,
    require_record_crc: bool,
) -> GatherResult: ...
def scan_runs(
    buf: Buf,
    pos: int,
    limit: int,
    base: int,
    max_records: int,
    name: bytes,
    member_flag: int,
) -> tuple[int, int, int, str | None, list[tuple[Any, ...]], tuple[int, int, int, str] | None]: ...
