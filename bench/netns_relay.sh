#!/usr/bin/env bash
# netns_relay.sh: a relayed stream against a direct one on the same shaped network.
#
# Three hosts in their own network namespaces (unshare -Urn: no root needed) on one bridge,
# each sending through `tc tbf` at RATE: a sender A, a receiver B, a relay R. A streams BYTES to
# B directly (B listens), then to B' (in B's namespace, accepts no connections, reserved at R)
# through R. Prints both rates and relayed ÷ direct, REPS times each, alternating.
#
#   bench/netns_relay.sh [build-perf/bench/relay_bench] [--rate 100mbit] [--bytes 128M] [--reps 3]
set -uo pipefail
B=${1:-build-perf/bench/relay_bench}
[[ "$B" == --* ]] && B=build-perf/bench/relay_bench || shift
RATE=100mbit BYTES=128M REPS=3
while (($#)); do
  case $1 in
    --rate) RATE=$2; shift 2 ;;
    --bytes) BYTES=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    *) echo "netns_relay.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ -x "$B" ]] || { echo "netns_relay.sh: build $B first (ninja -C build-perf bench/relay_bench)" >&2; exit 2; }
if [[ -z "${GROVE_NS_INNER:-}" ]]; then
  unshare -Urn true 2>/dev/null || { echo "netns_relay.sh: unshare -Urn refused here" >&2; exit 2; }
  export GROVE_NS_INNER=1
  exec unshare -Urn bash "$0" "$B" --rate "$RATE" --bytes "$BYTES" --reps "$REPS"
fi
W=$(mktemp -d /tmp/grove-relay.XXXXXX)
declare -A P
cleanup() {
  for p in "${P[@]}"; do kill "$p" 2>/dev/null; done
  jobs -p | xargs -r kill 2>/dev/null
  wait 2>/dev/null
  rm -rf "$W"
}
trap cleanup EXIT
ip link set lo up
ip link add br0 type bridge && ip link set br0 up
i=1
for n in a b r; do
  unshare -n sleep 100000 >/dev/null 2>&1 &
  P[$n]=$!
  until [[ "$(readlink /proc/${P[$n]}/ns/net)" != "$(readlink /proc/self/ns/net)" ]]; do sleep 0.05; done
  ip link add v-$n type veth peer name eth0 netns "${P[$n]}"
  ip link set v-$n master br0 up
  nsenter -t "${P[$n]}" -n ip link set lo up
  nsenter -t "${P[$n]}" -n ip addr add 10.98.0.$i/24 dev eth0
  nsenter -t "${P[$n]}" -n ip link set eth0 up
  nsenter -t "${P[$n]}" -n tc qdisc replace dev eth0 root tbf rate "$RATE" burst 256kb latency 50ms
  i=$((i + 1))
done
ns() {
  local n=$1
  shift
  nsenter -t "${P[$n]}" -n "$@"
}
# Starts a server role with its stdin held open; waits for its "address" line.
serve() {
  local name=$1 n=$2
  shift 2
  mkfifo "$W/$name.in"
  ns "$n" "$B" "$@" <"$W/$name.in" >"$W/$name.out" 2>&1 &
  exec {fd}>"$W/$name.in"
  eval "FD_$name=$fd"
  for _ in $(seq 100); do grep -q '^address' "$W/$name.out" && return 0; sleep 0.1; done
  echo "netns_relay.sh: $name did not start:" >&2
  cat "$W/$name.out" >&2
  exit 1
}
field() { grep "^$2 " "$W/$1.out" | head -1 | cut -d' ' -f2; }
serve relay r relay --listen 10.98.0.3:7400
serve direct b sink --listen 10.98.0.2:7400
serve hidden b sink --relay 10.98.0.3:7400 --relay-id "$(field relay id)"
echo "relay bench: $BYTES per stream, every host sending through tbf at $RATE"
direct=() relayed=()
rate_of() { grep -oE '[0-9.]+ MB/s' | cut -d' ' -f1; }
for rep in $(seq "$REPS"); do
  d=$(ns a "$B" send --to "$(field direct address)" --to-id "$(field direct id)" --bytes "$BYTES")
  echo "  $d"
  r=$(ns a "$B" send --to "$(field hidden address)" --to-id "$(field hidden id)" --bytes "$BYTES")
  echo "  $r"
  direct+=("$(echo "$d" | rate_of)")
  relayed+=("$(echo "$r" | rate_of)")
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
md=$(median "${direct[@]}") mr=$(median "${relayed[@]}")
grep -h "received" "$W/direct.out" "$W/hidden.out" | sort | uniq -c
awk -v d="$md" -v r="$mr" 'BEGIN { printf "median: direct %.2f MB/s, relayed %.2f MB/s, relayed / direct = %.3f\n", d, r, r / d }'
