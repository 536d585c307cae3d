"""tidemq through the official RocketMQ 5 Python client, unmodified (docs/rocketmq-clients.md).

    pip install rocketmq-python-client==5.1.2
    python official_python_client.py 127.0.0.1:8081   # a broker's --rocketmq-listen address

Sends one message with a tag, keys and a property, receives it with a SimpleConsumer and acks it.
The topic must exist (tidemq topic create example-orders)."""

import sys

from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)

TOPIC, GROUP = "example-orders", "example-billing"


def main() -> None:
    endpoints = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:8081"
    config = ClientConfiguration(endpoints, Credentials())  # no TLS, no credentials
    consumer = SimpleConsumer(config, GROUP, {TOPIC: FilterExpression("created")}, await_duration=2)
    producer = Producer(config, (TOPIC,))
    consumer.startup()
    producer.startup()
    try:
        # A new group starts at the end of the topic: receive once so that it exists before
        # the message is sent.
        consumer.receive(16, 30)
        msg = Message()
        msg.topic = TOPIC
        msg.body = b"hello from the official Python client"
        msg.tag = "created"
        msg.keys = "order-1"  # each assignment adds one key
        msg.add_property("source", "example")
        receipt = producer.send(msg)
        print("sent", receipt.message_id)
        received = []
        for _ in range(10):
            received = consumer.receive(16, 30)  # up to 16 messages, invisible for 30 s
            if received:
                break
        for m in received:
            print("received", m.message_id, m.tag, sorted(m.keys), m.properties, m.body.decode())
            consumer.ack(m)
    finally:
        producer.shutdown()
        consumer.shutdown()


if __name__ == "__main__":
    main()
