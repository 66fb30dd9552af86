#!/usr/bin/env bash
# Runs a two-sided benchmark (bench_transport, bench_stage_layout) across a
# capped wire instead of loopback: its receiving side in a network namespace
# of its own, joined to this one by a veth pair whose two ends each send
# through a token bucket of RATE (tc tbf), as a NIC between two hosts that is
# slower than the CPUs. The benchmark is told where with --receiver_netns,
# --receiver_ip and --sender_ip; what each side keeps to itself (a tensor
# group's own traffic) stays on its namespace's loopback. Needs root (ip
# netns, tc); everything it makes is removed on exit.
#
#   bench/capped_veth.sh RATE BENCHMARK [benchmark flags...]
#   e.g. bench/capped_veth.sh 10gbit build/bin/bench_transport --sizes=1048576 --json=netns.json
#        bench/capped_veth.sh 1gbit build/bin/bench_stage_layout --ranks=2,4 --json=layout.json
set -euo pipefail

if [[ $# -lt 2 || $1 == -* ]]; then
  echo "usage: $0 RATE (as tc takes it: 1gbit, 10gbit...) BENCHMARK [flags...]" >&2
  exit 2
fi
rate=$1
bench=$2
shift 2
[[ -x $bench ]] || { echo "Error: $bench not found or not executable (build first)" >&2; exit 2; }

ns=slveth$$
here=slv$$a
there=slv$$b
cleanup() {
  ip netns del "$ns" 2>/dev/null || true
  ip link del "$here" 2>/dev/null || true
}
trap cleanup EXIT

ip netns add "$ns"
ip link add "$here" type veth peer name "$there"
ip link set "$there" netns "$ns"
ip addr add 10.213.0.1/30 dev "$here"
ip link set "$here" up
ip netns exec "$ns" ip addr add 10.213.0.2/30 dev "$there"
ip netns exec "$ns" ip link set "$there" up
ip netns exec "$ns" ip link set lo up
# A 4 MB bucket: enough for the kernel's largest segments at tens of Gbit/s;
# it lets a few MB through at once, little against the tens of MiB of one
# figure.
tc qdisc add dev "$here" root tbf rate "$rate" burst 4mb latency 50ms
ip netns exec "$ns" tc qdisc add dev "$there" root tbf rate "$rate" burst 4mb latency 50ms

echo "wire: veth capped at $rate each way"
"$bench" --receiver_netns="$ns" --receiver_ip=10.213.0.2 --sender_ip=10.213.0.1 "$@"
