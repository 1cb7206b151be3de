# shellcheck shell=bash
# Sourced by the quickstart tests: checks of the demo's output.

fail() { echo "FAIL: $*" >&2; exit 1; }
expect() {  # expect <file> <extended regex>
  grep -Eq -- "$2" "$1" || { cat "$1"; fail "output lacks /$2/"; }
}

# expect_servers_run <file> <orders> <orders as printed> <streams>: the summary of a passing run
# on PostgreSQL and a broker: every committed event published (more events than orders), none
# lost, phantom or out of order, no rolled-back one published, outboxd stopped cleanly.
expect_servers_run() {
  local out=$1 orders=$2 printed=$3 streams=$4 committed published
  expect "$out" "^  orders written +$printed "
  expect "$out" '^  events published \(distinct ids\) +([0-9,]+)$'
  expect "$out" '^  lost \(committed, not published\) +0  ok$'
  expect "$out" '^  phantom \(published, not committed\) +0  ok$'
  expect "$out" '^  rolled back, never published +([0-9,]+)  of \1  ok$'
  expect "$out" "^  streams out of order +0  of $streams .* ok\$"
  expect "$out" '^  payloads intact +[0-9,]+  ok$'
  expect "$out" '^  outboxd stopped by SIGTERM +exit 0  ok$'
  expect "$out" '^PASS: '
  committed=$(sed -nE 's/^  events committed +([0-9,]+)$/\1/p' "$out" | tr -d ,)
  published=$(sed -nE 's/^  events published \(distinct ids\) +([0-9,]+)$/\1/p' "$out" | tr -d ,)
  [ "$committed" -gt "$orders" ] ||
    fail "expected more than $orders committed events, got $committed"
  [ "$published" -eq "$committed" ] || fail "$published published for $committed committed"
}

# expect_usage_error <demo> <dir> <regex> <options>: the demo with <options> (split on spaces)
# exits 2 with a line matching <regex>, and starts no run in <dir>.
expect_usage_error() {
  local demo=$1 dir=$2 regex=$3 options=$4 status=0
  # shellcheck disable=SC2086  # the options and their values, split on purpose
  "$demo" $options --orders 10 --dir "$dir" >"$dir.out" 2>&1 || status=$?
  cat "$dir.out"
  [ "$status" -eq 2 ] || fail "expected exit 2 for $options, got $status"
  expect "$dir.out" "$regex"
  [ ! -e "$dir" ] || fail "a usage error must not start a run"
}
