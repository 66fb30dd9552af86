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

# A gtest suite's CUDA instances (as CTest's `gpu` entries run them); a skip
# counts as a failure here, since this machine is supposed to have the device.
# Tests that need more GPUs than it has are left out by name, and the figure
# says so, so that no skip is expected.
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
run_suite() {
  local name=$1 log=$out/$1.log filter=${2:-'*/cuda0:CudaFactoryTest.*'} left_out=""
  if [ "$gpus" -lt 2 ]; then
    filter="$filter-CudaFactoryTest.SecondDeviceWorksFromAThreadUsingTheFirst"
    [ "$name" = backend_transfer_test ] && left_out=" (2-GPU test not run: $gpus GPU)"
  fi
  timeout 300 "$work/bin/$name" --gtest_filter="$filter" >"$log" 2>&1
  local rc=$?
  local passed skipped failed_n
  passed=$(grep -oP '\[  PASSED  \] \K[0-9]+' "$log" | tail -n 1)
  skipped=$(grep -oP '\[  SKIPPED \] \K[0-9]+(?= test)' "$log" | tail -n 1)
  failed_n=$(grep -oP '\[  FAILED  \] \K[0-9]+(?= test)' "$log" | tail -n 1)
  local result=PASS
  if [ $rc -ne 0 ] || [ "${skipped:-0}" != 0 ]; then result=FAIL; failed=1; fi
  rows+=("$name|$result|passed ${passed:-0}, failed ${failed_n:-0}, skipped ${skipped:-0}$left_out")
}

# worker_pipeline_equivalence_test: four stages on cuda:0 against the
# reference trainer on cuda:0 (the asynchronous copies and the stage sender).
for suite in backend_conformance_test backend_transfer_test backend_errors_test gradient_check_test \
             worker_pipeline_equivalence_test; do
  run_suite "$suite"
done
# Both collectives (in-process and gRPC between ranks) on cuda:0 buffers.
run_suite worker_collective_test '*_cuda0'


# A few training steps of a small GPT on cuda:0 and on the CPU: the losses
# must agree (FP32 on both; cuBLAS and OpenBLAS sum in different orders, and
# AdamW amplifies that a little over the steps): relative 2e-3 per step.
cat >"$work/tiny.json" <<'SPEC'
{"name": "gpu-check",
 "model": {"kind": "gpt", "vocab_size": 16, "context": 16, "d_model": 128, "n_heads": 4, "n_layers": 4},
 "data": {"kind": "addition", "digits": 2},
 "train": {"steps": 20, "global_batch": 64, "micro_batches": 4, "seed": 1, "log_every": 1,
           "eval_examples": 100, "optimizer": {"kind": "adamw", "lr": 0.001, "warmup_steps": 5}}}
SPEC
train_ok=1
for dev in cpu cuda:0; do
  timeout 120 "$work/bin/shardline-train" "$work/tiny.json" --device="$dev" \
    --metrics_out="$out/train_${dev%%:*}.jsonl" --out="$work/w_${dev%%:*}.safetensors" \
    >"$out/train_${dev%%:*}.log" 2>&1 || train_ok=0
done
if [ $train_ok = 1 ]; then
  figure=$(python3 - "$out/train_cpu.jsonl" "$out/train_cuda.jsonl" <<'PY'
import json, sys
def losses(p):
    return [r["loss"] for r in map(json.loads, open(p)) if "loss" in r]
cpu, gpu = losses(sys.argv[1]), losses(sys.argv[2])
worst = max(abs(a - b) / abs(a) for a, b in zip(cpu, gpu))
ok = len(cpu) == len(gpu) == 20 and worst <= 2e-3
print(("PASS" if ok else "FAIL") + f"|20 steps, worst relative loss gap {worst:.2e} (limit 2e-3)")
PY
)
  rows+=("train_cuda_vs_cpu|$figure")
  case "$figure" in PASS*) ;; *) failed=1 ;; esac
else
  rows+=("train_cuda_vs_cpu|FAIL|see train_*.log")
  failed=1
fi
if timeout 120 "$work/bin/bench_train" --device=cuda:0 --json="$out/bench_train.json" \
     >"$out/bench_train.log" 2>&1; then
  rows+=("bench_train|PASS|$(awk '$1 == "large" {print "large model " $7 " tok/s"}' "$out/bench_train.log")")
else
  rows+=("bench_train|FAIL|see bench_train.log")
  failed=1
fi

bench_log=$out/bench_backend.log
if timeout 240 "$work/bin/bench_backend" --devices=cuda:0 --gemm_sizes=1024,4096,8192 \
     --json="$out/bench_backend.json" >"$bench_log" 2>&1; then
  gemm=$(awk '$2 == "gemm" && $3 == "8192x8192x8192" {print $5}' "$bench_log")
  rows+=("bench_backend|PASS|fp32 GEMM 8192^3: ${gemm:-?} GFLOP/s")
else
  rows+=("bench_backend|FAIL|see bench_backend.log")
  failed=1
fi

# Pinned vs pageable copies, a D2H copy under running GEMMs (raw CUDA, and our
# Backend's CopyToHostAsync with GEMMs queued behind it), and GPU → wire → GPU
# hops of 16 and 64 MiB checked byte for byte.
transport_log=$out/bench_gpu_transport.log
if timeout 180 "$work/bin/bench_gpu_transport" --json="$out/bench_gpu_transport.json" \
     >"$transport_log" 2>&1; then
  figure=$(python3 - "$out/bench_gpu_transport.json" <<'PY'
import json, sys
rows = {(r["check"], r["bytes"]): r for r in json.load(open(sys.argv[1]))}
parts = []
for (check, size), r in sorted(rows.items()):
    if check.startswith("copy_"):
        parts.append(f"{check[5:]} H2D {r['h2d_gbps']:.1f} / D2H {r['d2h_gbps']:.1f} GB/s")
    elif check == "d2h_under_gemm":
        parts.append(f"D2H under GEMM overlap {r['overlap']:.2f}")
    elif check == "backend_d2h_under_gemm":
        parts.append(f"Backend CopyToHostAsync under GEMM overlap {r['overlap']:.2f}")
    elif check == "backend_h2d_under_gemm":
        parts.append(f"Backend upload after a mark under GEMM overlap {r['overlap']:.2f}")
    else:
        parts.append(f"hop {size / 2**20:.0f} MiB {r['hop_gbps']:.2f} GB/s")
print("; ".join(parts))
PY
)
  rows+=("bench_gpu_transport|PASS|$figure")
else
  rows+=("bench_gpu_transport|FAIL|see bench_gpu_transport.log")
  failed=1
fi

# The whole stage path on the GPU: 2 and 4 stages on cuda:0 over real gRPC
# links (pinned slots, the sender, uploads alongside compute), against the
# trainer on cuda:0: losses must agree (relative 1e-4), efficiency reported.
pipeline_log=$out/bench_pipeline.log
if timeout 240 "$work/bin/bench_pipeline" --device=cuda:0 --stages=2,4 --steps=4 \
     --json="$out/bench_pipeline.json" >"$pipeline_log" 2>&1; then
  figure=$(python3 - "$out/bench_pipeline.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
gap = max(r["max_loss_gap"] for r in rows)
parts = [f"p={int(r['stages'])}: {r['tokens_per_s']:.0f} tok/s, eff/bound {r['efficiency_vs_bound']:.2f}"
         for r in rows]
print(("PASS" if gap <= 1e-4 else "FAIL") + "|" + "; ".join(parts) + f"; loss gap {gap:.1e} (limit 1e-4)")
PY
)
  rows+=("bench_pipeline_cuda|$figure")
  case "$figure" in PASS*) ;; *) failed=1 ;; esac
else
  rows+=("bench_pipeline_cuda|FAIL|see bench_pipeline.log")
  failed=1
fi

cat "$bench_log" "$out/bench_train.log" "$transport_log" "$pipeline_log" 2>/dev/null
echo
echo "== Shardline GPU check (commit $(cat "$bundle/commit" 2>/dev/null || echo ?)) =="
echo "device: ${device:-none found}   driver: ${driver:-?}"
printf '%-34s %-6s %s\n' check result figure
for row in "${rows[@]}"; do
  IFS='|' read -r name result figure <<<"$row"
  printf '%-34s %-6s %s\n' "$name" "$result" "$figure"
done
exit $failed
