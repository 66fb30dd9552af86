#!/usr/bin/env bash
# Runs bench_transport across a capped wire instead of loopback: the receiver
# in a network namespace of its own, joined to this one by a veth pair whose
# two ends each send through a token bucket of RATE (tc tbf). Shows how close
# each path gets to a wire that is slower than the CPUs, as real NICs between
# hosts often are. Needs root (ip netns, tc); everything it makes is removed
# on exit.
#
#   bench/bench_transport_netns.sh RATE [bench_transport flags...]
#   e.g. bench/bench_transport_netns.sh 10gbit --sizes=1048576,16777216 --json=netns.json
#
# BENCH_TRANSPORT names the binary (default: build/bin/bench_transport).
set -euo pipefail

if [[ $# -lt 1 || $1 == -* ]]; then
  echo "usage: $0 RATE (as tc takes it: 1gbit, 10gbit...) [bench_transport flags...]" >&2
  exit 2
fi
rate=$1
shift
bench=${BENCH_TRANSPORT:-$(dirname "$0")/../build/bin/bench_transport}
[[ -x $bench ]] || { echo "Error: $bench not found (build first)" >&2; exit 2; }

ns=slbench$$
here=slb$$a
there=slb$$b
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
# it lets a few MB through at once, nothing against 256 MiB per figure.
tc qdisc add dev "$here" root tbf rate "$rate" burst 4mb latency 50ms
ip netns exec "$ns" tc qdisc add dev "$there" root tbf rate "$rate" burst 4mb latency 50ms

echo "wire: veth capped at $rate each way"
"$bench" --receiver_netns="$ns" --receiver_ip=10.213.0.2 --sender_ip=10.213.0.1 "$@"
