"""What the transaction tests share: a checker that answers what it is told and remembers what
it was asked, and reading a topic whole (every queue from the start) as consumers would."""

from __future__ import annotations

import threading
from collections import Counter

import tidemq
from tidemq import TransactionChecker, TransactionResolution
from tidemq.types import ReceivedMessage


class ScriptedChecker(TransactionChecker):
    """Answers checks with ``answer`` (changeable) and records the bodies asked about."""

    def __init__(self, answer: TransactionResolution) -> None:
        self.answer = answer
        self.asked: Counter[bytes] = Counter()
        self._lock = threading.Lock()

    def check(self, message: ReceivedMessage) -> TransactionResolution:
        with self._lock:
            self.asked[message.body] += 1
        return self.answer


def bodies_in(nameserver: str, topic: str) -> Counter[bytes]:
    """Every message stored in ``topic``'s queues, read from the start (as a consumer sees them)."""
    seen: Counter[bytes] = Counter()
    with tidemq.QueueReader(nameserver) as reader:
        for queue in reader.read_queues(topic):
            offset = 0
            while True:
                got = reader.pull(queue, offset, max_messages=256)
                for m in got.messages:
                    seen[m.body] += 1
                if got.next_offset <= offset:
                    break
                offset = got.next_offset
    return seen
