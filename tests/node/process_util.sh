# Shared by the shell process tests (nat_test.sh, lan_test.sh); sourced, with $W the test's
# working directory holding one <name>.log per process.

# Prints the tail of every process log and fails the test.
fail() {
  echo "FAIL: $*"
  for f in "$W"/*.log; do
    echo "---- $(basename "$f") (last 40 lines)"
    tail -n 40 "$f"
  done
  exit 1
}

# Waits (at most $2 seconds) until file $1 has a line matching $3.
wait_for() {
  local file=$1 limit=$2 re=$3 t=0
  until grep -qE "$re" "$file" 2>/dev/null; do
    ((t >= limit * 10)) && return 1
    sleep 0.1
    t=$((t + 1))
  done
}

# Waits (at most $1 seconds) until the command that follows succeeds.
wait_until() {
  local limit=$1 t=0
  shift
  until "$@" >/dev/null 2>&1; do
    ((t >= limit * 10)) && return 1
    sleep 0.1
    t=$((t + 1))
  done
}

# Waits (at most $3 seconds) until the metrics file $1 has $2 round events; fails otherwise.
wait_rounds() {
  local file=$1 n=$2 limit=$3 t=0
  until (($(grep -c '"event":"round"' "$file" 2>/dev/null || echo 0) >= n)); do
    ((t >= limit * 10)) && fail "$(basename "$file" .jsonl) did not end $n rounds in $limit s"
    sleep 0.1
    t=$((t + 1))
  done
}
