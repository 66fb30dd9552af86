#!/usr/bin/env bash
# The testbed (deploy/testbed/testbed.sh) as a user runs it: a topology
# with a bad line is refused before anything is made; two racks joined by a
# capped uplink come up, a three-stage job runs across the namespaces, every
# daemon checking the CA's revocation list in its handshakes (a
# stage link crosses the uplink: its token bucket counts the bytes) and
# succeeds, and the links the workers measured on joining show the uplink's
# rate across racks and a much higher one inside; with two workers in each
# rack (probes running at once) every link across still shows the whole
# uplink; a failing command's status
# comes back; and each time nothing is left: no namespace, veth, bridge or
# qdisc of ours; a worker capped with cpu= measures a lower GEMM rate, and
# its cgroup goes with the rest; a worker behind a slow uplink takes over a
# job with its lease kept; a link cut under an all-reduce is observed.
#
#   check_testbed.sh SOURCE_DIR BIN_DIR WORKDIR
# Exit 77 (skipped, with the reason) without root or network namespaces.
set -euo pipefail
source_dir=$1
bin_dir=$2
work=$3
testbed=$source_dir/deploy/testbed/testbed.sh

[[ $(id -u) -eq 0 ]] || { echo "skipped: network namespaces need root"; exit 77; }
if ! ip netns add sltbprobe$$ 2>/dev/null; then echo "skipped: ip netns add fails here"; exit 77; fi
ip netns del sltbprobe$$
rm -rf "$work"
mkdir -p "$work"

ours() { ip netns list | grep -c '^sltb' || true; }
# The testbed's link names (made inside its namespaces: none may show up
# here). Other tests may add and remove links of their own meanwhile.
stray_links() { ip -o link show | awk -F': ' '{sub(/@.*/, "", $2); print $2}' | grep -E '^(n[0-9]+|up[0-9]+[ab]|br[0-9]+)$' || true; }
left_nothing() {
  [[ $(ours) -eq 0 ]] || { echo "FAIL ($1): namespaces left: $(ip netns list | grep '^sltb')"; exit 1; }
  if [[ -n ${cgroup_base:-} ]] && compgen -G "$cgroup_base/sltb*" >/dev/null; then
    echo "FAIL ($1): cgroups left: $(echo "$cgroup_base"/sltb*)"; exit 1
  fi
  [[ -z $(stray_links) ]] || { echo "FAIL ($1): links left in the host namespace: $(stray_links)"; exit 1; }
}

# addition_spec OUT PYTHON: examples/addition.json as changed by PYTHON
# (statements on `spec`), written to OUT.
addition_spec() {
  python3 -c 'import json, sys
spec = json.load(open(sys.argv[1]))
exec(sys.argv[3])
json.dump(spec, open(sys.argv[2], "w"))' "$source_dir/examples/addition.json" "$1" "$2"
}

# --- A bad topology: refused with the line (exit 2), nothing made.
# refused NAME CONTENTS MESSAGE: the topology file NAME holding CONTENTS is
# refused with MESSAGE.
refused() {
  printf '%b' "$2" >"$work/$1"
  local status=0
  bash "$testbed" --bin "$bin_dir" --work "$work/bad" "$work/$1" -- true 2>"$work/bad.err" || status=$?
  [[ $status -eq 2 ]] && grep -q "$1:$3" "$work/bad.err" \
    || { echo "FAIL: $1 gave status $status: $(cat "$work/bad.err")"; exit 1; }
  left_nothing "$1"
}
refused cycle.topology 'rack a 1gbit\nrack b 1gbit\nrack c 1gbit\nuplink a b 1gbit\nuplink b c 1gbit\nuplink c a 1gbit\ncoordinator a\nworker w a\n' \
  "6: uplink c-a closes a cycle"
echo "ok: a cycle of racks is refused, naming the line"
refused cpu.topology 'rack a 1gbit\ncoordinator a\nworker w a cpu=0\n' "3: cpu must be a share of CPUs from 0.01"
echo "ok: cpu=0 is refused, naming the line"

# --- A job across two racks.
cat >"$work/racks.topology" <<'TOPO'
rack a 10gbit
rack b 10gbit
uplink a b 200mbit
coordinator a
worker a1 a threads=1
worker a2 a threads=1
worker b1 b threads=1
TOPO
# b1 at 0.15 CPU where this machine has a cgroup cpu controller: its GEMM
# rate must show it, and its cgroup must go with the testbed.
source "$source_dir/deploy/testbed/cpu_cap.sh"
capped=""
if cgroup_base=$(cpu_cap_base); then
  sed -i 's/^worker b1 b threads=1$/worker b1 b threads=1 cpu=0.15/' "$work/racks.topology"
  capped=1
else
  echo "note: no cpu= cap checked ($cgroup_base)"
fi
addition_spec "$work/spec.json" '
spec["train"]["steps"] = 40
spec["checkpoint"]["every_steps"] = 20
spec["train"]["optimizer"]["warmup_steps"] = 10'
cat >"$work/job.sh" <<'JOB'
set -euo pipefail
ctl() { timeout 60 $TESTBED_SHARDCTL "$@"; }
# The workers measured their links on joining: wait for all six directions.
for _ in $(seq 300); do
  ctl -o json get links >"$TESTBED_WORK/links.json"
  python3 -c 'import json,sys; l=json.load(open(sys.argv[1])); sys.exit(0 if len(l.get("links",[]))==6 and not l.get("pendingProbes", l.get("pending_probes")) else 1)' \
    "$TESTBED_WORK/links.json" && break
  sleep 0.5
done
ctl get links
job=$(ctl -o json submit "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')
timeout 300 $TESTBED_SHARDCTL watch "$job" >"$TESTBED_WORK/watch.log" 2>&1 \
  || { echo "FAIL: the job did not succeed"; tail -n 5 "$TESTBED_WORK/watch.log"; ctl describe job "$job"; exit 1; }
ctl -o json describe job "$job" >"$TESTBED_WORK/job.json"
ctl -o json get workers >"$TESTBED_WORK/workers.json"
# Every daemon checked the CA's revocation list in its handshakes.
for log in coordinator a1 a2 b1; do
  grep -q "revocation lists in $TESTBED_WORK/tls/crl" "$TESTBED_WORK/logs/$log.log" \
    || { echo "FAIL: $log did not check revocation lists"; grep "channels:" "$TESTBED_WORK/logs/$log.log"; exit 1; }
done
# Bytes the uplink's token buckets passed (both directions).
ip netns exec "${TESTBED_NETNS_PREFIX}sw" tc -s qdisc show | awk '/^qdisc tbf/ {dev=$5} /Sent/ && dev ~ /^up/ {s += $2} END {print s + 0}' \
  >"$TESTBED_WORK/uplink.bytes"
# A node's link rate changes while it runs, both ways; an unknown node and
# a rate that is not one are refused.
$TESTBED_LINK_RATE a1 5mbit || { echo "FAIL: a1's link rate could not change"; exit 1; }
ip netns exec "${TESTBED_NETNS_PREFIX}a1" tc qdisc show dev eth0 | grep -q "rate 5Mbit" \
  || { echo "FAIL: a1's eth0 is not at 5 Mbit/s"; ip netns exec "${TESTBED_NETNS_PREFIX}a1" tc qdisc show dev eth0; exit 1; }
[[ $(ip netns exec "${TESTBED_NETNS_PREFIX}sw" tc qdisc show | grep -c "rate 5Mbit") -eq 1 ]] \
  || { echo "FAIL: a1's switch port is not at 5 Mbit/s"; exit 1; }
if $TESTBED_LINK_RATE zz 5mbit 2>/dev/null; then echo "FAIL: an unknown node's link changed"; exit 1; fi
if $TESTBED_LINK_RATE a1 fast 2>/dev/null; then echo "FAIL: a1's link took the rate 'fast'"; exit 1; fi
echo "ok: a1's link rate changed while it ran; an unknown node and 'fast' refused"
# A capped worker's share changes while it runs; others, and shares that
# are not one, are refused.
if [[ -n ${2:-} ]]; then
  $TESTBED_CPU_CAP b1 0.3 || { echo "FAIL: b1's share could not change"; exit 1; }
  if $TESTBED_CPU_CAP a1 0.3 2>/dev/null; then echo "FAIL: a1 (uncapped) took a share"; exit 1; fi
  if $TESTBED_CPU_CAP b1 lots 2>/dev/null; then echo "FAIL: b1 took the share 'lots'"; exit 1; fi
  echo "ok: b1's CPU share changed while it ran; a1's and 'lots' refused"
fi
JOB
bash "$testbed" --bin "$bin_dir" --work "$work/bed" --deadline 600 "$work/racks.topology" -- bash "$work/job.sh" "$work/spec.json" "$capped"
left_nothing "job"
python3 - "$work/bed/job.json" "$work/bed/workers.json" "$work/bed/uplink.bytes" "$capped" <<'PY'
import json, sys
job = json.load(open(sys.argv[1]))
workers = {w["name"]: w for w in json.load(open(sys.argv[2]))["workers"]}
uplink = int(open(sys.argv[3]).read())
if sys.argv[4]:
    rate = lambda w: float(w.get("gemm_flops", w.get("gemmFlops", 0)))
    fast = max(rate(workers["a1"]), rate(workers["a2"]))
    # 0.15 CPU against at least a share of a core (the machine may be busy).
    assert 0 < rate(workers["b1"]) < 0.7 * fast, ("b1 at cpu=0.15 measured", rate(workers["b1"]), "a1/a2", fast)
    print("ok: b1 at cpu=0.15 measured %.1f GFLOP/s, the uncapped %.1f" % (rate(workers["b1"]) / 1e9, fast / 1e9))
assert job["state"] == "SUCCEEDED" and int(job["step"]) == 40, job
assert sorted(s["worker"] for s in job["stages"]) == ["a1", "a2", "b1"], job["stages"]
for name, w in workers.items():
    assert (w.get("listen_address") or w.get("listenAddress", "")).startswith("10.216.0."), w
# 40 steps of 8 micro-batches, 64×16 activations of 128 floats each way on
# each crossing link: megabytes, not the kilobytes of heartbeats alone.
assert uplink > 4 << 20, ("the uplink passed only %d bytes" % uplink)
print("ok: 3 stages on a1, a2, b1 trained 40 steps; the 200 Mbit/s uplink passed %.1f MB" % (uplink / 1e6))
PY
python3 - "$work/bed/links.json" <<'PY'
import json, sys
links = json.load(open(sys.argv[1])).get("links", [])
def rate(a, b):
    for l in links:
        if (l.get("fromWorker", l.get("from_worker")), l.get("toWorker", l.get("to_worker"))) == (a, b):
            assert not l.get("error"), l
            return float(l.get("bytesPerSecond", l.get("bytes_per_second", 0)))
    raise AssertionError("no link %s -> %s in %s" % (a, b, links))
cross = [rate(a, b) for a, b in [("a1", "b1"), ("b1", "a1"), ("a2", "b1"), ("b1", "a2")]]
inside = [rate("a1", "a2"), rate("a2", "a1")]
uplink = 200e6 / 8
for r in cross:
    # tbf's 200 Mbit/s counts IP packets; gRPC's payload is most of them.
    assert 0.5 * uplink < r < 1.25 * uplink, ("a link across the uplink measured %.0f Mbit/s" % (r * 8 / 1e6), cross)
for r in inside:
    assert r > 4 * max(cross), ("a link inside a rack measured %.0f Mbit/s" % (r * 8 / 1e6), inside, cross)
print("ok: links measured: across the 200 Mbit/s uplink %s Mbit/s, inside rack a %s Mbit/s"
      % ([round(r * 8 / 1e6) for r in cross], [round(r * 8 / 1e6) for r in inside]))
PY

# --- Two racks of two (the shipped two-racks.topology): probes run at once
# on distinct hosts inside a rack, never two across the uplink (each would
# measure half of it), so every link across shows the uplink's own rate.
cat >"$work/links.sh" <<'LINKS'
set -euo pipefail
for _ in $(seq 600); do
  timeout 60 $TESTBED_SHARDCTL -o json get links >"$TESTBED_WORK/links.json"
  python3 -c 'import json,sys; l=json.load(open(sys.argv[1])); sys.exit(0 if len(l.get("links",[]))==12 and not l.get("pendingProbes", l.get("pending_probes")) else 1)' \
    "$TESTBED_WORK/links.json" && exit 0
  sleep 0.2
done
echo "FAIL: the 12 directions were not all measured"; timeout 60 $TESTBED_SHARDCTL get links; exit 1
LINKS
bash "$testbed" --bin "$bin_dir" --work "$work/racks4" --deadline 300 "$source_dir/deploy/testbed/two-racks.topology" -- bash "$work/links.sh"
left_nothing "two racks of two"
python3 - "$work/racks4/links.json" <<'PY'
import json, sys
links = json.load(open(sys.argv[1])).get("links", [])
cross, inside = [], []
for l in links:
    a, b = l.get("fromWorker", l.get("from_worker")), l.get("toWorker", l.get("to_worker"))
    assert not l.get("error"), l
    (inside if a[0] == b[0] else cross).append(float(l.get("bytesPerSecond", l.get("bytes_per_second", 0))))
assert len(cross) == 8 and len(inside) == 4, (cross, inside)
uplink = 200e6 / 8
for r in cross:
    # Two probes across at once would each see about half of it; even two
    # opposite ways read as little as 0.78 of it (each one's TCP ACKs wait
    # behind the other's data in the 2 ms buckets).
    assert 0.85 * uplink < r < 1.25 * uplink, ("a link across the uplink measured %.0f Mbit/s" % (r * 8 / 1e6), cross)
for r in inside:
    assert r > 4 * max(cross), ("a link inside a rack measured %.0f Mbit/s" % (r * 8 / 1e6), inside, cross)
print("ok: two racks of two: the 8 directions across the 200 Mbit/s uplink measured %s Mbit/s, the 4 inside %s"
      % (sorted(round(r * 8 / 1e6) for r in cross), sorted(round(r * 8 / 1e6) for r in inside)))
PY

# --- A failing command: its status, and the teardown.
status=0
bash "$testbed" --bin "$bin_dir" --work "$work/fail" "$work/racks.topology" -- bash -c 'exit 7' 2>/dev/null || status=$?
[[ $status -eq 7 ]] || { echo "FAIL: a command's exit 7 came back as $status"; exit 1; }
left_nothing "failing command"
echo "ok: a failing command's status comes back and the testbed is gone"

# --- Stopped from outside (SIGTERM to the script) while its command runs.
bash "$testbed" --bin "$bin_dir" --work "$work/stopped" "$work/racks.topology" -- sleep 300 2>"$work/stopped.err" &
bed=$!
for _ in $(seq 300); do grep -q "workers .* idle" "$work/stopped.err" 2>/dev/null && break; sleep 0.2; done
grep -q "workers .* idle" "$work/stopped.err" || { echo "FAIL: the testbed did not come up"; cat "$work/stopped.err"; kill $bed; exit 1; }
start=$(date +%s)
kill -TERM $bed
status=0
wait $bed || status=$?
[[ $status -eq 143 ]] || { echo "FAIL: a stopped testbed exited $status"; exit 1; }
left_nothing "stopped"
echo "ok: SIGTERM tears the testbed down in $(($(date +%s) - start)) s"

# --- A worker behind a slow uplink (4 Mbit/s) takes over a job: the
# stage's state (5 MB) comes to it from the coordinator and its
# checkpoints go back, ten seconds each, while its heartbeats (a 3 s lease)
# must still get through. It keeps its lease and the job succeeds.
cat >"$work/slow.topology" <<'TOPO'
rack a 1gbit
rack b 1gbit
uplink a b 4mbit
coordinator a
worker w1 a threads=1
worker w2 b threads=1
TOPO
addition_spec "$work/slow.json" '
spec["model"]["n_layers"] = 2
spec["train"].update(steps=300, global_batch=32, micro_batches=2)
spec["train"]["optimizer"]["warmup_steps"] = 10
spec["parallel"].update(pipeline_stages=1, placement="in_order")
spec["checkpoint"]["every_steps"] = 100'
cat >"$work/slow.sh" <<'SLOW'
set -euo pipefail
ctl() { timeout 60 $TESTBED_SHARDCTL "$@"; }
job=$(ctl -o json submit "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')
# On w1 (registered first) until its first checkpoint is committed, then
# moved to w2 at once.
for _ in $(seq 600); do
  committed=$(ctl -o json describe job "$job" | python3 -c 'import json,sys; j=json.load(sys.stdin); print(int(j.get("committedStep", j.get("committed_step", -1))))')
  [[ $committed -ge 100 ]] && break
  sleep 0.1
done
[[ $committed -ge 100 ]] || { echo "FAIL: no checkpoint was committed on w1"; exit 1; }
ctl drain --at_once w1 >/dev/null
timeout 240 $TESTBED_SHARDCTL watch "$job" >"$TESTBED_WORK/watch.log" 2>&1 \
  || { echo "FAIL: the job did not succeed on w2"; tail -n 5 "$TESTBED_WORK/watch.log"; ctl describe job "$job"; exit 1; }
ctl -o json describe job "$job" >"$TESTBED_WORK/job.json"
SLOW
bash "$testbed" --bin "$bin_dir" --work "$work/slow" --deadline 400 "$work/slow.topology" -- bash "$work/slow.sh" "$work/slow.json"
left_nothing "a slow uplink"
python3 - "$work/slow/job.json" <<'PY'
import json, sys
job = json.load(open(sys.argv[1]))
assert job["state"] == "SUCCEEDED" and int(job["step"]) == 300, job
assert [s["worker"] for s in job["stages"]] == ["w2"], job["stages"]
PY
grep -q "resumed from step 100, its state from the coordinator" "$work/slow/logs/w2.log" \
  || { echo "FAIL: w2 did not take the state from the coordinator"; grep -v "link to" "$work/slow/logs/w2.log"; exit 1; }
stored=$(grep -c "checkpoint of step [0-9]* stored" "$work/slow/logs/w2.log" || true)
[[ $stored -ge 2 ]] || { echo "FAIL: w2 stored $stored checkpoints"; exit 1; }
if grep -q "lost its lease" "$work/slow/logs/coordinator.log"; then
  echo "FAIL: a worker lost its lease behind the slow uplink:"; grep "lease\|restarting" "$work/slow/logs/coordinator.log"; exit 1
fi
echo "ok: behind a 4 Mbit/s uplink w2 took the state from the coordinator and stored $stored checkpoints, its lease kept"

# --- A link that slows under a data-parallel pair is seen: two replicas
# of a 2-block model in one rack, w2's link cut to 5 Mbit/s at step 8. Each
# all-reduce message is ~800 KB, under one 1 MiB frame: sent whole, its
# receiver could time nothing of the wire and the cut went unseen (the
# coordinator kept planning on 1 Gbit/s). Halves now: the slowdown must be
# observed on the link between them, named after the job, while it runs.
cat >"$work/cut.topology" <<'TOPO'
rack a 1gbit
coordinator a
worker w1 a threads=1
worker w2 a threads=1
TOPO
addition_spec "$work/cut.json" '
spec["model"]["n_layers"] = 2
spec["train"].update(steps=2000, global_batch=32, micro_batches=2)  # cancelled
spec["train"]["optimizer"]["warmup_steps"] = 2
spec["parallel"].update(pipeline_stages=1, data_parallel=2, placement="in_order")
spec["checkpoint"]["every_steps"] = 0'
cat >"$work/cut.sh" <<'CUT'
set -euo pipefail
ctl() { timeout 60 $TESTBED_SHARDCTL "$@"; }
# Both directions probed first (busy workers are not probed).
for _ in $(seq 300); do
  ctl -o json get links | python3 -c 'import json,sys; l=json.load(sys.stdin); sys.exit(0 if len(l.get("links",[]))==2 and not l.get("pendingProbes", l.get("pending_probes")) else 1)' \
    && break
  sleep 0.5
done
job=$(ctl -o json submit "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')
for _ in $(seq 600); do
  step=$(ctl -o json describe job "$job" | python3 -c 'import json,sys; print(int(json.load(sys.stdin).get("step", 0)))')
  [[ $step -ge 8 ]] && break
  sleep 0.1
done
$TESTBED_LINK_RATE w2 5mbit
# ~2.6 s a step now: until the coordinator observed it (90 s), then cancelled.
for _ in $(seq 180); do
  ctl -o json get links >"$TESTBED_WORK/links.json"
  grep -q observed "$TESTBED_WORK/links.json" && break
  sleep 0.5
done
ctl -o json describe job "$job" >"$TESTBED_WORK/job.json"
ctl cancel "$job" >/dev/null
echo "$job" >"$TESTBED_WORK/job.id"
CUT
bash "$testbed" --bin "$bin_dir" --work "$work/cut" --deadline 400 "$work/cut.topology" -- bash "$work/cut.sh" "$work/cut.json"
left_nothing "a link cut under an all-reduce"
python3 - "$work/cut/links.json" "$(cat "$work/cut/job.id")" "$work/cut/job.json" <<'PY'
import json, sys
links, job = json.load(open(sys.argv[1])).get("links", []), sys.argv[2]
assert json.load(open(sys.argv[3]))["state"] == "RUNNING", "the job ended before the cut was seen"
f = lambda l, name: l.get(name, l.get("".join(p if i == 0 else p.title() for i, p in enumerate(name.split("_")))))
seen = {(f(l, "from_worker"), f(l, "to_worker")): (float(f(l, "observed_bytes_per_second") or 0), f(l, "observed_in"))
        for l in links}
slowed = {k: v for k, v in seen.items() if v[0] > 0}
# Observed as the median of the last steps crossed a third of the epoch's
# rate: far under the 1 Gbit/s probed, the cut's 5 Mbit/s showing in one
# direction at least. The token bucket lets its 128 KiB burst through at
# line rate, so a direction whose messages are little larger than that
# reads above the cap when the bucket refilled between them, as it does
# between a loaded machine's slower steps (59 Mbit/s seen once), and a
# receiver short of CPU that reads two frames late, together, reads them
# as fast (122 Mbit/s in CI beside two training tests; 5-11 alone): every
# observed direction under a fifth of the probed rate, named after the job.
# How close a reading comes to the cap is the testbed benchmark's figure
# (docs/benchmarks.md), not asserted here.
assert slowed and all(0 < r < 200e6 / 8 and j == job for r, j in slowed.values()), ("no slowdown observed", seen)
print("ok: w2's link cut to 5 Mbit/s under an all-reduce was observed: %s"
      % ", ".join("%s -> %s %.1f Mbit/s" % (a, b, r * 8 / 1e6) for (a, b), (r, _) in sorted(slowed.items())))
PY
