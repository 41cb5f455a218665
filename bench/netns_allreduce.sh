#!/usr/bin/env bash
# netns_allreduce.sh: grove-node's ring all-reduce and Gloo's on the same shaped network.
#
# Builds N network namespaces (one per process), each with a veth to a bridge that lives in a
# namespace of its own, shapes every veth end with `tc ... tbf` (this kernel has no netem),
# measures the TCP goodput of that network (every node sending to the next at once, the ring's
# traffic pattern), then runs bench/allreduce_bench (each member enters its namespace with
# setns) and bench/gloo_allreduce.py (one rank per namespace, via `ip netns exec`) on it, and
# prints both times against the ring bound 2(N-1)/N x wire bytes / goodput.
#
#   sudo bench/netns_allreduce.sh [--procs 2,4] [--sizes 4M,64M,256M] [--reps 3]
#                                 [--rate 1gbit] [--build build-perf] [--goodput-mib 256]
#                                 [--notsent-lowat BYTES]
#                                 [-- extra allreduce_bench options, e.g. --codec fp32]
#
# --notsent-lowat sets net.ipv4.tcp_notsent_lowat in every namespace: the kernel then keeps at
# most that many not-yet-sent bytes per socket, so frames queued behind bulk data (credit,
# stream_done) wait less. An experiment knob: the same as TCP_NOTSENT_LOWAT on the sockets.
#
# Needs root, iproute2 and tc, /usr/bin/python3 with torch (Gloo). Uses private addresses
# 10.199.77.0/24 inside namespaces it creates and removes them all on exit.
set -euo pipefail

procs="2,4"
sizes="4M,64M,256M"
reps=3
rate="1gbit"
build="build-perf"
goodput_mib=256
notsent_lowat=""
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --procs) procs="$2"; shift 2 ;;
    --sizes) sizes="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --rate) rate="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --goodput-mib) goodput_mib="$2"; shift 2 ;;
    --notsent-lowat) notsent_lowat="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "netns_allreduce.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bench="$src/$build/bench/allreduce_bench"
[[ $(id -u) -eq 0 ]] || { echo "netns_allreduce.sh: needs root (namespaces, tc)" >&2; exit 2; }
[[ -x "$bench" ]] || { echo "netns_allreduce.sh: build $bench first" >&2; exit 2; }
command -v tc >/dev/null || { echo "netns_allreduce.sh: tc (iproute2) missing" >&2; exit 2; }

IFS=, read -r -a proc_list <<<"$procs"
IFS=, read -r -a size_list <<<"$sizes"
n_max=0
for n in "${proc_list[@]}"; do ((n > n_max)) && n_max=$n; done
((n_max >= 2)) || { echo "netns_allreduce.sh: --procs needs values >= 2" >&2; exit 2; }
((n_max <= 200)) || { echo "netns_allreduce.sh: at most 200 members" >&2; exit 2; }

# Sizes as bytes (K/M/G are binary units, as allreduce_bench reads them).
to_bytes() {
  local v="${1%[KkMmGg]}" unit="${1: -1}"
  case "$unit" in
    K | k) echo $((v << 10)) ;;
    M | m) echo $((v << 20)) ;;
    G | g) echo $((v << 30)) ;;
    *) echo "$1" ;;
  esac
}
size_bytes=()
for s in "${size_list[@]}"; do size_bytes+=("$(to_bytes "$s")"); done

# --- the network ------------------------------------------------------------------------------
tag="grv$$"
br_ns="${tag}b"
ns=()
ips=()
for ((i = 0; i < n_max; ++i)); do
  ns+=("${tag}n$i")
  ips+=("10.199.77.$((i + 1))")
done
work="$(mktemp -d)"

cleanup() {
  local name pid
  for name in "${ns[@]}" "$br_ns"; do
    [[ -e "/var/run/netns/$name" ]] || continue
    for pid in $(ip netns pids "$name" 2>/dev/null); do kill "$pid" 2>/dev/null || true; done
    ip netns del "$name" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

shape() {  # namespace, device
  ip netns exec "$1" tc qdisc replace dev "$2" root tbf rate "$rate" burst 1mb latency 20ms
}

ip netns add "$br_ns"
ip -n "$br_ns" link add br0 type bridge
ip -n "$br_ns" link set br0 up
# br_netfilter is loaded on this host: bridged frames must not go through iptables here.
if ip netns exec "$br_ns" test -e /proc/sys/net/bridge/bridge-nf-call-iptables; then
  ip netns exec "$br_ns" sysctl -qw net.bridge.bridge-nf-call-iptables=0
fi
for ((i = 0; i < n_max; ++i)); do
  ip netns add "${ns[i]}"
  ip link add "gv$i" netns "${ns[i]}" type veth peer name "gb$i" netns "$br_ns"
  ip -n "${ns[i]}" link set lo up
  ip -n "${ns[i]}" addr add "${ips[i]}/24" dev "gv$i"
  ip -n "${ns[i]}" link set "gv$i" up
  ip -n "$br_ns" link set "gb$i" master br0 up
  shape "${ns[i]}" "gv$i"
  shape "$br_ns" "gb$i"
  if [[ -n "$notsent_lowat" ]]; then
    ip netns exec "${ns[i]}" sysctl -qw net.ipv4.tcp_notsent_lowat="$notsent_lowat"
  fi
done

# --- goodput: every node sends to the next at once ---------------------------------------------
cat >"$work/tcp_goodput.py" <<'EOF'
import socket, sys, time
if sys.argv[1] == "recv":  # recv PORT BYTES: prints "BYTES SECONDS" from the first byte on
    port, want = int(sys.argv[2]), int(sys.argv[3])
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(1)
    srv.settimeout(30)
    conn, _ = srv.accept()
    conn.settimeout(60)
    buf, got, t0 = bytearray(1 << 20), 0, None
    while got < want:
        n = conn.recv_into(buf)
        if n == 0:
            break
        if t0 is None:
            t0 = time.perf_counter()
        got += n
    print(got, time.perf_counter() - t0)
else:  # send HOST PORT BYTES (retries the connect for up to 10 s while the receiver starts)
    host, port, want = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    deadline = time.monotonic() + 10
    while True:
        try:
            s = socket.create_connection((host, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    s.settimeout(60)
    chunk, sent = bytes(1 << 20), 0
    while sent < want:
        s.sendall(chunk)
        sent += len(chunk)
    s.close()
EOF
goodput_bytes=$((goodput_mib << 20))
ring_n=$n_max
pids=()
for ((i = 0; i < ring_n; ++i)); do
  ip netns exec "${ns[i]}" /usr/bin/python3 "$work/tcp_goodput.py" recv 5201 "$goodput_bytes" \
    >"$work/goodput.$i" &
  pids+=($!)
done
for ((i = 0; i < ring_n; ++i)); do
  ip netns exec "${ns[i]}" /usr/bin/python3 "$work/tcp_goodput.py" send \
    "${ips[(i + 1) % ring_n]}" 5201 "$goodput_bytes" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
goodput=$(cat "$work"/goodput.* | awk '{r = $1 / $2; if (min == "" || r < min) min = r} END {printf "%.0f", min}')
echo "network: $n_max namespaces on a bridge, every veth end shaped with tbf rate $rate" \
  "${notsent_lowat:+(tcp_notsent_lowat $notsent_lowat)}"
echo "TCP goodput, $ring_n nodes each sending $goodput_mib MiB to the next at once:" \
  "$(awk -v g="$goodput" 'BEGIN {printf "%.1f MB/s (%.0f Mbit/s) per node, the slowest", g / 1e6, g * 8 / 1e6}')"

# --- the runs -----------------------------------------------------------------------------------
declare -A grove_s grove_wire grove_cpu grove_build gloo_s
for n in "${proc_list[@]}"; do
  ns_arg=$(IFS=,; echo "${ns[*]:0:n}")
  ip_arg=$(IFS=,; echo "${ips[*]:0:n}")
  "$bench" --procs "$n" --sizes "$sizes" --reps "$reps" --netns "$ns_arg" --hosts "$ip_arg" \
    --raw "${extra[@]}" >"$work/grove.$n" 2>"$work/grove.$n.err" || {
    echo "netns_allreduce.sh: allreduce_bench failed for N=$n:" >&2
    cat "$work/grove.$n" "$work/grove.$n.err" >&2
  }
  while read -r _ p bytes secs wire cpu build; do
    grove_s[$p.$bytes]=$secs
    grove_wire[$p.$bytes]=$wire
    grove_cpu[$p.$bytes]=$cpu
    grove_build[$p.$bytes]=$build
  done < <(grep '^grove ' "$work/grove.$n" || true)

  gpids=()
  for ((r = 0; r < n; ++r)); do
    ip netns exec "${ns[r]}" env GLOO_SOCKET_IFNAME="gv$r" /usr/bin/python3 \
      "$src/bench/gloo_allreduce.py" --rank "$r" --world "$n" --master "${ips[0]}:29500" \
      "$reps" "${size_bytes[@]}" >"$work/gloo.$n.$r" 2>"$work/gloo.$n.$r.err" &
    gpids+=($!)
  done
  gloo_ok=1
  for pid in "${gpids[@]}"; do wait "$pid" || gloo_ok=0; done
  ((gloo_ok)) || { echo "netns_allreduce.sh: Gloo failed for N=$n:" >&2; cat "$work"/gloo."$n".*.err >&2; }
  while read -r _ p bytes secs; do gloo_s[$p.$bytes]=$secs; done < <(grep '^gloo ' "$work/gloo.$n.0" || true)
done

# --- the table ----------------------------------------------------------------------------------
codec="fp16"
for ((k = 0; k < ${#extra[@]}; ++k)); do [[ "${extra[k]}" == --codec ]] && codec="${extra[k + 1]}"; done
echo
echo "all-reduce, median of $reps, slowest member; grove: encrypted, $codec on the wire; Gloo: fp32."
echo "bound = 2(N-1)/N x wire bytes / measured goodput (grove's wire bytes: the most one member"
echo "sent, as counted by its core; Gloo's: 2(N-1)/N x the fp32 tensor); grove cpu: CPU seconds"
echo "of all grove members together during the op ($(nproc) cores here); build: the slowest"
echo "member's time to construct its core (input check, first messages encoded), included in grove s"
printf "%10s %3s %9s %9s %10s %9s %11s %9s %10s %9s %7s\n" size N "grove s" "gloo s" grove/gloo \
  "bound s" grove/bound "gloo bd" gloo/bound "grove cpu" build
for n in "${proc_list[@]}"; do
  for ((k = 0; k < ${#size_list[@]}; ++k)); do
    b="${size_bytes[k]}"
    awk -v size="${size_list[k]}" -v n="$n" -v b="$b" -v g="${grove_s[$n.$b]:--1}" \
      -v w="${grove_wire[$n.$b]:-0}" -v c="${grove_cpu[$n.$b]:-0}" -v l="${gloo_s[$n.$b]:--1}" \
      -v bt="${grove_build[$n.$b]:-0}" -v gp="$goodput" 'BEGIN {
        bound = w / gp; lbound = 2 * (n - 1) / n * b / gp
        printf "%10s %3d %9.3f %9.3f %10s %9.3f %11s %9.3f %10s %9.3f %7.3f\n", size, n, g, l,
          (g > 0 && l > 0) ? sprintf("%.3fx", g / l) : "-", bound,
          (g > 0 && w > 0) ? sprintf("%.3fx", g / bound) : "-", lbound,
          (l > 0) ? sprintf("%.3fx", l / lbound) : "-", c, bt
      }'
  done
done
