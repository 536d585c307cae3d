"""The ``tidemq`` source's and sink's options, validated once when a query is planned.

Spark passes options as a case-insensitive dict of strings; the dataclasses here hold them typed,
with units in the names. A bad option fails the query at planning with a message naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from tidemq._runtime import nameserver_addresses
from tidemq.pipeline.offsets import EARLIEST, LATEST, OffsetSpec, OffsetSpecError, parse_spec
from tidemq.reader import MAX_PULL_MESSAGES

DEFAULT_PULL_TIMEOUT_MS: Final = 60_000
DEFAULT_PULL_MAX_BYTES: Final = 4 << 20
DEFAULT_BATCH_MAX_MESSAGES: Final = 256
MAX_TIMESTAMP_MS: Final = (1 << 63) - 1

READ_OPTIONS: Final = frozenset(
    {
        "nameserver",
        "topic",
        "tags",
        "startingoffsets",
        "endingoffsets",
        "startingtimestamp",
        "endingtimestamp",
        "maxoffsetspertrigger",
        "failondataloss",
        "pullbatchsize",
        "pullmaxbytes",
        "pulltimeoutms",
    }
)
WRITE_OPTIONS: Final = frozenset({"nameserver", "topic", "batchmaxmessages", "lingerms"})
# Set by Spark itself (load(path), writeStream's checkpoint), not by the user for us.
SPARK_OPTIONS: Final = frozenset({"path", "checkpointlocation"})


class OptionError(ValueError):
    """An option of the tidemq source or sink is missing or wrong."""


@dataclass(frozen=True)
class ReadOptions:
    nameserver: str
    topics: tuple[str, ...]
    tags: str
    starting: OffsetSpec
    ending: OffsetSpec
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    pull_batch_messages: int
    pull_max_bytes: int
    pull_timeout_ms: int
    # Spark's Kafka options of these names: per queue, start at the first offset stored at or
    # after startingTimestamp, and stop before the first stored at or after endingTimestamp
    # (ms since the epoch), as the brokers' offset search finds them. They replace
    # startingOffsets / endingOffsets.
    starting_timestamp_ms: int | None = None
    ending_timestamp_ms: int | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
        opts = {k.lower(): v for k, v in options.items()}
        _reject_unknown(opts, READ_OPTIONS)
        topics = tuple(t.strip() for t in opts.get("topic", "").split(",") if t.strip())
        if not topics:
            raise OptionError('option "topic" is required: one topic, or several separated by ,')
        if len(set(topics)) != len(topics):
            raise OptionError(f'option "topic" lists a topic twice: {",".join(topics)}')
        if streaming and "endingoffsets" in opts:
            raise OptionError('"endingOffsets" applies to batch reads only')
        if not streaming and "maxoffsetspertrigger" in opts:
            raise OptionError('"maxOffsetsPerTrigger" applies to streaming reads only')
        if streaming and "endingtimestamp" in opts:
            raise OptionError('"endingTimestamp" applies to batch reads only')
        for word in ("starting", "ending"):
            if f"{word}timestamp" in opts and f"{word}offsets" in opts:
                raise OptionError(
                    f'"{word}Timestamp" and "{word}Offsets" both say where to {word[:-3]}; '
                    "give one of them"
                )
        starting_ms = _timestamp(opts.get("startingtimestamp"), "startingTimestamp")
        ending_ms = _timestamp(opts.get("endingtimestamp"), "endingTimestamp")
        if starting_ms is not None and ending_ms is not None and ending_ms < starting_ms:
            raise OptionError(
                f"endingTimestamp {ending_ms} is before startingTimestamp {starting_ms}"
            )
        try:
            # Spark's Kafka defaults: a batch reads everything, a stream only what comes next.
            starting = parse_spec(
                opts.get("startingoffsets"),
                LATEST if streaming else EARLIEST,
                name="startingOffsets",
            )
            ending = parse_spec(opts.get("endingoffsets"), LATEST, name="endingOffsets")
        except OffsetSpecError as e:
            raise OptionError(str(e)) from None
        if ending.default == EARLIEST:
            raise OptionError('endingOffsets "earliest" would read nothing')
        max_rows = opts.get("maxoffsetspertrigger")
        return cls(
            nameserver=_nameserver(opts),
            topics=topics,
            tags=opts.get("tags", "*").strip() or "*",
            starting=starting,
            ending=ending,
            max_offsets_per_trigger=(
                None if max_rows is None else _positive_int(max_rows, "maxOffsetsPerTrigger")
            ),
            fail_on_data_loss=_bool(opts.get("failondataloss", "true"), "failOnDataLoss"),
            pull_batch_messages=min(
                _positive_int(opts.get("pullbatchsize", str(MAX_PULL_MESSAGES)), "pullBatchSize"),
                MAX_PULL_MESSAGES,
            ),
            pull_max_bytes=_positive_int(
                opts.get("pullmaxbytes", str(DEFAULT_PULL_MAX_BYTES)), "pullMaxBytes"
            ),
            pull_timeout_ms=_positive_int(
                opts.get("pulltimeoutms", str(DEFAULT_PULL_TIMEOUT_MS)), "pullTimeoutMs"
            ),
            starting_timestamp_ms=starting_ms,
            ending_timestamp_ms=ending_ms,
        )


@dataclass(frozen=True)
class WriteOptions:
    nameserver: str
    topic: str | None  # overrides the topic column
    batch_max_messages: int
    linger_ms: int

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> WriteOptions:
        opts = {k.lower(): v for k, v in options.items()}
        _reject_unknown(opts, WRITE_OPTIONS)
        topic = opts.get("topic", "").strip() or None
        if topic is not None and "," in topic:
            raise OptionError('the sink\'s "topic" option names one topic')
        linger = opts.get("lingerms", "5")
        if not linger.strip().isdigit():
            raise OptionError(f'option "lingerMs" must be an integer >= 0, not {linger!r}')
        return cls(
            nameserver=_nameserver(opts),
            topic=topic,
            batch_max_messages=_positive_int(
                opts.get("batchmaxmessages", str(DEFAULT_BATCH_MAX_MESSAGES)), "batchMaxMessages"
            ),
            linger_ms=int(linger),
        )


def _reject_unknown(opts: Mapping[str, str], known: frozenset[str]) -> None:
    unknown = sorted(set(opts) - known - SPARK_OPTIONS)
    if unknown:
        raise OptionError(f"unknown option(s) {unknown}; known: {sorted(known)}")


def _nameserver(opts: Mapping[str, str]) -> str:
    try:
        return ",".join(nameserver_addresses(opts.get("nameserver")))
    except ValueError as e:
        raise OptionError(f'option "nameserver": {e}') from None


def _positive_int(raw: str, name: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f'option "{name}" must be an integer, not {raw!r}') from None
    if value <= 0:
        raise OptionError(f'option "{name}" must be > 0, not {value}')
    return value


def _timestamp(raw: str | None, name: str) -> int | None:
    """Milliseconds since the epoch, as Spark's Kafka source takes them."""
    if raw is None:
        return None
    text = raw.strip()
    # Digits only: no sign, no fraction, no ISO date; and within the brokers' int64.
    if not (text.isascii() and text.isdigit()) or int(text) > MAX_TIMESTAMP_MS:
        raise OptionError(
            f'option "{name}" must be milliseconds since the epoch (an integer >= 0), not {raw!r}'
        )
    return int(text)


def _bool(raw: str, name: str) -> bool:
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise OptionError(f'option "{name}" must be true or false, not {raw!r}')
    return value == "true"
