#!/usr/bin/env bash
# Zero-config join over a real Avahi daemon: a private dbus-daemon and avahi-daemon in fresh
# network and mount namespaces (only `lo`, allow-interfaces=lo: no multicast leaves the test),
# a bootstrap node that publishes the swarm through it, and a node started with no address that
# finds it over mDNS/DNS-SD, joins, syncs and averages with it.
#
# Usage: lan_test.sh GROVE_NODE. Exit 77 (skipped, with the reason) without root (avahi-daemon
# does not run in a user namespace) or without the daemons (Debian: avahi-daemon dbus-daemon).
set -uo pipefail
G=${1:?usage: lan_test.sh GROVE_NODE}

if [[ -z "${GROVE_LAN_INNER:-}" ]]; then
  if [[ $(id -u) -ne 0 ]]; then
    echo "SKIP: needs root (avahi-daemon cannot run in a user namespace)"
    exit 77
  fi
  for b in dbus-daemon avahi-daemon; do
    command -v $b >/dev/null || { echo "SKIP: $b is not installed"; exit 77; }
  done
  if ! unshare -nm true 2>/dev/null; then
    echo "SKIP: network and mount namespaces are refused here"
    exit 77
  fi
  export GROVE_LAN_INNER=1
  exec unshare -nm bash "$0" "$@"
fi

mount --make-rprivate / && mount -t tmpfs tmpfs /run || { echo "SKIP: cannot mount a private /run"; exit 77; }
ip link set lo up
W=$(mktemp -d /tmp/grove-lan.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$W"
}
trap cleanup EXIT
source "$(dirname "$0")/process_util.sh"

cat >"$W/bus.conf" <<EOF
<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path=$W/bus</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
  </policy>
</busconfig>
EOF
printf '[server]\nuse-ipv4=yes\nuse-ipv6=yes\nallow-interfaces=lo\nenable-dbus=yes\nhost-name=grove-lan-test\nratelimit-interval-usec=1000000\nratelimit-burst=1000\n[wide-area]\nenable-wide-area=no\n[publish]\npublish-hinfo=no\npublish-workstation=no\n' >"$W/avahi.conf"
export DBUS_SYSTEM_BUS_ADDRESS=unix:path=$W/bus
dbus-daemon --config-file="$W/bus.conf" --nofork >"$W/dbus.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do [[ -S "$W/bus" ]] && break; sleep 0.1; done
[[ -S "$W/bus" ]] || fail "dbus-daemon did not start"
avahi-daemon -f "$W/avahi.conf" --no-drop-root --no-chroot --no-rlimits >"$W/avahi.log" 2>&1 &
PIDS+=($!)
wait_for "$W/avahi.log" 20 "Server startup complete" || fail "avahi-daemon did not start"

"$G" --bootstrap --workload mlp --model-size tiny --inner-steps 20 --lr 0.01 --warmup 10 \
  --schedule-steps 2000 --eval-every 20 --window-ms 1000 --listen 127.0.0.1:0 --no-progress \
  --swarm-key-file "$W/key" --state-dir "$W/boot" >"$W/boot.log" 2>&1 &
BOOT=$!
PIDS+=($BOOT)
wait_for "$W/boot.log" 30 "start +eval loss" || fail "the bootstrap node did not start"
grep -q "LAN discovery off" "$W/boot.log" && fail "the bootstrap node found no Avahi daemon"
# No --peer: the joiner has only the LAN to find the swarm.
"$G" --listen 127.0.0.1:0 --no-progress --swarm-key-file "$W/key" --state-dir "$W/join" \
  --max-steps 200 --metrics "$W/join.jsonl" >"$W/join.log" 2>&1 &
JOIN=$!
PIDS+=($JOIN)
wait_for "$W/join.log" 30 "on the LAN at 127\.0\.0\.1:" || fail "the joiner did not find the swarm on the LAN"
wait_for "$W/join.log" 60 "synced +round" || fail "the joiner did not sync"
wait "$JOIN" || fail "the joiner exited with an error"
rounds=$(grep -c '"event":"round"' "$W/join.jsonl")
averaged=$(grep '"event":"round"' "$W/join.jsonl" | grep -c '"partners":\["')
echo "lan: the joiner found the bootstrap node over Avahi, synced, averaged $averaged of $rounds rounds"
((rounds >= 8 && averaged * 10 >= rounds * 7)) || fail "averaged only $averaged of $rounds rounds"
kill -TERM "$BOOT"
wait "$BOOT"
rc=$?
((rc == 0)) || fail "the bootstrap node did not leave cleanly (exit $rc)"
echo "PASS"
