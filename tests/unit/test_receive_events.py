"""RECEIVE_LOG event records: golden bytes of every kind, round trips, refusals, sizes."""

import random
from dataclasses import replace

import pytest

from tidemq.services.broker.receive.events import (
    RECEIVE_LOG_TOPIC,
    Acked,
    Changed,
    Dead,
    Event,
    EventFormatError,
    Init,
    QueueKey,
    Received,
    Reset,
    decode_event,
    encode_event,
    message_group_hash,
    recorded_client_id,
)

pytestmark = pytest.mark.unit

K = QueueKey("g", "t", 1)
KEY_BYTES = "0001 67 0001 74 00000001"  # group "g", topic "t", queue 1

# Pinned: slaves and restarts replay records written by older brokers.
GOLDEN: list[tuple[Event, str]] = [
    (Init(K, 5), "01 01" + KEY_BYTES + "05"),
    (
        Received(K, 1000, 31000, ((10, 1, 0), (12, 2, 7)), (11,), ((13, 7),), 14),
        "01 02" + KEY_BYTES + "e807"  # now 1000
        "e0d403"  # invisible until now + 30000 (zig-zag 60000)
        "0e"  # cursor 14
        "02 14 01 00  04 02 07"  # 2 delivered: (10, attempt 1, no group), (+2, attempt 2, 7)
        "01 16"  # 1 filtered: 11
        "01 1a 07",  # 1 held: (13, group 7)
    ),
    (
        Received(K, 1000, 31000, ((10, 1, 0), (12, 2, 7)), (11,), ((13, 7),), 14, "c1"),
        "01 07" + KEY_BYTES + "0002 6331"  # kind 7: client "c1", then kind 2's fields
        "e807 e0d403 0e 02 14 01 00  04 02 07 01 16 01 1a 07",
    ),
    (Acked(K, ((10, 500), (12, 400))), "01 03" + KEY_BYTES + "02 14 e807 04 c701"),
    (Changed(K, 2000, ((10, 500, 3000),), True), "01 04" + KEY_BYTES + "d00f 01 01 14 e807 d00f"),
    (Changed(K, 2000, ((10, 500, 2000),), False), "01 04" + KEY_BYTES + "d00f 00 01 14 e807 00"),
    (Dead(K, ((12, 400),)), "01 05" + KEY_BYTES + "01 18 a006"),
    (Reset(K, 300), "01 06" + KEY_BYTES + "ac02"),
]


@pytest.mark.parametrize(("event", "hexbytes"), GOLDEN, ids=lambda v: type(v).__name__)
def test_every_event_kind_has_pinned_bytes(event: Event, hexbytes: str) -> None:
    raw = bytes.fromhex(hexbytes)
    assert encode_event(event) == raw
    assert decode_event(raw) == event


def test_receive_log_is_a_system_topic() -> None:
    assert RECEIVE_LOG_TOPIC == "%SYS%RECEIVE_LOG"


def test_message_group_hash_is_pinned_non_zero_63_bit_and_zero_for_no_group() -> None:
    assert message_group_hash(None) == 0
    assert message_group_hash("") == 0
    assert message_group_hash("order-1") == 2709196713320186429
    assert message_group_hash("a") == 4681665781835383343
    hashes = {message_group_hash(f"group-{i}") for i in range(10_000)}
    assert len(hashes) == 10_000
    assert all(0 < h < 2**63 for h in hashes)


def test_a_received_of_32_offsets_is_under_300_bytes() -> None:
    key = QueueKey("consumer-group-orders", "orders-topic", 7)
    now = 1_700_000_000_000
    base = 123_456_789
    plain = Received(
        key, now, now + 30_000, tuple((base + i, 1, 0) for i in range(32)), (), (), base + 32
    )
    retries = Received(
        key,
        now,
        now + 30_000,
        tuple((base + 3 * i, 1 + i % 16, 0) for i in range(32)),
        (),
        (),
        base,
    )
    assert len(encode_event(plain)) == 158  # 41 bytes of key, 3 per delivered offset
    assert len(encode_event(retries)) < 300


def _random_event(rng: random.Random) -> Event:
    key = QueueKey(
        rng.choice(["g", "grüppe", "x" * 300]),
        rng.choice(["t", "主题"]),
        rng.randint(-1, 2**31 - 1),
    )
    big = rng.choice([10, 2**20, 2**40, 2**62])

    def off() -> int:
        return rng.randint(0, big)

    now = rng.randint(0, 2**45)
    kind = rng.randint(1, 6)
    n = rng.randint(0, 40)
    if kind == 1:
        return Init(key, off())
    if kind == 2:
        return Received(
            key,
            now,
            now + rng.randint(-1000, 10**9),
            tuple(
                (off(), rng.randint(1, 1000), rng.choice([0, rng.randint(1, 2**63 - 1)]))
                for _ in range(n)
            ),
            tuple(off() for _ in range(rng.randint(0, 5))),
            tuple((off(), rng.randint(1, 2**63 - 1)) for _ in range(rng.randint(0, 5))),
            off(),
            rng.choice(["", "host@123@abc", "клиент"]),
        )
    if kind == 3:
        return Acked(key, tuple((off(), off()) for _ in range(n)))
    if kind == 4:
        items = tuple((off(), off(), now + rng.randint(-10, 10**9)) for _ in range(n))
        return Changed(key, now, items, rng.random() < 0.5)
    if kind == 5:
        return Dead(key, tuple((off(), off()) for _ in range(n)))
    return Reset(key, off())


def test_random_events_round_trip() -> None:
    rng = random.Random(1919)
    for _ in range(3000):
        ev = _random_event(rng)
        assert decode_event(encode_event(ev)) == ev


def test_unknown_version_kind_truncation_and_trailing_bytes_are_refused() -> None:
    good = bytes.fromhex(GOLDEN[1][1])
    with pytest.raises(EventFormatError, match="version 2"):
        decode_event(b"\x02" + good[1:])
    with pytest.raises(EventFormatError, match="kind 9"):
        decode_event(good[:1] + b"\x09" + good[2:])
    for cut in range(len(good)):
        with pytest.raises(EventFormatError):
            decode_event(good[:cut])
    with pytest.raises(EventFormatError, match="after the event"):
        decode_event(good + b"\x00")
    with pytest.raises(EventFormatError, match="released flag"):
        decode_event(bytes.fromhex("01 04" + KEY_BYTES + "d00f 02 00"))
    with pytest.raises(EventFormatError, match="varint"):
        decode_event(bytes.fromhex("01 06" + KEY_BYTES) + b"\xff" * 11)
    with pytest.raises(EventFormatError, match="negative offset"):
        decode_event(bytes.fromhex("01 03" + KEY_BYTES + "01 01 00"))  # offset delta -1
    with pytest.raises(EventFormatError, match="count"):
        decode_event(bytes.fromhex("01 03" + KEY_BYTES + "ffffff7f"))
    with pytest.raises(EventFormatError, match="UTF-8"):
        decode_event(bytes.fromhex("01 06 0001 ff 0001 74 00000001 00"))
    assert issubclass(EventFormatError, ValueError)


def test_random_garbage_never_raises_anything_but_event_format_error() -> None:
    rng = random.Random(7)
    goods = [bytes.fromhex(h) for _, h in GOLDEN]
    for _ in range(5000):
        raw = bytearray(rng.choice(goods))
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        try:
            ev = decode_event(bytes(raw))
        except EventFormatError:
            continue
        assert decode_event(encode_event(ev)) == ev


def test_encode_refuses_negative_offsets() -> None:
    with pytest.raises(ValueError, match="negative"):
        encode_event(Acked(K, ((-1, 5),)))
    with pytest.raises(ValueError, match="negative"):
        encode_event(Init(K, -3))


def test_a_received_without_client_keeps_the_version_1_kind_2_bytes() -> None:
    # Records written before kind 7 existed decode as receives by an unknown client.
    v1 = bytes.fromhex(GOLDEN[1][1])
    assert v1[:2] == b"\x01\x02"
    ev = decode_event(v1)
    assert isinstance(ev, Received)
    assert ev.client_id == ""
    assert encode_event(ev) == v1


def test_a_received_by_a_client_decodes_to_the_same_state_change_as_kind_2() -> None:
    by = decode_event(bytes.fromhex(GOLDEN[2][1]))
    plain = decode_event(bytes.fromhex(GOLDEN[1][1]))
    assert isinstance(by, Received)
    assert by.client_id == "c1"
    assert replace(by, client_id="") == plain


def test_recorded_client_ids_are_cut_to_255_bytes_on_a_character_boundary() -> None:
    assert recorded_client_id("host@1@x") == "host@1@x"
    cut = recorded_client_id("é" * 200)  # 400 bytes
    assert cut == "é" * 127
    assert len(recorded_client_id("x" * 70_000).encode()) == 255
