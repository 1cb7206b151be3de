#!/usr/bin/env python3
"""Applies outbox messages from a Redis stream to a table exactly once, in Python.

    redis_inbox_consumer.py --redis redis://127.0.0.1:6379 --stream orders
        --db postgresql://app@127.0.0.1/app [--schema outbox] [--consumer orders-projection]
        [--table applied] [--dead-letter STREAM]

Reads the stream in a consumer group named after --consumer (created at the stream's start if
missing), as the group's consumer of the same name, so that a restarted process first reads the
entries it had read but not acknowledged. Each entry goes through the SQL inbox
(outbox_inbox.py): the row in the table and the inbox mark are one transaction, and XACK comes
after the commit. On a gap or a database failure the entry stays pending and is read again after
a delay; an entry that is invalid or not from an outbox is copied to the dead-letter stream
(default: <stream>.dead-letter) and acknowledged. Runs until SIGTERM/SIGINT, then prints what it
did. Needs Debian's python3-psycopg and python3-redis.
"""

import argparse
import sys
import time

import psycopg
import redis

from outbox_inbox import (REDIS_ID_FIELD, AppliedTable, Backoff, Inbox, NotFromAnOutbox,
                          Stopping, delivery_from_headers)


def main():
    stopping = Stopping()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default="redis://127.0.0.1:6379")
    parser.add_argument("--stream", required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--schema", default="outbox")
    parser.add_argument("--consumer", default="example-consumer")
    parser.add_argument("--table", default="applied")
    parser.add_argument("--dead-letter", default="")
    args = parser.parse_args()
    dead_letter = args.dead_letter or args.stream + ".dead-letter"

    inbox = Inbox(args.db, args.consumer, args.schema)
    table = AppliedTable(inbox, args.table)
    client = redis.Redis.from_url(args.redis)
    try:
        client.xgroup_create(args.stream, args.consumer, id="0", mkstream=True)
    except redis.ResponseError as error:
        if "BUSYGROUP" not in str(error):
            raise
    counts = {"processed": 0, "duplicates": 0, "retried": 0, "dead_lettered": 0}
    print(f"redis_inbox_consumer: consuming stream '{args.stream}' into {args.table} as "
          f"'{args.consumer}' (Python, SQL inbox)", file=sys.stderr, flush=True)
    backoff = Backoff()
    pending_first = True  # after a start or a retry: this consumer's unacknowledged entries first
    while not stopping:
        try:
            start = "0" if pending_first else ">"
            answer = client.xreadgroup(args.consumer, args.consumer, {args.stream: start},
                                       count=100, block=None if pending_first else 200)
            entries = answer[0][1] if answer else []
            if pending_first and not entries:
                pending_first = False
                continue
            for entry_id, fields in entries:
                if stopping:
                    break
                try:
                    delivery = delivery_from_headers(
                        lambda name: fields.get(name.encode()), REDIS_ID_FIELD)
                    payload = fields.get(b"payload", b"").decode("utf-8", "replace")
                    decision = inbox.handle(delivery, table.effect(delivery, payload))
                except (NotFromAnOutbox, ValueError) as problem:
                    print(f"dead-lettering entry {entry_id.decode()}: {problem}",
                          file=sys.stderr, flush=True)
                    decision = "invalid"
                if decision == "invalid":
                    client.xadd(dead_letter, fields)
                    counts["dead_lettered"] += 1
                elif decision == "gap":
                    # Its predecessor is not applied yet: leave it (and what follows) pending.
                    counts["retried"] += 1
                    pending_first = True
                    time.sleep(backoff.failed())
                    break
                else:
                    counts["processed" if decision == "process" else "duplicates"] += 1
                    backoff.succeeded()
                client.xack(args.stream, args.consumer, entry_id)
        except (psycopg.Error, redis.ConnectionError, redis.TimeoutError) as problem:
            print(f"retrying after: {problem}", file=sys.stderr, flush=True)
            counts["retried"] += 1
            pending_first = True
            time.sleep(backoff.failed())
    print(f"redis_inbox_consumer: processed {counts['processed']}, duplicates "
          f"{counts['duplicates']}, retried {counts['retried']}, dead-lettered "
          f"{counts['dead_lettered']}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
