#!/usr/bin/env bash
# bench_link_probes: how long a cluster takes to measure every link, one
# probe at a time (coordinator --concurrent_probes=1, as before) against
# the default (16 at once where no wire is shared), on the testbed
# (deploy/testbed/): "fabric", 8 workers behind one switch, each member's
# link capped at 200 Mbit/s; "racks", two racks of 4 at 200 Mbit/s joined
# by a 50 Mbit/s uplink. For each: the seconds until nothing is queued
# after the last worker registered ("join": probes start as soon as two
# workers are in), then the seconds of `shardctl probe` re-measuring all
# 56 directions at once ("reprobe"), the most probes seen running at once
# (shardctl get links, sampled every 0.1 s), and the figures: inside a
# rack and across the uplink, as fractions of the cap (two probes sharing
# a wire would each see half of it).
#
#   bench/bench_link_probes.sh [--bin DIR] [--json FILE] [--work DIR]
#
# Root, ip netns and tc tbf (testbed.sh; exit 77 with the reason where
# they are missing). About 8 minutes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source_dir=$(cd "$here/.." && pwd)
bin_dir=$source_dir/build/bin
json=""
work=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --bin) bin_dir=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    *) echo "usage: $0 [--bin DIR] [--json FILE] [--work DIR]" >&2; exit 2 ;;
  esac
done
[[ -n $work ]] || work=$(mktemp -d /tmp/bench_link_probes.XXXXXX)
mkdir -p "$work"

{
  echo "# 8 workers behind one switch, 200 Mbit/s each."
  echo "rack a 200mbit"
  echo "coordinator a"
  for i in 1 2 3 4 5 6 7 8; do echo "worker w$i a threads=1"; done
} >"$work/fabric.topology"
{
  echo "# Two racks of 4 at 200 Mbit/s, a 50 Mbit/s uplink between them."
  echo "rack a 200mbit"
  echo "rack b 200mbit"
  echo "uplink a b 50mbit"
  echo "coordinator a"
  for r in a b; do for i in 1 2 3 4; do echo "worker $r$i $r threads=1"; done; done
} >"$work/racks.topology"

# Runs beside the coordinator: the row for one run.
cat >"$work/measure.py" <<'PY'
import json, os, shlex, subprocess, sys, time
ctl = shlex.split(os.environ["TESTBED_SHARDCTL"])
out = sys.argv[1]

def links():
    r = subprocess.run(ctl + ["-o", "json", "get", "links"], capture_output=True, text=True, timeout=60)
    r.check_returncode()
    d = json.loads(r.stdout)
    return d, int(d.get("pendingProbes", d.get("pending_probes", 0))), int(d.get("probing", 0))

def until_done(proc=None, deadline=900):
    start, most = time.monotonic(), 0
    while time.monotonic() - start < deadline:
        d, pending, probing = links()
        most = max(most, probing)
        if (proc is None and pending == 0) or (proc is not None and proc.poll() is not None):
            return time.monotonic() - start, most, d
        time.sleep(0.1)
    raise SystemExit("the probes did not end within %d s" % deadline)

join_s, join_most, _ = until_done()
probe = subprocess.Popen(ctl + ["--probe_wait_s=900", "probe"], stdout=subprocess.DEVNULL)
reprobe_s, reprobe_most, d = until_done(probe)
if probe.wait() != 0:
    raise SystemExit("shardctl probe failed")
_, pending, _ = links()
rows = [(l.get("fromWorker", l.get("from_worker")), l.get("toWorker", l.get("to_worker")),
         float(l.get("bytesPerSecond", l.get("bytes_per_second", 0))), l.get("error", "")) for l in d.get("links", [])]
json.dump({"join_s": join_s, "join_most_at_once": join_most, "reprobe_s": reprobe_s,
           "reprobe_most_at_once": reprobe_most, "pending_after": pending, "links": rows}, open(out, "w"))
PY

for topology in fabric racks; do
  for mode in one_at_a_time concurrent; do
    probes=16
    [[ $mode == one_at_a_time ]] && probes=1
    echo "== $topology, $mode (--concurrent_probes=$probes)" >&2
    SHARDLINE_CONCURRENT_PROBES=$probes bash "$source_dir/deploy/testbed/testbed.sh" --bin "$bin_dir" \
      --work "$work/$topology-$mode" --deadline 1200 "$work/$topology.topology" -- \
      python3 "$work/measure.py" "$work/$topology-$mode.row.json"
  done
done

python3 - "$work" "$json" <<'PY'
import json, sys
work, out = sys.argv[1], sys.argv[2]
caps = {"inside": 200e6 / 8, "across": 50e6 / 8}
rows = []
for topology in ("fabric", "racks"):
    runs = {}
    for mode in ("one_at_a_time", "concurrent"):
        r = json.load(open("%s/%s-%s.row.json" % (work, topology, mode)))
        links = r.pop("links")
        assert len(links) == 56 and not any(e for _, _, _, e in links), links
        assert r["pending_after"] == 0, r
        for part in ("inside", "across"):
            rates = [b for a, c, b, _ in links if (a[0] == c[0] or topology == "fabric") == (part == "inside")]
            r[part + "_min_of_cap"] = min(rates) / caps[part] if rates else None
            r[part + "_max_of_cap"] = max(rates) / caps[part] if rates else None
        r.update(topology=topology, mode=mode, directions=len(links))
        runs[mode] = r
        rows.append(r)
    for key in ("join_s", "reprobe_s"):
        runs["concurrent"][key.replace("_s", "_speedup")] = runs["one_at_a_time"][key] / runs["concurrent"][key]
fmt = "%-7s %-14s %8s %10s %11s %13s %13s"
print(fmt % ("", "", "join s", "reprobe s", "at once", "inside/cap", "across/cap"))
for r in rows:
    span = lambda p: "-" if r[p + "_min_of_cap"] is None else "%.2f-%.2f" % (r[p + "_min_of_cap"], r[p + "_max_of_cap"])
    print(fmt % (r["topology"], r["mode"], "%.1f" % r["join_s"], "%.1f" % r["reprobe_s"],
                 "%d" % r["reprobe_most_at_once"], span("inside"), span("across")))
for r in rows:
    if "reprobe_speedup" in r:
        print("%s: concurrent is %.2fx faster to re-probe, %.2fx after joining" % (r["topology"], r["reprobe_speedup"], r["join_speedup"]))
if out:
    json.dump(rows, open(out, "w"), indent=1)
PY
