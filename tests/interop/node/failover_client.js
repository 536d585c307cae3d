// The official Node.js client's Producer and SimpleConsumer in one process, as a service uses
// them through a failover: the producer sends numbered messages one after another, the consumer
// receives and acks what comes, and neither is restarted whatever the brokers do; a failure is
// reported, then the application carries on. The plan and the lines it prints are those of
// tests/interop/python/failover_client.py: endpoints, topic, group, await_s, invisible_s,
// send_interval_ms, error_pause_ms; prints started, sent / send_error, received, acked /
// ack_error, receive_error, producing_stopped (after a "stop_producing" line on stdin), done
// (after stdin ends).
//
// One more plan field, renew_producer_after_failures (0: never): after that many sends in a row
// failed, a new Producer replaces the old one (producer_renewed, or renew_error). This client's
// Producer (1.0.8) keeps the queues of its first send for good, so after a failover it sends to
// the dead master until it is replaced (docs/rocketmq-clients.md, "Failover").
'use strict';

const readline = require('node:readline');
const { Producer, SimpleConsumer } = require('rocketmq-client-nodejs');
const { readPlan, emit, clientOptions, errorJson, runMain } = require('./plan');

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function say(event, fields = {}) {
  emit(event, { at_ms: Date.now(), ...fields });
}

// A new Producer in this process, as an application does when its producer keeps failing.
async function newProducer(plan) {
  const producer = new Producer({ ...clientOptions(plan), topics: [plan.topic] });
  await producer.startup();
  return producer;
}

async function produce(holder, plan, stop) {
  let n = 0;
  let failures = 0;
  while (!stop.producing) {
    const body = `m-${n}`;
    const renewAfter = plan.renew_producer_after_failures ?? 0;
    if (renewAfter > 0 && failures >= renewAfter) {
      failures = 0;
      try {
        const renewed = await newProducer(plan);
        await holder.producer.shutdown().catch(() => {});
        holder.producer = renewed;
        say('producer_renewed', { n });
      } catch (e) {
        say('renew_error', errorJson(e));
        await sleep(plan.error_pause_ms);
        continue;
      }
    }
    try {
      const receipt = await holder.producer.send({ topic: plan.topic, body: Buffer.from(body, 'utf8') });
      failures = 0;
      say('sent', {
        n,
        body,
        message_id: receipt.messageId,
        offset: receipt.offset,
        endpoint: receipt.endpoints.facade,
      });
      await sleep(plan.send_interval_ms);
    } catch (e) {
      failures += 1;
      say('send_error', { n, body, ...errorJson(e) });
      await sleep(plan.error_pause_ms);
    }
    n += 1;
  }
  say('producing_stopped', { sends: n });
}

async function consume(consumer, plan, stop) {
  while (!stop.consuming) {
    let batch;
    try {
      batch = await consumer.receive(16, plan.invisible_s * 1000);
    } catch (e) {
      say('receive_error', errorJson(e));
      await sleep(plan.error_pause_ms);
      continue;
    }
    for (const m of batch) {
      say('received', {
        body: m.body.toString('utf8'),
        message_id: m.messageId,
        delivery_attempt: m.deliveryAttempt ?? null,
        endpoint: m.endpoints ? m.endpoints.facade : null,
      });
      try {
        await consumer.ack(m);
        say('acked', { message_id: m.messageId });
      } catch (e) {
        // It comes back after its invisible time.
        say('ack_error', { message_id: m.messageId, ...errorJson(e) });
      }
    }
  }
}

// Resolves when stdin ends; a "stop_producing" line sets stop.producing.
function control(stop) {
  return new Promise((resolve) => {
    const lines = readline.createInterface({ input: process.stdin });
    lines.on('line', (line) => {
      if (line.trim() === 'stop_producing') stop.producing = true;
    });
    lines.on('close', resolve);
  });
}

async function main() {
  const plan = readPlan();
  const consumer = new SimpleConsumer({
    ...clientOptions(plan),
    consumerGroup: plan.group,
    subscriptions: new Map([[plan.topic, '*']]),
    awaitDuration: plan.await_s * 1000,
  });
  await consumer.startup();
  const holder = { producer: await newProducer(plan) };
  const stop = { producing: false, consuming: false };
  try {
    // A new group starts at the end of the topic: it exists once a receive has returned.
    await consumer.receive(16, plan.invisible_s * 1000);
    say('started');
    const ended = control(stop);
    const loops = [consume(consumer, plan, stop), produce(holder, plan, stop)];
    await ended;
    stop.producing = true;
    stop.consuming = true;
    await Promise.all(loops);
  } finally {
    await holder.producer.shutdown();
    await consumer.shutdown();
  }
  say('done');
}

runMain(main);
