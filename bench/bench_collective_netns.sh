#!/usr/bin/env bash
# Runs bench_collective with its ranks spread over network namespaces: rank
# r in namespace slc$$r (rank 0 too), each joined by a veth pair to a bridge
# in a namespace of its own, both ends of every veth sending through a token
# bucket of RATE (tc tbf), as d hosts behind one switch. Every all-reduce
# byte crosses two capped veth links (rank → bridge → rank), as the raw-TCP
# ring's do. Needs root (ip netns, tc); everything it makes is removed on
# exit; nothing on the host's own interfaces changes.
#
#   bench/bench_collective_netns.sh RATE RANKS [bench_collective flags...]
#   e.g. bench/bench_collective_netns.sh 1gbit 4 --sizes=4194304,16777216 --json=veth.json
#
# BENCH_COLLECTIVE names the binary (default: build/bin/bench_collective).
set -euo pipefail

if [[ $# -lt 2 || $1 == -* || ! $2 =~ ^[0-9]+$ || $2 -lt 2 || $2 -gt 16 ]]; then
  echo "usage: $0 RATE (as tc takes it: 1gbit, 10gbit...) RANKS (2..16) [bench_collective flags...]" >&2
  exit 2
fi
rate=$1
ranks=$2
shift 2
bench=${BENCH_COLLECTIVE:-$(dirname "$0")/../build/bin/bench_collective}
[[ -x $bench ]] || { echo "Error: $bench not found (build first)" >&2; exit 2; }

switch=slcsw$$
cleanup() {
  for ((r = 0; r < ranks; ++r)); do ip netns del "slc$$r$r" 2>/dev/null || true; done
  ip netns del "$switch" 2>/dev/null || true
}
trap cleanup EXIT

ip netns add "$switch"
ip netns exec "$switch" ip link add br0 type bridge
ip netns exec "$switch" ip link set br0 up
ips=()
namespaces=()
for ((r = 0; r < ranks; ++r)); do
  ns=slc$$r$r
  ip netns add "$ns"
  ip netns exec "$ns" ip link set lo up
  ip link add "slc$$a$r" netns "$ns" type veth peer name "slc$$b$r" netns "$switch"
  ip netns exec "$ns" ip addr add "10.214.0.$((r + 1))/24" dev "slc$$a$r"
  ip netns exec "$ns" ip link set "slc$$a$r" up
  ip netns exec "$switch" ip link set "slc$$b$r" master br0
  ip netns exec "$switch" ip link set "slc$$b$r" up
  # A 4 MB bucket, as capped_veth.sh: the kernel's largest
  # segments pass, nothing against the megabytes of one figure.
  ip netns exec "$ns" tc qdisc add dev "slc$$a$r" root tbf rate "$rate" burst 4mb latency 50ms
  ip netns exec "$switch" tc qdisc add dev "slc$$b$r" root tbf rate "$rate" burst 4mb latency 50ms
  ips+=("10.214.0.$((r + 1))")
  namespaces+=("$ns")
done

echo "wire: $ranks ranks behind a bridge, each veth capped at $rate each way"
# Rank 0 enters its namespace with the whole process (ip netns exec); the
# others are forked into theirs.
others=$(IFS=,; echo "${namespaces[*]:1}")
ip netns exec "${namespaces[0]}" "$bench" --rank_ips="$(IFS=,; echo "${ips[*]}")" --rank_netns="$others" "$@"
