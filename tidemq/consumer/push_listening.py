"""The push consumers' listener contract: the listener types, what a listener's answer means
(``consume_outcome``), how a listener's failure is logged, and the counters a push consumer
keeps (``PushStats``)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from tidemq.types import ConsumeResult, ReceivedMessage

# The push consumer's logger, so that logging set up for it keeps covering these lines.
log = logging.getLogger("tidemq.consumer.push")

AsyncListener = Callable[[ReceivedMessage], Awaitable[Any] | Any]
Listener = Callable[[ReceivedMessage], Any]


def consume_outcome(result: object) -> ConsumeResult:
    """What a listener's answer means: SUCCESS only when it said so."""
    if result is ConsumeResult.SUCCESS:
        return ConsumeResult.SUCCESS
    if result is not ConsumeResult.FAILURE:
        log.warning("listener answered %r, not a ConsumeResult: counted as FAILURE", result)
    return ConsumeResult.FAILURE


@dataclass
class PushStats:
    """Counters since the consumer started."""

    received: int = 0
    receive_calls: int = 0  # answered receive calls (with messages or not)
    succeeded: int = 0  # listener answered SUCCESS
    failed: int = 0  # FAILURE, an exception, or another answer
    acked: int = 0
    ack_errors: int = 0  # the ack did not take (the message comes back)
    nacked: int = 0
    renewed: int = 0


def log_listener_error(message: ReceivedMessage, error: BaseException) -> None:
    log.error(
        "listener failed on %s (attempt %d)",
        message.msg_id,
        message.delivery_attempt,
        exc_info=error,
    )
