// What the official Node.js client's programs share: the plan they are given (JSON, the first
// argument; stdin is kept for "stop now": a program that stays runs until stdin closes), the JSON
// lines they print, a received message as JSON, and a logger that writes to stderr (the test
// shows it when a program fails) instead of ~/logs.
'use strict';

const util = require('node:util');

function readPlan() {
  return JSON.parse(process.argv[2]);
}

function emit(event, fields = {}) {
  process.stdout.write(JSON.stringify({ event, ...fields }) + '\n');
}

function log(level) {
  return (...args) => process.stderr.write(`${level} ${util.format(...args)}\n`);
}

const logger = { info: log('INFO'), warn: log('WARN'), error: log('ERROR'), debug: () => {} };

// The access point ("host:port[;host:port]"), the plan's credentials (access_key/secret_key;
// none without them), TLS when the plan says (trusting GRPC_DEFAULT_SSL_ROOTS_FILE_PATH's CA),
// and the plan's request timeout.
function clientOptions(plan) {
  const options = {
    endpoints: plan.endpoints,
    namespace: '',
    requestTimeout: (plan.request_timeout_s ?? 3) * 1000,
    sslEnabled: plan.tls === true,
    logger,
  };
  if (plan.access_key) {
    options.sessionCredentials = { accessKey: plan.access_key, accessSecret: plan.secret_key };
  }
  return options;
}

// What an application reads of a received message (a MessageView).
function messageJson(m) {
  return {
    message_id: m.messageId,
    topic: m.topic,
    tag: m.tag ?? null,
    keys: [...m.keys].sort(),
    properties: Object.fromEntries(m.properties ?? new Map()),
    body: m.body.toString('utf8'),
    message_group: m.messageGroup ?? null,
    delivery_attempt: m.deliveryAttempt ?? null,
    delivery_timestamp_ms: m.deliveryTimestamp ? m.deliveryTimestamp.getTime() : null,
    born_timestamp_ms: m.bornTimestamp ? m.bornTimestamp.getTime() : null,
    corrupted: m.corrupted === true, // only set when the body digest does not match
    received_at_ms: Date.now(),
  };
}

function errorJson(e) {
  return { error: e?.name ?? 'Error', message: String(e?.message ?? e) };
}

// Resolves when the test closes our stdin.
function stdinClosed() {
  return new Promise((resolve) => {
    process.stdin.on('data', () => {});
    process.stdin.on('end', resolve);
    process.stdin.on('close', resolve);
    process.stdin.resume();
  });
}

// An unexpected failure: its stack on stderr and exit code 1, so the test shows why.
function runMain(main) {
  main().then(
    () => process.exit(0),
    (e) => {
      process.stderr.write(`${e?.stack ?? e}\n`);
      process.exit(1);
    },
  );
}

module.exports = { readPlan, emit, clientOptions, messageJson, errorJson, stdinClosed, runMain };
