#!/usr/bin/env bash
# `grove-node top` in a real terminal: three nodes train (a fast mlp run on loopback), the
# dashboard runs in a tmux pane (a private tmux server, 160x40), and the pane must show the three
# members with their state, step and the column headers, the sort must move to the next column on
# 's', and 'q' must end it. Then without a terminal (a pipe): one plain table of the three.
#
# Usage: top_test.sh GROVE_NODE. Exit 77 (skipped, with the reason) without tmux.
set -uo pipefail
G=${1:?usage: top_test.sh GROVE_NODE}
command -v tmux >/dev/null || { echo "SKIP: tmux is not installed"; exit 77; }
W=$(mktemp -d /tmp/grove-top.XXXXXX)
SOCK="grove-top-$$"
PIDS=()
cleanup() {
  tmux -L "$SOCK" kill-server 2>/dev/null
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$W"
}
trap cleanup EXIT
source "$(dirname "$0")/process_util.sh"

run=(--workload mlp --model-size tiny --inner-steps 20 --lr 0.01 --warmup 10 --window-ms 1000)
"$G" --bootstrap "${run[@]}" --listen 127.0.0.1:0 --state-dir "$W/n0" --no-progress \
  >"$W/n0.log" 2>&1 &
PIDS+=($!)
wait_for "$W/n0.log" 30 "listening " || fail "the bootstrap node did not start"
addr=$(grep -oE "listening [^ ]+" "$W/n0.log" | head -1 | cut -d' ' -f2)
for i in 1 2; do
  "$G" --peer "$addr" --listen 127.0.0.1:0 --state-dir "$W/n$i" --swarm-key-file "$W/n0/swarm.key" \
    --no-progress >"$W/n$i.log" 2>&1 &
  PIDS+=($!)
done
for i in 1 2; do wait_for "$W/n$i.log" 60 "synced +round" || fail "n$i did not join"; done
ids=()
for i in 0 1 2; do
  id=$(grep -oE "^grove-node [0-9a-f]{16}" "$W/n$i.log" | head -1 | cut -d' ' -f2)
  [[ -n "$id" ]] || fail "no node id in n$i.log"
  ids+=("${id:0:8}")
done

tmux -L "$SOCK" -f /dev/null new-session -d -s top -x 160 -y 40 \
  "'$G' top --state-dir '$W/n0' 2>'$W/top.err'; echo top-exited-\$? > '$W/top.rc'"
pane() { tmux -L "$SOCK" capture-pane -p -t top 2>/dev/null; }
shows_all() {
  local p
  p=$(pane)
  grep -q "grove-node top:" <<<"$p" && grep -qE "^node +state +step +round" <<<"$p" || return 1
  for id in "${ids[@]}"; do
    grep -qE "^$id +(training|syncing|checkpointing) +[0-9]+ +[0-9]+ " <<<"$p" || return 1
  done
  grep -q "3 members" <<<"$p"
}
wait_until 30 shows_all || { pane >"$W/pane.log"; fail "the dashboard did not show the three members"; }
pane >"$W/pane.log"
grep -q "sort (by node)" "$W/pane.log" || fail "the footer does not say the sort"
tmux -L "$SOCK" send-keys -t top s
wait_until 10 bash -c "tmux -L '$SOCK' capture-pane -p -t top | grep -q 'sort (by state)'" ||
  { pane >"$W/pane.log"; fail "'s' did not sort by the next column"; }
tmux -L "$SOCK" send-keys -t top q
wait_until 15 test -s "$W/top.rc" || { pane >"$W/pane.log"; fail "'q' did not end the dashboard"; }
grep -q "top-exited-0" "$W/top.rc" || fail "top exited with $(cat "$W/top.rc"): $(cat "$W/top.err")"

# Not a terminal: one plain table, a header and the three members.
"$G" top --state-dir "$W/n0" >"$W/table.log" 2>&1 || fail "top into a pipe failed"
grep -qE "^node +state +step" "$W/table.log" || fail "no table header without a terminal"
for id in "${ids[@]}"; do grep -q "^$id " "$W/table.log" || fail "$id missing from the table"; done
grep -q $'\e' "$W/table.log" && fail "terminal escapes in the plain table"
echo "top_test: OK (three members in the pane, sorted on 's', ended by 'q'; a plain table in a pipe)"
