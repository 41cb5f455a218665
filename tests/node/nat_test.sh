#!/usr/bin/env bash
# Real NAT on this machine: network namespaces (unshare -Urn: no root needed), a bridge for the
# "Internet", two home routers that masquerade with nftables and drop unsolicited inbound
# connections (as home routers do), and one grove-node process per host:
#
#   pub 10.99.0.10 ──┬── br0 ──┬── r1 10.99.0.11 ── h1 192.168.1.2
#   (bootstrap,      │         └── r2 10.99.0.12 ── h2 192.168.2.2   (joins mid-run)
#    relay)
#
# Checks: pub is found reachable, h1 and h2 are not (their peers' dial-back checks fail at the
# router), both take a relay at pub; h2 joins mid-run and syncs the swarm's state; all three
# average most of their rounds, h1 and h2 with each other through the relay.
#
# With mode relay-kill: a second reachable node pub2 (10.99.0.13) joins, h1 and h2 reserve at
# both, and pub is killed with SIGKILL mid-run; h1 and h2 go on averaging through pub2.
#
# With mode upnp: the "Internet" is 11.99.0.0/24 (a router refuses to map ports behind a private
# external address) and r1 runs miniupnpd, a UPnP IGD: h1 has it map a port, is found reachable
# at r1's address, h2 (r2 maps nothing) dials it directly, and the mapping is gone after h1 exits.
#
# With mode ipv6: the Internet carries fd99::/64 as well, r1 routes fd99:1::/64 to h1 without NAT
# but drops unsolicited inbound connections (IPv6 behind a home router's firewall). Nodes listen
# on [::]:7400 and join through pub's IPv6 address: pub2 is found reachable at both its IPv4 and
# IPv6 addresses, h1 (seen at its IPv6 address) is not, and all three train together.
#
# Usage: nat_test.sh GROVE_NODE noloco|diloco|relay-kill|upnp|ipv6. Exit 77 (skipped, with the reason)
# when the kernel refuses user and network namespaces, or nftables (miniupnpd for upnp) is missing.
set -uo pipefail
G=${1:?usage: nat_test.sh GROVE_NODE noloco|diloco|relay-kill|upnp|ipv6}
MODE=${2:-noloco}
NET=10.99.0
[[ $MODE == upnp ]] && NET=11.99.0

if [[ -z "${GROVE_NAT_INNER:-}" ]]; then
  if ! command -v nft >/dev/null; then
    echo "SKIP: nft (Debian package nftables) is not installed: no NAT to test"
    exit 77
  fi
  if [[ $MODE == upnp && ! -x /usr/sbin/miniupnpd ]]; then
    echo "SKIP: miniupnpd (Debian package miniupnpd-nftables) is not installed: no UPnP router"
    exit 77
  fi
  if ! unshare -Urn true 2>/dev/null; then
    echo "SKIP: this kernel refuses user + network namespaces (unshare -Urn): NAT not tested here;"
    echo "      nodes that cannot listen are covered by NodeProcess.ANodeNobodyCanDial*"
    exit 77
  fi
  export GROVE_NAT_INNER=1
  exec unshare -Urn bash "$0" "$@"
fi

W=$(mktemp -d /tmp/grove-nat.XXXXXX)
declare -A P
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${P[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$W"
}
trap cleanup EXIT
source "$(dirname "$0")/process_util.sh"

ip link set lo up
ip link add br0 type bridge && ip link set br0 up || fail "no bridge"
HOSTS=(pub pub2 r1 r2 h1 h2)
for n in "${HOSTS[@]}"; do
  unshare -n sleep 100000 >/dev/null 2>&1 &
  P[$n]=$!
done
for n in "${HOSTS[@]}"; do
  until [[ "$(readlink /proc/${P[$n]}/ns/net)" != "$(readlink /proc/self/ns/net)" ]]; do sleep 0.05; done
done
ns() {
  local n=$1
  shift
  nsenter -t "${P[$n]}" -n "$@"
}
# Starts a grove-node in host $1's namespace, output to $W/$1.log; its pid (nsenter execs the
# program: the pid is the node's) goes to PIDS and LAST.
launch() {
  local n=$1
  shift
  nsenter -t "${P[$n]}" -n "$G" "$@" >"$W/$n.log" 2>&1 &
  LAST=$!
  PIDS+=("$LAST")
}
for n in "${HOSTS[@]}"; do ns $n ip link set lo up; done
i=10
for n in pub r1 r2 pub2; do
  ip link add v-$n type veth peer name eth0 netns "${P[$n]}"
  ip link set v-$n master br0 up
  ns $n ip addr add $NET.$i/24 dev eth0
  ns $n ip link set eth0 up
  i=$((i + 1))
done
for k in 1 2; do
  r=r$k h=h$k
  ns $r ip link add lan0 type veth peer name eth0 netns "${P[$h]}"
  ns $r ip addr add 192.168.$k.1/24 dev lan0
  ns $r ip link set lan0 up
  ns $h ip addr add 192.168.$k.2/24 dev eth0
  ns $h ip link set eth0 up
  ns $h ip route add default via 192.168.$k.1
  ns $r sysctl -qw net.ipv4.ip_forward=1
  # Port forwards (DNAT, as miniupnpd adds them) pass the firewall; nothing else comes in.
  ns $r nft -f - <<'EOF' || fail "nftables refused the NAT rules"
table inet fw {
  chain forward { type filter hook forward priority filter; policy drop;
    ct state established,related accept
    ct status dnat accept
    iifname "lan0" oifname "eth0" accept; }
  chain input { type filter hook input priority filter; policy drop;
    ct state established,related accept
    meta l4proto ipv6-icmp accept
    iifname { "lo", "lan0" } accept; }
}
table ip nat {
  chain post { type nat hook postrouting priority srcnat; oifname "eth0" masquerade; }
}
EOF
done
if [[ $MODE == ipv6 ]]; then
  i=10
  for n in pub r1 r2 pub2; do
    ns $n ip addr add fd99::$i/64 dev eth0 nodad
    i=$((i + 1))
  done
  ns r1 ip addr add fd99:1::1/64 dev lan0 nodad
  ns h1 ip addr add fd99:1::2/64 dev eth0 nodad
  ns h1 ip -6 route add default via fd99:1::1
  ns r1 sysctl -qw net.ipv6.conf.all.forwarding=1
  for n in pub pub2; do ns $n ip -6 route add fd99:1::/64 via fd99::11; done
  ns h1 bash -c 'exec 3<>/dev/tcp/fd99::10/9' 2>/dev/null  # refused is fine: a route exists
  ns pub timeout 2 bash -c 'exec 3<>/dev/tcp/fd99:1::2/7400' 2>/dev/null &&
    fail "r1 let an unsolicited IPv6 connection through"
fi
# The NAT works: h1 reaches pub, pub cannot reach h1's router.
ns h1 bash -c "exec 3<>/dev/tcp/$NET.10/9" 2>/dev/null  # refused is fine: a route exists
ns pub timeout 2 bash -c "exec 3<>/dev/tcp/$NET.11/7400" 2>/dev/null &&
  fail "the router accepted an unsolicited connection"

if [[ $MODE == upnp ]]; then
  # r1 is a UPnP IGD: miniupnpd adds its DNAT and forward rules to the tables made for it here.
  ns r1 nft -f - <<'EOF' || fail "nftables refused miniupnpd's tables"
table inet filter {
  chain forward { type filter hook forward priority 0; policy accept; jump miniupnpd; }
  chain miniupnpd { }
}
table inet nat {
  chain prerouting { type nat hook prerouting priority -100; policy accept; jump prerouting_miniupnpd; }
  chain prerouting_miniupnpd { }
  chain postrouting { type nat hook postrouting priority 100; policy accept; jump postrouting_miniupnpd; }
  chain postrouting_miniupnpd { }
}
EOF
  cat >"$W/miniupnpd.conf" <<EOF
ext_ifname=eth0
listening_ip=lan0
http_port=0
enable_natpmp=no
enable_upnp=yes
secure_mode=yes
system_uptime=yes
uuid=3d3cec3a-8cf0-11e0-98ee-001a6bd2d07b
upnp_table_name=filter
upnp_nat_table_name=nat
upnp_forward_chain=miniupnpd
upnp_nat_chain=prerouting_miniupnpd
upnp_nat_postrouting_chain=postrouting_miniupnpd
allow 1024-65535 192.168.1.0/24 1024-65535
deny 0-65535 0.0.0.0/0 0-65535
EOF
  nsenter -t "${P[r1]}" -n /usr/sbin/miniupnpd -d -f "$W/miniupnpd.conf" -P "$W/miniupnpd.pid" \
    >"$W/miniupnpd.log" 2>&1 &
  PIDS+=($!)
  wait_for "$W/miniupnpd.log" 20 "HTTP listening on port" || fail "miniupnpd did not start"
fi

COMMON=(--no-progress --swarm-key-file "$W/key" --listen 0.0.0.0:7400)
[[ $MODE == ipv6 ]] && COMMON=(--no-progress --swarm-key-file "$W/key" --listen "[::]:7400")
# Of a metrics file: its node id, its rounds, the rounds averaged, the rounds with node $2.
node_id() { grep -oE '"node":"[0-9a-f]+"' "$1" | head -1 | cut -d'"' -f4; }
rounds() { grep -c '"event":"round"' "$1"; }
averaged() { grep '"event":"round"' "$1" | grep -c '"partners":\["'; }
rounds_with() { grep '"event":"round"' "$1" | grep -c "\"$2\""; }
# The bootstrap node (or $1) leaves cleanly on SIGTERM; then the test has passed. Prints the
# network line of each node's summary first.
finish() {
  local pid=${1:-$PUB} rc n
  kill -TERM "$pid"
  wait "$pid"
  rc=$?
  ((rc == 0)) || fail "the last reachable node did not leave cleanly (exit $rc)"
  for n in "${HOSTS[@]}"; do
    [[ -f "$W/$n.log" ]] && grep -q "^  network" "$W/$n.log" &&
      echo "$n: $(grep -h "^  network" "$W/$n.log" | sed 's/^ *network *//')"
  done
  echo "PASS"
  exit 0
}
launch pub --bootstrap --workload mlp --model-size tiny --inner-steps 20 --lr 0.01 --warmup 10 \
  --schedule-steps 4000 --eval-every 20 --window-ms 1000 \
  --outer "$([[ $MODE == diloco ]] && echo diloco || echo noloco)" \
  --state-dir "$W/pub" --metrics "$W/pub.jsonl" "${COMMON[@]}"
PUB=$LAST
wait_for "$W/pub.log" 30 "listening" || fail "pub did not start"

if [[ $MODE == ipv6 ]]; then
  launch pub2 --peer "[fd99::10]:7400" --state-dir "$W/pub2" --metrics "$W/pub2.jsonl" \
    --max-steps 300 "${COMMON[@]}"
  PUB2=$LAST
  wait_for "$W/pub2.log" 60 "reach: reachable at 10.99.0.13:7400, \[fd99::13\]:7400" ||
    fail "pub2 was not found reachable at both of its addresses"
  launch h1 --peer "[fd99::10]:7400" --state-dir "$W/h1" --metrics "$W/h1.jsonl" \
    --max-steps 300 "${COMMON[@]}"
  H1=$LAST
  wait_for "$W/h1.log" 60 "could not dial us at 192.168.1.2:7400, \[fd99:1::2\]:7400" ||
    fail "h1 was not found unreachable at its IPv6 address"
  wait "$H1" || fail "h1 exited with an error"
  wait "$PUB2" || fail "pub2 exited with an error"
  grep -q "reach: reachable at 10.99.0.10:7400, \[fd99::10\]:7400" "$W/pub.log" ||
    fail "pub was not found reachable at both of its addresses"
  rounds=$(rounds "$W/h1.jsonl") averaged=$(averaged "$W/h1.jsonl")
  together=$(rounds_with "$W/h1.jsonl" "$(node_id "$W/pub2.jsonl")")
  echo "nat (ipv6): pub and pub2 reachable at their IPv4 and IPv6 addresses, h1 (firewalled" \
    "IPv6, NATed IPv4) not; h1 averaged $averaged of $rounds rounds, $together with pub2"
  ((rounds >= 10 && averaged * 10 >= rounds * 7)) || fail "h1 averaged only $averaged of $rounds"
  ((together >= 2)) || fail "h1 and pub2 averaged with each other only $together times"
  finish
fi

# Whether r1's nftables rules hold a mapping to h1.
r1_maps_h1() { ns r1 nft list ruleset | grep -q "192.168.1.2"; }
r1_maps_nothing() {
  local rules
  rules=$(ns r1 nft list ruleset) && ! grep -q "192.168.1.2" <<<"$rules"
}
if [[ $MODE == upnp ]]; then
  T0=$(date +%s%N)
  launch h1 --peer $NET.10:7400 --state-dir "$W/h1" --metrics "$W/h1.jsonl" --max-steps 400 \
    "${COMMON[@]}"
  H1=$LAST
  wait_for "$W/h1.log" 30 "upnp: the router maps $NET.11:7400 to us" ||
    fail "r1 mapped no port to h1"
  # miniupnpd answers once it sent its rules; nftables may show them a moment later.
  wait_until 10 r1_maps_h1 || fail "no mapping in r1's rules"
  wait_for "$W/h1.log" 60 "reach: reachable at $NET.11:7400" || fail "h1 was not found reachable"
  T1=$(date +%s%N)
  launch h2 --peer $NET.10:7400 --state-dir "$W/h2" --metrics "$W/h2.jsonl" --max-steps 400 \
    "${COMMON[@]}"
  H2=$LAST
  wait_for "$W/h2.log" 60 "could not dial us" || fail "h2 was not found unreachable"
  wait "$H1" || fail "h1 exited with an error"
  grep -q "upnp: removed the mapping $NET.11:7400" "$W/h1.log" || fail "h1 did not remove its mapping"
  wait_until 10 r1_maps_nothing || fail "the mapping is still in r1's rules"
  wait "$H2" || fail "h2 exited with an error"
  grep -q "upnp: no gateway answered" "$W/h2.log" || fail "h2 found a gateway behind r2"
  rounds=$(rounds "$W/h2.jsonl") averaged=$(averaged "$W/h2.jsonl")
  together=$(rounds_with "$W/h2.jsonl" "$(node_id "$W/h1.jsonl")")
  echo "nat (upnp): h1 mapped $NET.11:7400 on r1 and was found reachable there; h2 averaged" \
    "$averaged of $rounds rounds, $together with h1; the mapping was removed at h1's exit;" \
    "h1 was reachable $(((T1 - T0) / 1000000)) ms after its start"
  ((rounds >= 15 && averaged * 10 >= rounds * 7)) || fail "h2 averaged only $averaged of $rounds"
  ((together >= 3)) || fail "h1 and h2 averaged with each other only $together times"
  finish
fi

if [[ $MODE == relay-kill ]]; then
  # A second reachable node; h1 and h2 reserve at both; pub (a relay and the bootstrap node)
  # is killed with SIGKILL mid-run: h1 and h2 must go on averaging with each other through pub2.
  launch pub2 --peer $NET.10:7400 --state-dir "$W/pub2" "${COMMON[@]}"
  PUB2=$LAST
  wait_for "$W/pub2.log" 60 "reach: reachable at $NET.13:7400" || fail "pub2 not reachable"
  for h in h1 h2; do
    launch $h --peer $NET.10:7400 --state-dir "$W/$h" --metrics "$W/$h.jsonl" \
      --max-steps 1200 "${COMMON[@]}"
    eval "${h^^}=$LAST"
  done
  for h in h1 h2; do
    wait_for "$W/$h.log" 60 "reachable through 2 relay" || fail "$h did not take two relays"
  done
  wait_rounds "$W/h1.jsonl" 10 120
  kill -KILL "$PUB"
  before=$(rounds "$W/h1.jsonl")
  h2_id=$(node_id "$W/h2.jsonl")
  wait "$H1" || fail "h1 exited with an error after the relay died"
  wait "$H2" || fail "h2 exited with an error after the relay died"
  after=$(tail -n +$((before + 1)) "$W/h1.jsonl" | grep '"event":"round"')
  rounds=$(echo "$after" | grep -c .)
  averaged=$(echo "$after" | grep -c '"partners":\["')
  together=$(echo "$after" | grep -c "\"$h2_id\"")
  echo "nat (relay killed): after the kill h1 ended $rounds rounds, averaged $averaged," \
    "$together of them with h2 (through pub2)"
  grep -q "reachable through 1 relay" "$W/h1.log" || fail "h1 did not drop the dead relay"
  ((rounds >= 30)) || fail "h1 ended only $rounds rounds after the kill"
  ((averaged * 10 >= rounds * 7)) || fail "h1 averaged only $averaged of $rounds rounds"
  ((together >= 5)) || fail "h1 and h2 averaged with each other only $together times"
  finish "$PUB2"
fi

launch h1 --peer $NET.10:7400 --state-dir "$W/h1" --metrics "$W/h1.jsonl" --max-steps 400 \
  "${COMMON[@]}"
H1=$LAST
wait_for "$W/h1.log" 60 "could not dial us" || fail "h1 was not found unreachable"
wait_for "$W/h1.log" 60 "reachable through 1 relay" || fail "h1 took no relay"
# h2 joins mid-run: after h1 has ended 5 rounds.
wait_rounds "$W/h1.jsonl" 5 120
T0=$(date +%s%N)
launch h2 --peer $NET.10:7400 --state-dir "$W/h2" --metrics "$W/h2.jsonl" --max-steps 400 \
  "${COMMON[@]}"
H2=$LAST
wait_for "$W/h2.log" 60 "synced +round" || fail "h2 did not sync the swarm's state"
T1=$(date +%s%N)
wait_for "$W/h2.jsonl" 60 '"event":"round"' || fail "h2 ended no round"
T2=$(date +%s%N)
wait_for "$W/h2.log" 60 "could not dial us" || fail "h2 was not found unreachable"
wait "$H1" || fail "h1 exited with an error"
wait "$H2" || fail "h2 exited with an error"
grep -q "reach: reachable at $NET.10:7400" "$W/pub.log" || fail "pub was not found reachable"

together=$(rounds_with "$W/h1.jsonl" "$(node_id "$W/h2.jsonl")")
synced=$(grep -oE "synced +round +[0-9]+" "$W/h2.log" | head -1 | grep -oE "[0-9]+$")
echo "nat ($MODE): h1 averaged $(averaged "$W/h1.jsonl") of $(rounds "$W/h1.jsonl") rounds," \
  "h2 $(averaged "$W/h2.jsonl") of $(rounds "$W/h2.jsonl") (joined at round $synced)," \
  "h1 with h2 (through the relay at pub) $together times;" \
  "h2 training $(((T1 - T0) / 1000000)) ms after start, first round ended after $(((T2 - T0) / 1000000)) ms"
for h in h1 h2; do
  r=$(rounds "$W/$h.jsonl") a=$(averaged "$W/$h.jsonl")
  ((r >= 15)) || fail "$h ended only $r rounds"
  ((a * 10 >= r * 7)) || fail "$h averaged only $a of $r rounds"
done
((synced >= 3)) || fail "h2 joined at round $synced, not mid-run"
((together >= 3)) || fail "h1 and h2 averaged with each other only $together times"
finish
