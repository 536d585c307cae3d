"""The store's CRC-32 is zlib's, value for value, whichever implementation computes it: records
written by one build are checked by another, and RocketMQ defines BODYCRC by zlib's."""

import mmap
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.storage import crc

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", 0),
        (b"123456789", 0xCBF43926),  # the CRC-32/ISO-HDLC check value
        (b"The quick brown fox jumps over the lazy dog", 0x414FA339),
    ],
)
def test_check_values(data: bytes, expected: int) -> None:
    assert crc.crc32(data) == expected


@given(st.binary(max_size=9000), st.integers(0, 0xFFFFFFFF), st.integers(0, 64))
def test_equals_zlib_for_any_bytes_start_value_and_slice(data: bytes, start: int, cut: int) -> None:
    assert crc.crc32(data, start) == zlib.crc32(data, start)
    view = memoryview(data)[cut:]
    assert crc.crc32(view) == zlib.crc32(data[cut:])
    # Running CRCs continue across pieces exactly as over the whole, as the record CRC does.
    assert crc.crc32(data[cut:], crc.crc32(data[:cut])) == zlib.crc32(data)


def test_reads_straight_from_a_mapping() -> None:
    with mmap.mmap(-1, 8192) as mm:
        mm[:11] = b"hello world"
        with memoryview(mm) as view:
            assert crc.crc32(view[:11]) == zlib.crc32(b"hello world")


def test_the_fast_implementation_is_installed() -> None:
    # zlib-ng is a dependency: without it every put, pull and check computes its CRCs about
    # seven times slower, which only the benchmarks would show.
    assert crc.IMPLEMENTATION == "zlib-ng"
