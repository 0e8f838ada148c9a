#!/usr/bin/env bash
# Builds the libFuzzer targets (build-fuzz/, clang-14, -DBFTFS_FUZZ=ON), seeds their corpora with valid
# encodings (fuzz/corpus-<target>/), and runs every target for FUZZ_RUNS executions.
#
#   scripts/fuzz.sh                      # every target, 100000 runs each
#   FUZZ_RUNS=10000000 scripts/fuzz.sh   # a long campaign
#   scripts/fuzz.sh fuzz_frame fuzz_record   # only these targets
#
# Environment: FUZZ_RUNS (default 100000), FUZZ_BUILD_DIR (default build-fuzz), FUZZ_JOBS (ninja -j, default 2),
# FUZZ_MAX_LEN (libFuzzer -max_len, default 65536), FUZZ_TIMEOUT_S (per-input timeout, default 10).
# Prints, per target, the executions done, exec/s and whether it crashed; exits 1 if any target crashed (the
# crashing input is left as fuzz/crash-<target>-*, reproduce with `build-fuzz/fuzz/<target> <file>`).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${FUZZ_BUILD_DIR:-$root/build-fuzz}"
runs="${FUZZ_RUNS:-100000}"
jobs="${FUZZ_JOBS:-2}"
max_len="${FUZZ_MAX_LEN:-65536}"
timeout_s="${FUZZ_TIMEOUT_S:-10}"
logs="$build/fuzz-logs"

CC=clang-14 CXX=clang++-14 cmake -G Ninja -S "$root" -B "$build" -DBFTFS_FUZZ=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null

if [[ $# -gt 0 ]]; then
  targets=("$@")
else
  mapfile -t targets < <(grep -v '^$' "$build/fuzz_targets.txt")
fi
ninja -C "$build" -j "$jobs" fuzz_seed_corpus "${targets[@]}"

"$build/fuzz/fuzz_seed_corpus" "$root/fuzz"
mkdir -p "$logs"

crashed=0
printf '%-26s %12s %10s %8s  %s\n' target executions exec/s seconds result
for t in "${targets[@]}"; do
  corpus="$root/fuzz/corpus-$t"
  mkdir -p "$corpus"
  log="$logs/$t.log"
  start=$(date +%s.%N)
  set +e
  "$build/fuzz/$t" -runs="$runs" -max_len="$max_len" -timeout="$timeout_s" -print_final_stats=1 \
    -artifact_prefix="$root/fuzz/crash-$t-" "$corpus" >"$log" 2>&1
  rc=$?
  set -e
  end=$(date +%s.%N)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  seconds=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
  # libFuzzer's own average truncates to whole seconds of run time; the wall-clock rate includes loading the
  # corpus, which is small next to a long run.
  rate=$(awk -v n="${execs:-0}" -v a="$start" -v b="$end" 'BEGIN { printf "%.0f", n / (b - a) }')
  if [[ $rc -eq 0 ]]; then
    result=ok
  else
    result="CRASHED (rc=$rc, log $log)"
    crashed=1
  fi
  printf '%-26s %12s %10s %8s  %s\n' "$t" "${execs:-?}" "${rate:-?}" "$seconds" "$result"
done
exit "$crashed"
