"""The command line's parsing and output that need no broker: durations as typed, the tables
scripts cut columns from, and what ``consumer-group update``'s flags ask the Admin for."""

from __future__ import annotations

import pytest

from tidemq.admin import RetryPolicy
from tidemq.cli import build_parser, main
from tidemq.cli.consumer_groups import update_kwargs
from tidemq.cli.durations import format_ms, parse_seconds, parse_seconds_list
from tidemq.cli.tables import render

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("500ms", 0.5), ("30s", 30.0), ("1.5s", 1.5), ("2m", 120.0), ("2h", 7200.0), ("45", 45.0)],
)
def test_durations_are_read_in_their_units(text: str, seconds: float) -> None:
    assert parse_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "0s", "-1s", "1x", "s", "1 s s", "nan", "inf"])
def test_durations_that_are_not_positive_durations_are_refused_naming_the_text(text: str) -> None:
    with pytest.raises(ValueError, match=repr(text).replace("(", r"\(")):
        parse_seconds(text)


def test_a_delay_list_keeps_its_order_and_needs_one_delay() -> None:
    assert parse_seconds_list("1s,5s, 30s,2m") == [1.0, 5.0, 30.0, 120.0]
    with pytest.raises(ValueError, match="at least one"):
        parse_seconds_list(" , ")


@pytest.mark.parametrize(
    ("ms", "text"),
    [(1000, "1s"), (120_000, "2m"), (7_200_000, "2h"), (1500, "1500ms"), (90_000, "90s")],
)
def test_delays_print_in_the_shortest_exact_unit(ms: int, text: str) -> None:
    assert format_ms(ms) == text
    assert round(parse_seconds(text) * 1000) == ms


def test_tables_right_align_numbers_and_show_missing_cells_as_a_dash() -> None:
    lines = render(
        ("GROUP", "ATTEMPTS", "TOPICS"),
        [("billing", 16, "orders"), ("audit-long-name", 3, None)],
    )
    assert lines == [
        "GROUP            ATTEMPTS  TOPICS",
        "billing                16  orders",
        "audit-long-name         3  -",
    ]
    # Every row splits into the same number of fields: awk/cut work on it.
    assert {len(line.split()) for line in lines} == {3}


def test_a_column_of_numbers_with_a_missing_one_stays_right_aligned() -> None:
    assert render(("QUEUE", "COMMITTED"), [(0, None), (1, 1234)]) == [
        "QUEUE  COMMITTED",
        "    0          -",
        "    1       1234",
    ]


def test_a_cell_with_a_newline_stays_on_its_row() -> None:
    assert render(("A",), [("two\nlines",)]) == ["A", "two lines"]


def _update(*flags: str) -> dict[str, object]:
    args = build_parser().parse_args(["consumer-group", "update", "billing", *flags])
    return update_kwargs(args)


def test_update_flags_name_exactly_the_settings_to_change() -> None:
    assert _update("--max-delivery-attempts", "3", "--fifo") == {
        "max_delivery_attempts": 3,
        "fifo": True,
    }
    assert _update("--no-fifo", "--disable", "--model", "receive") == {
        "fifo": False,
        "consume_enabled": False,
        "model": "receive",
    }
    assert _update("--retry-delays", "1s,5s,2m") == {"retry_delays_s": [1.0, 5.0, 120.0]}
    # The setting's own name works too (the broker's CONSUME_DISABLED message names it).
    assert _update("--consume-enabled", "true") == {"consume_enabled": True}
    assert _update("--consume-enabled", "False") == {"consume_enabled": False}


def test_update_retry_flags_become_the_admins_retry_policy() -> None:
    assert _update("--retry-initial", "500ms", "--retry-max", "10m", "--retry-multiplier", "3") == {
        "retry_policy": RetryPolicy.exponential(initial_ms=500, max_ms=600_000, multiplier=3.0)
    }
    # Unnamed exponential fields take their defaults; --retry-default is the 18 levels again.
    assert _update("--retry-multiplier", "1.5") == {
        "retry_policy": RetryPolicy.exponential(initial_ms=1000, max_ms=7_200_000, multiplier=1.5)
    }
    assert _update("--retry-default") == {"retry_policy": RetryPolicy()}


def test_update_without_a_setting_or_with_two_retry_policies_is_refused() -> None:
    with pytest.raises(ValueError, match="nothing to change"):
        _update()
    with pytest.raises(ValueError, match="one retry policy"):
        _update("--retry-delays", "1s", "--retry-multiplier", "2")
    with pytest.raises(SystemExit):  # argparse: --fifo and --no-fifo exclude each other
        _update("--fifo", "--no-fifo")
    with pytest.raises(SystemExit):
        _update("--consume-enabled", "maybe")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["receive", "t", "--group", "g", "--count", "0"], "--count must be > 0"),
        (["receive", "t", "--group", "g", "--timeout", "inf"], "--timeout must be"),
        (["receive", "t", "--group", "g", "--invisible", "0s"], "more than zero"),
        (["receive", "t", "--group", "g", "--from", "yesterday"], "--from takes"),
        (["consumer-group", "update", "g"], "nothing to change"),
        (["consumer-group", "update", "g", "--retry-multiplier", "0.5"], "multiplier >= 1"),
        (["dlq", "list", "g", "--limit", "0"], "--limit must be > 0"),
        (["dlq", "resend", "g"], "give the message ids"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2_before_any_call(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # No nameserver listens on port 1: a command that got as far as calling one would exit 1.
    assert main([*argv, "--nameserver", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tidemq: ") and says in err and err.count("\n") == 1
