"""What the console producer, the console consumer and the offset and config commands parse,
without a broker: input lines, starting positions, KEY=VALUE settings, body file names, and the
produce/consume rates of ``cluster status``."""

from __future__ import annotations

import argparse
import base64
import json

import pytest

from tidemq.admin.offset_tables import GroupPosition, OffsetTable, QueueOffsets
from tidemq.admin.rates import broker_rates
from tidemq.cli.broker_config import parse_assignments
from tidemq.cli.console_consume import body_path
from tidemq.cli.console_input import LineDefaults, LineError, parse_line, read_lines
from tidemq.cli.positions import consume_start, reset_arguments

pytestmark = pytest.mark.unit

DEFAULTS = LineDefaults(tag="t", keys=("k",), properties={"a": "1"}, message_group="g")


def test_plain_lines_take_the_flags_and_blank_lines_are_skipped() -> None:
    lines = list(read_lines(["one\n", "\n", "  \r\n", "two\r\n"], DEFAULTS, json_lines=False))
    assert [(x.number, x.body) for x in lines] == [(1, b"one"), (4, b"two")]
    assert lines[0].options == {
        "tag": "t",
        "keys": ("k",),
        "properties": {"a": "1"},
        "message_group": "g",
    }


def test_a_json_line_overrides_the_flags_field_by_field() -> None:
    text = json.dumps(
        {"body": "hé", "keys": "one", "properties": {"b": "2"}, "tag": "x", "delay": "2m"}
    )
    line = parse_line(3, text, DEFAULTS, json_lines=True)
    assert line.body == "hé".encode()
    assert line.options == {
        "tag": "x",
        "keys": ("one",),
        "properties": {"a": "1", "b": "2"},
        "message_group": "g",
        "delay": 120.0,
    }
    raw = base64.b64encode(b"\x00\x01").decode()
    binary = parse_line(
        1, json.dumps({"body_base64": raw, "delay": 1.5}), LineDefaults(), json_lines=True
    )
    assert binary.body == b"\x00\x01" and binary.options["delay"] == 1.5


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "must be an object"),
        ('{"body": "a", "body_base64": "YQ=="}', "exactly one of"),
        ('{"tag": "a"}', "exactly one of"),
        ('{"body": "a", "colour": "red"}', "unknown field(s) colour"),
        ('{"body": 5}', "'body' must be a string"),
        ('{"body_base64": "***"}', "not base64"),
        ('{"body": "a", "keys": [1]}', "'keys' must be"),
        ('{"body": "a", "properties": {"p": 1}}', "'properties' must be"),
        ('{"body": "a", "delay": "soon"}', "not a duration"),
        ('{"body": "a", "delay": -1}', "more than zero"),
        ('{"body": ""}', "body is empty"),
    ],
)
def test_a_bad_json_line_names_its_number_and_the_problem(text: str, problem: str) -> None:
    with pytest.raises(LineError) as e:
        parse_line(7, text, DEFAULTS, json_lines=True)
    assert e.value.number == 7 and str(e.value).startswith("line 7: ")
    assert problem in str(e.value)


def test_reading_stops_at_the_first_bad_line_after_yielding_the_good_ones() -> None:
    lines = read_lines(
        ['{"body": "a"}', '{"body": "b"}', "oops", '{"body": "c"}'], LineDefaults(), json_lines=True
    )
    assert [next(lines).body, next(lines).body] == [b"a", b"b"]
    with pytest.raises(LineError) as e:
        next(lines)
    assert e.value.number == 3


def test_reset_positions() -> None:
    assert reset_arguments(to="first") == {"to": "first", "queue_id": None, "broker": None}
    assert reset_arguments(offset=5, queue=2, broker="b") == {
        "offset": 5,
        "queue_id": 2,
        "broker": "b",
    }
    assert reset_arguments(to="1764018000000")["to"] == 1764018000000
    assert reset_arguments(to="2025-11-24T21:00:00Z")["to"] == 1764018000000
    for bad, message in [
        ({}, "give one position"),
        ({"to": "last", "offset": 1}, "give one position"),
        ({"offset": -1}, ">= 0"),
        ({"to": "first", "queue": -2}, "queue id"),
        ({"to": "yesterday"}, "is not a time"),
    ]:
        with pytest.raises(ValueError, match=message):
            reset_arguments(**bad)  # type: ignore[arg-type]


def _consume_args(**kw: object) -> argparse.Namespace:
    base = {"from_offset": None, "from_time": None, "queue": None, "broker": None}
    return argparse.Namespace(**{**base, **kw})


def test_consume_start_positions() -> None:
    assert consume_start(_consume_args()) is None
    assert consume_start(_consume_args(from_offset=3, queue=1))["offset"] == 3  # type: ignore[index]
    assert consume_start(_consume_args(from_time="0"))["to"] == 0  # type: ignore[index]
    with pytest.raises(ValueError, match="--queue goes with"):
        consume_start(_consume_args(queue=1))
    with pytest.raises(ValueError, match="not both"):
        consume_start(_consume_args(from_offset=1, from_time="0"))


def test_body_files_stay_in_their_directory() -> None:
    assert body_path("d", "7F0000011F90000000000000012A") == "d/7F0000011F90000000000000012A"
    assert body_path("d", "../../etc/passwd") == "d/_.._etc_passwd"
    assert body_path("d", "..") == "d/_"


def test_key_value_settings() -> None:
    assert parse_assignments(["a=1", " b = x ", "c="]) == {"a": "1", "b": "x", "c": ""}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_assignments(["novalue"])
    with pytest.raises(ValueError, match="given twice"):
        parse_assignments(["a=1", "a=2"])


def _table(now_ms: int, max_offset: int, position: int, broker: str = "b") -> OffsetTable:
    return OffsetTable(
        broker,
        now_ms,
        {("t", 0): QueueOffsets(0, max_offset), ("%SYS%x", 0): QueueOffsets(0, max_offset * 9)},
        [GroupPosition("g", "t", 0, position)],
    )


def test_broker_rates_use_each_brokers_own_clock() -> None:
    [r] = broker_rates([_table(1_000, 10, 5)], [_table(3_000, 30, 9)])
    assert (r.broker, r.in_per_s, r.out_per_s, r.seconds) == ("b", 10.0, 2.0, 2.0)
    # A broker that answered once, or whose clock did not move, has no rate.
    assert broker_rates([_table(1_000, 10, 5)], [_table(1_000, 30, 9), _table(9, 1, 1, "c")]) == []
    # An offset reset moves a position back: no consumption, never negative.
    [reset] = broker_rates([_table(0, 10, 9)], [_table(1_000, 10, 0)])
    assert reset.out_per_s == 0.0
