#!/usr/bin/env python3
"""Applies outbox messages from a RabbitMQ queue to a table exactly once, in Python.

The Python twin of examples/rabbitmq_inbox_consumer.cpp, with the same command line and
behaviour, on the SQL inbox: one call of outbox.inbox_begin(...) in the consumer's own
transaction decides (process, duplicate, gap, invalid) and records; the table row is written in
that same transaction, and the delivery is acked only after the commit. A crash between the
commit and the ack redelivers the message, and the inbox then says duplicate.

    rabbitmq_inbox_consumer.py --amqp amqp://guest:guest@127.0.0.1:5672/ --queue orders
        --db postgresql://app@127.0.0.1/app [--schema outbox] [--consumer orders-projection]
        [--table applied_orders] [--dead-letter orders.dead-letter]

The schema must be migrated (outboxctl migrate). Each delivery is acked after the commit when
the inbox says process or duplicate; requeued after a delay (doubling from 50 ms to 1 s while
nothing is processed) on a gap or a database failure; rejected without requeue (dead-lettered)
when it is invalid or not from an outbox. Runs until SIGTERM/SIGINT, then prints what it did.
Needs Debian's python3-psycopg and python3-pika.
"""

import argparse
import signal
import sys
import time
import uuid

import pika
import pika.exceptions
import psycopg
from psycopg import sql

stopping = False


def stop(_signum, _frame):
    global stopping
    stopping = True


class NotFromAnOutbox(Exception):
    pass


def header_text(headers, name):
    value = headers.get(name)
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    if not isinstance(value, str):
        raise ValueError(f"header {name} is not a string")
    return value


def header_integer(headers, name):
    value = headers.get(name)
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str) and value.lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not -2**63 <= value < 2**63:
        raise ValueError(f"header {name} is not an integer")
    return value


def delivery_of(properties):
    """The inbox's arguments from a delivery as outbox's RabbitMQ sink writes it."""
    try:
        message_id = uuid.UUID(properties.message_id or "")
    except ValueError:
        raise NotFromAnOutbox(f"message_id {properties.message_id!r} is not a UUID") from None
    headers = properties.headers or {}
    return {
        "message_id": message_id,
        "stream_key": header_text(headers, "outbox-stream-key"),
        "stream_seq": header_integer(headers, "outbox-stream-seq"),
        "stream_prev_seq": header_integer(headers, "outbox-stream-prev-seq"),
        "target": header_text(headers, "outbox-target"),
    }


def connect_and_consume(url, queue, dead_letter):
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.exchange_declare(dead_letter, exchange_type="fanout", durable=True)
    channel.queue_declare(dead_letter, durable=True)
    channel.queue_bind(dead_letter, dead_letter)
    channel.queue_declare(queue, durable=True, arguments={"x-dead-letter-exchange": dead_letter})
    channel.basic_qos(prefetch_count=100)
    return connection, channel


def main():
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672/")
    parser.add_argument("--queue", required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--schema", default="outbox")
    parser.add_argument("--consumer", default="example-consumer")
    parser.add_argument("--table", default="applied")
    parser.add_argument("--dead-letter", default="")
    args = parser.parse_args()
    dead_letter = args.dead_letter or args.queue + ".dead-letter"

    table = sql.Identifier(*args.table.split("."))
    begin = sql.SQL(
        "SELECT {}.inbox_begin(%(consumer)s, %(message_id)s, %(stream_key)s, "
        "%(stream_seq)s::bigint, %(stream_prev_seq)s::bigint, %(target)s)"
    ).format(sql.Identifier(args.schema))
    insert = sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s)").format(table)
    db = psycopg.connect(args.db, autocommit=True)
    db.execute("SET client_min_messages = warning")
    db.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (id uuid, stream_key text, "
                       "stream_seq bigint, payload text)").format(table))
    counts = {"processed": 0, "duplicates": 0, "requeued": 0, "dead_lettered": 0}
    print(f"rabbitmq_inbox_consumer: consuming queue '{args.queue}' into {args.table} as "
          f"'{args.consumer}' (Python, SQL inbox)", file=sys.stderr, flush=True)
    delay = 0.0
    connection = channel = None
    while not stopping:
        try:
            if channel is None:
                connection, channel = connect_and_consume(args.amqp, args.queue, dead_letter)
            for method, properties, body in channel.consume(args.queue, inactivity_timeout=0.2):
                if stopping:
                    break
                if method is None:
                    continue
                outcome = "dead-letter"
                try:
                    delivery = delivery_of(properties)
                except (NotFromAnOutbox, ValueError) as problem:
                    print(f"dead-lettering message {properties.message_id}: {problem}",
                          file=sys.stderr, flush=True)
                    delivery = None
                if delivery is not None:
                    try:
                        if db.broken:
                            db = psycopg.connect(args.db, autocommit=True)
                        with db.transaction():
                            decision = db.execute(
                                begin, {"consumer": args.consumer, **delivery}).fetchone()[0]
                            if decision == "process":
                                db.execute(insert, (delivery["message_id"],
                                                    delivery["stream_key"],
                                                    delivery["stream_seq"],
                                                    body.decode("utf-8", "replace")))
                        outcome = {"process": "ack", "duplicate": "ack",
                                   "gap": "requeue"}.get(decision, "dead-letter")
                        counts[{"process": "processed", "duplicate": "duplicates",
                                "gap": "requeued"}.get(decision, "dead_lettered")] += 1
                        if outcome == "dead-letter":
                            print(f"dead-lettering message {delivery['message_id']}: {decision}",
                                  file=sys.stderr, flush=True)
                    except psycopg.Error as failure:
                        print(f"will retry {delivery['message_id']}: {failure}",
                              file=sys.stderr, flush=True)
                        outcome = "requeue"
                else:
                    counts["dead_lettered"] += 1
                if outcome == "ack":
                    delay = 0.0
                    channel.basic_ack(method.delivery_tag)
                elif outcome == "requeue":
                    # Not yet: wait a little (longer each time nothing else moves), hand it back.
                    delay = min(max(delay * 2, 0.05), 1.0)
                    until = time.monotonic() + delay
                    while not stopping and time.monotonic() < until:
                        time.sleep(0.02)
                    channel.basic_reject(method.delivery_tag, requeue=True)
                else:
                    channel.basic_reject(method.delivery_tag, requeue=False)
        except pika.exceptions.AMQPError:
            # The broker went away: unacked deliveries come back after we reconnect.
            connection = channel = None
            time.sleep(0.2)
    if connection is not None and connection.is_open:
        try:
            connection.close()
        except pika.exceptions.AMQPError:
            pass
    print(f"processed {counts['processed']}, duplicates {counts['duplicates']}, "
          f"requeued out of order {counts['requeued']}, "
          f"dead-lettered {counts['dead_lettered']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
