# shellcheck shell=bash
# What the outboxctl scripts share (sourced): `expect` runs outboxctl ($ctl) and checks its exit
# code and combined output; `same` checks a value. Each failure is printed and counted in
# $failures.
# shellcheck disable=SC2154  # ctl and failures are the sourcing script's

# expect <exit code> <regex> <args...>
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

# same <what> <actual> <wanted>: a check of output or of the database's state.
same() {
  if [[ $2 != "$3" ]]; then
    echo "FAIL: $1: got '$2', want '$3'"
    failures=$((failures + 1))
  fi
}
