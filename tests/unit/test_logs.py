"""``--log-format`` and ``--log-level`` (``tidemq.logs``): on every command, JSON lines a log
shipper parses, and the level the user asked for."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from tidemq import logs
from tidemq.cli import build_parser


@pytest.fixture
def restored_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_every_command_and_subcommand_takes_the_logging_flags() -> None:
    parser = build_parser()
    for argv in (
        ["broker", "--store", "/tmp/s", "--log-format", "json", "--log-level", "debug"],
        ["nameserver", "--log-format", "json"],
        ["topic", "create", "orders", "--log-level", "error"],
        ["--log-format", "json", "health", "127.0.0.1:9876"],
    ):
        args = parser.parse_args(argv)
        assert logs.format_of(args) in logs.FORMATS, argv
    args = parser.parse_args(["topic", "create", "orders", "--log-level", "error"])
    assert logs.level_of(args) == logging.ERROR
    with pytest.raises(SystemExit):
        parser.parse_args(["nameserver", "--log-format", "xml"])


def test_the_level_is_the_flag_then_verbose_then_the_commands_default() -> None:
    parser = build_parser()
    assert logs.level_of(parser.parse_args(["nameserver"])) == logging.INFO  # a server
    assert logs.level_of(parser.parse_args(["topic", "list"])) == logging.WARNING  # a tool
    assert logs.level_of(parser.parse_args(["-v", "topic", "list"])) == logging.INFO
    args = parser.parse_args(["-v", "topic", "list", "--log-level", "error"])
    assert logs.level_of(args) == logging.ERROR
    assert logs.format_of(parser.parse_args(["nameserver"])) == "text"


def test_json_lines_carry_time_level_logger_message_and_the_traceback(
    restored_logging: None,
) -> None:
    logs.configure("json", logging.INFO)
    out = io.StringIO()
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(out)
    log = logging.getLogger("tidemq.test")
    log.debug("not at info")
    log.info('stored "orders" at %d', 42)
    try:
        raise ValueError("bad input")
    except ValueError:
        log.exception("refused")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(d["level"], d["logger"], d["message"]) for d in lines] == [
        ("INFO", "tidemq.test", 'stored "orders" at 42'),
        ("ERROR", "tidemq.test", "refused"),
    ]
    assert lines[0]["time"].endswith("+0000")  # UTC, whatever the host's zone
    assert "ValueError: bad input" in lines[1]["exc_info"]
