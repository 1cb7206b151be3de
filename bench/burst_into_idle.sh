#!/bin/bash
# A burst into an idle relay (issue #48): outboxd starts on an empty outbox table (autovacuum off
# for it, so no ANALYZE re-plans anything meanwhile), delivers one message, then N messages arrive
# in one transaction; prints the time from that commit until the table is empty. It shows what a
# claim plan cached while the table was empty costs once a backlog is there.
#
#   bench/burst_into_idle.sh OUTBOXD OUTBOXCTL [N=200000]
#
# Server: scripts/services' PostgreSQL, database outbox_bench (or $OUTBOX_BENCH_PG_URL); a schema of its
# own, dropped at the end; file sink into a temporary directory. Bounded: gives up after 120 s.
set -euo pipefail
OUTBOXD=$1 OUTBOXCTL=$2 N=${3:-200000}
URL=${OUTBOX_BENCH_PG_URL:-postgresql://outbox:outbox@127.0.0.1:15432/outbox_bench}
S=burst_$$
D=$(mktemp -d)
"$OUTBOXCTL" --db "$URL" --schema "$S" migrate >/dev/null
psql -qX "$URL" -c "ALTER TABLE $S.messages SET (autovacuum_enabled = false)"
cat >"$D/outboxd.toml" <<EOT
[database]
url = "$URL"
schema = "$S"
[relay]
instance = "burst"
[log]
level = "warn"
[sinks.default]
type = "file"
path = "$D/out.jsonl"
EOT
"$OUTBOXD" -c "$D/outboxd.toml" >"$D/outboxd.log" 2>&1 &
PID=$!
cleanup() {
  kill "$PID" 2>/dev/null || true
  wait "$PID" 2>/dev/null || true
  psql -qX "$URL" -c "SET client_min_messages = warning; DROP SCHEMA IF EXISTS $S CASCADE" || true
  rm -rf "$D"
}
trap cleanup EXIT
sleep 3
psql -qX "$URL" -c "SELECT $S.enqueue('t', '{}')" >/dev/null
sleep 1
T0=$(date +%s.%N)
psql -qX "$URL" >/dev/null <<EOT
INSERT INTO $S.messages (id, topic, stream_key, stream_seq, partition, target, payload, content_type)
SELECT $S.uuid_v7(), 'q', 's' || (g % 1000), g / 1000 + 1, (g % 1000) % 64, 'default',
       convert_to(repeat('x', 256), 'UTF8'), 'application/json'
FROM generate_series(0, $N - 1) g;
SELECT $S.wake_relay();
EOT
T1=$(date +%s.%N)
left=$N
for _ in $(seq 1 600); do
  left=$(psql -qtAX "$URL" -c "SELECT count(*) FROM $S.messages")
  [[ $left == 0 ]] && break
  sleep 0.2
done
T2=$(date +%s.%N)
echo "$OUTBOXD: $N messages: insert $(echo "$T1 - $T0" | bc) s, table empty $(echo "$T2 - $T1" | bc) s after the insert's commit (left: $left, lines written: $(wc -l <"$D/out.jsonl"))"
