#!/usr/bin/env bash
# The Compose cluster with a real Docker engine, as a user runs it: starts
# its own dockerd (own data and exec roots and socket), makes the Debian
# base image with debootstrap, builds the image, brings up a coordinator and
# three workers (--profile cpu --scale worker=3), submits
# examples/addition.json on two stages with the host's shardctl, kills a busy
# worker's container mid-run, and checks what recovery promises (the job
# restarts from its committed step on the spare worker and succeeds, the
# dead one is lost); exports the weights and evaluates them with
# shardline-train (the held-out exact match shardline-train reaches, 100%). Then it removes everything it made: containers,
# networks, volumes, images, dockerd (by its pid), and the iptables rules,
# bridges and sysctls dockerd changed. Traffic stays between our containers
# and loopback (the image build reaches the Debian archive, as apt here does).
#
#   check_compose.sh SOURCE_DIR BIN_DIR WORKDIR
# Exit 77 (skipped, with the reason) where dockerd cannot run.
set -euo pipefail
source_dir=$1
bin_dir=$2
work=$3

skip() {
  echo "skipped: $*"
  exit 77
}
[[ $(id -u) -eq 0 ]] || skip "starting dockerd needs root"
for tool in dockerd docker docker-compose debootstrap iptables-save iptables-restore python3 openssl; do
  command -v "$tool" >/dev/null || skip "$tool is not installed (deploy/install-deps.sh installs docker.io, docker-compose, debootstrap)"
done

rm -rf "$work"
mkdir -p "$work"
# Unix sockets under the exec root must stay short: a directory of its own in /tmp.
exec_root=$(mktemp -d /tmp/sldk.XXXXXX)
export DOCKER_HOST=unix://$exec_root/docker.sock
export SHARDLINE_IMAGE=shardline-test:$$ BASE_IMAGE=shardline-base-test:$$ SHARDLINE_PORT=
project=shardlinetest$$
compose=(docker-compose -p "$project" -f "$source_dir/deploy/docker/docker-compose.yml" --profile cpu)
# TLS as the compose file asks for it: development certificates and a token.
tls=$work/tls
for name in coordinator worker shardctl; do bash "$source_dir/deploy/certs.sh" "$tls" "$name" >/dev/null; done
token=$(openssl rand -hex 32)
echo "admin ops $token" >"$tls/admin-tokens"
echo "$token" >"$work/token"
chmod a+rx "$tls" && chmod a+r "$tls"/*  # the containers' user reads them (development certificates)
export SHARDLINE_TLS_DIR=$tls
secure=(--tls_cert="$tls/shardctl.pem" --tls_key="$tls/shardctl.key" --tls_ca="$tls/ca.pem" --token_file="$work/token")
ctl() { timeout 60 "$bin_dir/shardctl" --coordinator="$coordinator" "${secure[@]}" "$@"; }

ip_forward=$(sysctl -n net.ipv4.ip_forward)
iptables-save >"$work/iptables.before"
have_ip6=""
if command -v ip6tables-save >/dev/null && ip6tables-save >"$work/ip6tables.before" 2>/dev/null; then have_ip6=1; fi
links_before=$(ip -o link show | awk -F': ' '{print $2}' | sort)
dockerd_pid=""

# The rules as they were: the tables the dump holds are restored; those it
# lacks did not exist before (iptables-save lists every table that does), so
# everything in them now is dockerd's: its chains go and the built-in chains'
# policies are ACCEPT again (dockerd sets FORWARD to DROP).
restore_firewall() {
  local tool=$1 before=$2 table chain
  "$tool-restore" <"$before"
  for table in $("$tool-save" | sed -n 's/^\*//p'); do
    grep -qx "\*$table" "$before" && continue
    "$tool" -t "$table" -F && "$tool" -t "$table" -X
    for chain in $("$tool" -t "$table" -S | awk '$1 == "-P" {print $2}'); do "$tool" -t "$table" -P "$chain" ACCEPT; done
  done
}

cleanup() {
  local status=$?
  set +e
  if [[ -n $dockerd_pid ]]; then
    if [[ $status -ne 0 ]]; then
      echo "--- containers"; docker ps -a 2>&1 | head -20
      echo "--- compose logs (last lines)"; "${compose[@]}" logs --no-color --tail=30 2>&1 | tail -80
    fi
    # The images and build cache live in its data root, removed below:
    # only the containers, networks and volumes go through the engine.
    timeout 120 "${compose[@]}" down --volumes --timeout 5 >/dev/null 2>&1
    kill "$dockerd_pid" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$dockerd_pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$dockerd_pid" 2>/dev/null
    wait "$dockerd_pid" 2>/dev/null
  fi
  # Mounts dockerd left (it unmounts on a clean stop).
  grep -E " ($work|$exec_root)" /proc/mounts | awk '{print $2}' | sort -r | xargs -r -n1 umount -l
  # Bridges it made (docker0, br-<id>), then its firewall rules and sysctl.
  for link in $(ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | sort); do
    if ! grep -qx "$link" <<<"$links_before" && [[ $link == docker0 || $link == br-* || $link == veth* ]]; then
      ip link del "$link" 2>/dev/null
    fi
  done
  restore_firewall iptables "$work/iptables.before"
  [[ -n $have_ip6 ]] && restore_firewall ip6tables "$work/ip6tables.before"
  sysctl -qw net.ipv4.ip_forward="$ip_forward"
  rm -rf "$exec_root" "$work/data"
  exit $status
}
trap cleanup EXIT

# --- The engine.
dockerd --data-root="$work/data" --exec-root="$exec_root/exec" --pidfile="$exec_root/docker.pid" \
  -H "$DOCKER_HOST" >"$work/dockerd.log" 2>&1 &
dockerd_pid=$!
for _ in $(seq 100); do
  docker info >/dev/null 2>&1 && break
  kill -0 "$dockerd_pid" 2>/dev/null || break
  sleep 0.2
done
if ! docker info >/dev/null 2>&1; then
  reason=$(tail -n 3 "$work/dockerd.log" | tr '\n' ' ')
  kill "$dockerd_pid" 2>/dev/null
  wait "$dockerd_pid" 2>/dev/null
  dockerd_pid=""
  skip "dockerd cannot start here: $reason"
fi
echo "dockerd $(docker version --format '{{.Server.Version}}') up (pid $dockerd_pid)"

# --- The images.
start=$(date +%s)
timeout 600 "$source_dir/deploy/docker/make-base-image.sh" "$BASE_IMAGE"
echo "base image in $(($(date +%s) - start)) s"
start=$(date +%s)
timeout 1500 "${compose[@]}" build --quiet coordinator >"$work/build.log" 2>&1 || { tail -n 40 "$work/build.log"; exit 1; }
echo "image built in $(($(date +%s) - start)) s ($(docker image inspect "$SHARDLINE_IMAGE" --format '{{.Size}}') bytes)"
user=$(docker run --rm --entrypoint id "$SHARDLINE_IMAGE" -u)
[[ $user != 0 ]] || { echo "FAIL: the image runs as root"; exit 1; }
docker run --rm --entrypoint shardline-worker "$SHARDLINE_IMAGE" --help | grep -q -- "--advertise_host" \
  || { echo "FAIL: shardline-worker --help in the image"; exit 1; }

# --- The cluster.
start=$(date +%s)
timeout 300 "${compose[@]}" up -d --scale worker=3 >"$work/up.log" 2>&1 || { cat "$work/up.log"; exit 1; }
coordinator=$("${compose[@]}" port coordinator 7400)
echo "coordinator at $coordinator"
workers_ready=""
for _ in $(seq 240); do
  idle=$(ctl get workers 2>/dev/null | grep -c " idle " || true)
  if [[ $idle -eq 3 ]]; then workers_ready=1; break; fi
  sleep 0.5
done
[[ -n $workers_ready ]] || { echo "FAIL: three workers never registered"; ctl get workers; exit 1; }
for c in $("${compose[@]}" ps -q); do
  health=$(docker inspect --format '{{.State.Health.Status}}' "$c")
  for _ in $(seq 60); do [[ $health == healthy ]] && break; sleep 1; health=$(docker inspect --format '{{.State.Health.Status}}' "$c"); done
  [[ $health == healthy ]] || { echo "FAIL: container $c is $health"; exit 1; }
done
echo "coordinator and 3 workers healthy in $(($(date +%s) - start)) s"
start=$(date +%s)

# --- A job, a lost worker, recovery.
python3 - "$source_dir/examples/addition.json" "$work/spec.json" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
spec["parallel"]["pipeline_stages"] = 2  # the third worker is the spare
json.dump(spec, open(sys.argv[2], "w"))
PY
job=$(ctl -o json submit "$work/spec.json" | python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')
echo "submitted $job"
step=0
for _ in $(seq 600); do
  step=$(ctl -o json describe job "$job" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("committed_step", -1))')
  [[ $step -ge 200 ]] && break
  sleep 0.2
done
[[ $step -ge 200 ]] || { echo "FAIL: no checkpoint at step 200"; ctl describe job "$job"; exit 1; }
victim=$(ctl -o json get workers | python3 -c '
import json, sys
busy = [w["name"] for w in json.load(sys.stdin)["workers"] if w.get("state") == "busy"]
print(sorted(busy)[-1])')
echo "committed step $step; killing worker container $victim"
docker kill "$victim" >/dev/null
timeout 600 "$bin_dir/shardctl" --coordinator="$coordinator" "${secure[@]}" watch "$job" >"$work/watch.log" 2>&1 \
  || { echo "FAIL: the job did not succeed"; tail -n 5 "$work/watch.log"; ctl describe job "$job"; exit 1; }
ctl -o json describe job "$job" >"$work/job.json"
ctl -o json get workers >"$work/workers.json"
python3 - "$work/job.json" "$work/workers.json" "$victim" <<'PY'
import json, sys
job = json.load(open(sys.argv[1]))
workers = {w["name"]: w for w in json.load(open(sys.argv[2]))["workers"]}
victim = sys.argv[3]
assert job["state"] == "SUCCEEDED", job["state"]
assert int(job["step"]) == 1500 and int(job["committed_step"]) == 1500, job
assert int(job["plan_epoch"]) >= 2, ("no restart after the lost worker", job["plan_epoch"])
assert workers[victim]["state"] == "lost", workers[victim]
names = [s["worker"] for s in job["stages"]]
assert victim not in names, ("the dead worker still holds a stage", names)
resumed = [s.get("resumed_from", "") for s in job["stages"]]
assert any(resumed), ("no position says where its state came from", job["stages"])
print("recovered: epoch %s, stages on %s, state from %s" % (job["plan_epoch"], names, resumed))
PY
echo "job trained, lost a worker and recovered in $(($(date +%s) - start)) s"

# --- The weights.
ctl export "$job" -o "$work/weights.safetensors" >/dev/null
timeout 120 "$bin_dir/shardline-train" "$work/spec.json" --eval_weights="$work/weights.safetensors" \
  --metrics_out="$work/eval.jsonl" >"$work/eval.log" 2>&1 || { cat "$work/eval.log"; exit 1; }
python3 - "$work/eval.jsonl" <<'PY'
import json, sys
record = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][-1]
# shardline-train reaches 100% on the 993 held-out problems (docs/benchmarks.md),
# and recovery is bit-identical to a run without a loss.
assert record.get("eval") and record["examples"] == 993 and record["accuracy"] >= 0.99, record
print("exported weights: held-out exact match %.1f%% of %d" % (100 * record["accuracy"], record["examples"]))
PY
echo "ok: compose cluster trained, lost a worker, recovered and exported"
