#!/usr/bin/env python3
"""Applies outbox messages from a Kafka topic to a table exactly once, in Python.

    kafka_inbox_consumer.py --brokers 127.0.0.1:9092 --topic orders
        --db postgresql://app@127.0.0.1/app [--schema outbox] [--consumer orders-projection]
        [--table applied] [--dead-letter TOPIC]

Reads every partition of the topic (assigned, not subscribed: no group rebalances to wait for
after a crash) from the offsets committed under the group id --consumer. Each record goes through
the SQL inbox (outbox_inbox.py): the row in the table and the inbox mark are one transaction, and
the offset is committed to Kafka only after that commit, so a crash in between reads the record
again and the inbox says duplicate. On a gap or a database failure the partition is read again
from that record after a delay; a record that is invalid or not from an outbox is copied to the
dead-letter topic (default: <topic>.dead-letter). Both of outbox's Kafka header styles carry the
id in the message_id header. Runs until SIGTERM/SIGINT, then prints what it did. Needs Debian's
python3-psycopg and python3-confluent-kafka.
"""

import argparse
import sys
import time

import psycopg
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from outbox_inbox import (KAFKA_ID_HEADER, AppliedTable, Backoff, Inbox, NotFromAnOutbox,
                          Stopping, delivery_from_headers)


def header_lookup(record):
    headers = {}
    for name, value in record.headers() or []:
        headers[name] = value  # the last of a name wins, as in rd_kafka_header_get_last
    return headers.get


def main():
    stopping = Stopping()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--schema", default="outbox")
    parser.add_argument("--consumer", default="example-consumer")
    parser.add_argument("--table", default="applied")
    parser.add_argument("--dead-letter", default="")
    args = parser.parse_args()
    dead_letter = args.dead_letter or args.topic + ".dead-letter"

    inbox = Inbox(args.db, args.consumer, args.schema)
    table = AppliedTable(inbox, args.table)
    consumer = Consumer({"bootstrap.servers": args.brokers, "group.id": args.consumer,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    producer = Producer({"bootstrap.servers": args.brokers, "enable.idempotence": True})
    partitions = consumer.list_topics(args.topic, timeout=30).topics[args.topic].partitions
    consumer.assign([TopicPartition(args.topic, p) for p in sorted(partitions)])
    counts = {"processed": 0, "duplicates": 0, "retried": 0, "dead_lettered": 0}
    print(f"kafka_inbox_consumer: consuming topic '{args.topic}' ({len(partitions)} partitions) "
          f"into {args.table} as '{args.consumer}' (Python, SQL inbox)", file=sys.stderr,
          flush=True)
    backoff = Backoff()
    while not stopping:
        records = consumer.consume(num_messages=500, timeout=0.2)
        done = {}     # partition -> the offset to commit (the next record's)
        held = set()  # partitions to read again from a record of this batch
        for record in records:
            if stopping:
                break
            if record.error():
                print(f"consumer error: {record.error()}", file=sys.stderr, flush=True)
                continue
            if record.partition() in held:
                continue
            try:
                delivery = delivery_from_headers(header_lookup(record), KAFKA_ID_HEADER)
                payload = (record.value() or b"").decode("utf-8", "replace")
                decision = inbox.handle(delivery, table.effect(delivery, payload))
            except (NotFromAnOutbox, ValueError) as problem:
                print(f"dead-lettering {record.topic()}[{record.partition()}]@{record.offset()}: "
                      f"{problem}", file=sys.stderr, flush=True)
                decision = "invalid"
            except psycopg.Error as problem:
                print(f"retrying after: {problem}", file=sys.stderr, flush=True)
                decision = "retry"
            if decision == "invalid":
                producer.produce(dead_letter, record.value(), record.key(),
                                 headers=record.headers())
                producer.flush(30)
                counts["dead_lettered"] += 1
            elif decision in ("gap", "retry"):
                # Not applied: read the partition again from here after a delay.
                held.add(record.partition())
                consumer.seek(TopicPartition(args.topic, record.partition(), record.offset()))
                counts["retried"] += 1
                continue
            else:
                counts["processed" if decision == "process" else "duplicates"] += 1
            done[record.partition()] = record.offset() + 1
        if done:
            try:
                consumer.commit(offsets=[TopicPartition(args.topic, p, o) for p, o in done.items()],
                                asynchronous=False)
            except KafkaException as problem:  # applied anyway; read again, they are duplicates
                print(f"offset commit failed: {problem}", file=sys.stderr, flush=True)
        if held:
            time.sleep(backoff.failed())
        elif done:
            backoff.succeeded()
    consumer.close()
    print(f"kafka_inbox_consumer: processed {counts['processed']}, duplicates "
          f"{counts['duplicates']}, retried {counts['retried']}, dead-lettered "
          f"{counts['dead_lettered']}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
