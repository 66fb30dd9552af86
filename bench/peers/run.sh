#!/usr/bin/env bash
# Peer benchmark: shardline-train against PyTorch (bench/peers/torch_gpt.py)
# on the same GPT, initial weights and batches, in one run, taking turns:
# the 25.5M-parameter model (d_model 512, 8 layers, context 128, batch 16 in 4
# micro-batches) and the default addition model. PyTorch runs twice: with its
# fused attention (scaled_dot_product_attention) and eager (matmul, mask,
# softmax). Then two-stage pipelines of the 25.5M model (8 micro-batches of 2
# sequences, one thread per stage): bench_pipeline --stages=2 (stages over
# gRPC on loopback), with 1F1B and with the zero-bubble schedule, against
# torch.distributed.pipelining (two processes, gloo) with 1F1B and with its
# zero-bubble ScheduleZBVZeroBubble (which needs two stages per rank in a V:
# four chunks of two blocks). Prints a table (median step, wall time of the timed steps, tokens/s,
# the largest loss difference from ours) and writes JSON.
#
#   bench/peers/run.sh [BUILD_DIR] [--threads=N] [--large_steps=N] [--addition_steps=N]
#                      [--pipeline_steps=N] [--json=FILE]
#
# Needs the peers venv (bench/peers/setup.sh; created on first use). Never run
# by CI: it downloads PyTorch.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=build
threads=2 large_steps=12 addition_steps=120 pipeline_steps=8 json=""
for arg in "$@"; do
  case $arg in
    --threads=*) threads=${arg#*=} ;;
    --large_steps=*) large_steps=${arg#*=} ;;
    --addition_steps=*) addition_steps=${arg#*=} ;;
    --pipeline_steps=*) pipeline_steps=${arg#*=} ;;
    --json=*) json=${arg#*=} ;;
    -*) echo "unknown flag $arg" >&2; exit 2 ;;
    *) build=$arg ;;
  esac
done
build=$(cd "$build" && pwd)
train=$build/bin/shardline-train
[[ -x $train ]] || { echo "no $train: build first" >&2; exit 2; }
venv=${SHARDLINE_PEERS_VENV:-$HOME/.cache/shardline/peers-venv}
[[ -x $venv/bin/python ]] || "$here/setup.sh"
py=$venv/bin/python

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The machine, in every row: the peers' ratios depend on it (MKL is slower on
# AMD CPUs than on Intel ones, docs/benchmarks.md).
cpu=$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
torch_version=$("$py" -c 'import torch; print(torch.__version__)')
echo "# $cpu, $(nproc) cores; $("$build/bin/shardline-train" --version 2>/dev/null | head -1); torch $torch_version" >&2
text=/usr/share/common-licenses/GPL-3

# spec NAME STEPS LR WARMUP: the benchmark's two models.
spec() {
  local model data batch
  if [[ $1 == large || $1 == pipeline ]]; then
    model='"vocab_size": 256, "context": 128, "d_model": 512, "n_heads": 8, "n_layers": 8'
    data="\"kind\": \"text_bytes\", \"path\": \"$text\""
    batch='"global_batch": 16, "micro_batches": 4'
    [[ $1 == pipeline ]] && batch='"global_batch": 16, "micro_batches": 8'  # bench_pipeline's Spec(2, 1)
  else
    model='"vocab_size": 16, "context": 16, "d_model": 128, "n_heads": 4, "n_layers": 4'
    data='"kind": "addition", "digits": 2'
    batch='"global_batch": 64, "micro_batches": 8'
  fi
  cat <<EOF
{"name": "$1", "model": {"kind": "gpt", $model}, "data": {$data},
 "train": {"steps": $2, $batch, "seed": 1, "log_every": 1, "eval_examples": 16,
           "optimizer": {"kind": "adamw", "lr": $3, "warmup_steps": $4}}}
EOF
}

for model in large addition; do
  steps=$large_steps lr=0.0003 warmup=10
  [[ $model == addition ]] && steps=$addition_steps lr=0.001 warmup=10
  # The initial weights, as PyTorch loads them: one step at lr 1e-9 (the
  # smallest a spec allows) moves them by at most ~1e-10.
  spec "$model" 1 1e-9 0 > "$work/$model-init.json"
  "$train" "$work/$model-init.json" --threads="$threads" --out="$work/$model-init.safetensors" \
    --metrics_out="$work/$model-init.jsonl" > /dev/null
  spec "$model" "$steps" "$lr" "$warmup" > "$work/$model.json"
  echo "# $model: shardline-train, torch fused, torch eager, $steps steps each, $threads threads" >&2
  OPENBLAS_NUM_THREADS=$threads "$train" "$work/$model.json" --threads="$threads" \
    --metrics_out="$work/$model-shardline.jsonl" --out="$work/$model-out.safetensors" > /dev/null
  for attention in fused eager; do
    "$py" "$here/torch_gpt.py" "$work/$model.json" --init="$work/$model-init.safetensors" --steps="$steps" \
      --threads="$threads" --attention=$attention > "$work/$model-torch-$attention.jsonl"
  done
done

# Pipelines: the spec bench_pipeline trains (no warm-up), the large model's
# initial weights. Our losses from shardline-train on it (bench_pipeline's
# max_loss_gap shows the pipeline's equal the trainer's).
spec pipeline 1000 0.0003 0 > "$work/pipeline.json"
echo "# pipeline: bench_pipeline --stages=2 (1f1b, zb), torch.distributed.pipelining, $pipeline_steps steps each" >&2
"$build/bin/bench_pipeline" --stages=2 --schedule=1f1b,zb --threads="$threads" --steps="$pipeline_steps" \
  --json="$work/pipeline-bench.json" > /dev/null
timeout 600 "$train" "$work/pipeline.json" --threads="$threads" --metrics_out="$work/pipeline-shardline.jsonl" \
  --out="$work/pipeline-out.safetensors" > /dev/null 2>&1 &
train_pid=$!
# Only the first steps' losses are needed: stop it once they are written.
logged() { grep -c '"step"' "$work/pipeline-shardline.jsonl" 2>/dev/null || true; }
while kill -0 $train_pid 2>/dev/null; do
  count=$(logged)
  (( ${count:-0} > pipeline_steps )) && break
  sleep 0.5
done
kill $train_pid 2>/dev/null || true
wait $train_pid 2>/dev/null || true
stage_threads=$(( threads / 2 > 0 ? threads / 2 : 1 ))
# The rank with the head prints the steps: rank 1 under 1F1B, rank 0 under ZBV.
for schedule in 1f1b zbv; do
  quiet=0 loud=1
  [[ $schedule == zbv ]] && quiet=1 loud=0
  rm -f "$work/store"
  "$py" "$here/torch_gpt.py" "$work/pipeline.json" --init="$work/large-init.safetensors" --steps=$((pipeline_steps + 1)) \
    --threads=$stage_threads --pipeline_rank=$quiet --pipeline_store="$work/store" --pipeline_schedule=$schedule > /dev/null &
  quiet_pid=$!
  "$py" "$here/torch_gpt.py" "$work/pipeline.json" --init="$work/large-init.safetensors" --steps=$((pipeline_steps + 1)) \
    --threads=$stage_threads --pipeline_rank=$loud --pipeline_store="$work/store" --pipeline_schedule=$schedule \
    > "$work/pipeline-torch-$schedule.jsonl"
  wait $quiet_pid
done

"$py" - "$work" "$json" "$cpu" "$torch_version" <<'EOF'
import json, statistics, sys
work, out, cpu, torch_version = sys.argv[1:5]
rows = []
for model in ("large", "addition"):
    def load(name):
        return [json.loads(l) for l in open(f"{work}/{model}-{name}.jsonl") if '"step"' in l and '"eval"' not in l]
    ours = load("shardline")
    tokens = load("torch-fused")[0]["tokens"]  # per step, the same batches in both
    # Our step time from the per-step tokens/s (log_every 1); step 1 (warm-up) left out.
    timed = {"shardline": [tokens / r["tokens_per_s"] for r in ours[1:]]}
    losses = {"shardline": [r["loss"] for r in ours]}
    for attention in ("fused", "eager"):
        theirs = load(f"torch-{attention}")
        timed[f"torch {attention}"] = [r["seconds"] for r in theirs[1:]]
        losses[f"torch {attention}"] = [r["loss"] for r in theirs]
    for name in timed:
        median = statistics.median(timed[name])
        wall = sum(timed[name])
        diff = max(abs(a - b) / abs(b) for a, b in zip(losses[name], losses["shardline"]))
        rows.append({"model": model, "run": name, "steps": len(timed[name]), "median_step_ms": median * 1e3,
                     "wall_s": wall, "tokens_per_s": tokens * len(timed[name]) / wall,
                     "max_rel_loss_diff": diff})
    for row in rows[-3:]:
        ref = rows[-3]
        row["shardline_speedup_median"] = (row["median_step_ms"] / ref["median_step_ms"])
        row["shardline_speedup_wall"] = row["wall_s"] / ref["wall_s"]
# Pipelines: ours from bench_pipeline's rows (1F1B, then zero-bubble), theirs
# (1F1B, then ZBV) per step.
bench = json.load(open(f"{work}/pipeline-bench.json"))
bench_rows = bench if isinstance(bench, list) else bench["rows"]
ours_losses = [json.loads(l)["loss"] for l in open(f"{work}/pipeline-shardline.jsonl") if '"eval"' not in l]
def torch_row(schedule):
    theirs = [json.loads(l) for l in open(f"{work}/pipeline-torch-{schedule}.jsonl") if '"step"' in l]
    timed = [r["seconds"] for r in theirs[1:]]
    return {"model": "pipeline", "run": f"torch {schedule}", "steps": len(timed),
            "median_step_ms": statistics.median(timed) * 1e3, "wall_s": sum(timed),
            "tokens_per_s": theirs[0]["tokens"] * len(timed) / sum(timed),
            "max_rel_loss_diff": max(abs(a["loss"] - b) / abs(b) for a, b in zip(theirs, ours_losses))}
theirs_rows = [torch_row("1f1b"), torch_row("zbv")]
ours_rows = []
for row in bench_rows:
    ours_rows.append({"model": "pipeline", "run": "shardline zb" if row["zero_bubble"] else "shardline",
                      "steps": int(row["timed_steps"]), "median_step_ms": row["median_step_ms"],
                      "wall_s": row["wall_s"], "tokens_per_s": row["tokens_per_s"],
                      "max_rel_loss_diff": row["max_loss_gap"]})
# "ours x": each row's step ÷ our 1F1B row's; the ratios of our zero-bubble
# row to each of PyTorch's are printed under the table.
for r in ours_rows + theirs_rows:
    r["shardline_speedup_median"] = r["median_step_ms"] / ours_rows[0]["median_step_ms"]
    r["shardline_speedup_wall"] = (r["wall_s"] / r["steps"]) / (ours_rows[0]["wall_s"] / ours_rows[0]["steps"])
pipeline_ratios = [(o, t, t["median_step_ms"] / o["median_step_ms"],
                    (t["wall_s"] / t["steps"]) / (o["wall_s"] / o["steps"])) for o in ours_rows for t in theirs_rows]
rows += ours_rows + theirs_rows
print(f"{'model':9} {'run':12} {'steps':>5} {'median_ms':>10} {'wall_s':>8} {'tok/s':>8} {'ours x (median)':>15} "
      f"{'ours x (wall)':>13} {'max loss diff':>13}")
for r in rows:
    print(f"{r['model']:9} {r['run']:12} {r['steps']:5d} {r['median_step_ms']:10.1f} {r['wall_s']:8.2f} "
          f"{r['tokens_per_s']:8.0f} {r['shardline_speedup_median']:15.2f} {r['shardline_speedup_wall']:13.2f} "
          f"{r['max_rel_loss_diff']:13.1e}")
for o, t, median, wall in pipeline_ratios:
    print(f"pipeline: {o['run']} x {t['run']}: {median:.2f} by median step, {wall:.2f} by wall time")
if out:
    for r in rows:
        r["cpu"], r["torch"] = cpu, torch_version
    json.dump(rows, open(out, "w"), indent=1)
EOF
