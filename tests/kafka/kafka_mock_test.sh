#!/usr/bin/env bash
# outbox-kafka-mock as a program: prints its bootstrap servers, answers its commands, refuses
# --port, says in --help that it is not Kafka, and stops on SIGTERM. Bounded: every read waits
# at most 10 s.
set -euo pipefail
mock=$1
fail() { echo "FAIL: $*" >&2; exit 1; }

"$mock" --help | grep -q "NOT Kafka" || fail "--help does not say it is a protocol mock"
if "$mock" --port 9092 2>/dev/null; then fail "--port accepted"; fi
if "$mock" --brokers 0 2>/dev/null; then fail "--brokers 0 accepted"; fi

coproc MOCK { exec "$mock" --brokers 2; }
pid=$MOCK_PID
trap 'kill "$pid" 2>/dev/null || true' EXIT
read -r -t 10 -u "${MOCK[0]}" bootstraps || fail "no bootstrap line"
[[ $bootstraps =~ ^127\.0\.0\.1:[0-9]+,127\.0\.0\.1:[0-9]+$ ]] || fail "bootstraps: $bootstraps"
first=${bootstraps%%,*}
(exec 3<>"/dev/tcp/127.0.0.1/${first#*:}") 2>/dev/null || fail "nothing listens on $first"

ask() {  # ask COMMAND EXPECTED-PREFIX
  local answer
  printf '%s\n' "$1" >&"${MOCK[1]}"
  read -r -t 10 -u "${MOCK[0]}" answer || fail "no answer to '$1'"
  [[ $answer == "$2"* ]] || fail "'$1' answered '$answer', expected '$2...'"
}
ask "topic orders 3" ok
ask "leader orders 0 2" ok
ask "down 1" ok
ask "up all" ok
ask "unknown-topic missing" ok
ask "produce-errors NOT_LEADER_FOR_PARTITION 2" ok
ask "delay 1 100" ok
ask "produce-errors NO_SUCH_ERROR" error
ask "down seven" error
ask "fly" error

kill -TERM "$pid"
for _ in $(seq 100); do
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$pid" 2>/dev/null; then fail "still running 10 s after SIGTERM"; fi
wait "$pid" || fail "exit status $? after SIGTERM"
trap - EXIT
echo "outbox-kafka-mock: ok"
