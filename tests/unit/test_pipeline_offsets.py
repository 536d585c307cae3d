"""startingOffsets / endingOffsets and checkpointed offsets of the Spark source (pure logic)."""

from __future__ import annotations

import json

import pytest

from tidemq.pipeline.offsets import (
    EARLIEST,
    LATEST,
    OffsetSpecError,
    QueueBounds,
    from_json_dict,
    limit_rows,
    parse_spec,
    resolve,
    to_json_dict,
)
from tidemq.pipeline.options import OptionError, ReadOptions, WriteOptions
from tidemq.routes import MessageQueue

pytestmark = pytest.mark.unit

A0, A1 = MessageQueue("orders", "broker-a", 0), MessageQueue("orders", "broker-a", 1)
QUEUES = {A0: QueueBounds(5, 50), A1: QueueBounds(0, 10)}


def test_words_and_per_queue_json() -> None:
    assert resolve(parse_spec("earliest", LATEST, name="s"), QUEUES, name="s", ending=False) == {
        A0: 5,
        A1: 0,
    }
    assert resolve(parse_spec(None, LATEST, name="s"), QUEUES, name="s", ending=False) == {
        A0: 50,
        A1: 10,
    }
    spec = parse_spec('{"orders": {"0": 7, "1": -1}}', EARLIEST, name="s")
    assert resolve(spec, QUEUES, name="s", ending=False) == {A0: 7, A1: 10}
    nested = parse_spec('{"orders": {"broker-a": {"1": 3}}}', EARLIEST, name="s")
    assert resolve(nested, QUEUES, name="s", ending=False) == {A0: 5, A1: 3}
    # A start below the minimum is kept: reading it reports the data loss.
    below = parse_spec('{"orders": {"0": 0}}', EARLIEST, name="s")
    assert resolve(below, QUEUES, name="s", ending=False)[A0] == 0


@pytest.mark.parametrize(
    ("text", "ending", "message"),
    [
        ('{"orders": {"0": 51}}', False, "past the queue's end"),
        ('{"orders": {"0": -2}}', True, "not a valid end"),
        ('{"orders": {"0": 4}}', True, "below the queue's start"),
        ('{"orders": {"7": 1}}', False, "does not have"),
        ('{"other": {"0": 1}}', False, "not being read"),
        ('{"orders": {"x": 1}}', False, "not a number"),
        ('{"orders": {"0": -3}}', False, "-2, -1 or >= 0"),
        ("[1]", False, "object of topics"),
        ("soon", False, "neither earliest/latest nor JSON"),
    ],
)
def test_bad_offsets_are_refused_with_the_reason(text: str, ending: bool, message: str) -> None:
    with pytest.raises(OffsetSpecError, match=message):
        resolve(parse_spec(text, EARLIEST, name="x"), QUEUES, name="x", ending=ending)


def test_queue_ids_alone_are_ambiguous_when_a_topic_spans_groups() -> None:
    queues = {**QUEUES, MessageQueue("orders", "broker-b", 0): QueueBounds(0, 1)}
    with pytest.raises(OffsetSpecError, match="name the group"):
        resolve(
            parse_spec('{"orders": {"0": 1}}', EARLIEST, name="s"), queues, name="s", ending=False
        )


def test_checkpoint_json_is_canonical_whatever_the_order() -> None:
    keys = [MessageQueue("b", "g", 10), MessageQueue("a", "g", 2), MessageQueue("b", "g", 9)]
    one = to_json_dict({k: i for i, k in enumerate(keys)})
    two = to_json_dict({k: i for i, k in reversed(list(enumerate(keys)))})
    assert (
        json.dumps(one)
        == json.dumps(two)
        == '{"a": {"g": {"2": 1}}, "b": {"g": {"9": 2, "10": 0}}}'
    )
    assert from_json_dict(json.loads(json.dumps(one))) == {k: i for i, k in enumerate(keys)}


def test_max_rows_spread_over_queues_in_proportion_to_their_backlog() -> None:
    start = {A0: 0, A1: 0}
    assert limit_rows(start, {A0: 30, A1: 10}, 20) == {A0: 15, A1: 5}
    assert limit_rows(start, {A0: 30, A1: 10}, 100) == {A0: 30, A1: 10}
    ends = limit_rows(start, {A0: 1, A1: 1, MessageQueue("x", "g", 0): 1}, 2)
    assert sum(ends.values()) == 2  # remainders go to single queues, never over the limit
    # A queue absent from the start (new) counts from 0.
    assert limit_rows({A0: 10}, {A0: 20, A1: 10}, 10) == {A0: 15, A1: 5}


def test_options_are_validated_once_with_their_names() -> None:
    opts = ReadOptions.parse(
        {"nameserver": "h:1", "topic": "a, b", "maxOffsetsPerTrigger": "10"}, streaming=True
    )
    assert (opts.topics, opts.max_offsets_per_trigger, opts.fail_on_data_loss) == (
        ("a", "b"),
        10,
        True,
    )
    assert opts.starting.default == LATEST
    assert (
        ReadOptions.parse({"nameserver": "h:1", "topic": "a"}, streaming=False).starting.default
        == EARLIEST
    )
    for bad, message in [
        ({"nameserver": "h:1"}, '"topic" is required'),
        ({"nameserver": "h:1", "topic": "a", "failOnDataLoss": "maybe"}, "true or false"),
        ({"nameserver": "h:1", "topic": "a", "maxOffsetsPerTrigger": "0"}, "must be > 0"),
        ({"nameserver": "h:1", "topic": "a", "endingOffsets": "latest"}, "batch reads only"),
        ({"nameserver": "h:1", "topic": "a", "startingOffset": "latest"}, "unknown option"),
        ({"nameserver": "nowhere", "topic": "a"}, "HOST:PORT"),
    ]:
        with pytest.raises(OptionError, match=message):
            ReadOptions.parse(bad, streaming=True)
    with pytest.raises(OptionError, match="one topic"):
        WriteOptions.parse({"nameserver": "h:1", "topic": "a,b"})
