"""Between a producer's message and its half record, and from the half back to the message a
commit stores in its topic. Pure: no store, no clock.

A half is stored in ``%SYS%TRANS_HALF`` queue 0 (no consumer reads it) with its real place in
properties; the committed copy is the message as sent, with ``TRAN_HALF_OFFSET`` naming its half
and a ``UNIQ_KEY`` (the client's, else the half's message id) that the index finds it by: a
commit whose op record was lost is recognised at rebuild (``log.TransactionLog.repair``)."""

from __future__ import annotations

from tidemq.services.broker.idempotence.stamp import PRODUCER_SEQ_PROPERTY
from tidemq.services.broker.relocate import relocated
from tidemq.services.broker.transactions.events import HALF_TOPIC
from tidemq.storage import Message, StoredMessage
from tidemq.storage.record import PROP_UNIQ_KEY

REAL_TOPIC = "REAL_TOPIC"
REAL_QID = "REAL_QID"
PGROUP = "PGROUP"
TRAN_MSG = "TRAN_MSG"
TRAN_HALF_OFFSET = "TRAN_HALF_OFFSET"
# An idempotent half's stamp stays on the half: the table knows the sequence from it, and on a
# committed copy it would name a run of records that are not there.
_HALF_ONLY = (REAL_TOPIC, REAL_QID, PGROUP, TRAN_MSG, "TAGS", "KEYS", PRODUCER_SEQ_PROPERTY)


def to_half(m: Message, producer_group: str) -> Message:
    props = dict(m.properties)
    props[REAL_TOPIC] = m.topic
    props[REAL_QID] = str(m.queue_id)
    props[PGROUP] = producer_group
    props[TRAN_MSG] = "true"
    return relocated(m, HALF_TOPIC, 0, props)


def real_topic(half: StoredMessage) -> tuple[str, int]:
    p = half.properties
    return p[REAL_TOPIC], int(p[REAL_QID])


def commit_key(half: StoredMessage) -> str:
    """The UNIQ_KEY the committed copy carries (and is indexed under)."""
    return half.properties.get(PROP_UNIQ_KEY) or half.msg_id


def user_properties(half: StoredMessage) -> dict[str, str]:
    """The properties as the producer sent them."""
    return {k: v for k, v in half.properties.items() if k not in _HALF_ONLY}


def to_committed(half: StoredMessage) -> Message:
    topic, qid = real_topic(half)
    props = user_properties(half)
    props[PROP_UNIQ_KEY] = commit_key(half)
    props[TRAN_HALF_OFFSET] = str(half.phy_offset)
    return relocated(half, topic, qid, props)


def is_committed_copy(m: StoredMessage, half_offset: int) -> bool:
    return m.properties.get(TRAN_HALF_OFFSET) == str(half_offset)
