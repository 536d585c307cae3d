// The official Node.js client's PushConsumer with a listener that fails the first fail_times
// deliveries of each message, then succeeds. The plan and the lines it prints are those of
// tests/interop/python/push_consumer.py: endpoints, group, topic, tag, fail_times; runs until
// stdin closes; prints started, delivery (ok, local_attempt, the message), done.
'use strict';

const { PushConsumer, ConsumeResult } = require('rocketmq-client-nodejs');
const { readPlan, emit, clientOptions, messageJson, stdinClosed, runMain } = require('./plan');

async function main() {
  const plan = readPlan();
  const failTimes = plan.fail_times ?? 0;
  const calls = new Map();
  const consumer = new PushConsumer({
    ...clientOptions(plan),
    consumerGroup: plan.group,
    subscriptions: new Map([[plan.topic, plan.tag ?? '*']]),
    messageListener: {
      async consume(messageView) {
        const n = (calls.get(messageView.messageId) ?? 0) + 1;
        calls.set(messageView.messageId, n);
        const ok = n > failTimes;
        emit('delivery', { ok, local_attempt: n, ...messageJson(messageView) });
        return ok ? ConsumeResult.SUCCESS : ConsumeResult.FAILURE;
      },
    },
  });
  await consumer.startup();
  emit('started');
  try {
    await stdinClosed();
  } finally {
    await consumer.shutdown();
  }
  emit('done');
}

runMain(main);
