#!/usr/bin/env bash
# bench_heterogeneous: the planner's layout against the naive one on an
# uneven cluster (deploy/testbed/): two racks of two workers, 1 Gbit/s
# inside each rack, a 20× slower uplink (50 Mbit/s) between them, and one
# worker at half the CPU of the others (cgroup caps: 0.4 CPU each, b2 0.2).
# One job shape, p = 2 stages × d = 2 replicas of an 8-block model on the
# addition task, trained with parallel.placement "planned" (the
# coordinator's search on the measured rates and links) and "in_order"
# (the workers in registration order, the cut as if all were equally fast:
# the naive even split), on the same cluster with the same measurements.
# First a short planned job on the fresh cluster ("first": predicted from
# the GEMM probes alone), whose reports give the coordinator each worker's
# achieved rate; then the two measured jobs; last, the planner's layout
# again with parallel.wire_dtype "auto" (8-bit blocks on the hops the plan
# finds slow: here the ones across the uplink), and the naive layout with
# "auto" (its all-reduces cross the uplink: 8-bit blocks with error
# feedback where the plan finds them slow). Last, a planned job during which
# a1's CPU share drops to 0.1 at step 15 (its machine got busier): tokens/s
# before, slowed, and after the coordinator re-planned; and on a fresh
# testbed with a spare worker in rack a, a planned job during which the link
# of the worker holding stage 1 of replica 1 drops to 5 Mbit/s at step 15
# (mode link_slowdown); and (mode recovery, run before slowdown) the same
# slowdown, a1 getting its 0.4 CPU back 12 steps after the re-plan: tokens/s
# once the coordinator moved the job back; and (mode idle_recovery, a testbed
# with a slower spare a3 at 0.2 CPU) a1 cut to 0.05 CPU, moved out to the
# spare, given its share back while idle: the job moves back once a fresh
# GEMM probe of a1 sets its slow reports aside; and (mode link_recovery, a
# testbed whose spare a3 has 0.1 CPU) link_slowdown's cut, moved out to the
# spare, the link given its 1 Gbit/s back 12 steps later: the job moves back
# once a check of the link (against busy workers) finds it back. For each: tokens/s between
# two steps (wall time, the first steps left out), the measured and the
# predicted step time, the critical path, the layout, each hop's wire; and
# the ratios to in_order.
#
#   bench/bench_heterogeneous.sh [--bin DIR] [--steps N] [--uplink RATE] [--json FILE] [--work DIR]
#
# --uplink sets the uplink's rate (default 50mbit: 20× slower than the
# racks; 10mbit makes the hops across it what paces the planner's layout).
#
# Root, ip netns, tc tbf and a cgroup cpu controller (testbed.sh; exit 77
# with the reason where they are missing). About 17 minutes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source_dir=$(cd "$here/.." && pwd)
bin_dir=$source_dir/build/bin
steps=30
json=""
work=""
uplink=50mbit
while [[ $# -gt 0 ]]; do
  case $1 in
    --bin) bin_dir=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --uplink) uplink=$2; shift 2 ;;
    *) echo "usage: $0 [--bin DIR] [--steps N] [--uplink RATE] [--json FILE] [--work DIR]" >&2; exit 2 ;;
  esac
done
[[ $steps =~ ^[0-9]+$ && $steps -ge 10 && $steps -le 10000 ]] || { echo "bench_heterogeneous: --steps must be 10 to 10000" >&2; exit 2; }
[[ -n $work ]] || work=$(mktemp -d /tmp/bench_heterogeneous.XXXXXX)
mkdir -p "$work"

[[ $uplink =~ ^[0-9]+(kbit|mbit|gbit)$ ]] || { echo "bench_heterogeneous: --uplink must be a tc rate (50mbit)" >&2; exit 2; }
cat >"$work/skewed.topology" <<TOPO
# Two racks at 1 Gbit/s, an uplink at $uplink, b2 at half the CPU.
rack a 1gbit
rack b 1gbit
uplink a b $uplink
coordinator a
worker a1 a threads=1 cpu=0.4
worker a2 a threads=1 cpu=0.4
worker b1 b threads=1 cpu=0.4
worker b2 b threads=1 cpu=0.2
TOPO
python3 - "$source_dir/examples/addition.json" "$work" "$steps" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
work, steps = sys.argv[2], int(sys.argv[3])
spec["model"]["n_layers"] = 8
spec["train"].update({"steps": steps, "global_batch": 128, "micro_batches": 8, "log_every": 5})
spec["train"]["optimizer"]["warmup_steps"] = 5
spec["checkpoint"] = {"every_steps": 0}
for mode, placement, wire in (("first", "planned", "f32"), ("planned", "planned", "f32"),
                              ("in_order", "in_order", "f32"), ("planned_auto", "planned", "auto"),
                              ("in_order_auto", "in_order", "auto"), ("slowdown", "planned", "f32"),
                              ("link_slowdown", "planned", "f32"), ("recovery", "planned", "f32"),
                              ("idle_recovery", "planned", "f32"), ("link_recovery", "planned", "f32"),
                              ("join", "planned", "f32")):
    spec["name"] = "skewed-" + mode
    spec["parallel"] = {"pipeline_stages": 2, "data_parallel": 2, "schedule": "1f1b", "wire_dtype": wire,
                        "placement": placement}
    spec["train"]["steps"] = {"first": 15, "slowdown": 80, "link_slowdown": 80, "recovery": 150,
                              "idle_recovery": 300, "link_recovery": 400, "join": 150}.get(mode, steps)
    json.dump(spec, open("%s/%s.json" % (work, mode), "w"), indent=1)
PY
rm -f "$work/rows.jsonl"
bash "$source_dir/deploy/testbed/testbed.sh" --bin "$bin_dir" --work "$work/bed" --deadline 1200 "$work/skewed.topology" -- \
  python3 "$here/heterogeneous_run.py" "$work" first planned in_order planned_auto in_order_auto recovery slowdown
# A link that slows: the same racks with a spare worker in rack a, whose
# link the job can move to (a fresh testbed: the spare changes the plans).
{ cat "$work/skewed.topology"; echo "worker a3 a threads=1 cpu=0.4"; } >"$work/spare.topology"
bash "$source_dir/deploy/testbed/testbed.sh" --bin "$bin_dir" --work "$work/bed-spare" --deadline 900 "$work/spare.topology" -- \
  python3 "$here/heterogeneous_run.py" "$work" link_slowdown
# A worker moved off entirely: the same racks with a slower spare (0.2 CPU),
# a1 cut to 0.05 CPU; given its share back while idle, it measures its GEMM
# rate again when the coordinator asks, and the job moves back onto it.
{ cat "$work/skewed.topology"; echo "worker a3 a threads=1 cpu=0.2"; } >"$work/slow-spare.topology"
bash "$source_dir/deploy/testbed/testbed.sh" --bin "$bin_dir" --work "$work/bed-slow-spare" --deadline 900 \
  "$work/slow-spare.topology" -- python3 "$here/heterogeneous_run.py" "$work" idle_recovery
# A link that comes back: the same racks with a spare at a quarter of the
# others' CPU (0.1); the cut worker's position goes to it, and back to the
# worker once a check finds its link back (on a 0.2 CPU spare the move back
# is predicted 1.24x faster, under the 1.25x a move needs: docs/benchmarks.md).
{ cat "$work/skewed.topology"; echo "worker a3 a threads=1 cpu=0.1"; } >"$work/slower-spare.topology"
bash "$source_dir/deploy/testbed/testbed.sh" --bin "$bin_dir" --work "$work/bed-slower-spare" --deadline 900 \
  "$work/slower-spare.topology" -- python3 "$here/heterogeneous_run.py" "$work" link_recovery
# (Mode join, a worker drained when the job is submitted and undrained at
# step 15, runs by hand: on these racks the planner's cut leaves a joining
# worker nothing clearly faster to take; docs/benchmarks.md.)
python3 "$here/heterogeneous_run.py" --report "$work" "${json:-$work/bench_heterogeneous.json}"
