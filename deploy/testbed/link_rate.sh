#!/usr/bin/env bash
# Changes a testbed node's link rate, both directions, while the testbed
# runs (TESTBED_LINK_RATE is this with the testbed's table of node links):
#   link_rate.sh NODE_LINKS NAME RATE
# RATE as tc takes it (5mbit). Run as root from the testbed's command (the
# coordinator's namespace reaches the others' through ip netns). Exit 0
# once both token buckets changed; 1 with the reason otherwise.
set -euo pipefail
[[ $# -eq 3 ]] || { echo "usage: $0 NODE_LINKS NAME RATE" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=deploy/testbed/topology.sh
source "$here/topology.sh"
table=$1 name=$2 rate=$3
valid_rate "$rate" || { echo "refused: $rate is not a rate (5mbit)" >&2; exit 1; }
read -r _ ns dev switch port < <(awk -v n="$name" '$1 == n' "$table") || true
[[ -n ${ns:-} ]] || { echo "refused: $name is not a node of this testbed" >&2; exit 1; }
burst=$(burst_of "$rate")
ip netns exec "$ns" tc qdisc change dev "$dev" root tbf rate "$rate" burst "$burst" latency 50ms
ip netns exec "$switch" tc qdisc change dev "$port" root tbf rate "$rate" burst "$burst" latency 50ms
echo "testbed: $name's link to $rate" >&2
