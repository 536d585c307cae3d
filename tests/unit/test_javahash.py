"""Java String.hashCode vectors: tag codes and index keys must match Java bit for bit."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.storage.javahash import index_key_hash, java_hash, tag_code, topic_key_hash

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


@given(
    st.from_regex(r"[%|a-zA-Z0-9_-]{1,20}", fullmatch=True),
    st.text(max_size=300) | st.text(alphabet="0123456789ABCDEF", min_size=32, max_size=32),
)
def test_topic_key_hash_is_the_hash_of_topic_hash_key(topic: str, key: str) -> None:
    raw = key.encode("utf-8", "surrogatepass")
    expected = index_key_hash(f"{topic}#{raw.decode('utf-8', 'replace')}")
    assert topic_key_hash(topic, raw) == expected


def test_topic_key_hash_maps_min_value_to_zero() -> None:
    # A 7-character key that brings "t#" + key to Integer.MIN_VALUE: characters 64 + d with
    # base-31 digits d, and 31**7 > 2**32 so every residue has such digits.
    weights = [31**k for k in range(7)]
    target = (0x80000000 - java_hash("t#") * 31**7 - 64 * sum(weights)) % (1 << 32)
    digits = [(target // w) % 31 for w in reversed(weights)]
    key = bytes(64 + d for d in digits)
    assert java_hash("t#" + key.decode()) == -(1 << 31)
    assert topic_key_hash("t", key) == index_key_hash("t#" + key.decode()) == 0
