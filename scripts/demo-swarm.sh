#!/usr/bin/env bash
# The main job: a real swarm on this machine. Builds grove-node, then
#   A  bootstraps a run of the default workload (the byte-level GPT, preset small) and trains;
#   B  joins through A and trains with it;
#   C  joins mid-run (it takes the swarm's current state);
#   B  leaves mid-run (SIGTERM: it finishes its round, leaves the member list, checkpoints);
#   A and C go on, then stop,
# and prints each node's outcome: eval loss at its start and at the end against the corpus's
# known floor, rounds averaged with others, bytes sent.
#
# Environment: DEMO_MODEL (gpt preset, default small), DEMO_OUTER (noloco or diloco, default
# noloco), DEMO_ROUNDS (rounds of A and C after B left, default 4), BUILD_DIR (default build).
set -euo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."

MODEL=${DEMO_MODEL:-small}
OUTER=${DEMO_OUTER:-noloco}
AFTER=${DEMO_ROUNDS:-4}
BUILD=${BUILD_DIR:-build}
LIMIT=900 # seconds any one stage may take

cmake -S . -B "$BUILD" -G Ninja >/dev/null
cmake --build "$BUILD" -j2 --target grove-node
BIN="$BUILD/node/grove-node"

D=$(mktemp -d /tmp/grove-demo.XXXXXX)
declare -A PID=()
cleanup() {
  for n in "${!PID[@]}"; do kill -9 "${PID[$n]}" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$D"
}
trap cleanup EXIT
trap 'echo "demo: interrupted"; exit 130' INT TERM

say() { printf '\n=== %s\n' "$*"; }

# start NAME ARGS...: a node whose output is shown prefixed with [NAME] and kept in $D/NAME.log.
start() {
  local name=$1
  shift
  "$BIN" --listen 127.0.0.1:0 --state-dir "$D/$name" --metrics "$D/$name.jsonl" --threads 1 \
    --log-level warn "$@" > >(tee "$D/$name.log" | sed -u "s/^/[$name] /") 2>&1 &
  PID[$name]=$!
}

# count NAME EVENT [averaged]: how many EVENT lines NAME's metrics hold (averaged: with partners).
count() {
  local f="$D/$1.jsonl"
  [[ -f $f ]] || {
    echo 0
    return
  }
  if [[ ${3:-} == averaged ]]; then
    grep -c "\"event\":\"$2\".*\"partners\":\[\"" "$f" || true
  else
    grep -c "\"event\":\"$2\"" "$f" || true
  fi
}

# wait_for DESCRIPTION COMMAND...: polls the condition until it holds; fails after $LIMIT s.
wait_for() {
  local what=$1
  shift
  local end=$((SECONDS + LIMIT))
  until "$@"; do
    if ((SECONDS > end)); then
      echo "demo: timed out waiting for $what" >&2
      for n in "${!PID[@]}"; do tail -n 5 "$D/$n.log" | sed "s/^/[$n] /" >&2; done
      exit 1
    fi
    for n in "${!PID[@]}"; do
      kill -0 "${PID[$n]}" 2>/dev/null || {
        echo "demo: node $n exited early" >&2
        exit 1
      }
    done
    sleep 1
  done
}

stop() { # stop NAME: SIGTERM, then wait for a clean exit
  kill -TERM "${PID[$1]}"
  local end=$((SECONDS + 120))
  while kill -0 "${PID[$1]}" 2>/dev/null; do
    ((SECONDS < end)) || {
      echo "demo: node $1 did not exit" >&2
      exit 1
    }
    sleep 0.5
  done
  wait "${PID[$1]}" || {
    echo "demo: node $1 exited with an error" >&2
    exit 1
  }
  unset "PID[$1]"
}

listening() { grep -q '^  listening ' "$D/A.log" 2>/dev/null; }
rounds_at_least() { (($(count "$1" round ${3:-}) >= $2)); }
started() { (($(count "$1" start) >= 1)); }

say "A bootstraps a run (gpt $MODEL, $OUTER) and trains"
start A --bootstrap --workload gpt --model-size "$MODEL" --outer "$OUTER" --inner-steps 20 \
  --warmup 20 --eval-every 20 --window-ms 2000
wait_for "A to listen" listening
ADDR=$(sed -n 's/^  listening \(.*\)$/\1/p' "$D/A.log" | head -n 1)
# The swarm is closed: A's join command carries its key (also in $D/A/swarm.key).
joinable() { grep -q '^  join with: ' "$D/A.log" 2>/dev/null; }
wait_for "A's join command" joinable
KEY=$(sed -n 's/^  join with: .*--swarm-key \([0-9a-f]\{64\}\).*$/\1/p' "$D/A.log" | head -n 1)

say "B joins through $ADDR with A's swarm key"
start B --peer "$ADDR" --swarm-key "$KEY"
wait_for "B to average with A" rounds_at_least B 2 averaged

say "C joins mid-run"
start C --peer "$ADDR" --swarm-key "$KEY"
wait_for "C to sync" started C
wait_for "C to average" rounds_at_least C 2 averaged

say "B leaves mid-run (SIGTERM)"
stop B
a0=$(count A round)
c0=$(count C round)
went_on() { (($(count A round) >= a0 + AFTER && $(count C round) >= c0 + AFTER)); }
wait_for "A and C to go on" went_on

say "A and C stop"
stop C
stop A

say "outcome (eval loss on held-out data; the floor is the corpus's entropy rate)"
/usr/bin/python3 - "$D" <<'EOF'
import json, sys
d = sys.argv[1]
print(f"{'node':<5}{'first round':>12}{'eval at start':>15}{'eval at end':>13}{'floor':>8}"
      f"{'steps':>7}{'averaged':>10}{'local':>7}{'MB sent':>9}")
for n in "ABC":
    ev = [json.loads(l) for l in open(f"{d}/{n}.jsonl")]
    start = next(e for e in ev if e["event"] == "start")
    stop = next(e for e in ev if e["event"] == "stop")
    print(f"{n:<5}{start['round']:>12}{start['eval_loss']:>15.4f}{stop['eval_loss']:>13.4f}"
          f"{stop['loss_floor']:>8.4f}{stop['step']:>7}{stop['rounds_averaged']:>10}"
          f"{stop['rounds_local']:>7}{stop['bytes_sent'] / 1e6:>9.1f}")
EOF

# The run as a picture (loss and eval loss against steps and time, sync time and bytes a round),
# kept beside the repository's checkout: DEMO_PLOT (default demo-run.png).
PLOT=${DEMO_PLOT:-demo-run.png}
if "$BIN" plot "$D/A.jsonl" "$D/B.jsonl" "$D/C.jsonl" -o "$PLOT" --title "demo swarm: A, B, C"; then
  echo "demo: the run's plot is $PLOT"
fi
