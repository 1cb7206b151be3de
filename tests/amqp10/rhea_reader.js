// An independent AMQP 1.0 consumer (npm rhea, not Proton) for the e2e test: reads `address` on
// the broker of `url`, accepting each message, and prints one JSON line per message
// ({"id", "key", "seq"}: message-id and the outbox-stream-key / outbox-stream-seq application
// properties) until none came for `idle_ms` (after at least `expected`) or `limit_ms` passed.
//
//   node rhea_reader.js URL ADDRESS EXPECTED IDLE_MS LIMIT_MS
// Exit status 0, or 2 with the reason on stderr (cannot connect, the link refused).
'use strict';
const rhea = require('rhea');

const [url, address, expectedText, idleText, limitText] = process.argv.slice(2);
const target = new URL(url);
const expected = Number(expectedText);
const idle = Number(idleText);
const limit = Number(limitText);
const started = Date.now();
let last = Date.now();
let count = 0;
const lines = [];

const container = rhea.create_container();
const connection = container.connect({
  host: target.hostname,
  port: Number(target.port || 5672),
  username: decodeURIComponent(target.username),
  password: decodeURIComponent(target.password),
  reconnect: false,
});
connection.open_receiver({ source: { address }, credit_window: 1000, autoaccept: true });

container.on('message', (context) => {
  const message = context.message;
  const properties = message.application_properties || {};
  lines.push(JSON.stringify({
    id: String(message.message_id),
    key: properties['outbox-stream-key'] ?? null,
    seq: properties['outbox-stream-seq'] === undefined ? null : Number(properties['outbox-stream-seq']),
  }));
  count += 1;
  last = Date.now();
});

function fail(why) {
  process.stderr.write('rhea_reader: ' + why + '\n');
  process.exit(2);
}
container.on('receiver_error', (context) => fail('link refused: ' + JSON.stringify(context.receiver.error)));
container.on('connection_error', (context) => fail('connection error: ' + JSON.stringify(context.connection.error)));
container.on('error', (error) => fail(String(error)));
container.on('disconnected', (context) => {
  if (!finished) fail('disconnected: ' + String(context.error || 'no reason'));
});

let finished = false;
setInterval(() => {
  const now = Date.now();
  if ((count >= expected && now - last >= idle) || now - started >= limit) {
    finished = true;
    process.stdout.write(lines.join('\n') + (lines.length ? '\n' : ''), () => {
      connection.close();
      process.exit(0);
    });
  }
}, 50);
