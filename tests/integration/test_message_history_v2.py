"""A receive over the RocketMQ 5 protocol (the official clients' ReceiveMessage) records the
receiving client's id, as a receive over tidemq's own protocol does: the message's history on
a real broker process names the client from the call's metadata."""

from __future__ import annotations

import pytest

from tests.integration.conftest import StartBroker
from tests.integration.receiving import GROUP, TOPIC, create_topic, send
from tests.integration.test_v2_receive import from_start
from tests.integration.v2_receiving import METADATA, ack, name, receive, start_v2
from tidemq.protos import broker_pb2

pytestmark = pytest.mark.integration


def test_a_v2_receive_records_the_client_id_of_its_metadata(start_broker: StartBroker) -> None:
    v2 = start_v2(start_broker)
    create_topic(v2.broker)
    from_start(v2.broker)
    send(v2.broker, [b"hello"])
    (m,) = receive(v2).messages
    assert name(ack(v2, [m]).status.code) == "OK"
    history = v2.broker.stub().GetMessageHistory(
        broker_pb2.GetMessageHistoryRequest(
            topic=TOPIC, queue_id=0, queue_offset=m.system_properties.queue_offset
        ),
        timeout=10,
    )
    client = dict(METADATA)["x-mq-client-id"]
    # The reset of from_start may fall within the scan's clock slack before the message.
    got = [
        (broker_pb2.MessageEventKind.Name(e.kind), e.group, e.client_id)
        for e in history.events
        if e.kind != broker_pb2.QUEUE_RESET
    ]
    assert got == [("DELIVERED", GROUP, client), ("ACKED", GROUP, "")]
    assert not history.truncated
