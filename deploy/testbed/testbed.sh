#!/usr/bin/env bash
# A heterogeneous cluster on one machine: a coordinator and N workers, each
# in a network namespace of its own with an address of its own, joined as a
# topology file describes (racks of bridges, capped links between them;
# deploy/testbed/README.md), then COMMAND run beside the coordinator, then
# everything removed: daemons (by pid), namespaces, veths, bridges and
# their token buckets, also when a step fails or the command does.
#
#   deploy/testbed/testbed.sh [--bin DIR] [--work DIR] [--deadline SECONDS] TOPOLOGY -- COMMAND [ARGS...]
#
# COMMAND runs in the coordinator's namespace (it reaches every daemon, and
# nothing else) with, in its environment:
#   TESTBED_COORDINATOR  the coordinator's address (IP:PORT)
#   TESTBED_SHARDCTL     shardctl with the address, certificates and token
#                        (word-split it: $TESTBED_SHARDCTL get workers)
#   TESTBED_WORK         the work directory (logs, certificates, state)
#   TESTBED_WORKERS      the workers' names, space-separated
#   TESTBED_NETNS_PREFIX the namespaces' common prefix (NAME = prefix + node)
#   TESTBED_CPU_CAP      a command that changes a capped worker's share:
#                        $TESTBED_CPU_CAP NAME F (a machine getting busier;
#                        the namespaces' own /sys has no cgroups, so a
#                        reader out here applies it: a FIFO in the work dir)
#   TESTBED_LINK_RATE    a command that changes a node's link, both ways:
#                        $TESTBED_LINK_RATE NAME RATE (a link getting slower)
# Every daemon runs with mutual TLS (deploy/certs.sh), the CA's revocation
# list checked in every handshake, and an admin token, as beyond loopback
# it must. A worker's `cpu=F` puts it in a cgroup of its own
# with F CPUs (deploy/testbed/cpu_cap.sh). Needs root, ip netns, a bridge
# and tc tbf (and a cgroup cpu controller for cpu=). Exit:
# COMMAND's status; 2 for a bad topology or flag; 77 when this machine
# cannot make namespaces (the reason on stderr).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
source_dir=$(cd "$here/../.." && pwd)
bin_dir=$source_dir/build/bin
work=""
deadline=3600
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in
    --bin) bin_dir=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --deadline) deadline=$2; shift 2 ;;
    *) echo "testbed: unknown flag $1" >&2; exit 2 ;;
  esac
done
if [[ $# -lt 3 || $2 != -- ]]; then
  echo "usage: $0 [--bin DIR] [--work DIR] [--deadline SECONDS] TOPOLOGY -- COMMAND [ARGS...]" >&2
  exit 2
fi
topology=$1
shift 2
[[ $deadline =~ ^[0-9]+$ && $deadline -ge 10 ]] || { echo "testbed: --deadline must be at least 10 seconds" >&2; exit 2; }
for b in shardline-coordinator shardline-worker shardctl; do
  [[ -x $bin_dir/$b ]] || { echo "testbed: $bin_dir/$b not found (build first, or --bin DIR)" >&2; exit 2; }
done

# --- The topology, checked whole before anything is made.
# shellcheck source=deploy/testbed/topology.sh
source "$here/topology.sh"
# shellcheck source=deploy/testbed/cpu_cap.sh
source "$here/cpu_cap.sh"
parse_topology "$topology" || exit 2

skip() { echo "skipped: $*" >&2; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "network namespaces need root"
command -v ip >/dev/null && command -v tc >/dev/null || skip "ip and tc (iproute2) are not installed"
command -v openssl >/dev/null || skip "openssl is not installed (deploy/certs.sh needs it)"
cgroup_base=""
if [[ -n ${node_cpu[*]// /} ]]; then cgroup_base=$(cpu_cap_base) || skip "cpu= caps: $cgroup_base"; fi

id=$(( $$ % 100000 ))
prefix=sltb$id-
switch=${prefix}sw
if [[ -z $work ]]; then work=$(mktemp -d /tmp/testbed.XXXXXX); fi
mkdir -p "$work"
rm -f "$work/node-links"
pids=()
cgroups=()

cleanup() {
  local status=$?
  set +e
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  # Deleting a namespace deletes its veth ends (and so their peers) and
  # the token buckets on them; the bridges live in the switch namespace.
  for node in "${node_names[@]}"; do ip netns del "$prefix$node" 2>/dev/null; done
  ip netns del "$switch" 2>/dev/null
  for group in "${cgroups[@]}"; do cpu_cap_remove "$group"; done
  exit $status
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ip netns add "$switch" 2>/dev/null || skip "ip netns add fails here (no CAP_SYS_ADMIN?)"
ip netns exec "$switch" ip link set lo up
for i in "${!rack_names[@]}"; do
  ip netns exec "$switch" ip link add "br$i" type bridge
  ip netns exec "$switch" ip link set "br$i" up
done
cap() { ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$3" burst "$(burst_of "$3")" latency 50ms; }
for i in "${!uplink_a[@]}"; do
  ip netns exec "$switch" ip link add "up${i}a" type veth peer name "up${i}b"
  ip netns exec "$switch" ip link set "up${i}a" master "br${uplink_a[$i]}" up
  ip netns exec "$switch" ip link set "up${i}b" master "br${uplink_b[$i]}" up
  cap "$switch" "up${i}a" "${uplink_rate[$i]}"
  cap "$switch" "up${i}b" "${uplink_rate[$i]}"
done
for i in "${!node_names[@]}"; do
  ns=$prefix${node_names[$i]}
  ip netns add "$ns"
  ip netns exec "$ns" ip link set lo up
  ip link add "eth0" netns "$ns" type veth peer name "n$i" netns "$switch"
  ip netns exec "$ns" ip addr add "${node_ips[$i]}/16" dev eth0
  ip netns exec "$ns" ip link set eth0 up
  ip netns exec "$switch" ip link set "n$i" master "br${node_rack[$i]}" up
  cap "$ns" eth0 "${node_rate[$i]}"
  cap "$switch" "n$i" "${node_rate[$i]}"
  echo "${node_names[$i]} $ns eth0 $switch n$i" >>"$work/node-links"
done
echo "testbed: ${#node_names[@]} namespaces (${prefix}*) on ${#rack_names[@]} racks, work in $work" >&2

# --- Certificates (every node's address in its own) and an admin token.
tls=$work/tls
rm -rf "$tls"
for i in "${!node_names[@]}"; do bash "$source_dir/deploy/certs.sh" "$tls" "${node_names[$i]}" "${node_ips[$i]}" >/dev/null; done
bash "$source_dir/deploy/certs.sh" "$tls" shardctl >/dev/null
bash "$source_dir/deploy/certs.sh" "$tls" --crl >/dev/null  # revocation lists checked on every channel
token=$(openssl rand -hex 32)
echo "admin testbed $token" >"$tls/admin-tokens"
echo "$token" >"$tls/token"
chmod 600 "$tls/admin-tokens" "$tls/token"
secure() { echo "--tls_cert=$tls/$1.pem --tls_key=$tls/$1.key --tls_ca=$tls/ca.pem --tls_crl_dir=$tls/crl"; }

# --- The daemons, each in its namespace, each with a deadline.
coordinator=${node_ips[0]}:7400
mkdir -p "$work/state" "$work/logs"
# shellcheck disable=SC2046
ip netns exec "$prefix${node_names[0]}" timeout --signal=TERM "$deadline" "$bin_dir/shardline-coordinator" \
  --listen="$coordinator" --state_dir="$work/state" --admin_tokens="$tls/admin-tokens" \
  $(secure "${node_names[0]}") >"$work/logs/coordinator.log" 2>&1 &
pids+=($!)
shardctl="$bin_dir/shardctl --coordinator=$coordinator $(secure shardctl) --token_file=$tls/token"
workers=${worker_names[*]}
# Waits until `want` workers are registered and idle (120 s), watching the
# daemons: one that exits ends the testbed with the logs' tails.
wait_registered() {
  local want=$1 registered=0
  for _ in $(seq 600); do
    registered=$(ip netns exec "$prefix${node_names[0]}" timeout 10 $shardctl get workers 2>/dev/null | grep -c " idle " || true)
    [[ $registered -ge $want ]] && return 0
    for pid in "${pids[@]}"; do
      kill -0 "$pid" 2>/dev/null || { echo "testbed: a daemon exited during start-up; logs in $work/logs" >&2; tail -n 5 "$work"/logs/*.log >&2; exit 1; }
    done
    sleep 0.2
  done
  echo "testbed: $registered of $want workers registered in 120 s; logs in $work/logs" >&2
  exit 1
}
# One at a time, each registered before the next starts: registration
# order is the file's (parallel.placement "in_order" takes that order).
started=0
for i in "${!node_names[@]}"; do
  [[ ${node_kind[$i]} == worker ]] || continue
  name=${node_names[$i]}
  in_group=()
  if [[ -n ${node_cpu[$i]} ]]; then
    cgroups+=("$cgroup_base/$prefix$name")
    cpu_cap_make "$cgroup_base/$prefix$name" "${node_cpu[$i]}" || { echo "testbed: cannot make the cgroup for $name" >&2; exit 1; }
    in_group=(cpu_cap_exec "$cgroup_base/$prefix$name")
  fi
  # shellcheck disable=SC2046,SC2086
  "${in_group[@]}" ip netns exec "$prefix$name" timeout --signal=TERM "$deadline" "$bin_dir/shardline-worker" \
    --name="$name" --coordinator="$coordinator" --listen="${node_ips[$i]}:0" --threads="${node_threads[$i]}" \
    --device=cpu --data_root="$source_dir" $(secure "$name") ${node_flags[$i]} \
    >"$work/logs/$name.log" 2>&1 &
  pids+=($!)
  started=$((started + 1))
  wait_registered "$started"
done
echo "testbed: coordinator at $coordinator, workers $workers idle" >&2

# Share changes asked for by the command (TESTBED_CPU_CAP), applied from
# here: "NAME F" lines on a FIFO, each answered on its reply FIFO.
if [[ -n $cgroup_base ]]; then
  mkfifo "$work/cpu-cap.requests" "$work/cpu-cap.replies"
  (
    while true; do
      while read -r name share; do
        reply="refused: $name is not a capped worker, or $share is not a share in (0, 64]"
        for i in "${!node_names[@]}"; do
          if [[ ${node_names[$i]} == "$name" && -n ${node_cpu[$i]} && $share =~ ^[0-9]*\.?[0-9]+$ ]] &&
            awk -v f="$share" 'BEGIN { exit !(f > 0 && f <= 64) }'; then
            if cpu_cap_set "$cgroup_base/$prefix$name" "$share"; then reply="ok"; else reply="failed"; fi
          fi
        done
        echo "testbed: $name's CPU share to $share: $reply" >&2
        echo "$reply" >"$work/cpu-cap.replies"
      done <"$work/cpu-cap.requests"
    done
  ) &
  pids+=($!)
fi

# In the background with our stdin (an interactive shell works), so that a
# signal to this script tears down at once instead of after the command.
ip netns exec "$prefix${node_names[0]}" env TESTBED_COORDINATOR="$coordinator" TESTBED_SHARDCTL="$shardctl" \
  TESTBED_WORK="$work" TESTBED_WORKERS="$workers" TESTBED_NETNS_PREFIX="$prefix" \
  TESTBED_CPU_CAP="$here/cpu_cap_request.sh $work/cpu-cap" TESTBED_LINK_RATE="$here/link_rate.sh $work/node-links" \
  timeout --signal=TERM "$deadline" "$@" <&0 &
command_pid=$!
pids=("$command_pid" "${pids[@]}")
status=0
wait "$command_pid" || status=$?
exit $status
