# CPU caps for testbed workers (`cpu=F` in a topology): a cgroup per capped
# worker with a CFS quota of F CPUs per 10 ms period, so a worker computes
# at a fixed share of the machine whatever the others do: a slower machine
# on this one. For testbed.sh to source.
#
#   cpu_cap_base        prints the cgroup directory to make groups under, or
#                       fails saying why (cgroup v1's cpu controller, or v2's
#                       root with cpu enabled for its children)
#   cpu_cap_make DIR F  makes group DIR with F CPUs (quota F × 10 ms per 10 ms)
#   cpu_cap_exec DIR CMD...  becomes CMD inside group DIR (an exec: call it
#                       in a subshell, e.g. in the background)
#   cpu_cap_remove DIR  removes the group (its processes gone)

cpu_cap_period_us=10000

cpu_cap_base() {
  if [[ -w /sys/fs/cgroup/cgroup.subtree_control ]] && grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control; then
    echo /sys/fs/cgroup
  elif [[ -w /sys/fs/cgroup/cpu/cgroup.procs && -e /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]]; then
    echo /sys/fs/cgroup/cpu
  else
    echo "no writable cgroup cpu controller (cgroup v1's /sys/fs/cgroup/cpu, or v2's root with +cpu in cgroup.subtree_control)"
    return 1
  fi
}

cpu_cap_make() {
  local dir=$1 share=$2 quota
  quota=$(awk -v c="$share" -v p="$cpu_cap_period_us" 'BEGIN { printf "%d", c * p }')
  mkdir "$dir" || return 1
  if [[ -e $dir/cpu.max ]]; then
    echo "$quota $cpu_cap_period_us" >"$dir/cpu.max"
  else
    echo "$cpu_cap_period_us" >"$dir/cpu.cfs_period_us" && echo "$quota" >"$dir/cpu.cfs_quota_us"
  fi
}

cpu_cap_exec() {
  local dir=$1
  shift
  # shellcheck disable=SC2016
  exec bash -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$dir" "$@"
}

cpu_cap_remove() {
  local dir=$1
  [[ -d $dir ]] || return 0
  for _ in $(seq 50); do rmdir "$dir" 2>/dev/null && return 0; sleep 0.1; done
  echo "testbed: could not remove the cgroup $dir" >&2
}
