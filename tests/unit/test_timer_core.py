"""The timer's pure core: delay levels and due times, recall handles, the timer log's events
(golden bytes) and the progress they build."""

import base64
import struct
import zlib

import pytest

from tidemq.services.broker.timer.delay_levels import (
    DELAY_LEVELS_MS,
    DelayTooLongError,
    due_ms,
    level_ms,
)
from tidemq.services.broker.timer.events import (
    TIMER_LOG_TOPIC,
    TIMER_TOPIC,
    Fired,
    Recalled,
    TimerEvent,
    TimerEventFormatError,
    decode_timer_event,
    encode_timer_event,
)
from tidemq.services.broker.timer.progress import TimerProgress, fired_mark
from tidemq.services.broker.timer.recall_handle import InvalidRecallHandle, RecallHandle

pytestmark = pytest.mark.unit

NOW = 1_700_000_000_000
DAY = 86_400_000


def test_delay_levels_are_rocketmqs_default_table() -> None:
    s, m, h = 1000, 60_000, 3_600_000
    rocketmq = (
        1 * s, 5 * s, 10 * s, 30 * s,
        1 * m, 2 * m, 3 * m, 4 * m, 5 * m, 6 * m, 7 * m, 8 * m, 9 * m, 10 * m, 20 * m, 30 * m,
        1 * h, 2 * h,
    )  # fmt: skip
    assert rocketmq == DELAY_LEVELS_MS
    assert level_ms(1) == 1000 and level_ms(18) == 2 * h
    for bad in (0, 19, -1):
        with pytest.raises(ValueError, match="delay_level"):
            level_ms(bad)


@pytest.mark.parametrize(
    ("deliver_at", "delay", "level", "due"),
    [
        (0, 0, 0, None),  # not delayed
        (NOW + 5000, 0, 0, NOW + 5000),
        (0, 2500, 0, NOW + 2500),
        (0, 0, 3, NOW + 10_000),
        (NOW - 1, 0, 0, NOW),  # a time already past is now
        (1, 0, 0, NOW),
        (NOW + 40 * DAY, 0, 0, NOW + 40 * DAY),  # exactly the limit is accepted
    ],
)
def test_due_time_of_each_way_to_ask(deliver_at: int, delay: int, level: int, due: int) -> None:
    assert due_ms(NOW, deliver_at, delay, level, 40 * DAY) == due


def test_a_time_beyond_max_delay_is_refused_with_its_limit() -> None:
    with pytest.raises(DelayTooLongError) as e:
        due_ms(NOW, NOW + 40 * DAY + 1, 0, 0, 40 * DAY)
    assert e.value.max_delay_ms == 40 * DAY
    with pytest.raises(DelayTooLongError):
        due_ms(NOW, 0, 0, 18, 3_600_000)  # level 18 is 2 h


@pytest.mark.parametrize(
    ("deliver_at", "delay", "level", "why"),
    [
        (NOW, 5, 0, "at most one"),
        (NOW, 0, 2, "at most one"),
        (0, 5, 2, "at most one"),
        (0, -1, 0, "negative"),
        (-5, 0, 0, "negative"),
        (0, 0, 19, "delay_level 19"),
        (0, 0, -2, "delay_level -2"),
    ],
)
def test_conflicting_or_bad_options_are_refused(
    deliver_at: int, delay: int, level: int, why: str
) -> None:
    with pytest.raises(ValueError, match=why) as e:
        due_ms(NOW, deliver_at, delay, level, 40 * DAY)
    assert not isinstance(e.value, DelayTooLongError)


# ---- recall handles ----

HANDLE = RecallHandle("broker-a", "orders", 123_456_789, NOW + 5000)
# version 1 | "broker-a" | "orders" | timer_id | deliver_at_ms | CRC-32, as bytes:
HANDLE_HEX = (
    "01" + "0008" + b"broker-a".hex() + "0006" + b"orders".hex()
    + "00000000075bcd15" + "0000018bcfe57b88" + "1624e056"
)  # fmt: skip
HANDLE_TEXT = "AQAIYnJva2VyLWEABm9yZGVycwAAAAAHW80VAAABi8_le4gWJOBW"


def test_recall_handle_golden_text_and_round_trip() -> None:
    assert HANDLE.encode() == HANDLE_TEXT
    assert base64.urlsafe_b64decode(HANDLE_TEXT + "=" * (-len(HANDLE_TEXT) % 4)).hex() == HANDLE_HEX
    assert RecallHandle.decode(HANDLE_TEXT) == HANDLE
    long = RecallHandle("b" * 100, "t" * 127, (1 << 64) - 1, (1 << 63) - 1)
    text = long.encode()
    assert len(text) <= 512 and "=" not in text and "+" not in text and "/" not in text
    assert RecallHandle.decode(text) == long


def _flip(text: str, at: int) -> str:
    raw = bytearray(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    raw[at] ^= 0x01
    return base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()


@pytest.mark.parametrize(
    "text",
    [
        "",
        "x" * 513,
        "not base64!",
        HANDLE_TEXT[:-6],  # truncated
        _flip(HANDLE_TEXT, 5),  # a damaged byte: the CRC catches it
        _flip(HANDLE_TEXT, 0),  # another version (its CRC fails too)
        "AQ",
    ],
)
def test_bad_recall_handles_are_refused_typed(text: str) -> None:
    with pytest.raises(InvalidRecallHandle):
        RecallHandle.decode(text)


def test_recall_handle_of_an_unknown_version_with_a_valid_crc_is_refused() -> None:
    body = bytes((2,)) + b"\x00\x01b\x00\x01t" + struct.pack(">QQ", 1, 2)
    text = base64.urlsafe_b64encode(body + struct.pack(">I", zlib.crc32(body))).decode()
    with pytest.raises(InvalidRecallHandle, match="version 2"):
        RecallHandle.decode(text.rstrip("="))


# ---- timer log events ----


def test_timer_topics() -> None:
    assert (TIMER_TOPIC, TIMER_LOG_TOPIC) == ("%SYS%TIMER", "%SYS%TIMER_LOG")


GOLDEN = [
    (Fired(NOW, 42), "0101" + "0000018bcfe56800" + "000000000000002a"),
    (Recalled(4096, NOW + 1), "0102" + "0000000000001000" + "0000018bcfe56801"),
]


@pytest.mark.parametrize(("event", "hex_bytes"), GOLDEN)
def test_timer_event_golden_bytes(event: Fired | Recalled, hex_bytes: str) -> None:
    assert encode_timer_event(event).hex() == hex_bytes
    assert decode_timer_event(bytes.fromhex(hex_bytes)) == event


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "truncated"),
        (b"\x02\x01" + bytes(16), "version 2"),
        (b"\x01\x09" + bytes(16), "kind 9"),
        (b"\x01\x01" + bytes(15), "bytes"),
        (b"\x01\x02" + bytes(17), "bytes"),
    ],
)
def test_bad_timer_events_are_refused_typed(data: bytes, why: str) -> None:
    with pytest.raises(TimerEventFormatError, match=why):
        decode_timer_event(data)


def test_a_timer_event_field_out_of_range_is_not_encoded() -> None:
    with pytest.raises(ValueError, match="2\\^64"):
        encode_timer_event(Fired(-1, 0))


# ---- progress ----


def test_progress_says_what_is_pending_as_fired_and_recalled_events_arrive() -> None:
    p = TimerProgress()
    assert p.is_pending(timer_id=100, due_ms=NOW, seq=0)
    p.apply(Recalled(200, NOW + 10))
    p.apply(Recalled(300, NOW + 500))
    assert not p.is_pending(200, NOW + 10, 1) and p.is_recalled(200)
    assert p.is_pending(250, NOW + 10, 2)
    p.apply(Fired(NOW + 100, 2))
    assert (p.delivered_up_to_ms, p.low_seq) == (NOW + 100, 2)
    assert not p.is_pending(250, NOW + 10, 2)  # due before the mark: delivered
    assert not p.is_pending(400, NOW + 900, 1)  # below low_seq: delivered or recalled
    assert p.is_pending(400, NOW + 900, 2)
    # Recalled ids past the delivered mark are dropped: only pending ones are kept.
    assert p.recalled == {300: NOW + 500}
    assert not p.is_pending(300, NOW + 500, 3)
    # Marks never move back (a Fired applied again or late changes nothing).
    p.apply(Fired(NOW, 1))
    assert (p.delivered_up_to_ms, p.low_seq) == (NOW + 100, 2)
    # A recall of a timer already past the mark records nothing.
    p.apply(Recalled(500, NOW + 50))
    assert not p.is_recalled(500)
    p.apply(Fired(NOW + 600, 5))
    assert p.recalled == {}


def test_progress_built_from_the_same_events_is_the_same_on_every_replica() -> None:
    events: list[TimerEvent] = [
        Recalled(10, NOW + 5),
        Fired(NOW, 0),
        Recalled(20, NOW + 9),
        Fired(NOW + 6, 3),
    ]
    a, b = TimerProgress(), TimerProgress()
    for ev in events:
        a.apply(ev)
        b.apply(decode_timer_event(encode_timer_event(ev)))
    assert a == b == TimerProgress(NOW + 6, 3, {20: NOW + 9})


@pytest.mark.parametrize(
    ("next_due", "low", "mark"),
    [
        (None, None, Fired(NOW, 50)),  # nothing pending: everything up to now, the queue's end
        (NOW + 10, 45, Fired(NOW, 45)),  # pending later: up to now, below its seq
        (NOW, 47, Fired(NOW - 1, 47)),  # a batch cut within this ms: the ms before
        (NOW - 30, 40, Fired(NOW - 31, 40)),  # overdue still pending: below it
    ],
)
def test_the_fired_mark_never_claims_a_pending_timer(
    next_due: int | None, low: int | None, mark: Fired
) -> None:
    assert fired_mark(NOW, next_due, low, next_seq=50) == mark
