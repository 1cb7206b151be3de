#!/usr/bin/env python3
"""The SQLite store's claim while a target is paused (issue #14), before and after the index
outbox_messages_waiting_streams, in one run.

Builds an in-memory database with the store's schema (read from src/store/sqlite/schema.cpp),
`paused` messages for a paused target ("other") and 10,000 for a healthy one ("default"), each over
500 streams, and times one claim of 500 for the healthy target: the claimable-ids statement of
src/store/sqlite/store.cpp (kClaimableIds, restated below: keep the two in step). "before" drops
the index first. Python's sqlite3 module links the same Debian libsqlite3 as the store.

    bench/sqlite_paused_claim.py [--paused 0,10000,100000,1000000]
"""
import argparse
import os
import re
import sqlite3
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMA_CPP = os.path.join(HERE, "..", "src", "store", "sqlite", "schema.cpp")

CLAIMABLE_IDS = (
    "SELECT m.position FROM outbox_messages m"
    " WHERE m.status IN ('pending', 'failed') AND m.available_at <= :now"
    "  AND m.target NOT IN (SELECT value FROM json_each(:paused))"
    "  AND (m.stream_key IS NULL OR NOT EXISTS ("
    "   SELECT 1 FROM outbox_messages e WHERE e.stream_key = m.stream_key"
    "    AND e.position < m.position AND e.status IN ('processing', 'failed')"
    "    AND ((e.status = 'processing' AND e.lease_owner <> :owner) OR"
    "         (e.status = 'failed' AND e.available_at > :now))))"
    "  AND (m.stream_key IS NULL OR :paused = '[]' OR NOT EXISTS ("
    "   SELECT 1 FROM outbox_messages e WHERE e.stream_key = m.stream_key"
    "    AND e.position < m.position AND e.status IN ('pending', 'failed')"
    "    AND e.target IN (SELECT value FROM json_each(:paused))))"
    " ORDER BY m.position LIMIT 500")


def build(paused, healthy=10000, streams=500):
    schema = re.search(r'kSchemaV1 = R"\((.*?)\)";', open(SCHEMA_CPP).read(), re.S).group(1)
    db = sqlite3.connect(":memory:")
    db.executescript(schema)
    now = int(time.time() * 1000)
    rows = [(f"p{i}", f"p-{i % streams}", i // streams + 1, "other") for i in range(paused)]
    rows += [(f"h{i}", f"h-{i % streams}", i // streams + 1, "default") for i in range(healthy)]
    db.executemany(
        "INSERT INTO outbox_messages (id, topic, stream_key, stream_seq, partition, target,"
        " payload, content_type, headers, status, available_at, created_at)"
        " VALUES (?, 't', ?, ?, 0, ?, x'00', 'application/json', '{}', 'pending', ?, ?)",
        [row + (now - 1000, now) for row in rows])
    db.commit()
    db.execute("ANALYZE")
    return db, now


def claim_ms(db, now, repeat=3):
    args = {"now": now, "paused": '["other"]', "owner": "bench"}
    best = None
    for _ in range(repeat):
        start = time.perf_counter()
        claimed = len(db.execute(CLAIMABLE_IDS, args).fetchall())
        elapsed = (time.perf_counter() - start) * 1000
        best = elapsed if best is None else min(best, elapsed)
    assert claimed == 500, claimed
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paused", default="0,10000,100000,1000000")
    options = parser.parse_args()
    print(f"SQLite {sqlite3.sqlite_version}, {os.cpu_count()} cores; 10,000 healthy messages "
          "behind the paused ones, 500 streams each; best of 3 claims of 500")
    print(f"{'paused':>10}  {'before (no index)':>18}  {'after':>10}")
    for paused in [int(n) for n in options.paused.split(",")]:
        db, now = build(paused)
        after = claim_ms(db, now)
        if paused > 100000:  # without the index: seconds behind 100k, far longer behind 1M
            print(f"{paused:>10,}  {'not run':>18}  {after:>7.1f} ms", flush=True)
            continue
        db.execute("DROP INDEX outbox_messages_waiting_streams")
        before = claim_ms(db, now, repeat=1 if paused >= 100000 else 3)
        print(f"{paused:>10,}  {before:>15.1f} ms  {after:>7.1f} ms", flush=True)


if __name__ == "__main__":
    main()
