#!/usr/bin/env bash
# The quickstart's demo with Kafka, small: 2,000 orders on PostgreSQL, relayed by the real outboxd
# with its kafka sink to outbox-kafka-mock (started by the demo, --kafka without brokers) and read
# back by the demo's own librdkafka consumer; and --kafka's usage errors.
#
#   quickstart_kafka_test.sh <quickstart_demo> <outboxd> <outbox-kafka-mock>
#
# PostgreSQL (scripts/services) must be running: OUTBOX_TEST_PG_URL, with scripts/services'
# default.
set -euo pipefail
demo=$1
outboxd=$2
mock=$3
pg_url=${OUTBOX_TEST_PG_URL:-postgresql://outbox:outbox@127.0.0.1:15432/outbox_test}
work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-quickstart-kafka-test.XXXXXX")
trap 'rm -rf "$work"' EXIT

# shellcheck source=tests/quickstart/checks.sh
. "$(dirname "$0")/checks.sh"

echo "== 2,000 orders on PostgreSQL, relayed by outboxd to outbox-kafka-mock, read back from there"
status=0
"$demo" --postgres "$pg_url" --kafka --kafka-mock "$mock" --orders 2000 --streams 50 \
  --dir "$work/run" --outboxd "$outboxd" --timeout 60 >"$work/out" 2>&1 || status=$?
cat "$work/out"
[ "$status" -eq 0 ] || fail "the demo on PostgreSQL + Kafka exited $status"
expect "$work/out" '^while outboxd relays the events to Kafka, where this program consumes them$'
expect "$work/out" '^  topic     outbox-quickstart-[0-9]+-orders on 127\.0\.0\.1:[0-9]+,'
expect "$work/out" 'outbox-kafka-mock, started here: .*a protocol mock, not Kafka$'
expect_servers_run "$work/out" 2000 2,000 50
expect "$work/out" \
  '^  cleanup: schema quickstart_[0-9]+ dropped, outbox-kafka-mock stopped: the topic lived in'
for line in 'type = "postgres"' 'type = "kafka"' 'listen = ""'; do
  grep -qF "$line" "$work/run/outboxd.toml" || fail "outboxd.toml lacks: $line"
done
grep -qE '^topic = "outbox-quickstart-[0-9]+-\{topic\}"$' "$work/run/outboxd.toml" ||
  fail "outboxd.toml lacks the demo's topic template"
[ -e "$work/run/kafka-mock.log" ] || fail "no kafka-mock.log"

echo "== --kafka without --postgres, and with --amqp, are usage errors"
expect_usage_error "$demo" "$work/usage" '^quickstart_demo: --kafka needs --postgres' "--kafka"
expect_usage_error "$demo" "$work/usage" '^quickstart_demo: --kafka and --amqp: choose one' \
  "--postgres $pg_url --amqp amqp://127.0.0.1:1/ --kafka"

echo "quickstart kafka test: ok"
