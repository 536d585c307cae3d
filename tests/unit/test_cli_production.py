"""The command line's production-semantics parts that need no broker: delivery times as typed
(ISO 8601 or epoch ms), times as printed, and what ``send``'s delay flags ask the producer for."""

from __future__ import annotations

import time
from datetime import datetime

import pytest

from tidemq.cli import build_parser, main
from tidemq.cli.messages import send_timing
from tidemq.cli.times import format_time_ms, parse_time_ms

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("2026-11-24T21:00:00Z", 1_795_554_000_000),
        ("2026-11-24T21:00:00.250Z", 1_795_554_000_250),
        ("2026-11-24 22:00:00+01:00", 1_795_554_000_000),
        ("1795554000000", 1_795_554_000_000),
        (" 1795554000123 ", 1_795_554_000_123),
    ],
)
def test_times_are_read_as_iso_8601_or_epoch_milliseconds(text: str, ms: int) -> None:
    assert parse_time_ms(text) == ms


def test_a_time_without_a_zone_is_the_local_time_of_the_machine() -> None:
    local = datetime(2026, 11, 24, 21, 0, 0)
    assert parse_time_ms("2026-11-24T21:00:00") == round(local.timestamp() * 1000)


@pytest.mark.parametrize("text", ["", "tomorrow", "2026-13-01T00:00:00Z", "-5", "1.5"])
def test_text_that_is_no_time_is_refused_naming_it(text: str) -> None:
    with pytest.raises(ValueError, match="is not a time"):
        parse_time_ms(text)


def test_times_print_in_utc_to_the_millisecond_and_read_back() -> None:
    assert format_time_ms(1_795_554_000_250) == "2026-11-24T21:00:00.250Z"
    assert format_time_ms(5) == "1970-01-01T00:00:00.005Z"
    now_ms = int(time.time() * 1000)
    assert parse_time_ms(format_time_ms(now_ms)) == now_ms


def send_args(*flags: str) -> dict[str, object]:
    return send_timing(build_parser().parse_args(["send", "t", "body", *flags]))


def test_send_without_a_delay_flag_asks_for_no_delay() -> None:
    assert send_args() == {}


@pytest.mark.parametrize(
    ("flags", "kwargs"),
    [
        (("--delay", "30s"), {"delay": 30.0}),
        (("--delay", "1500ms"), {"delay": 1.5}),
        (("--delay", "2h"), {"delay": 7200.0}),
        (("--deliver-at", "2026-11-24T21:00:00Z"), {"deliver_at": 1_795_554_000_000}),
        (("--deliver-at", "1795554000000"), {"deliver_at": 1_795_554_000_000}),
        (("--delay-level", "3"), {"delay_level": 3}),
    ],
)
def test_send_delay_flags_become_the_producers_send_options(
    flags: tuple[str, ...], kwargs: dict[str, object]
) -> None:
    assert send_args(*flags) == kwargs


@pytest.mark.parametrize(
    "flags",
    [
        ("--delay", "30s", "--delay-level", "3"),
        ("--delay", "30s", "--deliver-at", "1795554000000"),
        ("--deliver-at", "1795554000000", "--delay-level", "1"),
    ],
)
def test_two_delay_flags_at_once_are_a_usage_error(
    flags: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["send", "t", "body", *flags])
    assert exit_.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--delay", "0s"), "more than zero"),
        (("--delay", "soon"), "is not a duration"),
        (("--deliver-at", "noon"), "is not a time"),
        (("--delay-level", "0"), "1..18"),
        (("--delay-level", "19"), "1..18"),
    ],
)
def test_a_bad_delay_is_refused_before_anything_is_sent(
    flags: tuple[str, ...], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # No nameserver listens on port 9: reaching it would fail differently (exit 1, UNAVAILABLE).
    rc = main(["send", "t", "body", "--nameserver", "127.0.0.1:9", *flags])
    err = capsys.readouterr().err
    assert rc == 2 and says in err and err.count("\n") == 1


@pytest.mark.parametrize("command", [["delayed", "list"], ["transactions", "list"]])
def test_a_listing_limit_must_be_positive(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main([*command, "--limit", "0", "--nameserver", "127.0.0.1:9"])
    assert rc == 2 and "--limit must be > 0" in capsys.readouterr().err
