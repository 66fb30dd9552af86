# Reads a testbed topology file (deploy/testbed/README.md) into arrays, for
# testbed.sh to source. Every line is checked before anything is made; an
# error names the file, the line and what is wrong, and returns 1.
#
#   rack NAME RATE                      a switch; members' links capped at RATE
#   uplink RACK RACK RATE               a link between two racks' switches
#   coordinator RACK [rate=RATE]        exactly one
#   worker NAME RACK [threads=N] [cpu=F] [rate=RATE] [flag=--name=value ...]
#
# RATE as tc takes it (100mbit, 10gbit, 500kbit). The uplinks must join all
# racks without a cycle (a cycle of bridges would loop broadcasts).
#
# Sets: rack_names rack_rates; uplink_a uplink_b uplink_rate (rack
# indices); node_names node_kind node_ips node_rack node_rate node_threads
# node_cpu node_flags (node 0 is the coordinator); worker_names.

topology_error() {
  echo "testbed: $topology_file:$topology_line: $*" >&2
  return 1
}

# A token bucket of 2 ms at the rate, at least 128 KiB (two of the
# kernel's largest segments): small against what a step moves even on a
# slow link, so the link holds its rate instead of passing a step's bursts
# at line speed (a fixed 4 MB bucket let a 10 Mbit/s link carry several
# seconds' worth at once).
burst_of() {
  awk -v r="$1" 'BEGIN {
    n = r + 0; unit = substr(r, length(n "") + 1)
    m = unit == "gbit" ? 1e9 : unit == "mbit" ? 1e6 : unit == "kbit" ? 1e3 : 1
    b = n * m / 8 * 0.002; if (b < 131072) b = 131072; printf "%d", b }'
}

valid_rate() { [[ $1 =~ ^[0-9]+(\.[0-9]+)?(bit|kbit|mbit|gbit)$ ]]; }
valid_name() { [[ $1 =~ ^[a-z0-9][a-z0-9_-]{0,19}$ ]]; }

rack_index() {
  local i
  for i in "${!rack_names[@]}"; do
    [[ ${rack_names[$i]} == "$1" ]] && { echo "$i"; return 0; }
  done
  return 1
}

# Union-find over racks, for the no-cycle and all-joined rules.
rack_root() {
  local r=$1
  while [[ ${rack_parent[$r]} != "$r" ]]; do r=${rack_parent[$r]}; done
  echo "$r"
}

parse_topology() {
  topology_file=$1
  topology_line=0
  rack_names=() rack_rates=() uplink_a=() uplink_b=() uplink_rate=() rack_parent=()
  node_names=("coordinator") node_kind=("coordinator") node_ips=("10.216.0.1") node_rack=("") node_rate=("")
  node_threads=(0) node_cpu=("") node_flags=("") worker_names=()
  [[ -r $topology_file ]] || { echo "testbed: cannot read the topology $topology_file" >&2; return 1; }
  local have_coordinator="" words line
  while IFS= read -r line || [[ -n $line ]]; do
    topology_line=$((topology_line + 1))
    line=${line%%#*}
    read -ra words <<<"$line"
    [[ ${#words[@]} -eq 0 ]] && continue
    case ${words[0]} in
      rack)
        [[ ${#words[@]} -eq 3 ]] || { topology_error "rack takes NAME RATE"; return 1; }
        valid_name "${words[1]}" || { topology_error "rack name '${words[1]}' must be [a-z0-9_-], at most 20"; return 1; }
        rack_index "${words[1]}" >/dev/null && { topology_error "rack '${words[1]}' is defined twice"; return 1; }
        valid_rate "${words[2]}" || { topology_error "rate '${words[2]}' is not a tc rate (e.g. 10gbit)"; return 1; }
        rack_parent+=("${#rack_names[@]}")
        rack_names+=("${words[1]}")
        rack_rates+=("${words[2]}")
        ;;
      uplink)
        [[ ${#words[@]} -eq 4 ]] || { topology_error "uplink takes RACK RACK RATE"; return 1; }
        local a b
        a=$(rack_index "${words[1]}") || { topology_error "no rack '${words[1]}' (define racks first)"; return 1; }
        b=$(rack_index "${words[2]}") || { topology_error "no rack '${words[2]}' (define racks first)"; return 1; }
        valid_rate "${words[3]}" || { topology_error "rate '${words[3]}' is not a tc rate (e.g. 200mbit)"; return 1; }
        local ra rb
        ra=$(rack_root "$a") rb=$(rack_root "$b")
        [[ $ra != "$rb" ]] || { topology_error "uplink ${words[1]}-${words[2]} closes a cycle of racks"; return 1; }
        rack_parent[$ra]=$rb
        uplink_a+=("$a") uplink_b+=("$b") uplink_rate+=("${words[3]}")
        ;;
      coordinator|worker)
        local kind=${words[0]} name rack rate threads=0 cpu="" flags="" k
        if [[ $kind == coordinator ]]; then
          [[ -z $have_coordinator ]] || { topology_error "a second coordinator"; return 1; }
          [[ ${#words[@]} -ge 2 ]] || { topology_error "coordinator takes RACK [rate=RATE]"; return 1; }
          name=coordinator; rack=${words[1]}; k=2
        else
          [[ ${#words[@]} -ge 3 ]] || { topology_error "worker takes NAME RACK [threads=N] [cpu=F] [rate=RATE] [flag=...]"; return 1; }
          name=${words[1]}; rack=${words[2]}; k=3
          valid_name "$name" || { topology_error "worker name '$name' must be [a-z0-9_-], at most 20"; return 1; }
          [[ $name != coordinator && ! " ${worker_names[*]} " =~ " $name " ]] || { topology_error "node name '$name' is taken"; return 1; }
        fi
        local r
        r=$(rack_index "$rack") || { topology_error "no rack '$rack' (define racks first)"; return 1; }
        rate=${rack_rates[$r]}
        for ((; k < ${#words[@]}; ++k)); do
          case ${words[$k]} in
            rate=*) rate=${words[$k]#rate=}; valid_rate "$rate" || { topology_error "rate '$rate' is not a tc rate"; return 1; } ;;
            threads=*)
              threads=${words[$k]#threads=}
              [[ $kind == worker && $threads =~ ^[0-9]+$ && $threads -ge 1 && $threads -le 256 ]] \
                || { topology_error "threads must be 1 to 256, on a worker"; return 1; } ;;
            cpu=*)
              cpu=${words[$k]#cpu=}
              [[ $kind == worker && $cpu =~ ^[0-9]+(\.[0-9]{1,3})?$ ]] && awk -v c="$cpu" 'BEGIN { exit !(c >= 0.01 && c <= 256) }' \
                || { topology_error "cpu must be a share of CPUs from 0.01 to 256 (e.g. 0.5), on a worker"; return 1; } ;;
            flag=--*)
              [[ $kind == worker ]] || { topology_error "flag= is for workers"; return 1; }
              flags+=" ${words[$k]#flag=}" ;;
            *) topology_error "unknown option '${words[$k]}'"; return 1 ;;
          esac
        done
        if [[ $kind == coordinator ]]; then
          have_coordinator=1
          node_rack[0]=$r node_rate[0]=$rate
        else
          [[ ${#node_names[@]} -lt 200 ]] || { topology_error "at most 199 workers"; return 1; }
          node_ips+=("10.216.0.$(( ${#node_names[@]} + 1 ))")
          node_names+=("$name") node_kind+=(worker) node_rack+=("$r") node_rate+=("$rate")
          node_threads+=("$threads") node_cpu+=("$cpu") node_flags+=("$flags") worker_names+=("$name")
        fi
        ;;
      *) topology_error "unknown line '${words[0]}' (rack, uplink, coordinator or worker)"; return 1 ;;
    esac
  done <"$topology_file"
  topology_line=end
  [[ ${#rack_names[@]} -ge 1 ]] || { topology_error "no rack"; return 1; }
  [[ -n $have_coordinator ]] || { topology_error "no coordinator line"; return 1; }
  [[ ${#worker_names[@]} -ge 1 ]] || { topology_error "no worker"; return 1; }
  local i root0
  root0=$(rack_root 0)
  for i in "${!rack_names[@]}"; do
    [[ $(rack_root "$i") == "$root0" ]] || { topology_error "rack '${rack_names[$i]}' is not joined to '${rack_names[0]}' by uplinks"; return 1; }
  done
  for i in "${!node_threads[@]}"; do
    [[ ${node_kind[$i]} == worker && ${node_threads[$i]} -eq 0 ]] && node_threads[$i]=1
  done
  return 0
}
