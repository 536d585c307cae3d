// The official Node.js client's SimpleConsumer, as an application uses it. The plan and the
// lines it prints are those of tests/interop/python/simple_consumer.py: endpoints, group, topic,
// tag, await_s, rounds (count, invisible_s, timeout_s, change_invisible_s, ack); prints received,
// changed, acked, error, round_done, done. Durations are seconds in the plan, ms for the client.
'use strict';

const { SimpleConsumer } = require('rocketmq-client-nodejs');
const { readPlan, emit, clientOptions, messageJson, errorJson, runMain } = require('./plan');

async function handle(consumer, round, step, m) {
  emit('received', { round, ...messageJson(m) });
  try {
    if (step.change_invisible_s) {
      await consumer.changeInvisibleDuration(m, step.change_invisible_s * 1000);
      emit('changed', { round, message_id: m.messageId, invisible_s: step.change_invisible_s });
    }
    if (step.ack) {
      await consumer.ack(m);
      emit('acked', { round, message_id: m.messageId });
    }
  } catch (e) {
    emit('error', { round, message_id: m.messageId, ...errorJson(e) });
  }
}

async function runRound(consumer, round, step) {
  const count = step.count ?? 0;
  const deadline = Date.now() + (step.timeout_s ?? 20) * 1000;
  let got = 0;
  while ((count === 0 || got < count) && Date.now() < deadline) {
    const batch = await consumer.receive(count ? Math.max(count - got, 1) : 16, step.invisible_s * 1000);
    for (const m of batch) await handle(consumer, round, step, m);
    got += batch.length;
  }
  emit('round_done', { round, received: got });
}

async function main() {
  const plan = readPlan();
  const consumer = new SimpleConsumer({
    ...clientOptions(plan),
    consumerGroup: plan.group,
    subscriptions: new Map([[plan.topic, plan.tag ?? '*']]),
    awaitDuration: (plan.await_s ?? 5) * 1000,
  });
  await consumer.startup();
  try {
    for (const [round, step] of plan.rounds.entries()) await runRound(consumer, round, step);
  } finally {
    await consumer.shutdown();
  }
  emit('done');
}

runMain(main);
