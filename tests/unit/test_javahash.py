"""Java String.hashCode vectors: tag codes and index keys must match Java bit for bit."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage.javahash import index_key_hash, java_hash, tag_code

pytestmark = pytest.mark.unit


def reference(s: str) -> int:
    """The definition, one UTF-16 code unit at a time."""
    h = 0
    raw = s.encode("utf-16-be")
    for i in range(0, len(raw), 2):
        h = (31 * h + int.from_bytes(raw[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("hello", 99162322),
        ("Hello World", -862545276),
        ("TAG1", 2567159),
        ("polygenelubricants", -2147483648),  # Integer.MIN_VALUE
        ("Aa", 2112),
        ("BB", 2112),  # the classic collision
    ],
)
def test_known_java_values(text: str, expected: int) -> None:
    assert java_hash(text) == expected


def test_index_key_hash_maps_min_value_to_zero() -> None:
    assert index_key_hash("polygenelubricants") == 0
    assert index_key_hash("Hello World") == 862545276
    assert tag_code("TAG1") == 2567159


@given(st.text(max_size=700))
def test_matches_reference_including_surrogates_and_long_strings(text: str) -> None:
    assert java_hash(text) == reference(text)
