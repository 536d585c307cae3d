// tidemq through the official RocketMQ 5 Node.js client, unmodified (docs/rocketmq-clients.md).
//
//     npm install rocketmq-client-nodejs@1.0.8
//     node official_node_client.js 127.0.0.1:8081   # a broker's --rocketmq-listen address
//
// Sends one message with a tag, keys and a property, receives it with a SimpleConsumer and acks
// it. The topic must exist (tidemq topic create example-orders).
'use strict';

const { Producer, SimpleConsumer } = require('rocketmq-client-nodejs');

const TOPIC = 'example-orders';
const GROUP = 'example-billing';

async function main() {
  const endpoints = process.argv[2] ?? '127.0.0.1:8081';
  const consumer = new SimpleConsumer({
    endpoints,
    namespace: '',
    consumerGroup: GROUP,
    subscriptions: new Map([[TOPIC, 'created']]),
    awaitDuration: 2000, // long polling, ms
  });
  const producer = new Producer({ endpoints, namespace: '', topics: [TOPIC] });
  await consumer.startup();
  await producer.startup();
  try {
    // A new group starts at the end of the topic: receive once so that it exists before the
    // message is sent.
    await consumer.receive(16, 30000);
    const receipt = await producer.send({
      topic: TOPIC,
      tag: 'created',
      keys: ['order-1'],
      properties: new Map([['source', 'example']]),
      body: Buffer.from('hello from the official Node.js client'),
    });
    console.log('sent', receipt.messageId);
    let received = [];
    for (let i = 0; i < 10 && received.length === 0; i++) {
      received = await consumer.receive(16, 30000); // up to 16 messages, invisible for 30 s
    }
    for (const m of received) {
      console.log('received', m.messageId, m.tag, m.keys, Object.fromEntries(m.properties), m.body.toString());
      await consumer.ack(m);
    }
  } finally {
    await producer.shutdown();
    await consumer.shutdown();
  }
}

main().then(
  () => process.exit(0),
  (e) => {
    console.error(e);
    process.exit(1);
  },
);
