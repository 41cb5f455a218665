#!/usr/bin/env bash
# Long fuzzing (not in CI): runs one libFuzzer target of build-asan/ for SECONDS over a corpus that
# persists between runs (seeded from tests/fuzz/corpus/TARGET the first time), so that an hour of
# fuzzing can be spread over several sessions. Each run appends one line to ROOT/TARGET.runs:
# the date, the seconds it ran, the executions, the coverage (libFuzzer's cov and ft), the corpus
# size, the crashes it found, its exit status and the CPU seconds it used; the full log is ROOT/TARGET.<n>.log and crash reproducers go to
# ROOT/artifacts/TARGET/.
#
#   scripts/fuzz-long.sh TARGET SECONDS [ROOT]     (ROOT default: ../fuzz-long, beside the repo)
#   scripts/fuzz-long.sh --total [ROOT]            (seconds and executions per target so far)
set -euo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."

if [[ "${1:-}" == "--total" ]]; then
  root=${2:-../fuzz-long}
  for f in "$root"/*.runs; do
    [[ -f "$f" ]] || continue
    awk -v t="$(basename "$f" .runs)" '{ s += $3; e += $5; cov = $7; ft = $9; n = $11; c += $13
      u += (NF >= 17 ? $17 : $3) }
      END { printf "%-12s %6d s (%6d s CPU)  %12d executions  cov %s ft %s  corpus %s  crashes %d\n",
            t, s, u, e, cov, ft, n, c }' "$f"
  done
  exit 0
fi

if (($# < 2)); then
  echo "usage: scripts/fuzz-long.sh TARGET SECONDS [ROOT] | --total [ROOT]" >&2
  exit 2
fi
target=$1
seconds=$2
root=${3:-../fuzz-long}
bin=${FUZZ_BUILD:-build-asan}/tests/fuzz/fuzz_$target
[[ -x "$bin" ]] || { echo "fuzz-long: no $bin (build build-asan/ first)" >&2; exit 2; }
[[ "$seconds" =~ ^[0-9]+$ ]] || { echo "fuzz-long: SECONDS must be a number" >&2; exit 2; }
corpus=$root/$target
mkdir -p "$corpus" "$root/artifacts/$target"
if [[ -z "$(ls -A "$corpus")" ]]; then cp -R "tests/fuzz/corpus/$target/." "$corpus/"; fi
n=$(find "$root" -maxdepth 1 -name "$target.*.log" | wc -l)
log=$root/$target.$((n + 1)).log
crashes_before=$(find "$root/artifacts/$target" -maxdepth 1 -type f | wc -l)
started=$(date +%s)
TIMEFORMAT=%U
set +e
{ time UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 "$bin" -max_total_time="$seconds" \
  -max_len=70000 -rss_limit_mb=2048 -timeout=25 -print_final_stats=1 \
  -artifact_prefix="$root/artifacts/$target/" "$corpus" >"$log" 2>&1; } 2>"$log.cpu"
rc=$?
set -e
elapsed=$(($(date +%s) - started))
cpu=$(cut -d. -f1 <"$log.cpu")
rm -f "$log.cpu"
execs=$(grep -oE '^stat::number_of_executed_units: [0-9]+' "$log" | grep -oE '[0-9]+$' || echo 0)
last=$(grep -E '#[0-9]+.*cov: [0-9]+' "$log" | tail -n 1)
cov=$(grep -oE 'cov: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || echo 0)
ft=$(grep -oE 'ft: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || echo 0)
crashes=$(($(find "$root/artifacts/$target" -maxdepth 1 -type f | wc -l) - crashes_before))
size=$(ls "$corpus" | wc -l)
printf '%s seconds %s execs %s cov %s ft %s corpus %s crashes %s rc %s cpu %s\n' \
  "$(date -u +%FT%TZ)" "$elapsed" "$execs" "$cov" "$ft" "$size" "$crashes" "$rc" "$cpu" \
  >>"$root/$target.runs"
tail -n 1 "$root/$target.runs"
exit "$rc"
