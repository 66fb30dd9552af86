# CPU caps for testbed workers (`cpu=F` in a topology): a cgroup per capped
# worker with a CFS quota of F CPUs per short period, so a worker computes
# at a fixed share of the machine whatever the others do: a slower machine
# on this one. For testbed.sh to source.
#
#   cpu_cap_base        prints the cgroup directory to make groups under, or
#                       fails saying why (cgroup v1's cpu controller, or v2's
#                       root with cpu enabled for its children)
#   cpu_cap_make DIR F  makes group DIR with F CPUs (a quota of F periods per
#                       period: 1 ms of CPU per 5 ms for F = 0.2)
#   cpu_cap_set DIR F   changes group DIR's share to F CPUs (a machine that
#                       got busier or freer, with its processes running)
#   cpu_cap_exec DIR CMD...  becomes CMD inside group DIR (an exec: call it
#                       in a subshell, e.g. in the background)
#   cpu_cap_remove DIR  removes the group (its processes gone)

# Periods as short as the kernel allows (a quota is at least 1 ms): a
# worker idle between passes must not spend a long period's quota at full
# speed (with 10 ms periods a 0.2 CPU worker ran a light stage's short
# passes at a whole core's speed). 1 ms, or 1 ms / F below one CPU.
cpu_cap_period_us() { awk -v c="$1" 'BEGIN { p = 1000 / c; if (p < 1000) p = 1000; printf "%d", p + 0.5 }'; }

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
  mkdir "$1" || return 1
  cpu_cap_set "$@"
}

cpu_cap_set() {
  local dir=$1 share=$2 period quota
  period=$(cpu_cap_period_us "$share")
  quota=$(awk -v c="$share" -v p="$period" 'BEGIN { printf "%d", c * p + 0.5 }')
  if [[ -e $dir/cpu.max ]]; then
    echo "$quota $period" >"$dir/cpu.max"
  else
    # v1 refuses a period whose quota the old period's would exceed: the
    # quota off first.
    echo -1 >"$dir/cpu.cfs_quota_us" && echo "$period" >"$dir/cpu.cfs_period_us" &&
      echo "$quota" >"$dir/cpu.cfs_quota_us"
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
