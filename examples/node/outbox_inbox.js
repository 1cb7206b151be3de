// The SQL inbox from Node.js, as the consumer examples in this folder share it (copy it into
// yours). One call of outbox.inbox_begin(...) in the consumer's own transaction decides what to do
// with a delivery and records it; the business effect is written in that same transaction, and
// the broker is acknowledged only after the commit. A crash between the commit and the
// acknowledgement redelivers the message, and the inbox then says 'duplicate'.
//
//   const inbox = new Inbox(dbUrl, "orders-projection");
//   const delivery = deliveryFromHeaders((name) => msg.headers?.get(name), NATS_ID_HEADER);
//   const decision = await inbox.handle(delivery, (db) => db.query("INSERT ...", [...]));
//   // 'process' (the effect committed), 'duplicate': acknowledge.  'gap': its predecessor has not
//   // been applied yet; deliver it again after a short delay.  'invalid': it can never be applied;
//   // dead-letter it.  A thrown database error: nothing was recorded; deliver it again later.
"use strict";

const pg = require("pg");

// The id's header per broker, as outbox's sinks write it (include/outbox/inbox/headers.h).
const KAFKA_ID_HEADER = "message_id";
const NATS_ID_HEADER = "message_id";
const REDIS_ID_FIELD = "id";
const WEBHOOK_ID_HEADER = "webhook-id";

class NotFromAnOutbox extends Error {}
class MalformedHeader extends Error {}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const INTEGER = /^-?[0-9]{1,19}$/;

function integer(lookup, name) {
  const value = lookup(name);
  if (value === undefined || value === null || value === "") return null;
  if (!INTEGER.test(value)) throw new MalformedHeader(`${name} is not a decimal integer: ${value}`);
  const number = BigInt(value);
  if (number < -(2n ** 63n) || number >= 2n ** 63n) {
    throw new MalformedHeader(`${name} is out of the 64-bit range: ${value}`);
  }
  return value; // as text: PostgreSQL reads it as a bigint, without JavaScript's 53-bit numbers
}

// The inbox's arguments from a message whose outbox fields travel as text headers (Kafka record
// headers, NATS headers, Redis stream entry fields, webhook request headers). lookup(name) returns
// the header's text or undefined/null/"" when absent.
function deliveryFromHeaders(lookup, idName) {
  const id = lookup(idName);
  if (!id || !UUID.test(id)) throw new NotFromAnOutbox(`${idName} ${JSON.stringify(id)} is not a UUID`);
  return {
    messageId: id,
    streamKey: lookup("outbox-stream-key") || null,
    streamSeq: integer(lookup, "outbox-stream-seq"),
    streamPrevSeq: integer(lookup, "outbox-stream-prev-seq"),
    target: lookup("outbox-target") || null,
  };
}

function quoteName(name) {
  return name.split(".").map((part) => `"${part.replace(/"/g, '""')}"`).join(".");
}

// outbox.inbox_begin on a connection of its own, reconnecting after a failure.
class Inbox {
  constructor(dbUrl, consumer, schema = "outbox") {
    this.dbUrl = dbUrl;
    this.consumer = consumer;
    this.db = null;
    this.begin = `SELECT ${quoteName(schema)}.inbox_begin($1, $2::uuid, $3, $4::bigint, ` +
      "$5::bigint, $6) AS decision";
  }

  async connection() {
    if (this.db === null) {
      const db = new pg.Client({ connectionString: this.dbUrl });
      db.on("error", () => { if (this.db === db) this.db = null; }); // a lost connection
      await db.connect();
      await db.query("SET client_min_messages = warning");
      this.db = db;
    }
    return this.db;
  }

  // Decides and records in one transaction; runs effect(db) in it when the answer is 'process'.
  // Returns 'process', 'duplicate', 'gap' or 'invalid'.
  async handle(delivery, effect) {
    const db = await this.connection();
    try {
      await db.query("BEGIN");
      const { rows } = await db.query(this.begin, [this.consumer, delivery.messageId,
        delivery.streamKey, delivery.streamSeq, delivery.streamPrevSeq, delivery.target]);
      const decision = rows[0].decision;
      if (decision === "process") await effect(db);
      await db.query("COMMIT");
      return decision;
    } catch (error) {
      this.db = null; // a fresh connection next time; this one may be mid-transaction or broken
      db.end().catch(() => {});
      throw error;
    }
  }

  async close() {
    if (this.db !== null) await this.db.end();
  }
}

// The examples' business effect: a row per applied message, in the order of application.
class AppliedTable {
  constructor(name) {
    this.name = quoteName(name);
  }

  async create(inbox) {
    const db = await inbox.connection();
    await db.query(`CREATE TABLE IF NOT EXISTS ${this.name} (message_id uuid NOT NULL, ` +
      "target text, stream_key text, stream_seq bigint, payload text, " +
      "applied_at timestamptz NOT NULL DEFAULT now(), n bigserial)");
  }

  effect(delivery, payload) {
    return (db) => db.query(`INSERT INTO ${this.name} (message_id, target, stream_key, ` +
      "stream_seq, payload) VALUES ($1, $2, $3, $4, $5)",
    [delivery.messageId, delivery.target, delivery.streamKey, delivery.streamSeq, payload]);
  }
}

module.exports = {
  KAFKA_ID_HEADER, NATS_ID_HEADER, REDIS_ID_FIELD, WEBHOOK_ID_HEADER,
  NotFromAnOutbox, MalformedHeader, deliveryFromHeaders, quoteName, Inbox, AppliedTable,
};
