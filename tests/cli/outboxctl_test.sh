#!/usr/bin/env bash
# outboxctl against the test PostgreSQL: migrate is idempotent, status reads the counts, bad input
# gets a clear message and the documented exit code. Usage: outboxctl_test.sh <outboxctl>
set -uo pipefail
ctl=$1
db=${OUTBOX_TEST_PG_URL:-postgresql://outbox:outbox@127.0.0.1:15432/outbox_test}
schema="ctl_$$_$RANDOM"
failures=0

# expect <exit code> <regex> <args...>: runs outboxctl, checks its exit code and combined output.
expect() {
  local code=$1 pattern=$2 out rc
  shift 2
  out=$("$ctl" "$@" 2>&1)
  rc=$?
  if [[ $rc -ne $code || ! $out =~ $pattern ]]; then
    echo "FAIL: outboxctl $* -> exit $rc (want $code), output:"
    echo "$out" | sed 's/^/    /'
    echo "    (wanted /$pattern/)"
    failures=$((failures + 1))
  fi
}
cleanup() { psql -q "$db" -c "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1; }
trap cleanup EXIT

expect 0 "migrated from version 0 to 2" --db "$db" --schema "$schema" migrate
expect 0 "is up to date \(version 2\)" --db "$db" --schema "$schema" migrate
psql -q "$db" -c "SELECT $schema.enqueue('t', '{}') FROM generate_series(1, 3)" >/dev/null
expect 0 "pending     3" --db "$db" --schema "$schema" status
expect 0 '"pending":3,' --db "$db" --schema "$schema" status --json
expect 1 'the outbox schema "nope_'"$$"'" is not migrated .*run outboxctl migrate' \
  --db "$db" --schema "nope_$$" status
expect 1 "not a plain lower-case identifier" --db "$db" --schema "Bad" migrate
expect 1 "cannot connect to PostgreSQL \(host=127.0.0.1 port=1" \
  --db "postgresql://u:pw@127.0.0.1:1/x" status
expect 2 "A subcommand is required"
expect 2 "The following argument was not expected: --frobnicate" --frobnicate status
expect 0 "outboxctl 0\." --version
OUTBOX_DATABASE_URL=$db OUTBOX_SCHEMA=$schema expect 0 "pending     3" status

[[ $failures -eq 0 ]] && echo "outboxctl: all checks passed"
exit "$failures"
