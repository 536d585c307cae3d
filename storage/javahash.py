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
_POW_REV = [pow(31, i, 1 << 32) for i in range(_TABLE_LEN)]  # 31**i mod 2**32
_POW_TABLE_LEN = pow(31, _TABLE_LEN, 1 << 32)
_UTF16_NATIVE = "utf-16-le" if sys.byteorder == "little" else "utf-16-be"


def _to_signed(h: int) -> int:
    return h - (1 << 32) if h & 0x80000000 else h


def java_hash(s: str) -> int:
    """``s.hashCode()`` as Java computes it (signed 32-bit)."""
    units: bytes | array[int] = (
        s.encode("ascii") if s.isascii() else array("H", s.encode(_UTF16_NATIVE))
    )
    n = len(units)
    if n <= _TABLE_LEN:
        # The last unit has weight 31**0: pair the units backwards with the powers.
        return _to_signed(sum(map(operator.mul, reversed(units), _POW_REV)) & _MASK)
    h = 0
    for start in range(0, n, _TABLE_LEN):
        chunk = units[start : start + _TABLE_LEN]
        weight = _POW_TABLE_LEN if len(chunk) == _TABLE_LEN else pow(31, len(chunk), 1 << 32)
        h = (h * weight + sum(map(operator.mul, reversed(chunk), _POW_REV))) & _MASK
    return _to_signed(h)


@functools.lru_cache(maxsize=8192)
def tag_code(tag: str) -> int:
    """The ConsumeQueue tag code: the tag's Java hash code. Tags repeat, hence the cache."""
    return java_hash(tag)


@functools.lru_cache(maxsize=8192)
def tag_code_of_bytes(tag: bytes) -> int:
    """``tag_code`` of a TAGS value as a record stores it (UTF-8), without decoding each time."""
    return java_hash(tag.decode("utf-8", "replace"))


def index_key_hash(key: str) -> int:
    """The IndexFile key hash: ``abs(hashCode)``, 0 where ``abs`` overflows (Integer.MIN_VALUE)."""
    h = java_hash(key)
    if h == -(1 << 31):
        return 0
    return abs(h)


@functools.lru_cache(maxsize=4096)
def _topic_prefix_hash(topic: str) -> int:
    """The unsigned Java hash of ``topic + "#"``, where every index key of the topic starts."""
    return java_hash(topic + "#") & _MASK


def topic_key_hash(topic: str, key: bytes) -> int:
    """``index_key_hash(topic + "#" + key)`` for a key as a record stores it (UTF-8), without
    building the string: the hash of ``topic#`` is cached per topic and carried forward by
    31**len(key), so only the key's own units are summed."""
    n = len(key)
    if n > _TABLE_LEN or not key.isascii():
        return index_key_hash(f"{topic}#{key.decode('utf-8', 'replace')}")
    units: int = sum(map(operator.mul, reversed(key), _POW_REV))
    h = (_topic_prefix_hash(topic) * _POW_REV[n] + units) & _MASK
    if h == 0x80000000:
        return 0
    return (1 << 32) - h if h & 0x80000000 else h
