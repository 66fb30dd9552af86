#!/usr/bin/env bash
# Runs on the GPU machine, from the repo root, with the bundle made by
# tests/gpu/pack.sh: the gpu-labelled test suites on cuda:0 and the backend
# benchmark, then a short table (device, driver, each check's result and
# figure). Writes logs and JSON under $OUT when it is set. Exit status is
# non-zero when any check failed. Budget: well under 8 minutes.
set -uo pipefail

bundle=${1:-.gpu-bundle}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

[ -f "$bundle/bundle.tar.xz" ] || { echo "run: no $bundle/bundle.tar.xz; run tests/gpu/pack.sh first" >&2; exit 2; }
python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
  "$bundle/bundle.tar.xz" "$work" || exit 2

# CUDA's runtime and cuBLAS come from the machine: the toolkit, or the wheels.
libpath=$work/lib
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && libpath=$libpath:$d
done
for d in $(python3 -c 'import nvidia, os; p = nvidia.__path__[0]; print(" ".join(os.path.join(p, s, "lib") for s in os.listdir(p)))' 2>/dev/null); do
  [ -d "$d" ] && libpath=$libpath:$d
done
export LD_LIBRARY_PATH=$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export GLOG_logtostderr=1

device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)
rows=()
failed=0

# A gtest suite's CUDA instances; a skip counts as a failure here, since this
# machine is supposed to have the device.
run_suite() {
  local name=$1 log=$out/$1.log
  timeout 300 "$work/bin/$name" --gtest_filter='*/cuda0:BackendFactoryTest.*' >"$log" 2>&1
  local rc=$?
  local passed skipped failed_n
  passed=$(grep -oP '\[  PASSED  \] \K[0-9]+' "$log" | tail -n 1)
  skipped=$(grep -oP '\[  SKIPPED \] \K[0-9]+(?= test)' "$log" | tail -n 1)
  failed_n=$(grep -oP '\[  FAILED  \] \K[0-9]+(?= test)' "$log" | tail -n 1)
  local result=PASS
  if [ $rc -ne 0 ] || [ "${skipped:-0}" != 0 ]; then result=FAIL; failed=1; fi
  rows+=("$name|$result|passed ${passed:-0}, failed ${failed_n:-0}, skipped ${skipped:-0}")
}

for suite in backend_conformance_test backend_errors_test gradient_check_test; do
  run_suite "$suite"
done

bench_log=$out/bench_backend.log
if timeout 240 "$work/bin/bench_backend" --devices=cuda:0 --gemm_sizes=1024,4096,8192 \
     --json="$out/bench_backend.json" >"$bench_log" 2>&1; then
  gemm=$(awk '$2 == "gemm" && $3 == "8192x8192x8192" {print $5}' "$bench_log")
  rows+=("bench_backend|PASS|fp32 GEMM 8192^3: ${gemm:-?} GFLOP/s")
else
  rows+=("bench_backend|FAIL|see bench_backend.log")
  failed=1
fi

cat "$bench_log"
echo
echo "== Shardline GPU check (commit $(cat "$bundle/commit" 2>/dev/null || echo ?)) =="
echo "device: ${device:-none found}   driver: ${driver:-?}"
printf '%-28s %-6s %s\n' check result figure
for row in "${rows[@]}"; do
  IFS='|' read -r name result figure <<<"$row"
  printf '%-28s %-6s %s\n' "$name" "$result" "$figure"
done
exit $failed
