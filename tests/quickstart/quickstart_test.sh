#!/usr/bin/env bash
# The quickstart's demo, small, so that scripts/quickstart cannot rot: it must pass against the
# real outboxd, on SQLite and (--postgres --amqp) on PostgreSQL + RabbitMQ, and it must fail (exit
# non-zero, saying so) when the relay publishes nothing.
#
#   quickstart_test.sh <quickstart_demo> <outboxd>
#
# The servers (scripts/services) must be running: OUTBOX_TEST_PG_URL and OUTBOX_TEST_AMQP_URL,
# with scripts/services' defaults.
set -euo pipefail
demo=$1
outboxd=$2
pg_url=${OUTBOX_TEST_PG_URL:-postgresql://outbox:outbox@127.0.0.1:15432/outbox_test}
amqp_url=${OUTBOX_TEST_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/}
work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-quickstart-test.XXXXXX")
trap 'rm -rf "$work"' EXIT

# shellcheck source=tests/quickstart/checks.sh
. "$(dirname "$0")/checks.sh"

echo "== 500 orders against the real outboxd: everything checks out"
status=0
"$demo" --orders 500 --streams 20 --dir "$work/run" --outboxd "$outboxd" --timeout 60 \
  >"$work/out" 2>&1 || status=$?
cat "$work/out"
[ "$status" -eq 0 ] || fail "the demo exited $status"
expect "$work/out" '^  orders written +500 '
expect "$work/out" '^  lost \(committed, not published\) +0  ok$'
expect "$work/out" '^  phantom \(published, not committed\) +0  ok$'
expect "$work/out" '^  rolled back, never published +([0-9,]+)  of \1  ok$'
expect "$work/out" '^  streams out of order +0  of 20 .* ok$'
expect "$work/out" '^  outboxd stopped by SIGTERM +exit 0  ok$'
expect "$work/out" '^PASS: '
committed=$(sed -nE 's/^  events committed +([0-9,]+)$/\1/p' "$work/out" | tr -d ,)
lines=$(wc -l <"$work/run/events.jsonl")
[ "$committed" -gt 500 ] || fail "expected more than 500 committed events, got $committed"
[ "$lines" -ge "$committed" ] || fail "events.jsonl has $lines lines for $committed events"
grep -q 'type = "sqlite"' "$work/run/outboxd.toml" || fail "the relay did not use the SQLite store"

echo "== the dashboard on the demo's database, as the demo's last lines say"
expect "$work/out" "^  $outboxd --config $work/run/dashboard.toml\$"
expect "$work/out" '^then open http://127.0.0.1:9780/ui \(its token is in that file\)$'
[ "$(stat -c %a "$work/run/dashboard.toml")" = 600 ] || fail "dashboard.toml is not mode 0600"
token=$(sed -n 's/^token = "\([0-9a-f]\{32\}\)"$/\1/p' "$work/run/dashboard.toml")
[ -n "$token" ] || fail "dashboard.toml has no random token"
# On a free port rather than 9780, which other tests or a developer's outboxd may hold.
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
sed "s/127.0.0.1:9780/127.0.0.1:$port/" "$work/run/dashboard.toml" >"$work/dashboard.toml"
"$outboxd" --config "$work/dashboard.toml" >"$work/dashboard.log" 2>&1 &
relay=$!
trap 'kill "$relay" 2>/dev/null; rm -rf "$work"' EXIT
get() { curl -s -o "$work/body" -w '%{http_code}' --max-time 5 "$@"; }
for _ in $(seq 100); do
  [ "$(get "http://127.0.0.1:$port/healthz")" = 200 ] && break
  sleep 0.1
done
[ "$(get "http://127.0.0.1:$port/ui")" = 200 ] || fail "GET /ui: $(cat "$work/body")"
grep -q '<title>' "$work/body" || fail "/ui is not the page"
[ "$(get -H "Authorization: Bearer $token" "http://127.0.0.1:$port/api/outbox/relay")" = 200 ] ||
  fail "GET /api/outbox/relay with the token: $(cat "$work/body")"
grep -q '"database":"sqlite"' "$work/body" || fail "not the demo's SQLite outbox: $(cat "$work/body")"
[ "$(get "http://127.0.0.1:$port/api/outbox")" = 401 ] || fail "/api/outbox answered without the token"
kill -TERM "$relay"
wait "$relay" || fail "outboxd on dashboard.toml exited $?: $(cat "$work/dashboard.log")"
trap 'rm -rf "$work"' EXIT

echo "== 500 orders on PostgreSQL, relayed by outboxd to RabbitMQ and consumed from there"
status=0
"$demo" --postgres "$pg_url" --amqp "$amqp_url" --orders 500 --streams 20 --dir "$work/servers" \
  --outboxd "$outboxd" --timeout 60 >"$work/servers.out" 2>&1 || status=$?
cat "$work/servers.out"
[ "$status" -eq 0 ] || fail "the demo on PostgreSQL + RabbitMQ exited $status"
expect "$work/servers.out" '^outbox quickstart: 500 orders, each with its events in one PostgreSQL'
expect_servers_run "$work/servers.out" 500 500 20
expect "$work/servers.out" \
  '^  cleanup: schema quickstart_[0-9]+ dropped, queue outbox-quickstart-[0-9]+-orders deleted$'
for line in 'type = "postgres"' 'type = "rabbitmq"' 'listen = ""'; do
  grep -qF "$line" "$work/servers/outboxd.toml" || fail "outboxd.toml lacks: $line"
done
[ ! -e "$work/servers/events.jsonl" ] || fail "the RabbitMQ run wrote events.jsonl"
[ ! -e "$work/servers/app.db" ] || fail "the RabbitMQ run wrote app.db"

echo "== --postgres without --amqp (and the reverse) is a usage error"
for half in "--postgres $pg_url" "--amqp $amqp_url"; do
  expect_usage_error "$demo" "$work/half" \
    '^quickstart_demo: --(postgres|amqp) needs --(amqp|postgres): give both' "$half"
done

echo "== a relay that publishes nothing: the demo must notice"
status=0
"$demo" --orders 50 --dir "$work/broken" --outboxd "$(type -P true)" --timeout 2 \
  >"$work/broken.out" 2>&1 || status=$?
cat "$work/broken.out"
[ "$status" -eq 1 ] || fail "expected exit 1 when nothing is published, got $status"
expect "$work/broken.out" '^  lost \(committed, not published\) +[1-9][0-9,]*  FAILED$'
expect "$work/broken.out" '^FAILED'

echo "== a bad option is a usage error"
status=0
"$demo" --orders 0 >"$work/usage.out" 2>&1 || status=$?
[ "$status" -eq 2 ] || { cat "$work/usage.out"; fail "expected exit 2 for --orders 0, got $status"; }

echo "quickstart test: ok"
