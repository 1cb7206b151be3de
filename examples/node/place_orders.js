#!/usr/bin/env node
// Places orders and writes their events to the outbox in the same transactions, in Node.js.
//
//   node place_orders.js --db postgresql://app@127.0.0.1/app [--schema outbox] [--topic orders]
//       [--orders 1000] [--customers 50] [--rollback-percent 10] [--targets a,b] [--table orders]
//
// Each order is one transaction: a row in the orders table and an OrderPlaced event enqueued with
// outbox.enqueue(...) in the customer's stream, so that the customer's events are published in
// order. Some transactions roll back on purpose, and then neither the order nor its event exists.
// The order row keeps its event's message ids (one per target with --targets). Prints how many
// were committed and rolled back. The schema must be migrated (outboxctl migrate). Needs
// `npm install` in this folder (pg).
"use strict";

const { parseArgs } = require("node:util");
const { randomUUID } = require("node:crypto");
const pg = require("pg");
const { quoteName } = require("./outbox_inbox");

async function main() {
  const { values: args } = parseArgs({
    options: {
      db: { type: "string" },
      schema: { type: "string", default: "outbox" },
      topic: { type: "string", default: "orders" },
      orders: { type: "string", default: "1000" },
      customers: { type: "string", default: "50" },
      "rollback-percent": { type: "string", default: "10" },
      targets: { type: "string", default: "" },
      table: { type: "string", default: "orders" },
    },
  });
  const orders = Number(args.orders);
  const customers = Number(args.customers);
  const rollbackPercent = Number(args["rollback-percent"]);
  if (!args.db || !Number.isInteger(orders) || orders < 0 || !Number.isInteger(customers) ||
      customers < 1 || !(rollbackPercent >= 0 && rollbackPercent <= 100)) {
    console.error("place_orders: --db is required; --orders >= 0, --customers >= 1, " +
      "0 <= --rollback-percent <= 100");
    process.exit(2);
  }
  const targets = args.targets.split(",").filter((t) => t !== "");
  const outbox = quoteName(args.schema);
  const table = quoteName(args.table);
  const enqueue = targets.length > 0
    ? `SELECT ${outbox}.enqueue(topic => $1, payload => $2::json, stream_key => $3, ` +
      "type => 'OrderPlaced', targets => $4::text[]) AS ids"
    : `SELECT ARRAY[${outbox}.enqueue(topic => $1, payload => $2::json, stream_key => $3, ` +
      "type => 'OrderPlaced')] AS ids";

  const db = new pg.Client({ connectionString: args.db });
  await db.connect();
  await db.query("SET client_min_messages = warning");
  await db.query(`CREATE TABLE IF NOT EXISTS ${table} (id uuid PRIMARY KEY, customer text, ` +
    "total numeric, event_ids uuid[] NOT NULL)");
  let committed = 0;
  let rolledBack = 0;
  for (let i = 0; i < orders; i += 1) {
    const id = randomUUID();
    const customer = `customer-${Math.floor(Math.random() * customers)}`;
    const total = Math.round(Math.random() * 49500 + 500) / 100;
    const event = JSON.stringify({ order: id, customer, total });
    await db.query("BEGIN");
    const { rows } = await db.query(enqueue,
      [args.topic, event, customer, ...(targets.length > 0 ? [targets] : [])]);
    await db.query(`INSERT INTO ${table} (id, customer, total, event_ids) VALUES ($1, $2, $3, $4)`,
      [id, customer, total, rows[0].ids]);
    if (Math.random() * 100 < rollbackPercent) {
      await db.query("ROLLBACK");
      rolledBack += 1;
    } else {
      await db.query("COMMIT");
      committed += 1;
    }
  }
  await db.end();
  console.error(`place_orders: committed ${committed}, rolled back ${rolledBack}`);
}

main().catch((error) => {
  console.error(`place_orders: ${error.stack || error}`);
  process.exit(1);
});
