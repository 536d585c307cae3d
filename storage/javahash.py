"""Java ``String.hashCode`` in Python.

Tag codes in the ConsumeQueue and key hashes in the IndexFile are Java hash codes, so they must
match bit for bit: a 32-bit wrapping polynomial with multiplier 31 over UTF-16 code units (so a
character outside the BMP counts as its two surrogates), returned as a signed int32.

The sum over precomputed powers of 31 runs in C (``map``/``sum``), which is several times faster
than a Python loop: dispatch hashes every tag and key of every message.
"""

from __future__ import annotations

import functools
import operator
import sys
from array import array

_MASK = 0xFFFFFFFF
_TABLE_LEN = 256
# _POW[i] = 31**(_TABLE_LEN - 1 - i) mod 2**32, so the last n entries weight a string of length n.
_POW = [pow(31, _TABLE_LEN - 1 - i, 1 << 32) for i in range(_TABLE_LEN)]
_UTF16_NATIVE = "utf-16-le" if sys.byteorder == "little" else "utf-16-be"


def _to_signed(h: int) -> int:
    return h - (1 << 32) if h & 0x80000000 else h


def _units(s: str) -> bytes | array[int]:
    if s.isascii():
        return s.encode("ascii")
    return array("H", s.encode(_UTF16_NATIVE))


def java_hash(s: str) -> int:
    """``s.hashCode()`` as Java computes it (signed 32-bit)."""
    units = _units(s)
    n = len(units)
    h = 0
    start = 0
    # Horner over table-sized chunks: h * 31**len(chunk) + sum(chunk weights).
    while n - start > _TABLE_LEN:
        chunk = units[start : start + _TABLE_LEN]
        h = (h * pow(31, _TABLE_LEN, 1 << 32) + sum(map(operator.mul, chunk, _POW))) & _MASK
        start += _TABLE_LEN
    rest = units[start:]
    m = len(rest)
    if m:
        h = (h * pow(31, m, 1 << 32) + sum(map(operator.mul, rest, _POW[_TABLE_LEN - m :]))) & _MASK
    return _to_signed(h)


@functools.lru_cache(maxsize=8192)
def tag_code(tag: str) -> int:
    """The ConsumeQueue tag code: the tag's Java hash code. Tags repeat, hence the cache."""
    return java_hash(tag)


def index_key_hash(key: str) -> int:
    """The IndexFile key hash: ``abs(hashCode)``, 0 where ``abs`` overflows (Integer.MIN_VALUE)."""
    h = java_hash(key)
    if h == -(1 << 31):
        return 0
    return abs(h)
