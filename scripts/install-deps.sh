#!/usr/bin/env bash
# Installs the build and test dependencies of grove-node on Debian 12 (run as root; no sudo).
# Idempotent: when every package is already installed, apt is not touched at all.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config ccache
  clang libclang-rt-14-dev          # libFuzzer and the sanitizer runtimes for clang
  libboost-dev libsodium-dev libmsgpack-cxx-dev libavahi-client-dev libspdlog-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libtorch-dev libopenblas0-pthread # OpenBLAS: ~11x faster libtorch CPU training than reference BLAS
  python3-torch                     # reference checks and the Gloo baseline (/usr/bin/python3)
  python3-numpy python3-msgpack     # the grove Python package (node/python): trainers
  python3-matplotlib                # grove-node plot, the benchmarks' plots
  avahi-daemon dbus-daemon          # LAN discovery tests run a private daemon pair
  libminiupnpc-dev                  # UPnP IGD port mapping on home routers
  libncurses-dev                    # grove-node top: the live dashboard
  tmux                              # the dashboard's test: a real terminal to draw in
  nftables                          # the NAT tests: routers that masquerade, in namespaces
  miniupnpd-nftables                # the NAT tests: a home router that maps ports over UPnP
  git
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages already installed; skipping apt"
  exit 0
fi

echo "install-deps: missing ${#missing[@]} of ${#packages[@]}: ${missing[*]}"
if [[ $(id -u) -ne 0 ]]; then
  echo "install-deps: must run as root to install them (no sudo is used)" >&2
  exit 1
fi
echo "install-deps: apt-get update"
apt-get update
echo "install-deps: apt-get install (all ${#packages[@]}; apt skips the installed ones)"
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${packages[@]}"
echo "install-deps: done"
