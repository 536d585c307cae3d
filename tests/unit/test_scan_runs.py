"""scan_runs (storage/record/runs.py and its compiled twin in _cblock): where the records
carrying a property are and the runs of flagged records after them, both twins against golden
answers, against each other on random logs and on damaged ones."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemq.storage.record import Message, _cblock, encode_record
from tidemq.storage.record.layout import CORRUPT, END_OF_FILE, INCOMPLETE, OK
from tidemq.storage.record.runs import RunScan, py_scan_runs

STAMP = b"PRODUCER_SEQ"
MEMBER = 0x800
HOST = (b"\x0a\x00\x00\x05", 10911)
TWINS = {"python": py_scan_runs, "c": _cblock.scan_runs}
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def scan(twin: str, buf: bytes, pos: int = 0, limit: int | None = None, **kw: Any) -> RunScan:
    end = len(buf) if limit is None else limit
    return RunScan(
        *TWINS[twin](buf, pos, end, kw.get("base", 0), kw.get("max_records", 0), STAMP, MEMBER)
    )


def log_of(specs: list[tuple[str, int, str]], base: int = 0) -> tuple[bytes, list[int]]:
    """Records one after the other from log offset ``base``: (topic, queue, kind) with kind
    "head" (stamped), "member" (flagged) or "plain"; each queue's offsets count from 0."""
    out: list[bytes] = []
    offsets: list[int] = []
    qoff: dict[tuple[str, int], int] = {}
    pos = base
    for topic, qid, kind in specs:
        props = {"PRODUCER_SEQ": "1f.0.0.3"} if kind == "head" else {}
        m = Message(
            topic, b"x" * 10, qid, properties=props, sys_flag=MEMBER if kind == "member" else 0
        )
        q = qoff.get((topic, qid), 0)
        qoff[topic, qid] = q + 1
        record = encode_record(m, q, pos, 1_000, HOST, record_crc=True)
        offsets.append(pos)
        out.append(record)
        pos += len(record)
    return b"".join(out), offsets


@pytest.mark.parametrize("twin", TWINS)
def test_heads_member_runs_and_other_records_are_answered_in_log_order(twin: str) -> None:
    buf, at = log_of(
        [
            ("A", 0, "plain"), ("A", 0, "plain"),
            ("A", 1, "head"), ("A", 1, "member"), ("A", 1, "member"),
            ("B", 0, "member"),  # another queue: a run of its own
            ("A", 1, "plain"),
        ]
    )  # fmt: skip
    got = scan(twin, buf)
    assert (got.scanned, got.end, got.status, got.reason) == (7, len(buf), OK, None)
    head = got.items[1]
    assert head[:6] == (0, at[2], at[3] - at[2], "A", 1, 0)
    assert b"PRODUCER_SEQ\x011f.0.0.3\x02" in head[6]
    assert got.items == [
        (2, at[0]),
        head,
        (1, "A", 1, 1, 2, at[4], at[5] - at[4]),
        (1, "B", 0, 0, 1, at[5], at[6] - at[5]),
        (2, at[6]),
    ]
    assert got.last == (at[6], len(buf) - at[6], 3, "A")


@pytest.mark.parametrize("twin", TWINS)
def test_a_gap_in_a_queues_offsets_starts_a_new_member_run(twin: str) -> None:
    buf, _ = log_of([("A", 0, "member"), ("A", 1, "member"), ("A", 0, "member")])
    got = scan(twin, buf)
    assert [i[:5] for i in got.items] == [(1, "A", 0, 0, 1), (1, "A", 1, 0, 1), (1, "A", 0, 1, 1)]


@pytest.mark.parametrize("twin", TWINS)
def test_the_walk_stops_where_check_record_would(twin: str) -> None:
    buf, at = log_of([("A", 0, "head"), ("A", 0, "member")], base=4_096)
    torn = scan(twin, buf[:-5], base=4_096)
    assert (torn.scanned, torn.end, torn.status) == (1, at[1] - 4_096, INCOMPLETE)
    assert torn.reason is not None and "available" in torn.reason
    damaged = bytearray(buf)
    damaged[at[1] - 4_096 + 4] ^= 0xFF  # the second record's magic
    bad = scan(twin, bytes(damaged), base=4_096)
    assert (bad.scanned, bad.status) == (1, CORRUPT)
    blank = buf + (8).to_bytes(4, "big") + (0xCBD43194).to_bytes(4, "big")
    assert scan(twin, blank, base=4_096).status == END_OF_FILE
    assert scan(twin, buf, base=0).status == CORRUPT  # its PHYSICALOFFSETs say 4096 on
    assert scan(twin, buf, base=4_096, max_records=1).scanned == 1


KINDS = st.lists(
    st.tuples(
        st.sampled_from(["A", "B%x"]),
        st.integers(0, 2),
        st.sampled_from(["head", "member", "plain"]),
    ),
    min_size=0,
    max_size=30,
)


@SETTINGS
@given(specs=KINDS, cut=st.integers(0, 4_000), flips=st.lists(st.integers(0, 4_000), max_size=3))
def test_the_twins_answer_alike_on_random_and_damaged_logs(
    specs: list[tuple[str, int, str]], cut: int, flips: list[int]
) -> None:
    buf, _ = log_of(specs, base=100)
    data = bytearray(buf[: max(0, len(buf) - cut % (len(buf) + 1))])
    for f in flips:
        if data:
            data[f % len(data)] ^= 0x5A
    raw = bytes(data)
    assert scan("python", raw, base=100) == scan("c", raw, base=100)


def test_random_garbage_never_crashes_the_compiled_twin() -> None:
    rng = random.Random(22)
    for _ in range(2_000):
        raw = rng.randbytes(rng.randrange(0, 400))
        assert scan("python", raw) == scan("c", raw)
