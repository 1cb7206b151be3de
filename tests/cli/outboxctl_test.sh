#!/usr/bin/env bash
# outboxctl against the test PostgreSQL: migrate is idempotent, status reads the counts, list /
# show / replay / skip / abandon / purge do what they print, and bad input gets a clear message and the
# documented exit code (0 ok, 1 database failure or refusal, 2 bad command line, 3 not found).
# Usage: outboxctl_test.sh <outboxctl>
set -uo pipefail
ctl=$1
db=${OUTBOX_TEST_PG_URL:-postgresql://outbox:outbox@127.0.0.1:15432/outbox_test}
schema="ctl_$$_$RANDOM"
failures=0

# shellcheck source=tests/cli/expect.sh
source "$(dirname "$0")/expect.sh"
sql_dir=$(mktemp -d "${TMPDIR:-/tmp}/outboxctl-test.XXXXXX")
cleanup() {
  psql -q "$db" -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
    WHERE slot_name = 'outbox_$schema'" >/dev/null 2>&1
  psql -q "$db" -c "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1
  for s in "${schema}_sql" "${schema}_up" "${schema}_ref" "${schema}_empty"; do
    psql -q "$db" -c "DROP SCHEMA IF EXISTS $s CASCADE" >/dev/null 2>&1
  done
  rm -rf "$sql_dir"
}
trap cleanup EXIT

expect 0 "migrated from version 0 to 17" --db "$db" --schema "$schema" migrate
expect 0 "is up to date \(version 17\)" --db "$db" --schema "$schema" migrate
# WAL mode's slot: made once, then found (the cleanup above drops it).
for _ in 1 2; do
  expect 0 "WAL slot outbox_$schema ready \(set $schema\.settings\.delivery = 'wal' to use it\)" \
    --db "$db" --schema "$schema" migrate --wal-slot
done
expect 2 "migrate: --wal-slot creates a slot on the server; not with --print-sql" migrate --print-sql --wal-slot
psql -q "$db" -c "SELECT $schema.enqueue('t', '{}') FROM generate_series(1, 3)" >/dev/null
expect 0 "pending     3" --db "$db" --schema "$schema" status
expect 0 '"pending":3,' --db "$db" --schema "$schema" status --json
# The slot as status shows it: there, nobody reads it, the schema still delivers to the table.
expect 0 "delivery    table.*WAL slot    outbox_$schema: NOT being read, read up to 0/0" \
  --db "$db" --schema "$schema" status
psql -q "$db" -c "UPDATE $schema.settings SET delivery = 'wal'" >/dev/null
expect 0 '"delivery":"wal","wal_topics":0,"wal_slot":\{"name":"outbox_'"$schema"'","exists":true,"active":false' \
  --db "$db" --schema "$schema" status --json
# No reader: the server shows no flush lag.
expect 0 '"flush_lag_seconds":null' --db "$db" --schema "$schema" status --json
# No relay reads the slot: the switch back has no one to wait for.
psql -q "$db" -c "SET outbox.switch_wait = 0" -c "UPDATE $schema.settings SET delivery = 'table'" >/dev/null
expect 1 'the outbox schema "nope_'"$$"'" is not migrated .*run outboxctl migrate' \
  --db "$db" --schema "nope_$$" status
expect 1 "not a plain lower-case identifier" --db "$db" --schema "Bad" migrate
expect 1 "cannot connect to PostgreSQL \(host=127.0.0.1 port=1" \
  --db "postgresql://u:pw@127.0.0.1:1/x" status
expect 2 "A subcommand is required"
expect 2 "The following argument was not expected: --frobnicate" --frobnicate status
expect 0 "^outboxctl 0\.[0-9]+\.[0-9]+ \(PostgreSQL schema version 17\)$" --version
OUTBOX_DATABASE_URL=$db OUTBOX_SCHEMA=$schema expect 0 "pending     3" status
# Through outboxd's file (--config): its [database] table, read by the store registry; the counts
# and WAL mode's state come through the store's contracts (Store::Stats, Admin::Wal).
printf '[database]\ntype = "postgres"\nurl = "%s"\nschema = "%s"\n[sinks.default]\ntype = "file"\n' \
  "$db" "$schema" >"$sql_dir/outbox.toml"
expect 0 "pending     3.*delivery    table.*WAL slot    outbox_$schema: NOT being read" \
  --config "$sql_dir/outbox.toml" status
expect 0 '"pending":3,.*"delivery":"table","wal_topics":0,"wal_slot":\{"name":"outbox_'"$schema"'","exists":true' \
  --config "$sql_dir/outbox.toml" status --json
expect 0 "schema $schema is up to date \(version 17\)" --config "$sql_dir/outbox.toml" migrate
# The environment's url wins over the file's, as in outboxd.
OUTBOX_DATABASE_URL="postgresql://u:pw@127.0.0.1:1/x" expect 1 "cannot connect to PostgreSQL \(host=127.0.0.1 port=1" \
  --config "$sql_dir/outbox.toml" status
expect 2 "--config names the database; not with --db or --schema" \
  --config "$sql_dir/outbox.toml" --schema "$schema" status

# ---- many databases: --database NAME and migrate --all (issue #42) ----
# Tenants as schemas of the test database: two in [[databases]], one more and a refused row in a
# catalog table read by [discovery].
psql -q "$db" -c "CREATE TABLE ${schema}_catalog (name text, url text, schema text)" \
  -c "INSERT INTO ${schema}_catalog VALUES ('t3', '$db', '${schema}_t3'), ('bad name', '$db', 'x')" >/dev/null
printf '[[databases]]\nname = "t1"\nurl = "%s"\nschema = "%s"\n[[databases]]\nname = "t2"\nurl = "%s"\nschema = "%s_t2"\n[discovery]\nurl = "%s"\nquery = "SELECT name, url, schema FROM %s_catalog"\n[sinks.default]\ntype = "file"\n' \
  "$db" "$schema" "$db" "$schema" "$db" "$schema" >"$sql_dir/many.toml"
expect 1 "database t1: schema $schema is up to date \(version 17\).*database t2: schema ${schema}_t2 migrated from version 0 to 17.*database t3: schema ${schema}_t3 migrated from version 0 to 17.*catalog row bad name: not migrated: name: must be 1 to 63 bytes.*4 database\(s\), 1 failed" \
  --config "$sql_dir/many.toml" migrate --all
expect 0 "pending     3" --config "$sql_dir/many.toml" --database t1 status
expect 0 "pending     0" --config "$sql_dir/many.toml" --database t3 status
expect 2 "the file names many databases .*choose one with --database NAME" --config "$sql_dir/many.toml" status
expect 2 'no database named "t9" in \[\[databases\]\] or the catalog' --config "$sql_dir/many.toml" --database t9 status
expect 2 "the file names one database \(\[database\]\), not many" --config "$sql_dir/outbox.toml" --database t1 status
expect 2 "--database needs --config" --database t1 status
expect 2 "migrate --all needs --config" migrate --all
psql -q "$db" -c "DROP TABLE ${schema}_catalog" -c "DROP SCHEMA ${schema}_t2 CASCADE" -c "DROP SCHEMA ${schema}_t3 CASCADE" >/dev/null 2>&1

# ---- list, show, replay, abandon, purge ----
c=(--db "$db" --schema "$schema")
q() { psql -qtAX "$db" -c "$1"; }
state() { q "SELECT concat_ws(' ', status, attempts, lease_owner, last_error)
             FROM $schema.messages WHERE id = '$1'"; }

q "SELECT $schema.enqueue(topic => 'orders', payload => '{\"n\":1}', stream_key => 'o-' || g)
   FROM generate_series(1, 4) g" >/dev/null
bin=$(q "SELECT $schema.enqueue(topic => 'bin', payload => '\x00ff'::bytea,
         content_type => 'application/octet-stream', headers => '{\"x-h\": \"v\"}')")
mapfile -t orders < <(q "SELECT id FROM $schema.messages WHERE topic = 'orders' ORDER BY id")
# As a relay would leave them: two abandoned, one leased.
q "UPDATE $schema.messages SET status = 'abandoned', attempts = 1, abandoned_at = now(),
   last_error = 'rejected: nack' WHERE id IN ('${orders[0]}', '${orders[1]}')" >/dev/null
q "UPDATE $schema.messages SET status = 'processing', lease_owner = 'relay-x',
   lease_until = now() + interval '5 minutes' WHERE id = '${orders[3]}'" >/dev/null
missing=00000000-0000-7000-8000-000000000000
nl=$'\n'

# list: an aligned table, filters, keyset pages, JSON.
expect 0 "^ID +STATUS +ATTEMPTS +TOPIC +STREAM +TARGET +TYPE +AGE +BYTES +DETAIL$nl" "${c[@]}" list
same "list rows" "$("$ctl" "${c[@]}" list | wc -l)" 9
# The age reads in ms, or in s once over a second has passed since the enqueue (a loaded machine).
expect 0 "${orders[0]} +abandoned +1 +orders +o-1#1 +default +- +[0-9]+m?s +7 +rejected: nack" \
  "${c[@]}" list --status abandoned
expect 0 "leased by relay-x, [0-9]+m left" "${c[@]}" list --status processing
expect 0 "${orders[1]} .*${nl}more: --after ${orders[1]}\$" "${c[@]}" list --topic orders --limit 2
last_page=$("$ctl" "${c[@]}" list --topic orders --limit 2 --after "${orders[1]}")
expect 0 "${orders[2]} +pending .*${nl}${orders[3]} +processing [^$nl]*\$" \
  "${c[@]}" list --topic orders --limit 2 --after "${orders[1]}"
same "last page has no 'more:' line" "$(grep -c more: <<<"$last_page")" 0
expect 0 '^\{"messages":\[\{"id":"'"${orders[2]}"'","event_id":"'"${orders[2]}"'","topic":"orders","stream_key":"o-3",.*\],"more":false,"next_after":null\}$' \
  "${c[@]}" list --stream o-3 --json
expect 0 '"more":true,"next_after":"'"${orders[0]}"'"\}$' \
  "${c[@]}" list --status abandoned --limit 1 --json
expect 0 "^no messages match$" "${c[@]}" list --older-than 1h
expect 0 "${orders[0]}" "${c[@]}" list --older-than 0s --status abandoned
expect 0 "${orders[3]} +processing" list --db "$db" --schema "$schema" --status processing

# show: text or hex payload, headers, JSON; exit 3 when the id does not exist.
expect 0 "content type +application/octet-stream${nl}headers${nl}  x-h: v${nl}payload \(2 bytes, hex\)${nl}00ff\$" \
  "${c[@]}" show "$bin"
expect 0 '"status":"abandoned".*"last_error":"rejected: nack".*"payload_encoding":"text","payload":"\{\\"n\\":1\}"' \
  "${c[@]}" show "${orders[0]}" --json
expect 3 "^outboxctl: message $missing not found$" "${c[@]}" show "$missing"
expect 2 "'12345' is not a message id" "${c[@]}" show 12345

# replay: abandoned -> pending with attempts 0, same id; never a processing row.
expect 0 "^would replay 2 messages: ${orders[0]} ${orders[1]}\$" \
  "${c[@]}" replay --all-abandoned --dry-run
same "after a dry run" "$(state "${orders[0]}")" "abandoned 1 rejected: nack"
expect 0 "^replayed 1 message: ${orders[0]}\$" "${c[@]}" replay "${orders[0]}"
same "replayed" "$(state "${orders[0]}")" "pending 0 replayed by operator; was: rejected: nack"
expect 0 "^replayed 0 messages${nl}not replayed: ${orders[3]} \(processing: leased by relay-x, left alone\)\$" \
  "${c[@]}" replay "${orders[3]}"
same "a processing row" "$(state "${orders[3]}")" "processing 0 relay-x"
expect 3 "replayed 1 message: ${orders[1]}${nl}outboxctl: message $missing not found" \
  "${c[@]}" replay "${orders[1]}" "$missing"
expect 2 "replay: say which messages: .*refusing to replay everything" "${c[@]}" replay
expect 2 "replay: --status must be abandoned or failed" "${c[@]}" replay --status pending
expect 2 "excludes" "${c[@]}" replay --all-abandoned --status failed
expect 2 "'nope' is not a message id" "${c[@]}" replay nope

# abandon: pending/failed -> abandoned with the reason; never a processing row.
expect 2 "reason is required" "${c[@]}" abandon --topic orders
expect 2 "abandon: say which messages: .*refusing to abandon everything" \
  "${c[@]}" abandon --reason x
expect 2 "abandon: --status must be pending or failed" \
  "${c[@]}" abandon --status processing --reason x
expect 0 "^would abandon 3 messages: ${orders[0]} ${orders[1]} ${orders[2]}\$" \
  "${c[@]}" abandon --topic orders --reason "consumer gone" --dry-run
same "after a dry run" "$(state "${orders[2]}")" "pending 0"
expect 0 "^abandoned 3 messages: ${orders[0]} ${orders[1]} ${orders[2]}\$" \
  "${c[@]}" abandon --topic orders --reason "consumer gone"
same "abandoned" "$(state "${orders[2]}")" "abandoned 0 abandoned by operator: consumer gone"
same "a processing row" "$(state "${orders[3]}")" "processing 0 relay-x"

# skip (on_abandon = "hold", docs/dead-letters.md): a held stream goes on past its message.
held=$(q "SELECT $schema.enqueue(topic => 'held', payload => '{}', stream_key => 'h-1')")
q "UPDATE $schema.messages SET status = 'abandoned', attempts = 1, abandoned_at = now(),
   holds_stream = true, last_error = 'rejected: nack' WHERE id = '$held'" >/dev/null
expect 0 "${nl}streams held  1 \(by abandoned messages" "${c[@]}" status
expect 0 '"streams_held":1' "${c[@]}" status --json
expect 0 "$held +abandoned +1 +held +h-1#[0-9]+ .* holds its stream: rejected: nack" "${c[@]}" list --held
expect 0 '"holds_stream":true' "${c[@]}" list --held --json
same "list --held" "$("$ctl" "${c[@]}" list --held | wc -l)" 2
expect 0 "^would skip 1 message: $held\$" "${c[@]}" skip --all-held --dry-run
same "after a dry run" "$(q "SELECT holds_stream FROM $schema.messages WHERE id = '$held'")" "t"
expect 0 "^skipped 1 message: $held\$" "${c[@]}" skip "$held"
same "skipped" "$(q "SELECT status, holds_stream FROM $schema.messages WHERE id = '$held'")" "abandoned|f"
expect 0 "^skipped 0 messages${nl}not skipped: $held \(abandoned, not holding its stream: nothing to skip\)\$" \
  "${c[@]}" skip "$held"
expect 0 "^skipped 0 messages${nl}not skipped: ${orders[3]} \(processing: leased by relay-x, left alone\)\$" \
  "${c[@]}" skip "${orders[3]}"
expect 3 "outboxctl: message $missing not found" "${c[@]}" skip "$missing"
expect 0 "^no messages match\$" "${c[@]}" list --held
expect 2 "skip: say which messages: .*refusing to skip everything" "${c[@]}" skip
expect 2 "skip: --status must be abandoned" "${c[@]}" skip --status pending
# A message that holds its stream is never purged (that would release the stream unseen).
still=$(q "SELECT $schema.enqueue(topic => 'held', payload => '{}', stream_key => 'h-2')")
q "UPDATE $schema.messages SET status = 'abandoned', abandoned_at = now() - interval '1 day',
   holds_stream = true WHERE id = '$still'" >/dev/null

# purge: chunked deletes past retention.
expect 0 "^purged 0 messages \(published older than 0s, abandoned older than 30d\)\$" \
  "${c[@]}" purge
expect 0 "^purged 4 messages \(published older than 1h, abandoned older than 0s\)\$" \
  "${c[@]}" purge --published 1h --abandoned 0s
same "a held message after purge" "$(q "SELECT count(*) FROM $schema.messages WHERE id = '$still'")" "1"
expect 0 "^no messages match\$" "${c[@]}" list --topic orders --status abandoned

# Bad input: exit 2 before touching the database; database refusals: exit 1.
expect 2 "--status: unknown status 'bogus' \(expected one of pending, processing, failed, published, abandoned\)" \
  "${c[@]}" list --status bogus
expect 2 "--older-than: bad duration '10x': expected a whole number and a unit, like 30s, 10m, 2h or 30d" \
  "${c[@]}" list --older-than 10x
expect 2 "--older-than: duration '-5m' must not be negative" "${c[@]}" list --older-than=-5m
expect 2 "--abandoned: bad duration '5'" "${c[@]}" purge --abandoned 5
expect 2 "--older-than: bad duration '250ms'" "${c[@]}" list --older-than 250ms
expect 2 "--older-than: duration '36700d' is too large" "${c[@]}" list --older-than 36700d
expect 2 "--older-than: duration '999999999999d' is too large" "${c[@]}" list --older-than 999999999999d
expect 2 "--older-than: duration '9999999999999s' is too large" "${c[@]}" list --older-than 9999999999999s
expect 2 "--limit must be between 1 and 10000, got 0" "${c[@]}" list --limit 0
expect 2 "'x' is not a message id" "${c[@]}" list --after x
expect 2 "--topic must not be empty" "${c[@]}" list --topic ""
expect 2 "--status: unknown status 'done'" --db "postgresql://u:pw@127.0.0.1:1/x" list --status done
expect 1 'the outbox schema "nope_'"$$"'" is not migrated .*run outboxctl migrate' \
  --db "$db" --schema "nope_$$" list
expect 1 "cannot connect to PostgreSQL \(host=127.0.0.1 port=1" \
  --db "postgresql://u:pw@127.0.0.1:1/x" replay --all-abandoned

# ---- the copies of one event (issue #24) ----
mapfile -t copies < <(q "SELECT unnest($schema.enqueue(topic => 'fan', payload => '{}',
                         stream_key => 'f', targets => ARRAY['default', 'partner']))")
event=${copies[0]}
expect 0 "^ID +EVENT +STATUS +ATTEMPTS .*${nl}[0-9a-f-]{36} +$event +pending +0 +fan +f#1 +default .*${nl}[0-9a-f-]{36} +$event +pending +0 +fan +f#1 +partner " \
  "${c[@]}" list --event "$event"
expect 0 "^ID +STATUS +ATTEMPTS" "${c[@]}" list --topic bin
expect 0 "event +$event \(a copy: outboxctl list --event $event lists them all\)" \
  "${c[@]}" show "${copies[1]}"
expect 0 '"event_id":"'"$event"'"' "${c[@]}" show "${copies[1]}" --json
expect 0 "^would abandon 2 messages" "${c[@]}" abandon --event "$event" --reason r --dry-run
expect 2 "--event: 'x' is not a message id" "${c[@]}" list --event x

# ---- migrate --print-sql: the same schema as migrate, applied by psql (issue #19) ----
# apply <file>: psql in one transaction, as the script's header says; prints psql's output.
apply() { psql -X -q -v ON_ERROR_STOP=1 --single-transaction "$db" -f "$1" 2>&1 >/dev/null; }
# dump <schema>: its DDL with the schema's name replaced, to compare two schemas.
dump() {
  pg_dump --schema-only --no-owner --schema="$1" "$db" | sed "s/$1/SCHEMA/g" |
    grep -Ev '^--|^\\(un)?restrict '
}
ref=${schema}_ref
expect 0 "migrated from version 0 to 17" --db "$db" --schema "$ref" migrate
"$ctl" --schema "${schema}_sql" migrate --print-sql >"$sql_dir/full.sql"
same "--print-sql needs no database" "$?" "0"
out=$(apply "$sql_dir/full.sql")
same "the full script applied by psql" "$?:$out" "0:"
expect 0 "is up to date \(version 17\)" --db "$db" --schema "${schema}_sql" migrate
same "pg_dump shows the tables" "$(dump "$ref" | grep -c 'CREATE TABLE SCHEMA\.')" "$(q "SELECT count(*) FROM pg_tables WHERE schemaname = '$ref'")"
same "the script's schema equals migrate's" "$(diff <(dump "$ref") <(dump "${schema}_sql") | head -20)" ""
before=$(q "SELECT count(*) FROM ${schema}_sql.schema_version")
out=$(apply "$sql_dir/full.sql")
same "the script refuses a second run" "$?" "3"
[[ $out =~ "schema ${schema}_sql is at version 17, this script upgrades version 0" &&
  $out =~ "outboxctl migrate --print-sql --from 17" ]] ||
  { echo "FAIL: the guard's message: $out"; failures=$((failures + 1)); }
same "a refused run changes nothing" "$(q "SELECT count(*) FROM ${schema}_sql.schema_version")" "$before"
# An upgrade: version 14 from the full script cut before version 15, then --from 14.
"$ctl" --schema "${schema}_up" migrate --print-sql | sed '/^-- version 15:/,$d' >"$sql_dir/to14.sql"
out=$(apply "$sql_dir/to14.sql")
same "the script cut at version 14" "$?:$(q "SELECT max(version) FROM ${schema}_up.schema_version")" "0:14"
"$ctl" --schema "${schema}_up" migrate --print-sql --from 14 >"$sql_dir/from14.sql"
grep -q '^-- version 15: inbox_functions$' "$sql_dir/from14.sql" && ! grep -q '^-- version 14:' "$sql_dir/from14.sql" ||
  { echo "FAIL: --from 14 should hold versions 15 and up only"; failures=$((failures + 1)); }
out=$(apply "$sql_dir/from14.sql")
same "--from 14 applied to version 14" "$?:$out" "0:"
same "the upgraded schema equals migrate's" "$(diff <(dump "$ref") <(dump "${schema}_up") | head -20)" ""
"$ctl" --schema "${schema}_empty" migrate --print-sql --from 10 >"$sql_dir/empty.sql"
out=$(apply "$sql_dir/empty.sql")
[[ $out =~ "schema ${schema}_empty is at version 0, this script upgrades version 10" ]] ||
  { echo "FAIL: --from 10 on a new database: $out"; failures=$((failures + 1)); }
same "a refused script leaves nothing" "$(q "SELECT count(*) FROM pg_namespace WHERE nspname = '${schema}_empty'")" "0"
expect 2 "--from must be between 0 \(an empty database\) and 17, got 18" migrate --print-sql --from 18
expect 2 "--from must be between 0 \(an empty database\) and 17, got -1" migrate --print-sql --from -1
expect 2 "Could not convert: --from = x" migrate --print-sql --from x
expect 2 "migrate: --from is for --print-sql" "${c[@]}" migrate --from 9
expect 2 "not a plain lower-case identifier" --schema "Bad" migrate --print-sql

[[ $failures -eq 0 ]] && echo "outboxctl: all checks passed"
exit "$failures"
