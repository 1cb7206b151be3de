#!/usr/bin/env python3
"""Places orders and writes their events to the outbox in the same transactions, in Python.

    place_orders.py --db postgresql://app@127.0.0.1/app [--schema outbox] [--topic orders]
        [--orders 1000] [--customers 50] [--rollback-percent 10] [--targets a,b] [--seed 1]
        [--table orders]

Each order is one transaction: a row in the orders table and an OrderPlaced event enqueued with
outbox.enqueue(...) in the customer's stream, so that the customer's events are published in
order. Some transactions roll back on purpose (--rollback-percent), and then neither the order
nor its event exists. The order row keeps its event's message ids (one per target with
--targets), so what was committed can be compared with what consumers applied. Prints how many
were committed and rolled back. The schema must be migrated (outboxctl migrate). Needs Debian's
python3-psycopg.
"""

import argparse
import json
import random
import sys
import uuid

import psycopg
from psycopg import sql


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--schema", default="outbox")
    parser.add_argument("--topic", default="orders")
    parser.add_argument("--orders", type=int, default=1000)
    parser.add_argument("--customers", type=int, default=50)
    parser.add_argument("--rollback-percent", type=int, default=10)
    parser.add_argument("--targets", default="", help="comma-separated; default: the topic's")
    parser.add_argument("--table", default="orders")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.orders < 0 or args.customers < 1 or not 0 <= args.rollback_percent <= 100:
        parser.error("--orders >= 0, --customers >= 1, 0 <= --rollback-percent <= 100")
    targets = [t for t in args.targets.split(",") if t]

    outbox = sql.Identifier(args.schema)
    orders = sql.Identifier(*args.table.split("."))
    if targets:  # one message per target, their ids in one array
        enqueue = sql.SQL("SELECT {}.enqueue(topic => %s, payload => %s::json, stream_key => %s, "
                          "type => 'OrderPlaced', targets => %s::text[])").format(outbox)
    else:
        enqueue = sql.SQL("SELECT ARRAY[{}.enqueue(topic => %s, payload => %s::json, "
                          "stream_key => %s, type => 'OrderPlaced')]").format(outbox)
    insert = sql.SQL("INSERT INTO {} (id, customer, total, event_ids) VALUES (%s, %s, %s, %s)"
                     ).format(orders)
    random.seed(args.seed)
    committed = rolled_back = 0
    with psycopg.connect(args.db) as db:
        db.execute("SET client_min_messages = warning")
        db.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (id uuid PRIMARY KEY, customer text, "
                           "total numeric, event_ids uuid[] NOT NULL)").format(orders))
        db.commit()
        for _ in range(args.orders):
            order_id = uuid.uuid4()
            customer = f"customer-{random.randrange(args.customers)}"
            total = round(random.uniform(5, 500), 2)
            event = json.dumps({"order": str(order_id), "customer": customer, "total": total})
            params = (args.topic, event, customer) + ((targets,) if targets else ())
            # psycopg opens the transaction at the first statement; commit or rollback ends it.
            event_ids = db.execute(enqueue, params).fetchone()[0]
            db.execute(insert, (order_id, customer, total, event_ids))
            if random.randrange(100) < args.rollback_percent:
                db.rollback()
                rolled_back += 1
            else:
                db.commit()
                committed += 1
    print(f"place_orders: committed {committed}, rolled back {rolled_back}", file=sys.stderr,
          flush=True)


if __name__ == "__main__":
    main()
