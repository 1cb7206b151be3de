// Reads CloudEvents as a broker delivered them, with the official CloudEvents SDK for JavaScript
// (npm `cloudevents`), for the sink tests of envelope = "cloudevents" (issue #43;
// tests/support/cloudevents_reader.h runs it). Standard input: a JSON array of messages, each
//   {"binding": <one of the readers below>, "headers": {name: value, ...},
//    "body": "<text>" | "body_base64": "<bytes>", "key": "<kafka key>" (optional)}
// Standard output: a JSON array, one entry per message, {"ok": true, "event": <the event's
// attributes and data, as the SDK gives them>} or {"ok": false, "error": "<the SDK's words>"}.
//
// HTTP and Kafka go through the SDK's own bindings (HTTP.toEvent, Kafka.toEvent). The SDK has
// no binding for AMQP, NATS or Redis: their messages are rebuilt from the documented mapping
// (the binding specs; docs/cloudevents.md for Redis) into a CloudEvent, and validate()d.

"use strict";
const { CloudEvent, HTTP, Kafka } = require("cloudevents");

function bodyOf(message) {
  if (message.body_base64 !== undefined) return Buffer.from(message.body_base64, "base64");
  return message.body;
}

// A structured-mode JSON event (the JSON event format), as the SDK reads one.
function structured(text) {
  const event = new CloudEvent(JSON.parse(text.toString()), false);
  event.validate();
  return event;
}

// Binary mode of a binding without an SDK reader: `attributes` by name, `data` the body.
function rebuild(attributes, data) {
  const event = new CloudEvent({ ...attributes, data }, false);
  event.validate();
  return event;
}

// Attributes carried under `prefix` in `headers` (names compared as the binding says).
function prefixed(headers, prefix, { caseless = false, decode = false } = {}) {
  const attributes = {};
  for (const [name, value] of Object.entries(headers)) {
    const compared = caseless ? name.toLowerCase() : name;
    if (!compared.startsWith(prefix)) continue;
    attributes[compared.slice(prefix.length)] = decode ? decodeURIComponent(value) : value;
  }
  return attributes;
}

function headerNoCase(headers, wanted) {
  for (const [name, value] of Object.entries(headers)) {
    if (name.toLowerCase() === wanted) return value;
  }
  return undefined;
}

const readers = {
  // HTTP binding: the SDK's HTTP.toEvent (binary: ce-* headers; structured: the body).
  http(message) {
    const event = HTTP.toEvent({ headers: message.headers, body: bodyOf(message) });
    event.validate();
    return event;
  },
  // Kafka binding: the SDK's Kafka.toEvent (binary: ce_* headers; structured: the value).
  kafka(message) {
    const event = Kafka.toEvent({
      headers: message.headers,
      key: message.key,
      value: bodyOf(message),
    });
    event.validate();
    return event;
  },
  // AMQP binding (AMQP 1.0 application-properties; RabbitMQ's headers table by analogy):
  // cloudEvents_ (or cloudEvents:) attributes, datacontenttype in the content-type property
  // (handed over as the header "content-type").
  amqp(message) {
    const contentType = message.headers["content-type"];
    if (contentType && contentType.startsWith("application/cloudevents")) {
      return structured(bodyOf(message));
    }
    const attributes = {
      ...prefixed(message.headers, "cloudEvents:"),
      ...prefixed(message.headers, "cloudEvents_"),
    };
    if (contentType) attributes.datacontenttype = contentType;
    return rebuild(attributes, bodyOf(message));
  },
  // NATS binding: ce-* headers (case-insensitive names, percent-encoded values), datacontenttype
  // as ce-datacontenttype; structured when Content-Type is application/cloudevents....
  nats(message) {
    const contentType = headerNoCase(message.headers, "content-type");
    if (contentType && contentType.toLowerCase().startsWith("application/cloudevents")) {
      return structured(bodyOf(message));
    }
    const attributes = prefixed(message.headers, "ce-", { caseless: true, decode: true });
    return rebuild(attributes, bodyOf(message));
  },
  // Redis (no binding in the spec; docs/cloudevents.md): the entry's fields ce_<attribute>, the
  // data in the field `data`.
  redis(message) {
    const attributes = prefixed(message.headers, "ce_");
    return rebuild(attributes, bodyOf(message));
  },
  // A structured JSON event on its own (the file sink's lines).
  json(message) {
    return structured(bodyOf(message));
  },
};

function readAll(text) {
  return JSON.parse(text).map((message) => {
    try {
      const reader = readers[message.binding];
      if (!reader) throw new Error(`no reader for binding ${message.binding}`);
      const event = reader(message);
      const out = { ...event.toJSON() };
      if (Buffer.isBuffer(out.data) || out.data instanceof Uint8Array || out.data instanceof Uint32Array) {
        out.data_base64 = Buffer.from(out.data).toString("base64");
        delete out.data;
      }
      return { ok: true, event: out };
    } catch (error) {
      const details = error.errors ? ` ${JSON.stringify(error.errors)}` : "";
      return { ok: false, error: `${error.message}${details}` };
    }
  });
}

let input = "";
process.stdin.setEncoding("utf8");
process.stdin.on("data", (chunk) => (input += chunk));
process.stdin.on("end", () => process.stdout.write(JSON.stringify(readAll(input)) + "\n"));
