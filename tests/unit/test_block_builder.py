"""``BlockBuilder`` and ``RecordRef`` (``tidemq.protos.record_blocks`` and the compiled twins in
``_crecords``): a block built message by message is ``encode_block``'s bytes for any queue, a
bad message or an append after the seal changes nothing, concurrent appends and a seal lose no
message, send results survive ``release``, and compiled record refs (and their field-less
subclasses) are untracked by the cyclic collector. Both twins run every test, and give the same
results and errors on random input.
"""

from __future__ import annotations

import abc
import gc
import os
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.test_client_record_codec import (
    AT,
    GOLDEN,
    GOLDEN_MESSAGES,
    QUEUE,
    STORE_HOST,
    TEMPLATE,
    TOPIC,
    V6_HOST,
    BlockMessage,
    bad_messages,
    fill,
    messages,
    offsets,
    some,
)
from tidemq.protos import _crecords, record_blocks
from tidemq.protos.record_blocks import (
    HEADER_SIZE,
    RecordFormatError,
    py_block_results,
    py_check_message,
    py_encode_block,
)
from tidemq.types import SendResult

pytestmark = pytest.mark.unit


class Twin(NamedTuple):
    builder: Any
    ref: Any


PY = Twin(record_blocks.PyBlockBuilder, record_blocks.PyRecordRef)
C = Twin(_crecords.BlockBuilder, _crecords.RecordRef)
TWINS = [pytest.param(PY, id="python"), pytest.param(C, id="c")]
BIG = 1 << 30


def built(
    twin: Twin, msgs: Sequence[BlockMessage], max_records: int = BIG, max_bytes: int = BIG
) -> Any:
    b = twin.builder(TOPIC, max_records, max_bytes)
    for i, (body, tag, keys, props, born) in enumerate(msgs):
        assert b.append(body, tag, keys, props, born) == i
    return b


def records_of(block: bytes) -> Iterator[tuple[int, bytes]]:
    """(QUEUEID, body) of each record of a sent block."""
    pos = 0
    while pos < len(block):
        size = int.from_bytes(block[pos : pos + 4], "big")
        body_len = int.from_bytes(block[pos + 84 : pos + 88], "big")
        yield (
            int.from_bytes(block[pos + 12 : pos + 16], "big"),
            block[pos + HEADER_SIZE : pos + HEADER_SIZE + body_len],
        )
        pos += size
    assert pos == len(block)


def outcome(fn: Callable[..., Any], *args: Any) -> tuple[Any, ...]:
    """A call's result, or the class and text of the error it raised: the twins must agree on
    both. Any other exception fails the test."""
    try:
        return ("ok", fn(*args))
    except (ValueError, TypeError, RuntimeError) as e:  # RecordFormatError is a ValueError
        return (type(e), str(e))


def state(b: Any) -> tuple[int, int, bool, bool]:
    return (b.count, b.size, b.full, b.sealed)


# ================================================================================ the bytes
@pytest.mark.parametrize("twin", TWINS)
def test_a_block_built_by_appends_is_the_golden_bytes_of_encode_block(twin: Twin) -> None:
    b = built(twin, GOLDEN_MESSAGES)
    assert b.seal() is True
    assert b.records(QUEUE) == GOLDEN
    assert (b.count, b.size) == (3, len(GOLDEN))


@some
@given(
    st.lists(messages, min_size=1, max_size=8),
    st.integers(0, 2**31 - 1),
    st.integers(0, 2**31 - 1),
)
def test_the_twins_build_random_messages_into_encode_blocks_bytes_for_any_queue(
    msgs: list[BlockMessage], queue_id: int, other_queue: int
) -> None:
    expected = py_encode_block(TOPIC, queue_id, msgs)
    for twin in (PY, C):
        b = built(twin, msgs)
        assert (b.count, b.size) == (len(msgs), len(expected))
        b.seal()
        first = b.records(queue_id)
        assert first == expected
        assert b.records(queue_id) is first  # the last answer is kept
        assert b.records(other_queue) == py_encode_block(TOPIC, other_queue, msgs)
        assert b.records(queue_id) == expected
        b.release()
        assert first == expected  # an answer given out never changes


@some
@given(
    st.lists(
        st.tuples(st.integers(0, 70_000), st.sampled_from([None, "tag"]), st.integers(0, 2)),
        min_size=1,
        max_size=40,
    ),
    st.sampled_from([1, 3, 256, 1024, 2**31 - 1]),
    st.sampled_from([1, 5_000, 1 << 20, 2**31 - 1]),
)
def test_blocks_of_many_and_large_records_grow_to_encode_blocks_bytes(
    shapes: list[tuple[int, str | None, int]], max_records: int, max_bytes: int
) -> None:
    # Bodies of every size up to 70 KB under every limit: the buffer grows by doubling and by
    # its guess of the final size (the limits), which must never lose or misplace a byte.
    msgs: list[BlockMessage] = [
        (bytes([i % 251]) * n, tag, tuple(f"k{k}" for k in range(nkeys)), None, i)
        for i, (n, tag, nkeys) in enumerate(shapes)
    ]
    expected = py_encode_block(TOPIC, 9, msgs)
    for twin in (PY, C):
        b = built(twin, msgs, max_records, max_bytes)
        assert b.full == (len(msgs) >= max_records or len(expected) >= max_bytes)
        b.seal()
        assert b.records(9) == expected


@pytest.mark.parametrize("twin", TWINS)
def test_indexes_past_a_thousand_count_on(twin: Twin) -> None:
    msgs: list[BlockMessage] = [(b"%d" % i, None, (), None, i) for i in range(3000)]
    b = built(twin, msgs, 3000, BIG)  # built() checks every index
    assert b.full
    b.seal()
    assert b.records(4) == py_encode_block(TOPIC, 4, msgs)


@pytest.mark.parametrize("twin", TWINS)
def test_records_sets_every_records_queue_id_and_nothing_else(twin: Twin) -> None:
    msgs = [(b"m%d" % i * i, "t" if i % 2 else None, (), None, i) for i in range(40)]
    b = built(twin, msgs)
    b.seal()
    for queue_id in (0, 7, 2**31 - 1, 7):
        block = b.records(queue_id)
        assert [q for q, _ in records_of(block)] == [queue_id] * 40
        assert [body for _, body in records_of(block)] == [m[0] for m in msgs]
        assert block == py_encode_block(TOPIC, queue_id, msgs)


@pytest.mark.parametrize("twin", TWINS)
def test_a_born_timestamp_left_out_is_the_wall_clock_in_ms(twin: Twin) -> None:
    b = twin.builder(TOPIC, 10, BIG)
    before = time.time_ns() // 1_000_000
    assert b.append(b"x", None, (), None) == 0
    assert b.append(b"y", None, (), None, None) == 1
    after = time.time_ns() // 1_000_000
    b.seal()
    block = b.records(0)
    born = [int.from_bytes(block[at + 40 : at + 48], "big") for at in (0, len(block) // 2)]
    assert all(before <= ms <= after for ms in born)


@pytest.mark.parametrize("twin", TWINS)
def test_append_takes_its_arguments_by_name(twin: Twin) -> None:
    b = twin.builder(topic=TOPIC, max_records=10, max_bytes=BIG)
    body, tag, keys, props, born = GOLDEN_MESSAGES[0]
    assert b.append(body=body, tag=tag, keys=keys, properties=props, born_ms=born) == 0
    assert b.append(*GOLDEN_MESSAGES[1][:4], born_ms=GOLDEN_MESSAGES[1][4]) == 1
    assert b.append(*GOLDEN_MESSAGES[2]) == 2
    b.seal()
    assert b.records(QUEUE) == GOLDEN


# =================================================================== sealing, full, misuse
@pytest.mark.parametrize("twin", TWINS)
def test_an_append_after_the_seal_returns_minus_one_and_changes_nothing(twin: Twin) -> None:
    b = built(twin, GOLDEN_MESSAGES[:2])
    assert b.seal() is True
    assert b.seal() is False  # sealed already
    before = state(b)
    assert b.append(*GOLDEN_MESSAGES[2]) == -1
    assert b.append(b"x", None, (), None) == -1
    assert state(b) == before
    assert b.records(QUEUE) == py_encode_block(TOPIC, QUEUE, GOLDEN_MESSAGES[:2])


@pytest.mark.parametrize("twin", TWINS)
def test_full_counts_records_and_bytes_and_a_first_record_over_max_bytes_is_still_taken(
    twin: Twin,
) -> None:
    one = len(py_encode_block(TOPIC, 0, [(b"x" * 10, None, (), None, 1)]))
    b = twin.builder(TOPIC, 3, BIG)
    assert state(b) == (0, 0, False, False)
    for i in range(3):
        assert not b.full
        assert b.append(b"x" * 10, None, (), None, 1) == i
    assert state(b) == (3, 3 * one, True, False)
    assert b.append(b"x" * 10, None, (), None, 1) == 3  # full is advice: only a seal refuses
    b = twin.builder(TOPIC, 100, 2 * one)
    b.append(b"x" * 10, None, (), None, 1)
    assert state(b) == (1, one, False, False)
    b.append(b"x" * 10, None, (), None, 1)
    assert state(b) == (2, 2 * one, True, False)
    b = twin.builder(TOPIC, 100, 10)
    assert b.append(b"x" * 1000, None, (), None, 1) == 0
    assert state(b) == (1, one + 990, True, False)


@pytest.mark.parametrize("twin", TWINS)
def test_records_and_results_refuse_an_open_block_and_records_a_released_or_empty_one(
    twin: Twin,
) -> None:
    b = built(twin, GOLDEN_MESSAGES)
    answer = (SendResult, TEMPLATE, AT, 0, 0, 0, 0, (), (), STORE_HOST[0], STORE_HOST[1])
    with pytest.raises(RuntimeError, match=r"^the block is not sealed$"):
        b.records(QUEUE)
    with pytest.raises(RuntimeError, match=r"^the block is not sealed$"):
        b.results(*answer)
    b.release()  # seals it too
    assert b.sealed
    assert b.append(b"x", None, (), None) == -1
    with pytest.raises(RuntimeError, match=r"^the block was released$"):
        b.records(QUEUE)
    assert (b.count, b.size) == (3, len(GOLDEN))
    empty = twin.builder(TOPIC, 1, 1)
    empty.seal()
    with pytest.raises(RecordFormatError, match=r"^a block holds at least one message$"):
        empty.records(0)
    assert empty.results(*answer) == []


@pytest.mark.parametrize("twin", TWINS)
def test_a_bad_queue_id_is_refused_as_encode_block_refuses_it(twin: Twin) -> None:
    b = built(twin, GOLDEN_MESSAGES)
    b.seal()
    for queue_id in (-1, 2**31, 2**64, "0", 1.0):
        assert outcome(b.records, queue_id) == outcome(py_encode_block, TOPIC, queue_id, [])


@pytest.mark.parametrize("twin", TWINS)
def test_the_builder_cannot_be_subclassed(twin: Twin) -> None:
    with pytest.raises(TypeError, match="is not an acceptable base type"):
        type("Block", (twin.builder,), {"__slots__": ()})


BAD_BUILDERS: list[tuple[str, Any, Any, Any]] = [
    ("empty topic", "", 1, 1),
    ("long topic", "t" * 128, 1, 1),
    ("topic chars", "a b", 1, 1),
    ("topic type", b"t", 1, 1),
    ("records type", TOPIC, 1.0, 1),
    ("records zero", TOPIC, 0, 1),
    ("records huge", TOPIC, 2**31, 1),
    ("bytes type", TOPIC, 1, "1"),
    ("bytes negative", TOPIC, 1, -1),
    ("bytes huge", TOPIC, 1, 2**80),
]


@pytest.mark.parametrize(
    ("topic", "max_records", "max_bytes"), [pytest.param(*c[1:], id=c[0]) for c in BAD_BUILDERS]
)
def test_the_twins_refuse_a_bad_topic_as_encode_block_does_and_bad_limits_alike(
    topic: Any, max_records: Any, max_bytes: Any
) -> None:
    got = outcome(PY.builder, topic, max_records, max_bytes)
    assert got == outcome(C.builder, topic, max_records, max_bytes)
    assert got[0] in (TypeError, ValueError, RecordFormatError)
    if topic != TOPIC:
        assert got == outcome(py_encode_block, topic, 0, [])
    else:
        assert got[0] in (TypeError, ValueError)


# ============================================================================= bad messages
class ItemsMapping(Mapping[str, str]):
    """A Mapping that is not a dict: checking it runs Python code in the middle of an append."""

    def __init__(self, items: dict[str, str]) -> None:
        self._items = items

    def __getitem__(self, key: str) -> str:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


BAD_MESSAGES: list[tuple[str, tuple[Any, ...], type[Exception]]] = [
    ("body type", ("b", None, (), None, 1), TypeError),
    ("body none", (None, None, (), None, 1), TypeError),
    ("tag sep", (b"", "a\x01", (), None, 1), RecordFormatError),
    ("tag type", (b"", 7, (), None, 1), TypeError),
    ("tag surrogate", (b"", "\ud800", (), None, 1), RecordFormatError),
    ("keys str", (b"", None, "k", None, 1), TypeError),
    ("keys int", (b"", None, 5, None, 1), TypeError),
    ("empty key", (b"", None, ("",), None, 1), RecordFormatError),
    ("key space", (b"", None, ["a b"], None, 1), RecordFormatError),
    ("props type", (b"", None, (), [("a", "b")], 1), TypeError),
    ("reserved", (b"", None, (), {"KEYS": "x"}, 1), RecordFormatError),
    ("broker's", (b"", None, (), ItemsMapping({"a": "b", "PRODUCER_SEQ": "1"}), 1),
     RecordFormatError),
    ("value type", (b"", None, (), {"a": 1}, 1), TypeError),
    ("too big", (b"", "t", (), {"big": "v" * 32_767}, 1), RecordFormatError),
    ("born negative", (b"", None, (), None, -1), RecordFormatError),
    ("born huge", (b"", None, (), None, 2**63), RecordFormatError),
    ("born type", (b"", None, (), None, 1.0), TypeError),
    ("born str", (b"", None, (), None, "1"), TypeError),
]  # fmt: skip


@pytest.mark.parametrize(
    ("message", "error"), [pytest.param(*c[1:], id=c[0]) for c in BAD_MESSAGES]
)
def test_a_bad_message_raises_what_check_message_raises_and_appends_nothing(
    message: tuple[Any, ...], error: type[Exception]
) -> None:
    got = []
    for twin in (PY, C):
        b = built(twin, GOLDEN_MESSAGES[:1])
        before = state(b)
        got.append(outcome(b.append, *message))
        assert state(b) == before
        assert b.append(*GOLDEN_MESSAGES[1]) == 1  # the builder goes on
        b.seal()
        assert b.records(QUEUE) == py_encode_block(TOPIC, QUEUE, GOLDEN_MESSAGES[:2])
    assert got[0] == got[1]
    assert got[0][0] is error
    body, tag, keys, props, born = message
    if isinstance(body, bytes) and isinstance(born, int) and 0 <= born < 2**63:
        assert got[0] == outcome(py_check_message, tag, keys, props)
    else:  # the body and born timestamp errors are encode_block's, without "message 0: "
        expected = outcome(py_encode_block, TOPIC, 0, [message])
        assert got[0] == (expected[0], expected[1].removeprefix("message 0: "))


@some
@given(st.lists(st.one_of(messages, bad_messages), min_size=1, max_size=6))
def test_the_twins_take_and_refuse_random_messages_alike(msgs: list[Any]) -> None:
    builders = [PY.builder(TOPIC, 100, BIG), C.builder(TOPIC, 100, BIG)]
    taken = []
    for m in msgs:
        before = state(builders[0])
        got = [outcome(b.append, *m) for b in builders]
        assert got[0] == got[1]
        if got[0][0] == "ok":
            taken.append(m)
            tag, keys, props = m[1:4]
            assert outcome(py_check_message, tag, keys, props) == ("ok", None)
        else:
            assert state(builders[0]) == state(builders[1]) == before
    if taken:
        for b in builders:
            b.seal()
            assert b.records(3) == py_encode_block(TOPIC, 3, taken)


# ============================================================================== send results
@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize("v6", [False, True], ids=["ipv4", "ipv6"])
def test_results_after_release_are_block_results_of_the_blocks_records(
    twin: Twin, v6: bool
) -> None:
    msgs: list[BlockMessage] = [(b"m%d" % i * 40, "t", (f"k{i}",), None, i) for i in range(12)]
    store = V6_HOST if v6 else STORE_HOST
    b = built(twin, msgs)
    b.seal()
    records = b.records(QUEUE)
    filled, _ = fill(records, len(msgs), 4096 - 700, 4096, store_host=store, head=b"H\x01x\x02")
    assert filled.file_starts, "the block should cross into the next file"
    answer = (
        filled.first_phy_offset, filled.added_bytes, filled.head_added_bytes,
        [i for i, _ in filled.file_starts], [at for _, at in filled.file_starts], *store,
    )  # fmt: skip
    expected = py_block_results(SendResult, TEMPLATE, AT, records, 7, *answer)
    assert b.results(SendResult, TEMPLATE, AT, 7, *answer) == expected
    b.release()
    assert b.results(SendResult, TEMPLATE, AT, 7, *answer) == expected
    assert b.results(SendResult, TEMPLATE, AT, -1, *answer) == py_block_results(
        SendResult, TEMPLATE, AT, records, -1, *answer
    )
    by_name = b.results(
        cls=SendResult, template=TEMPLATE, at=AT, first_queue_offset=7,
        first_commitlog_offset=answer[0], added_bytes=answer[1], head_added_bytes=answer[2],
        file_start_indexes=answer[3], file_start_offsets=answer[4], store_host=store[0],
        store_port=store[1],
    )  # fmt: skip
    assert by_name == expected


SENT_MESSAGES = GOLDEN_MESSAGES * 2


@some
@given(
    offsets,
    offsets,
    st.one_of(st.integers(0, 64), st.sampled_from([-1, 2**31, "1"])),
    st.one_of(st.integers(0, 64), st.sampled_from([-1, 2**31])),
    st.one_of(st.lists(st.integers(-1, 7), max_size=3), st.just(5)),
    st.lists(offsets, max_size=3),
    st.sampled_from([STORE_HOST[0], V6_HOST[0], b"\x01", "host"]),
    st.sampled_from([0, 10911, -1, 2**31]),
    st.sampled_from([AT, (0, 1, 1), (1, 2, 99), (1, 2)]),
    st.booleans(),
)
def test_the_twins_results_are_block_results_on_random_answers(
    first_qoff: int, first_coff: int, added: Any, head: int, starts: Any,
    start_offsets: list[int], host: Any, port: int, at: Any, released: bool,
) -> None:  # fmt: skip
    answer = (first_qoff, first_coff, added, head, starts, start_offsets, host, port)
    records = py_encode_block(TOPIC, QUEUE, SENT_MESSAGES)
    expected = outcome(py_block_results, SendResult, TEMPLATE, at, records, *answer)
    for twin in (PY, C):
        b = built(twin, SENT_MESSAGES)
        b.seal()
        if released:
            b.release()
        assert outcome(b.results, SendResult, TEMPLATE, at, *answer) == expected


# =============================================================================== RecordRef
class Future(abc.ABC):
    """Like the SDK's ``SendFuture``: an ABC with no fields."""

    __slots__ = ()

    @abc.abstractmethod
    def done(self) -> bool: ...


def ref_classes(base: type) -> tuple[type, type, type]:
    """A field-less subclass that also derives from an ABC, one with a ``__dict__``, and one
    with an abstract method left."""

    class BlockFuture(base, Future):  # type: ignore[misc]
        __slots__ = ()

        def done(self) -> bool:
            return self.index >= 0  # type: ignore[no-any-return]

    class WithDict(base):  # type: ignore[misc]
        pass

    class Abstract(base, Future):  # type: ignore[misc]
        __slots__ = ()

    return BlockFuture, WithDict, Abstract


@pytest.mark.parametrize("twin", TWINS)
def test_a_record_ref_and_its_subclasses_read_back_owner_and_index_and_are_immutable(
    twin: Twin,
) -> None:
    owner = object()
    block_future, with_dict, _ = ref_classes(twin.ref)
    for cls in (twin.ref, block_future, with_dict):
        r = cls(owner, 5)
        assert (r.owner, r.index, type(r.index)) == (owner, 5, int)
        assert cls(owner=owner, index=2**63 - 1).index == 2**63 - 1
        assert type(cls(owner, True).index) is int
        for name in ("owner", "index"):
            with pytest.raises(AttributeError, match=r"^readonly attribute$"):
                setattr(r, name, 1)
            with pytest.raises(AttributeError, match=r"^readonly attribute$"):
                delattr(r, name)
    assert block_future(owner, 3).done()
    with pytest.raises(AttributeError, match="'BlockFuture' object has no attribute 'x'"):
        block_future(owner, 1).x = 1
    r = with_dict(owner, 1)
    r.x = 1
    assert r.x == 1


@pytest.mark.parametrize(
    "args",
    [(None, -1), (None, 2**63), (None, "1"), (None, 1.0), (None,), (None, 1, 2)],
    ids=["negative", "huge", "str", "float", "one argument", "three arguments"],
)
def test_the_twins_refuse_a_bad_index_and_an_abstract_subclass_alike(args: tuple[Any, ...]) -> None:
    def made(cls: type) -> tuple[Any, ...]:
        try:
            cls(*args)
        except (TypeError, ValueError) as e:
            return (type(e), str(e) if len(args) == 2 else "")
        return ("ok",)

    assert made(PY.ref) == made(C.ref)
    assert made(PY.ref)[0] in (TypeError, ValueError)
    abstract = [ref_classes(t.ref)[2] for t in (PY, C)]
    assert outcome(abstract[0], None, 1) == outcome(abstract[1], None, 1)
    assert outcome(abstract[0], None, 1)[1].startswith("Can't instantiate abstract class Abstract")


def test_compiled_record_refs_and_their_field_less_subclasses_are_untracked_by_the_collector() -> (
    None
):
    block_future, with_dict, _ = ref_classes(C.ref)
    owner: list[Any] = []
    assert not gc.is_tracked(C.ref(owner, 0))
    assert not gc.is_tracked(block_future(owner, 0))
    assert isinstance(block_future(owner, 0), Future)
    assert gc.is_tracked(with_dict(owner, 0))  # a __dict__ can make cycles: the collector sees it
    assert gc.is_tracked(PY.ref(owner, 0))  # the twin is a plain __slots__ class
    # An untracked ref keeps its owner alive, and lets it go when it goes.
    before = sys.getrefcount(owner)
    refs = [block_future(owner, i) for i in range(100)]
    assert sys.getrefcount(owner) == before + 100
    del refs
    assert sys.getrefcount(owner) == before


# =============================================================================== threads
@pytest.fixture
def switch_often() -> Iterator[None]:
    """Threads switch every microsecond, so appends and the seal interleave at every point."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)


@pytest.mark.usefixtures("switch_often")
@pytest.mark.parametrize("twin", TWINS)
def test_appends_from_four_threads_and_a_seal_lose_no_message_and_append_none_after_it(
    twin: Twin,
) -> None:
    b = twin.builder(TOPIC, 1 << 20, BIG)
    start = threading.Barrier(5)
    taken: list[list[tuple[int, bytes]]] = [[] for _ in range(4)]
    refused_at: list[int | None] = [None] * 4  # the first append that returned -1
    props = ItemsMapping({"p": "v"})

    def producer(n: int) -> None:
        start.wait()
        for seq in range(200_000):  # a bound, should the seal never come
            body = b"%d:%d" % (n, seq)
            index = b.append(body, None, (), props if seq % 5 == 0 else None, seq)
            if index < 0:
                refused_at[n] = seq
                assert b.append(body, None, (), None, seq) == -1  # and stays sealed
                return
            taken[n].append((index, body))

    threads = [threading.Thread(target=producer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    start.wait()
    while b.count < 5_000 and any(t.is_alive() for t in threads):  # seal mid-way
        pass
    assert b.seal() is True
    count_at_seal = b.count
    for t in threads:
        t.join()
    assert None not in refused_at, "every producer saw the seal"
    indexes = sorted(i for per_thread in taken for i, _ in per_thread)
    assert indexes == list(range(count_at_seal))
    assert b.count == count_at_seal
    bodies = [body for _, body in records_of(b.records(1))]
    assert len(bodies) == count_at_seal
    for per_thread in taken:
        for index, body in per_thread:
            assert bodies[index] == body


# ============================================================================ leaks, switch
def test_the_compiled_twin_keeps_no_reference_and_frees_every_buffer_on_every_path() -> None:
    body, tag, keys, props = b"b" * 3000, "tag", ("k1", "k2"), {"p": "v" * 600}
    bad_props = {"TAGS": "x"}
    owner = object()
    block_future = ref_classes(C.ref)[0]
    watched = [body, tag, keys, props, bad_props, owner, TEMPLATE, SendResult, 10_000_001]
    watched.append(block_future)  # each instance holds its (heap) class

    def cycle() -> None:
        b = C.builder(TOPIC, 100, BIG)
        for i in range(20):
            assert b.append(body, tag, keys, props, 10_000_001) == 2 * i
            assert b.append(body, None, (), None) == 2 * i + 1
            with pytest.raises(RecordFormatError):
                b.append(body, tag, keys, bad_props, 1)
            with pytest.raises(TypeError):
                b.append(body, tag, keys, props, "1")
        b.append(body, None, (), ItemsMapping({"a": "b"}))
        b.seal()
        assert b.append(body, tag, keys, props) == -1
        b.records(1)
        b.records(2)
        b.results(SendResult, TEMPLATE, AT, 0, 0, 0, 0, (), (), STORE_HOST[0], STORE_HOST[1])
        with pytest.raises(RecordFormatError):
            b.results(SendResult, TEMPLATE, AT, 0, 0, 0, 0, (99,), (0,), *STORE_HOST)
        b.release()
        b.results(SendResult, TEMPLATE, AT, 0, 0, 0, 0, (), (), STORE_HOST[0], STORE_HOST[1])
        refs = [C.ref(owner, i) for i in range(10)] + [block_future(owner, i) for i in range(10)]
        del refs
        with pytest.raises(ValueError, match="out of range"):
            C.ref(owner, -1)
        unsealed = C.builder(TOPIC, 100, BIG)  # freed open, with its buffer
        unsealed.append(body, tag, keys, props)

    for _ in range(20):  # warm: caches, interned strings, the first exceptions
        cycle()
    refcounts = [sys.getrefcount(o) for o in watched]
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        for _ in range(300):
            cycle()
        grown = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert [sys.getrefcount(o) for o in watched] == refcounts
    # 300 cycles each allocate ~200 KiB of records: a leak of any buffer would show as MiBs.
    assert grown < 64 * 1024


def test_the_compiled_builder_and_ref_are_used_unless_tidemq_pure_python_is_set() -> None:
    code = (
        "from tidemq.protos import record_blocks as r, _crecords as c\n"
        "print(r.BlockBuilder is c.BlockBuilder, r.RecordRef is c.RecordRef,"
        " r.BlockBuilder is r.PyBlockBuilder, r.RecordRef is r.PyRecordRef)"
    )
    env = {k: v for k, v in os.environ.items() if k != "TIDEMQ_PURE_PYTHON"}
    run = [sys.executable, "-c", code]
    assert subprocess.run(run, env=env, capture_output=True, text=True, check=True).stdout == (
        "True True False False\n"
    )
    pure = {**env, "TIDEMQ_PURE_PYTHON": "1"}
    assert subprocess.run(run, env=pure, capture_output=True, text=True, check=True).stdout == (
        "False False True True\n"
    )
