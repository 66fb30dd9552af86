#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) in a tree of their own with clang,
# AddressSanitizer and UndefinedBehaviorSanitizer, then runs each for
# SECONDS from its seed corpus (fuzz/corpus/NAME, copied: the checked-in
# seeds stay as they are), as many at once as there are cores. Any crash,
# hang (a unit over 10 s), leak or out-of-memory (2 GiB) fails, and its
# input is kept beside the log. Exit 77 (skipped) without clang or libFuzzer.
#
#   run_fuzzers.sh SOURCE_DIR BUILD_DIR SECONDS [TARGET ...]
#
# CI runs a short round (tests/CMakeLists.txt, in BUILD/fuzz-smoke); the
# documented longer run is SECONDS=3600 per target (docs/operations.md,
# Security) in another tree. A run empties BUILD_DIR/run-NAME, so one
# BUILD_DIR serves one run at a time: a second is refused (a lock).
set -euo pipefail
source_dir=$1
build_dir=$2
seconds=$3
shift 3
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(stage_frame job_spec safetensors coordinator_request)

command -v clang++ >/dev/null || { echo "skipped: clang++ is not installed (deploy/install-deps.sh)"; exit 77; }
if ! echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' |
     clang++ -x c++ -fsanitize=fuzzer - -o /dev/null 2>/dev/null; then
  echo "skipped: clang has no libFuzzer (libclang-rt-dev)"
  exit 77
fi

mkdir -p "$build_dir"
build_dir=$(cd "$build_dir" && pwd)   # the runs cd into their work directories
source_dir=$(cd "$source_dir" && pwd)
exec 9>"$build_dir.lock"
flock -n 9 || { echo "FAIL: another run_fuzzers.sh is using $build_dir (its lock: $build_dir.lock)"; exit 1; }

cmake -S "$source_dir" -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DSHARDLINE_FUZZ=ON -DSHARDLINE_CUDA=OFF -DSHARDLINE_BUILD_TESTS=OFF \
  -DSHARDLINE_BUILD_BENCH=OFF >"$build_dir.configure.log" 2>&1 || { tail -n 30 "$build_dir.configure.log"; exit 1; }
start=$(date +%s)
cmake --build "$build_dir" -j2 --target "${targets[@]/#/fuzz_}" >"$build_dir.build.log" 2>&1 \
  || { grep -E "error|Error" "$build_dir.build.log" | head -n 30; exit 1; }
echo "fuzzers built in $(($(date +%s) - start)) s"

# One target; its report (a line "ok: ..." or "FAIL: ...") in
# $build_dir/run-NAME.report.
fuzz() {
  local target=$1 work=$build_dir/run-$1 seeds runs
  rm -rf "$work" "$work.report"
  mkdir -p "$work/corpus"
  cp "$source_dir/fuzz/corpus/$target"/* "$work/corpus/"
  seeds=$(ls "$work/corpus" | wc -l)
  # -fork=1 would survive a crash to report more; one process keeps it simple.
  if (cd "$work" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
        "$build_dir/bin/fuzz_$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 corpus >"$work/fuzz.log" 2>&1); then
    runs=$(grep -oP 'stat::number_of_executed_units:\s*\K[0-9]+' "$work/fuzz.log" || echo "?")
    echo "ok: fuzz_$target: $runs inputs in ${seconds} s from $seeds seeds, corpus now $(ls "$work/corpus" | wc -l)" \
      >"$work.report"
  else
    { echo "FAIL: fuzz_$target (log and input in $work):"
      grep -E "ERROR|SUMMARY|runtime error|Test unit written" "$work/fuzz.log" | head -n 20; } >"$work.report"
  fi
}

# As many at once as there are cores; the reports in the targets' order.
for target in "${targets[@]}"; do
  while [[ $(jobs -rp | wc -l) -ge $(nproc) ]]; do wait -n || true; done
  fuzz "$target" &
done
wait
failed=0
for target in "${targets[@]}"; do
  report=$build_dir/run-$target.report
  [[ -s $report ]] || echo "FAIL: fuzz_$target left no report" >"$report"
  cat "$report"
  grep -q "^ok: " "$report" || failed=1
done
exit $failed
