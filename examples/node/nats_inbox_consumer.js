#!/usr/bin/env node
// Applies outbox messages from a NATS JetStream stream to a table exactly once, in Node.js.
//
//   node nats_inbox_consumer.js --nats nats://127.0.0.1:4222 --stream ORDERS
//       --db postgresql://app@127.0.0.1/app [--schema outbox] [--consumer orders-projection]
//       [--table applied] [--dead-letter SUBJECT]
//
// Reads the stream through a durable pull consumer named after --consumer (created when
// missing; explicit acks). Each message goes through the SQL inbox (outbox_inbox.js): the row in
// the table and the inbox mark are one transaction, and the ack comes only after the commit, so a
// crash in between has JetStream deliver it again and the inbox says duplicate. At most 32
// messages are unacknowledged at a time: after a crash the dead process's ones are delivered again
// when their ack wait (2 s) ends, before any later one, so that a stream's order holds. On a gap
// or a database failure the message is nak'ed with a delay; one that is invalid or not from
// an outbox is published to the dead-letter subject (default: <stream>.dead-letter, core NATS)
// and terminated. Runs until SIGTERM/SIGINT, then prints what it did. Needs `npm install` in this
// folder (nats, pg).
"use strict";

const { parseArgs } = require("node:util");
const { connect, AckPolicy, DeliverPolicy, nanos } = require("nats");
const {
  NATS_ID_HEADER, NotFromAnOutbox, MalformedHeader, deliveryFromHeaders, Inbox, AppliedTable,
} = require("./outbox_inbox");

async function main() {
  const { values: args } = parseArgs({
    options: {
      nats: { type: "string", default: "nats://127.0.0.1:4222" },
      stream: { type: "string" },
      db: { type: "string" },
      schema: { type: "string", default: "outbox" },
      consumer: { type: "string", default: "example-consumer" },
      table: { type: "string", default: "applied" },
      "dead-letter": { type: "string", default: "" },
    },
  });
  if (!args.stream || !args.db) {
    console.error("nats_inbox_consumer: --stream and --db are required");
    process.exit(2);
  }
  const deadLetter = args["dead-letter"] || `${args.stream}.dead-letter`;
  let stopping = false;
  let messages = null;
  const stop = () => { stopping = true; if (messages) messages.stop(); };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);

  const inbox = new Inbox(args.db, args.consumer, args.schema);
  const table = new AppliedTable(args.table);
  await table.create(inbox);
  const nc = await connect({ servers: args.nats, maxReconnectAttempts: -1 });
  const jsm = await nc.jetstreamManager();
  try {
    await jsm.consumers.info(args.stream, args.consumer);
  } catch {
    await jsm.consumers.add(args.stream, {
      durable_name: args.consumer, ack_policy: AckPolicy.Explicit,
      deliver_policy: DeliverPolicy.All, ack_wait: nanos(2000), max_ack_pending: 32,
    });
  }
  const consumer = await nc.jetstream().consumers.get(args.stream, args.consumer);
  const counts = { processed: 0, duplicates: 0, retried: 0, deadLettered: 0 };
  console.error(`nats_inbox_consumer: consuming stream '${args.stream}' into ${args.table} as ` +
    `'${args.consumer}' (Node.js, SQL inbox)`);
  let delay = 0; // after a gap or a failure: doubling from 50 ms to 1 s while nothing is processed
  while (!stopping) {
    messages = await consumer.consume({ max_messages: 32 });
    if (stopping) messages.stop();
    for await (const message of messages) {
      let decision;
      let delivery = null;
      try {
        delivery = deliveryFromHeaders((name) => message.headers?.get(name), NATS_ID_HEADER);
        decision = await inbox.handle(delivery,
          table.effect(delivery, Buffer.from(message.data).toString("utf8")));
      } catch (error) {
        if (error instanceof NotFromAnOutbox || error instanceof MalformedHeader) {
          console.error(`dead-lettering stream seq ${message.seq}: ${error.message}`);
          decision = "invalid";
        } else {
          console.error(`retrying after: ${error.message}`);
          decision = "retry";
        }
      }
      if (decision === "invalid") {
        nc.publish(deadLetter, message.data, { headers: message.headers });
        message.term();
        counts.deadLettered += 1;
      } else if (decision === "gap" || decision === "retry") {
        delay = Math.min(1000, Math.max(50, delay * 2));
        message.nak(delay);
        counts.retried += 1;
      } else {
        message.ack();
        delay = 0;
        counts[decision === "process" ? "processed" : "duplicates"] += 1;
      }
      if (stopping) break;
    }
  }
  await nc.drain();
  await inbox.close();
  console.error(`nats_inbox_consumer: processed ${counts.processed}, duplicates ` +
    `${counts.duplicates}, retried ${counts.retried}, dead-lettered ${counts.deadLettered}`);
}

main().catch((error) => {
  console.error(`nats_inbox_consumer: ${error.stack || error}`);
  process.exit(1);
});
