#!/usr/bin/env bash
# The quickstart's demo, small, so that scripts/quickstart cannot rot: it must pass against the
# real outboxd, and it must fail (exit non-zero, saying so) when the relay publishes nothing.
#
#   quickstart_test.sh <quickstart_demo> <outboxd>
set -euo pipefail
demo=$1
outboxd=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-quickstart-test.XXXXXX")
trap 'rm -rf "$work"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }
expect() {  # expect <file> <extended regex>
  grep -Eq -- "$2" "$1" || { cat "$1"; fail "output lacks /$2/"; }
}

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
