"""What a receive group's history must show, checked from the members' record alone.

A message is one stored copy: (broker group, queue id, queue offset, body). Grant times are the
broker's wall clock in whole ms, ack and nack times ours (the same clock): ``SLACK_MS`` covers
the broker's truncation to the ms, nothing more.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from tests.integration.receivers import DONE, Delivery, DeliveryLog, Outcome

SLACK_MS = 1.0

MessageId = tuple[str, int, int, str]


def by_message(log: DeliveryLog) -> dict[MessageId, list[Delivery]]:
    """Each stored message's deliveries in the order the broker granted them."""
    out: dict[MessageId, list[Delivery]] = {}
    for ds in log.by_body().values():
        for d in ds:
            out.setdefault((*d.queue, d.body), []).append(d)
    return out


def _show(ds: Iterable[Delivery]) -> list[str]:
    return [str(d) for d in ds]


def assert_every_sent_message_acked(sent: set[str], log: DeliveryLog) -> None:
    missing = sorted(sent - log.done_bodies())
    assert not missing, f"{len(missing)} SEND_OK messages never acked, e.g. {missing[:5]}"


def overlap_pairs(log: DeliveryLog) -> list[tuple[Delivery, Delivery]]:
    """(earlier, later) deliveries of one message where the later one was granted while the
    earlier one still held it: two holders at once (the same member twice counts too)."""
    found = []
    for ds in by_message(log).values():
        for a, b in itertools.pairwise(ds):
            if b.granted_ms + SLACK_MS < a.held_until_ms():
                found.append((a, b))
    return found


def overlaps(log: DeliveryLog) -> list[str]:
    return [f"{b} while {a}" for a, b in overlap_pairs(log)]


def duplicate_pairs(log: DeliveryLog) -> list[tuple[Delivery, Delivery]]:
    """(acked, later) deliveries of one message: granted after an earlier delivery of it was
    acked by its own ack (MESSAGE_ALREADY_ACKED proves only that someone acked it, maybe a later
    delivery)."""
    found = []
    for ds in by_message(log).values():
        acked = next((i for i, d in enumerate(ds) if d.outcome is Outcome.ACKED), None)
        if acked is not None:
            found += [(ds[acked], d) for d in ds[acked + 1 :]]
    return found


def duplicates(log: DeliveryLog) -> list[str]:
    return [f"{d} after {a}" for a, d in duplicate_pairs(log)]


def attempt_problems(log: DeliveryLog, *, exact: bool) -> list[str]:
    """Attempts per message, in grant order: 1, 2, 3, ... (``exact``), or at least strictly
    increasing from 1 on (a crash or failover can eat an answer the member never saw)."""
    found = []
    for ds in by_message(log).values():
        attempts = [d.attempt for d in ds]
        if exact:
            ok = attempts == list(range(1, len(ds) + 1))
        else:
            ok = attempts[0] >= 1 and all(x < y for x, y in itertools.pairwise(attempts))
        if not ok:
            found.append(f"attempts {attempts}: {_show(ds)}")
    return found


def fifo_violations(log: DeliveryLog) -> list[str]:
    """Per message group and queue, in queue order: no delivery of a message before the one in
    front of it was acked (its completing ack was sent)."""
    groups: dict[tuple[str, int, str], list[MessageId]] = {}
    messages = by_message(log)
    for mid, ds in messages.items():
        g = ds[0].message_group
        if g:
            groups.setdefault((mid[0], mid[1], g), []).append(mid)
    found = []
    for mids in groups.values():
        mids.sort(key=lambda mid: mid[2])
        for p, q in itertools.pairwise(mids):
            last = messages[p][-1]
            first = messages[q][0]
            completed = last.outcome in (*DONE, Outcome.ACK_UNKNOWN)
            if not completed or last.ended_at_ms is None:
                found.append(f"{first} while {p[3]} was not acked: {_show(messages[p])}")
            elif first.granted_ms + SLACK_MS < last.ended_at_ms:
                found.append(f"{first} before {last}")
    return found


def next_delivery(log: DeliveryLog, d: Delivery) -> Delivery:
    """The delivery of the same message that followed ``d`` (fails when there is none)."""
    ds = by_message(log)[(*d.queue, d.body)]
    at = next(i for i, x in enumerate(ds) if x is d)
    later = ds[at + 1 :]
    assert later, f"{d} was never delivered again"
    return later[0]


def assert_clean(found: list[str], what: str) -> None:
    assert not found, f"{len(found)} {what}, e.g.\n" + "\n".join(found[:8])
