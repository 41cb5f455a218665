#!/usr/bin/env bash
# cmake --install into a temporary prefix, then what a user of the installed tree runs: the
# installed grove-node's --version and --help, its manual page, the grove package imported by
# /usr/bin/python3 from where it was installed, and the systemd unit naming the installed binary.
# usage: install_test.sh BUILD_DIR
set -euo pipefail
build=$(readlink -f "$1")
prefix=$(mktemp -d /tmp/grove-install.XXXXXX)
trap 'rm -rf "$prefix"' EXIT
fail() { echo "install_test: FAIL: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" > "$prefix.log" 2>&1 || { cat "$prefix.log"; fail "cmake --install"; }
rm -f "$prefix.log"

bin="$prefix/bin/grove-node"
[[ -x "$bin" ]] || fail "no $bin"
version=$("$bin" --version)
[[ "$version" =~ ^grove-node\ [0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "--version printed '$version'"
"$bin" --help > "$prefix/help.txt" || fail "--help failed"
grep -q -- "--bootstrap" "$prefix/help.txt" || fail "--help does not list --bootstrap"

man="$prefix/share/man/man1/grove-node.1"
[[ -s "$man" ]] || fail "no manual page at $man"
grep -q '^\.TH GROVE\\-NODE 1' "$man" || fail "the manual page has no .TH line"
grep -q 'swarm\\-key' "$man" || fail "the manual page lacks the options of --help"
if command -v groff > /dev/null; then
  groff -man -Tutf8 -ww "$man" > /dev/null 2> "$prefix/groff.err" || fail "groff: $(cat "$prefix/groff.err")"
  [[ ! -s "$prefix/groff.err" ]] || fail "groff warns: $(cat "$prefix/groff.err")"
fi

pydir=$(ls -d "$prefix"/lib/python3*/dist-packages 2> /dev/null | head -1)
[[ -n "$pydir" && -f "$pydir/grove/__init__.py" ]] || fail "no grove package under $prefix/lib"
# Imported from the installed tree (not the source's node/python), with Debian's python3; the
# package needs torch, numpy and msgpack: without them (a machine with no python3-torch) only
# the files are checked.
if /usr/bin/python3 -c "import torch, numpy, msgpack" 2> /dev/null; then
  where=$(cd / && PYTHONPATH="$pydir" /usr/bin/python3 -c "import grove; print(grove.__file__)")
  [[ "$where" == "$pydir/grove/__init__.py" ]] || fail "grove imported from $where, not $pydir"
  (cd / && PYTHONPATH="$pydir" /usr/bin/python3 -c "import grove; grove.attach; grove.init; grove.average_gradients") \
    || fail "the installed package lacks its calls"
else
  echo "install_test: python3-torch/numpy/msgpack missing: the package's files checked, not its import"
fi

unit="$prefix/lib/systemd/system/grove-node@.service"
[[ -f "$unit" ]] || fail "no systemd unit at $unit"
grep -q "^ExecStart=$bin --state-dir /var/lib/grove-node/%i" "$unit" || fail "the unit does not run $bin: $(grep ExecStart "$unit")"
[[ -f "$prefix/share/doc/grove-node/example.conf" ]] || fail "no example.conf"
[[ -f "$prefix/share/doc/grove-node/examples/ddp.py" ]] || fail "no examples"
# The Debian package (cpack -G DEB): its dependencies are Debian's package names (from
# dpkg-shlibdeps), and it installs under /usr with the unit naming /usr/bin/grove-node.
if command -v dpkg-shlibdeps > /dev/null; then
  (cd "$build" && cpack -G DEB -B "$prefix/deb" > "$prefix/cpack.log" 2>&1) || { cat "$prefix/cpack.log"; fail "cpack -G DEB"; }
  deb=$(ls "$prefix"/deb/grove-node_*.deb 2> /dev/null | head -1)
  [[ -f "$deb" ]] || fail "cpack made no .deb"
  depends=$(dpkg-deb -f "$deb" Depends)
  [[ "$depends" == *libsodium23* ]] || fail "the .deb does not depend on libsodium23: $depends"
  IFS=',' read -ra deps <<< "$depends"
  for d in "${deps[@]}"; do
    name=$(sed -E 's/^ *([^ (]+).*/\1/' <<< "$d")
    [[ "$name" =~ ^[a-z0-9][a-z0-9.+-]+$ ]] || fail "'$d' in Depends is not a Debian package name"
  done
  dpkg-deb -c "$deb" > "$prefix/deb.list" || fail "dpkg-deb -c"
  grep -q " ./usr/bin/grove-node$" "$prefix/deb.list" || fail "the .deb has no /usr/bin/grove-node"
  grep -q "./usr/lib/python3/dist-packages/grove/__init__.py" "$prefix/deb.list" ||
    fail "the .deb has no grove package"
  dpkg-deb --fsys-tarfile "$deb" > "$prefix/deb.tar" || fail "dpkg-deb --fsys-tarfile"
  tar -xOf "$prefix/deb.tar" ./usr/lib/systemd/system/grove-node@.service > "$prefix/unit" ||
    fail "no unit in the .deb"
  grep -q "^ExecStart=/usr/bin/grove-node " "$prefix/unit" || fail "the .deb's unit does not run /usr/bin/grove-node"
fi
echo "install_test: OK ($version, package in ${pydir#$prefix/}, unit, manual page)"
