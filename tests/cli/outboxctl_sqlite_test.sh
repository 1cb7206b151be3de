#!/usr/bin/env bash
# outboxctl on SQLite, through outboxd's configuration file (--config with [database] type =
# "sqlite"): migrate, status, list, show, replay, abandon and purge work there as on PostgreSQL;
# what SQLite has not (WAL mode, a migration script) is refused clearly, changing nothing; and bad
# input gets a clear message and the documented exit code (0 ok, 1 database failure or refusal,
# 2 bad command line or configuration, 3 not found). No server needed.
# Usage: outboxctl_sqlite_test.sh <outboxctl> <outbox_ui_seed>
set -uo pipefail
ctl=$1
seed=$2
failures=0
dir=$(mktemp -d "${TMPDIR:-/tmp}/outboxctl-sqlite-test.XXXXXX")
trap 'rm -rf "$dir"' EXIT
db="$dir/app.db"
conf="$dir/outbox.toml"
cat >"$conf" <<EOF
# outboxd's file: outboxctl reads [database] only.
[database]
type = "sqlite"
path = "$db"

[relay]
batch_size = 100

[sinks.default]
type = "file"
path = "$dir/out.jsonl"
EOF

# shellcheck source=tests/cli/expect.sh
source "$(dirname "$0")/expect.sh"
c=(--config "$conf")
nl=$'\n'

# ---- before migrate: refused, and the file is not created by a read ----
expect 1 "cannot open SQLite database '$db': it does not exist.*outboxctl migrate" "${c[@]}" status
expect 1 "does not exist" "${c[@]}" list
same "status created no database file" "$([[ -e $db ]] && echo yes || echo no)" no

# ---- migrate: idempotent; SQLite has no WAL mode and no script, and says so ----
expect 0 "^SQLite database $db is ready" "${c[@]}" migrate
expect 0 "^SQLite database $db is ready" migrate "${c[@]}"
expect 2 "migrate --wal-slot: SQLite database $db has no WAL mode \(only PostgreSQL has one\); nothing was changed" \
  "${c[@]}" migrate --wal-slot
expect 2 "migrate --print-sql: SQLite database $db has no migration script" \
  "${c[@]}" migrate --print-sql

# ---- status on an empty outbox ----
expect 0 "^pending     0${nl}processing  0${nl}failed      0${nl}abandoned   0${nl}published   0 \(retained\)" \
  "${c[@]}" status
expect 0 "delivery    table$" "${c[@]}" status
expect 0 '^\{"pending":0,"processing":0,"failed":0,"abandoned":0,"published":0,"oldest_pending_age_ms":null,.*"delivery":"table","wal_topics":0,"wal_slot":null\}$' \
  "${c[@]}" status --json

# ---- messages written with the store's own API: three orders (one abandoned) and a refund ----
mapfile -t ids < <("$seed" --sqlite "$db" <<'EOF'
{"topic": "orders", "payload": "{\"n\":1}", "stream": "o-1", "type": "OrderPlaced"}
{"topic": "orders", "payload": "{\"n\":2}", "stream": "o-2", "abandon": "rejected: nack"}
{"topic": "orders", "payload": "{\"n\":3}", "stream": "o-3", "target": "audit"}
{"topic": "refunds", "payload": "{\"r\":1}", "headers": {"x-h": "v"}}
EOF
)
same "seeded" "${#ids[@]}" 4
missing=00000000-0000-7000-8000-000000000000

expect 0 "pending     3${nl}processing  0${nl}failed      0${nl}abandoned   1" "${c[@]}" status
expect 0 '"pending":3,"processing":0,"failed":0,"abandoned":1,' "${c[@]}" status --json

# list: the table, filters, pages, JSON.
expect 0 "^ID +STATUS +ATTEMPTS +TOPIC +STREAM +TARGET +TYPE +AGE +BYTES +DETAIL$nl" "${c[@]}" list
same "list rows" "$("$ctl" "${c[@]}" list | wc -l)" 5
expect 0 "${ids[1]} +abandoned .*orders +o-2.*abandoned by operator: rejected: nack" \
  "${c[@]}" list --status abandoned
expect 0 "${ids[2]} +pending .*audit" "${c[@]}" list --target audit
expect 0 "more: --after ${ids[1]}\$" "${c[@]}" list --topic orders --limit 2
expect 0 '^\{"messages":\[\{"id":"'"${ids[3]}"'",.*"topic":"refunds",.*\],"more":false,"next_after":null\}$' \
  "${c[@]}" list --topic refunds --json
expect 0 "^no messages match$" "${c[@]}" list --older-than 1h

# show: in full; exit 3 when the id does not exist.
expect 0 "headers${nl}  x-h: v${nl}payload \(7 bytes, text\)${nl}\{\"r\":1\}" "${c[@]}" show "${ids[3]}"
expect 0 '"status":"abandoned".*"payload":"\{\\"n\\":2\}"' "${c[@]}" show "${ids[1]}" --json
expect 3 "^outboxctl: message $missing not found$" "${c[@]}" show "$missing"

# replay and abandon, dry run first; purge.
expect 0 "^would replay 1 message: ${ids[1]}$" "${c[@]}" replay --all-abandoned --dry-run
expect 0 "abandoned   1" "${c[@]}" status
expect 0 "^replayed 1 message: ${ids[1]}$" "${c[@]}" replay --all-abandoned
expect 0 "pending     4${nl}processing  0${nl}failed      0${nl}abandoned   0" "${c[@]}" status
expect 0 "^abandoned 1 message: ${ids[3]}$" "${c[@]}" abandon --topic refunds --reason "no such customer"
expect 0 "abandoned by operator: no such customer" "${c[@]}" show "${ids[3]}"
expect 3 "outboxctl: message $missing not found" "${c[@]}" abandon "$missing" --reason x
expect 0 "^purged 0 messages \(published older than 0s, abandoned older than 30d\)$" "${c[@]}" purge
expect 0 "^purged 1 message \(published older than 0s, abandoned older than 0s\)$" \
  "${c[@]}" purge --abandoned 0s
expect 0 "pending     3${nl}processing  0${nl}failed      0${nl}abandoned   0" "${c[@]}" status

# ---- bad input: nothing is read or changed, exit 2 naming what is wrong ----
expect 2 "abandon: --reason must not be empty|--reason is required" "${c[@]}" abandon --topic orders
expect 2 "replay: say which messages" "${c[@]}" replay
expect 2 "--limit must be between 1 and 10000, got 0" "${c[@]}" list --limit 0
expect 2 "'nope' is not a message id" "${c[@]}" show nope
expect 2 "--config names the database; not with --db or --schema" "${c[@]}" --db "postgresql://x" status
expect 2 "cannot read $dir/none.toml: No such file or directory" --config "$dir/none.toml" status
cat >"$dir/typo.toml" <<EOF
[database]
type = "sqlite"
pth = "$db"
EOF
expect 2 "database.pth: unknown key \(did you mean \"database.path\"\?\)" --config "$dir/typo.toml" status
cat >"$dir/mixed.toml" <<EOF
[database]
type = "sqlite"
path = "$db"
url = "postgresql://u:secret-pw@h/db"
EOF
expect 2 "database.url: is for type = \"postgres\"" --config "$dir/mixed.toml" status
out=$("$ctl" --config "$dir/mixed.toml" status 2>&1)
same "no password in the error" "$(grep -c secret-pw <<<"$out")" 0
cat >"$dir/type.toml" <<EOF
[database]
type = "oracle"
EOF
expect 2 "database.type: unknown store type \"oracle\"; expected \"postgres\", \"sqlite\" or \"mariadb\"" --config "$dir/type.toml" status
printf '[database\ntype = "sqlite"\n' >"$dir/broken.toml"
expect 2 "is not valid TOML" --config "$dir/broken.toml" status
# The counts did not move through any of it.
expect 0 "pending     3${nl}processing  0${nl}failed      0${nl}abandoned   0" "${c[@]}" status

if [[ $failures -gt 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "outboxctl on SQLite: all checks passed"
