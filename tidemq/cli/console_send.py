"""``tidemq send TOPIC`` without a body: the console producer. Lines from stdin or ``--file``
(``console_input``) are sent with ``send_async``, ``WINDOW`` at a time, so a large file goes out
batched without holding every future. A bad line stops the command and says what was sent
before it; a message the broker refused is named by its line and the others still go."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from tidemq.cli.console_input import LineDefaults, LineError, read_lines
from tidemq.errors import TidemqError
from tidemq.producer import Producer
from tidemq.types import SendResult

# Sends in flight before the command waits for their answers: enough for the producer to batch,
# few enough that a refused send is reported near its line.
WINDOW = 512
# Refusals printed one per line; past this only the count (a wrong topic refuses every line).
MAX_ERRORS_SHOWN = 10
_TIMING_KEYS = ("delay", "deliver_at", "delay_level")


@dataclass
class Tally:
    statuses: dict[str, int] = field(default_factory=dict)
    failed: int = 0
    first_line: int | None = None
    last_line: int | None = None

    @property
    def sent(self) -> int:
        return sum(self.statuses.values())

    def summary(self) -> str:
        lines = "" if self.first_line is None else f" from lines {self.first_line}-{self.last_line}"
        statuses = ", ".join(f"{n} {s}" for s, n in sorted(self.statuses.items()))
        failed = f", {self.failed} failed" if self.failed else ""
        return f"{self.sent} message(s) sent{lines}{': ' + statuses if statuses else ''}{failed}"


def _result_json(number: int, r: SendResult) -> str:
    out: dict[str, Any] = {
        "line": number,
        "status": r.status.value,
        "msg_id": r.msg_id,
        "topic": r.topic,
        "broker": r.broker,
        "queue_id": r.queue_id,
        "queue_offset": r.queue_offset,
    }
    if r.recall_handle:
        out.update(deliver_at_ms=r.deliver_at_ms, recall_handle=r.recall_handle)
    return json.dumps(out)


class Sender:
    def __init__(self, producer: Producer, topic: str, timing: dict[str, Any], as_json: bool):
        self.producer = producer
        self.topic = topic
        self.timing = timing
        self.as_json = as_json
        self.tally = Tally()
        self._pending: list[tuple[int, Any]] = []

    def send(self, number: int, body: bytes, options: dict[str, Any]) -> None:
        # A line's own delay replaces the command's --delay/--deliver-at/--delay-level.
        timing = {} if "delay" in options else self.timing
        try:
            future: Any = self.producer.send_async(self.topic, body, **options, **timing)
        except TidemqError as e:
            self._failed(number, e)
            return
        self._pending.append((number, future))
        if len(self._pending) >= WINDOW:
            self.settle()

    def settle(self) -> None:
        pending, self._pending = self._pending, []
        for number, future in pending:
            try:
                r: SendResult = future.result()
            except TidemqError as e:
                self._failed(number, e)
                continue
            t = self.tally
            t.statuses[r.status.value] = t.statuses.get(r.status.value, 0) + 1
            t.first_line = number if t.first_line is None else t.first_line
            t.last_line = number
            if self.as_json:
                print(_result_json(number, r))

    def _failed(self, number: int, error: TidemqError) -> None:
        self.tally.failed += 1
        if self.tally.failed <= MAX_ERRORS_SHOWN:
            print(f"tidemq: line {number}: {error}", file=sys.stderr)


@contextlib.contextmanager
def _source(path: str | None) -> Iterator[IO[str]]:
    if path is None:
        yield sys.stdin
        return
    with open(path, encoding="utf-8") as f:
        yield f


def send_lines(args: argparse.Namespace, defaults: LineDefaults, timing: dict[str, Any]) -> int:
    with _source(args.file) as source, Producer(args.nameserver) as producer:
        sender = Sender(producer, args.topic, timing, args.json)
        try:
            for line in read_lines(source, defaults, json_lines=args.json_lines):
                sender.send(line.number, line.body, line.options)
        except LineError as e:
            sender.settle()
            sys.stdout.flush()
            # Nothing after the bad line was sent; everything before it was (or is reported
            # as failed above), so the user knows where to resume.
            raise ValueError(f"{e}; stopped there: {sender.tally.summary()}") from None
        finally:
            # Also on Ctrl-C: what was handed to the producer is answered before it closes
            # (a no-op after the settle above: nothing is pending then).
            sender.settle()
    tally = sender.tally
    print(f"{tally.summary()} to {args.topic}", file=sys.stderr if args.json else sys.stdout)
    if tally.failed > MAX_ERRORS_SHOWN:
        print(f"tidemq: {tally.failed - MAX_ERRORS_SHOWN} more failures not shown", file=sys.stderr)
    return 0 if tally.failed == 0 and set(tally.statuses) <= {"SEND_OK"} else 1
