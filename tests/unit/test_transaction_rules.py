"""Transactions' pure parts: the op log's records (golden bytes: they are replicated and
replayed by other versions), transaction ids (tamper-checked), the half <-> committed message
mapping, and the open-transaction state with the checker's decisions. No sockets, no clock."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemq.services.broker.config import BrokerConfig, load
from tidemq.services.broker.transactions.events import (
    Checked,
    EventFormatError,
    Resolution,
    Resolved,
    decode_event,
    encode_event,
)
from tidemq.services.broker.transactions.halves import (
    TRAN_HALF_OFFSET,
    commit_key,
    is_committed_copy,
    to_committed,
    to_half,
)
from tidemq.services.broker.transactions.ids import InvalidTransactionId, TransactionId
from tidemq.services.broker.transactions.state import Action, OpenHalf, OpenTransactions
from tidemq.storage import Message, StoredMessage
from tidemq.storage.errors import ConfigError

NOW = 1_700_000_000_000

GOLDEN = [
    (Resolved(4096, Resolution.COMMIT, True), "010100000000000010000101"),
    (Resolved(4096, Resolution.ROLLBACK, False), "010100000000000010000200"),
    (Checked(4096, 3, NOW), "01020000000000001000000000030000018bcfe56800"),
]


@pytest.mark.parametrize(("event", "hex_bytes"), GOLDEN)
def test_op_records_keep_their_bytes(event: Resolved | Checked, hex_bytes: str) -> None:
    assert encode_event(event).hex() == hex_bytes
    assert decode_event(bytes.fromhex(hex_bytes)) == event


@pytest.mark.parametrize(
    "data",
    [b"", b"\x01", b"\x02\x01" + bytes(10), b"\x01\x09" + bytes(10), b"\x01\x01" + bytes(3)],
    ids=["empty", "head only", "newer version", "unknown kind", "short body"],
)
def test_op_records_a_broker_cannot_read_are_refused_typed(data: bytes) -> None:
    with pytest.raises(EventFormatError):
        decode_event(data)


def test_a_bad_resolution_byte_is_a_format_error() -> None:
    with pytest.raises(EventFormatError):
        decode_event(bytes.fromhex("010100000000000010000901"))


def test_transaction_ids_round_trip_and_keep_their_text() -> None:
    txid = TransactionId("broker-a", 4096)
    assert txid.encode() == "AQAAAAAAABAAAAhicm9rZXItYQVBK-o"
    assert TransactionId.decode(txid.encode()) == txid


@pytest.mark.parametrize(
    "text",
    [
        "",
        "x" * 300,
        "not base64!",
        "AQAA",
        "AQAAAAAAABAAAAhicm9rZXItYgVBK-o",  # one character changed: the CRC fails
        TransactionId("broker-a", 4096).encode()[:-3],
    ],
    ids=["empty", "too long", "not base64", "too short", "altered", "truncated"],
)
def test_damaged_or_altered_transaction_ids_are_refused(text: str) -> None:
    with pytest.raises(InvalidTransactionId):
        TransactionId.decode(text)


def stored(m: Message, phy_offset: int, queue_offset: int = 0) -> StoredMessage:
    props = dict(m.properties)
    if m.tags:
        props["TAGS"] = m.tags
    if m.keys:
        props["KEYS"] = " ".join(m.keys)
    return StoredMessage(
        m.topic, m.queue_id, queue_offset, phy_offset, 100, m.body, 0, m.flag, 0,
        m.born_timestamp_ms, m.born_host, NOW, (b"\x7f\x00\x00\x01", 10911), 0, 0, props,
    )  # fmt: skip


def test_a_commit_stores_the_message_as_sent_with_its_half_named() -> None:
    sent = Message(
        topic="payments",
        body=b"b",
        queue_id=3,
        tags="paid",
        keys=("order-1",),
        properties={"app": "x"},
        born_timestamp_ms=NOW - 5,
    )
    half = to_half(sent, "payments-producer")
    assert (half.topic, half.queue_id) == ("%SYS%TRANS_HALF", 0)
    copy = to_committed(stored(half, 8192))
    assert (copy.topic, copy.queue_id, copy.body, copy.tags) == ("payments", 3, b"b", "paid")
    assert tuple(copy.keys) == ("order-1",)
    assert copy.properties["app"] == "x"
    assert copy.properties[TRAN_HALF_OFFSET] == "8192"
    assert not {"REAL_TOPIC", "REAL_QID", "PGROUP", "TRAN_MSG"} & set(copy.properties)
    # Found again by its UNIQ_KEY (the half's message id when the client set none).
    assert copy.properties["UNIQ_KEY"] == commit_key(stored(half, 8192))
    assert is_committed_copy(stored(copy, 9000), 8192)
    assert not is_committed_copy(stored(copy, 9000), 4096)


def test_a_client_uniq_key_is_kept_on_the_committed_copy() -> None:
    sent = Message(topic="t", body=b"b", properties={"UNIQ_KEY": "client-id-1"})
    copy = to_committed(stored(to_half(sent, "g"), 100))
    assert copy.properties["UNIQ_KEY"] == "client-id-1"


def half(offset: int, stored_at: int = NOW, group: str = "g") -> OpenHalf:
    return OpenHalf(offset, offset // 100, group, "t", 0, f"m{offset}", stored_at)


def test_resolutions_close_transactions_and_the_oldest_open_one_pins_retention() -> None:
    s = OpenTransactions()
    for o in (100, 200, 300):
        s.add_half(half(o), o + 50)
    s.apply(Resolved(100, Resolution.COMMIT, False))
    s.apply(Checked(200, 1, NOW + 10))
    assert sorted(s.open) == [200, 300]
    oldest = s.oldest()
    assert oldest is not None
    assert (oldest.offset, oldest.checks, oldest.last_check_ms) == (200, 1, NOW + 10)
    assert s.was_half(100) and not s.was_half(400)
    s.apply(Resolved(200, Resolution.ROLLBACK, True))
    s.apply(Resolved(300, Resolution.ROLLBACK, False))
    assert s.oldest() is None and len(s) == 0


def test_a_resolution_read_before_its_half_still_closes_it() -> None:
    s = OpenTransactions()
    s.add_half(half(100), 150)
    s.apply(Resolved(500, Resolution.COMMIT, False))  # its half not read yet
    s.apply(Resolved(50, Resolution.COMMIT, False))  # before every half read: already gone
    s.add_half(half(500), 550)
    assert sorted(s.open) == [100]


def test_the_checker_asks_after_the_timeout_every_interval_and_gives_up_after_max() -> None:
    s = OpenTransactions()
    s.add_half(half(100, stored_at=NOW), 150)
    s.add_half(half(200, stored_at=NOW + 5_000), 250)
    assert s.due(NOW + 5_999, 6_000, 30_000, 2) == []
    assert [(h.offset, a) for h, a in s.due(NOW + 6_000, 6_000, 30_000, 2)] == [(100, Action.CHECK)]
    s.apply(Checked(100, 1, NOW + 6_000))
    assert s.due(NOW + 35_999, 6_000, 30_000, 2) == [(s.open[200], Action.CHECK)]
    s.apply(Checked(200, 1, NOW + 35_999))
    assert [(h.offset, a) for h, a in s.due(NOW + 36_000, 6_000, 30_000, 2)] == [
        (100, Action.CHECK)
    ]
    s.apply(Checked(100, 2, NOW + 36_000))
    assert [(h.offset, a) for h, a in s.due(NOW + 66_000, 6_000, 30_000, 2)] == [
        (100, Action.EXHAUSTED),
        (200, Action.CHECK),
    ]


def test_listing_filters_by_group_and_counts_all() -> None:
    s = OpenTransactions()
    for o, g in ((100, "a"), (200, "b"), (300, "a")):
        s.add_half(half(o, group=g), o + 50)
    shown, total = s.listing("a", 1)
    assert [h.offset for h in shown] == [100] and total == 2
    assert s.listing(None, 10)[1] == 3


def test_transaction_settings_default_to_rocketmqs_and_bad_ones_are_refused(
    tmp_path: Path,
) -> None:
    cfg = BrokerConfig("/nonexistent/store")
    assert (
        cfg.transaction_timeout_ms,
        cfg.transaction_check_interval_ms,
        cfg.transaction_check_max,
        cfg.transaction_exhausted_resolution,
    ) == (6_000, 30_000, 15, "rollback")
    toml = tmp_path / "broker.toml"
    toml.write_text(
        'store_dir = "/s"\ntransaction_check_interval_ms = 500\n'
        'transaction_exhausted_resolution = "commit"\n'
    )
    loaded = load(str(toml), {"transaction_timeout_ms": 700})
    assert (loaded.transaction_check_interval_ms, loaded.transaction_timeout_ms) == (500, 700)
    assert loaded.transaction_exhausted_resolution == "commit"
    with pytest.raises(ConfigError, match="transaction_exhausted_resolution must be rollback"):
        BrokerConfig("/s", transaction_exhausted_resolution="maybe")
    for name in (
        "transaction_timeout_ms",
        "transaction_check_interval_ms",
        "transaction_check_max",
    ):
        with pytest.raises(ConfigError, match=f"{name} must be > 0"):
            BrokerConfig("/s", **{name: 0})  # type: ignore[arg-type]
