"""Receipt handles and retry policies of receive/ack consumption: formats and validation."""

import base64
import random
import zlib

import pytest

from tidemq.protos import broker_pb2
from tidemq.services.broker.receive.handle import (
    HandleReader,
    HandleWriter,
    InvalidHandle,
    ReceiptHandle,
)
from tidemq.services.broker.receive.retry_policy import (
    DEFAULT_DELAYS_MS,
    DEFAULT_MAX_DELIVERY_ATTEMPTS,
    RetryPolicy,
)

pytestmark = pytest.mark.unit

HANDLE = ReceiptHandle("broker-a", "g1", "orders", 3, 1234, 987654, 1_700_000_030_000)
# Pinned: a broker upgraded to a new version must still read handles issued before it.
GOLDEN_HANDLE = "AgAYAAhicm9rZXItYQACZzEABm9yZGVycwAAAAAAAwAAAAAAAATSAAAAAAAPEgYAAAGLz-XdMApqXPA"
GOLDEN_RAW = bytes.fromhex(
    "02"  # version
    "0018"  # names_len 24: 3 + 24 is a multiple of 3
    "0008 62726f6b65722d61"  # "broker-a"
    "0002 6731"  # "g1"
    "0006 6f7264657273"  # "orders"
    "0000"  # padding
    "00000003"  # queue 3
    "00000000000004d2"  # offset 1234
    "00000000000f1206"  # lease 987654
    "0000018bcfe5dd30"  # invisible until 1_700_000_030_000
    "0a6a5cf0"  # CRC32 of the above
)
# Version 1, as brokers before version 2 issued it: still read.
GOLDEN_HANDLE_V1 = "AQAIYnJva2VyLWEAAmcxAAZvcmRlcnMAAAADAAAAAAAABNIAAAAAAA8SBgAAAYvP5d0wFYxgzA"


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def test_handle_encodes_to_pinned_url_safe_text_and_back() -> None:
    text = HANDLE.encode()
    assert text == GOLDEN_HANDLE
    assert set(text) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    raw = _unb64(text)
    assert raw == GOLDEN_RAW
    assert raw[-4:] == zlib.crc32(raw[:-4]).to_bytes(4, "big")
    assert ReceiptHandle.decode(text) == HANDLE


def test_a_version_1_handle_is_still_read() -> None:
    assert ReceiptHandle.decode(GOLDEN_HANDLE_V1) == HANDLE
    bad = _unb64(GOLDEN_HANDLE_V1)
    with pytest.raises(InvalidHandle, match="CRC"):
        ReceiptHandle.decode(_b64(bad[:-1] + bytes((bad[-1] ^ 1,))))


def test_handles_of_one_call_share_the_text_of_their_names() -> None:
    writer = HandleWriter("broker-a", "g1", "orders")
    assert writer.encode(3, 1234, 987654, 1_700_000_030_000) == GOLDEN_HANDLE
    a, b = writer.encode(0, 1, 2, 3), writer.encode(7, 10**12, 5, 6)
    prefix = _b64(GOLDEN_RAW[:27])
    assert a.startswith(prefix) and b.startswith(prefix) and len(a) == len(b)
    assert ReceiptHandle.decode(b) == ReceiptHandle("broker-a", "g1", "orders", 7, 10**12, 5, 6)


def test_the_reader_of_a_calls_names_reads_their_handles_and_no_other() -> None:
    reader = HandleReader("broker-a", "g1", "orders")
    assert reader.numbers(GOLDEN_HANDLE) == (3, 1234, 987654, 1_700_000_030_000)
    rng = random.Random(7)
    for _ in range(100):
        numbers = tuple(rng.randint(0, 2**31 - 1) for _ in range(4))
        assert reader.numbers(HandleWriter("broker-a", "g1", "orders").encode(*numbers)) == numbers
    # Other names, another version, damage: None (the full decode says why).
    for names in (
        ("broker-b", "g1", "orders"),
        ("broker-a", "g2", "orders"),
        ("broker-a", "g1", "o"),
    ):
        assert reader.numbers(ReceiptHandle(*names, 3, 1234, 987654, 5).encode()) is None
    assert reader.numbers(GOLDEN_HANDLE_V1) is None
    raw = _unb64(GOLDEN_HANDLE)
    for i in range(27, len(raw)):
        bad = bytearray(raw)
        bad[i] ^= 0x10
        assert reader.numbers(_b64(bytes(bad))) is None
    assert reader.numbers(GOLDEN_HANDLE[:-1] + "é") is None
    assert reader.numbers(GOLDEN_HANDLE[:-1]) is None
    negative = raw[:-12] + (-1).to_bytes(8, "big", signed=True)
    assert reader.numbers(_sealed(negative)) is None


def test_handle_round_trips_unicode_names_and_extreme_values() -> None:
    rng = random.Random(19)
    for _ in range(200):
        h = ReceiptHandle(
            "b" * rng.randint(0, 40),
            "grüppe-" + str(rng.randint(0, 10**6)),
            "主题-" + str(rng.random()),
            rng.randint(0, 2**31 - 1),
            rng.randint(0, 2**63 - 1),
            rng.randint(0, 2**63 - 1),
            rng.randint(0, 2**63 - 1),
        )
        assert ReceiptHandle.decode(h.encode()) == h


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "empty"),
        ("x" * 1025, "over 1024"),
        ("not base64!", "base64"),
        ("é", "base64"),
        (_b64(b"\x01abc"), "too short"),
        (_b64(b"\x03" + _unb64(GOLDEN_HANDLE)[1:]), "version"),
        (_b64(b"\x00" + _unb64(GOLDEN_HANDLE)[1:]), "version"),
        (GOLDEN_HANDLE[:-1] + "+", "base64"),
        (GOLDEN_HANDLE + "AA", "base64"),
        (GOLDEN_HANDLE[:-2] + ("AA" if GOLDEN_HANDLE[-2:] != "AA" else "BA"), "CRC"),
    ],
)
def test_decode_refuses_what_is_not_a_handle(text: str, why: str) -> None:
    with pytest.raises(InvalidHandle, match=why):
        ReceiptHandle.decode(text)


def _sealed(body: bytes) -> str:
    return _b64(body + zlib.crc32(body).to_bytes(4, "big"))


def test_decode_refuses_bad_lengths_and_negatives_even_with_a_right_crc() -> None:
    body = _unb64(GOLDEN_HANDLE)[:-4]
    with pytest.raises(InvalidHandle, match="length"):
        ReceiptHandle.decode(_sealed(body + b"\x00"))
    with pytest.raises(InvalidHandle, match="length"):
        ReceiptHandle.decode(_sealed(b"\x02\xff\xff" + body[3:]))
    with pytest.raises(InvalidHandle, match="length"):  # names not ending on 3 bytes
        ReceiptHandle.decode(_sealed(b"\x02\x00\x17" + body[3:-1]))
    with pytest.raises(InvalidHandle, match="padding"):
        ReceiptHandle.decode(_sealed(body[:25] + b"\x00\x01" + body[27:]))
    with pytest.raises(InvalidHandle, match="name length"):
        ReceiptHandle.decode(_sealed(body[:3] + b"\x00\x20" + body[5:]))
    negative = body[:-8] + (-1).to_bytes(8, "big", signed=True)
    with pytest.raises(InvalidHandle, match="negative"):
        ReceiptHandle.decode(_sealed(negative))
    not_utf8 = body[:5] + b"\xff" + body[6:]
    with pytest.raises(InvalidHandle, match="UTF-8"):
        ReceiptHandle.decode(_sealed(not_utf8))
    v1 = _unb64(GOLDEN_HANDLE_V1)[:-4]
    with pytest.raises(InvalidHandle, match="length"):
        ReceiptHandle.decode(_sealed(v1 + b"\x00"))
    assert issubclass(InvalidHandle, ValueError)


def test_a_flipped_bit_anywhere_is_refused() -> None:
    raw = _unb64(GOLDEN_HANDLE)
    for i in range(len(raw)):
        for bit in (0, 3, 7):
            bad = bytearray(raw)
            bad[i] ^= 1 << bit
            with pytest.raises(InvalidHandle):
                ReceiptHandle.decode(_b64(bytes(bad)))


def test_encode_refuses_negative_fields() -> None:
    with pytest.raises(ValueError, match="offset"):
        ReceiptHandle("b", "g", "t", 0, -1, 0, 0).encode()
    with pytest.raises(ValueError, match="over 1024"):
        HandleWriter("b", "g" * 1000, "t")


# ---- retry policy ----


def test_default_policy_is_rocketmqs_eighteen_levels_with_the_last_repeating() -> None:
    p = RetryPolicy()
    assert DEFAULT_MAX_DELIVERY_ATTEMPTS == 16
    assert len(DEFAULT_DELAYS_MS) == 18
    assert [p.delay_ms(n) for n in (1, 2, 3, 4, 5, 18, 19, 500)] == [
        1_000,
        5_000,
        10_000,
        30_000,
        60_000,
        7_200_000,
        7_200_000,
        7_200_000,
    ]


def test_exponential_policy_grows_by_the_multiplier_up_to_the_cap() -> None:
    p = RetryPolicy(delays_ms=(), initial_ms=500, max_ms=10_000, multiplier=3.0)
    assert [p.delay_ms(n) for n in range(1, 7)] == [500, 1_500, 4_500, 10_000, 10_000, 10_000]
    assert p.delay_ms(10_000) == 10_000  # no overflow for absurd attempts
    flat = RetryPolicy(delays_ms=(), initial_ms=2_000, max_ms=2_000, multiplier=1.0)
    assert flat.delay_ms(7) == 2_000


def test_custom_delays_win_over_exponential_fields() -> None:
    p = RetryPolicy(delays_ms=(100, 200), initial_ms=5_000, multiplier=4.0)
    assert [p.delay_ms(n) for n in (1, 2, 3)] == [100, 200, 200]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"delays_ms": (0,)},
        {"delays_ms": (-5,)},
        {"delays_ms": (8 * 24 * 3_600_000,)},
        {"delays_ms": (1.5,)},
        {"delays_ms": (1,) * 1001},
        {"delays_ms": (), "initial_ms": 0},
        {"delays_ms": (), "initial_ms": 5_000, "max_ms": 1_000},
        {"delays_ms": (), "multiplier": 0.5},
        {"delays_ms": (), "multiplier": float("nan")},
        {"delays_ms": (), "multiplier": float("inf")},
    ],
)
def test_invalid_policies_are_refused_with_value_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="retry"):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_delay_of_attempt_zero_is_a_caller_error() -> None:
    with pytest.raises(ValueError, match="attempt"):
        RetryPolicy().delay_ms(0)


def test_proto_round_trip_and_empty_proto_means_defaults() -> None:
    assert RetryPolicy.from_proto(broker_pb2.RetryPolicy()) == RetryPolicy()
    for p in (
        RetryPolicy(),
        RetryPolicy(delays_ms=(100, 2_000)),
        RetryPolicy(delays_ms=(), initial_ms=250, max_ms=60_000, multiplier=1.5),
    ):
        assert RetryPolicy.from_proto(p.to_proto()) == p
    exp = RetryPolicy.from_proto(broker_pb2.RetryPolicy(initial_ms=300))
    assert exp == RetryPolicy(delays_ms=(), initial_ms=300)
    with pytest.raises(ValueError, match="retry"):
        RetryPolicy.from_proto(broker_pb2.RetryPolicy(delays_ms=[-1]))
