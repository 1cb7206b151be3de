"""The SQL inbox from Python, as the consumer examples in this folder share it (copy it into yours).

One call of outbox.inbox_begin(...) in the consumer's own transaction decides what to do with a
delivery and records it; the business effect is written in that same transaction, and the broker
is acknowledged only after the commit. A crash between the commit and the acknowledgement
redelivers the message, and the inbox then says 'duplicate'.

    inbox = Inbox(db_url, consumer="orders-projection")
    delivery = delivery_from_headers(headers.get, "message_id")   # Kafka, NATS: message_id
    decision = inbox.handle(delivery, lambda db: db.execute("INSERT ...", (...)))
    # 'process' (the effect committed), 'duplicate': acknowledge.  'gap': its predecessor has not
    # been applied yet; deliver it again after a short delay.  'invalid': it can never be applied;
    # dead-letter it.  A psycopg.Error: nothing was recorded; deliver it again later.

Needs Debian's python3-psycopg (psycopg 3).
"""

import signal
import uuid

import psycopg
from psycopg import sql

# The id's header per broker, as outbox's sinks write it (include/outbox/inbox/headers.h).
KAFKA_ID_HEADER = "message_id"
NATS_ID_HEADER = "message_id"
REDIS_ID_FIELD = "id"
WEBHOOK_ID_HEADER = "webhook-id"


class NotFromAnOutbox(Exception):
    """The message has no outbox id: dead-letter it."""


def _text(value, name):
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray)):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{name} is not UTF-8") from None
    if not isinstance(value, str):
        raise ValueError(f"{name} is not text")
    return value


def _integer(value, name):
    value = _text(value, name)
    if value is None:
        return None
    digits = value[1:] if value.startswith("-") else value
    if not digits.isascii() or not digits.isdigit() or not -2**63 <= int(value) < 2**63:
        raise ValueError(f"{name} is not a 64-bit decimal integer: {value!r}")
    return int(value)


def delivery_from_headers(lookup, id_name):
    """The inbox's arguments from a message whose outbox fields travel as text headers (Kafka
    record headers, NATS headers, Redis stream entry fields, webhook request headers).

    lookup(name) returns the header's value (str or bytes) or None. Raises NotFromAnOutbox when
    the id is missing or not a UUID, ValueError when an outbox header is unreadable."""
    raw_id = _text(lookup(id_name), id_name)
    try:
        message_id = uuid.UUID(raw_id or "")
    except ValueError:
        raise NotFromAnOutbox(f"{id_name} {raw_id!r} is not a UUID") from None
    return {
        "message_id": message_id,
        "stream_key": _text(lookup("outbox-stream-key"), "outbox-stream-key"),
        "stream_seq": _integer(lookup("outbox-stream-seq"), "outbox-stream-seq"),
        "stream_prev_seq": _integer(lookup("outbox-stream-prev-seq"), "outbox-stream-prev-seq"),
        "target": _text(lookup("outbox-target"), "outbox-target"),
    }


class Inbox:
    """outbox.inbox_begin on a connection of its own, reconnecting after a failure."""

    def __init__(self, db_url, consumer, schema="outbox"):
        self.db_url = db_url
        self.consumer = consumer
        self.db = None
        self.begin = sql.SQL(
            "SELECT {}.inbox_begin(%(consumer)s, %(message_id)s, %(stream_key)s, "
            "%(stream_seq)s::bigint, %(stream_prev_seq)s::bigint, %(target)s)"
        ).format(sql.Identifier(schema))

    def connection(self):
        if self.db is None or self.db.broken:
            self.db = psycopg.connect(self.db_url, autocommit=True)
            self.db.execute("SET client_min_messages = warning")
        return self.db

    def handle(self, delivery, effect):
        """Decides and records in one transaction; runs effect(db) in it when the answer is
        'process'. Returns 'process', 'duplicate', 'gap' or 'invalid'."""
        db = self.connection()
        with db.transaction():
            decision = db.execute(self.begin, {"consumer": self.consumer, **delivery}).fetchone()[0]
            if decision == "process":
                effect(db)
        return decision


class AppliedTable:
    """The examples' business effect: a row per applied message, in the order of application."""

    def __init__(self, inbox, name):
        self.name = sql.Identifier(*name.split("."))
        inbox.connection().execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (message_id uuid NOT NULL, target text, "
            "stream_key text, stream_seq bigint, payload text, "
            "applied_at timestamptz NOT NULL DEFAULT now(), n bigserial)").format(self.name))
        self.insert = sql.SQL("INSERT INTO {} (message_id, target, stream_key, stream_seq, payload) "
                              "VALUES (%s, %s, %s, %s, %s)").format(self.name)

    def effect(self, delivery, payload):
        def apply(db):
            db.execute(self.insert, (delivery["message_id"], delivery["target"],
                                     delivery["stream_key"], delivery["stream_seq"], payload))
        return apply


class Stopping:
    """True once SIGTERM or SIGINT arrived: finish the message in hand, then stop."""

    def __init__(self):
        self.requested = False
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)

    def _stop(self, _signum, _frame):
        self.requested = True

    def __bool__(self):
        return self.requested


class Backoff:
    """Delays after a gap or a failure: doubling from 50 ms to 1 s while nothing is processed."""

    def __init__(self):
        self.delay = 0.0

    def failed(self):
        self.delay = min(1.0, max(0.05, self.delay * 2))
        return self.delay

    def succeeded(self):
        self.delay = 0.0
