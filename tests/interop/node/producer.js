// The official Node.js client's Producer, as an application uses it. The plan and the lines it
// prints are those of tests/interop/python/producer.py: endpoints, topic, messages (body, tag,
// keys, properties, message_group, deliver_at_ms, transaction: commit | rollback | open),
// checker (commit | rollback), stay; prints sent / send_error, ended, checked, done.
'use strict';

const { Producer } = require('rocketmq-client-nodejs');
const { TransactionResolution } = require('rocketmq-client-nodejs/proto/apache/rocketmq/v2/definition_pb');
const { readPlan, emit, clientOptions, messageJson, errorJson, stdinClosed, runMain } = require('./plan');

const RESOLUTIONS = { commit: TransactionResolution.COMMIT, rollback: TransactionResolution.ROLLBACK };

function build(topic, spec) {
  const message = { topic, body: Buffer.from(spec.body, 'utf8') };
  if (spec.tag) message.tag = spec.tag;
  if (spec.keys) message.keys = spec.keys;
  if (spec.properties) message.properties = new Map(Object.entries(spec.properties));
  if (spec.message_group) message.messageGroup = spec.message_group;
  if (spec.deliver_at_ms) message.deliveryTimestamp = new Date(spec.deliver_at_ms);
  return message;
}

async function send(producer, topic, spec) {
  const transaction = spec.transaction ? producer.beginTransaction() : undefined;
  const receipt = await producer.send(build(topic, spec), transaction);
  emit('sent', {
    body: spec.body,
    message_id: receipt.messageId,
    offset: receipt.offset,
    transaction_id: receipt.transactionId,
    recall_handle: receipt.recallHandle,
    deliver_at_ms: spec.deliver_at_ms ?? null,
  });
  if (spec.transaction === 'commit' || spec.transaction === 'rollback') {
    await transaction[spec.transaction]();
    emit('ended', { body: spec.body, resolution: spec.transaction });
  }
}

async function main() {
  const plan = readPlan();
  const resolution = plan.checker ?? 'commit';
  const checker = {
    async check(messageView) {
      emit('checked', { resolution, ...messageJson(messageView) });
      return RESOLUTIONS[resolution];
    },
  };
  const producer = new Producer({ ...clientOptions(plan), topics: [plan.topic], checker });
  await producer.startup();
  try {
    for (const spec of plan.messages) {
      try {
        await send(producer, plan.topic, spec);
      } catch (e) {
        emit('send_error', { body: spec.body, ...errorJson(e) });
      }
    }
    if (plan.stay) {
      emit('staying');
      await stdinClosed();
    }
  } finally {
    await producer.shutdown();
  }
  emit('done');
}

runMain(main);
