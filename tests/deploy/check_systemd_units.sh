#!/usr/bin/env bash
# Checks deploy/systemd's units as systemd reads them: `systemd-analyze
# verify` (any output is a failure: it exits 0 on many parse errors) with
# ExecStart pointed at this build's binaries, and `systemd-analyze security
# --offline` below a threshold of exposure, so that a hardening option
# dropped by mistake fails. The environment files must set only flags the
# daemons have. Exit 77 (skipped) without systemd-analyze.
#
#   check_systemd_units.sh SOURCE_DIR BIN_DIR
set -euo pipefail
source_dir=$1
bin_dir=$2
if ! command -v systemd-analyze >/dev/null; then
  echo "skipped: systemd-analyze is not installed"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# unit file, name to verify it as, highest exposure allowed (0..100)
check() {
  local unit=$1 as=$2 threshold=$3
  sed "s#/usr/local/bin/#$bin_dir/#" "$source_dir/deploy/systemd/$unit" > "$work/$as"
  local out
  out=$(cd "$work" && systemd-analyze verify "./$as" 2>&1) || { echo "FAIL: verify $unit: $out"; exit 1; }
  if [[ -n $out ]]; then
    echo "FAIL: systemd-analyze verify $unit said:"
    echo "$out"
    exit 1
  fi
  if ! out=$(cd "$work" && systemd-analyze security --offline=yes --threshold="$threshold" "./$as" 2>&1); then
    echo "FAIL: $unit is more exposed than $threshold/100:"
    echo "$out" | tail -n 25
    exit 1
  fi
  echo "ok: $unit ($(echo "$out" | grep -o 'exposure level for [^:]*: [0-9.]*' | sed 's/.*: //'))"
}
check shardline-coordinator.service shardline-coordinator.service 15
check shardline-worker@.service shardline-worker@gpu0.service 25

# Every SHARDLINE_ variable of the example environment files names a flag
# of its daemon (a daemon reads only its own flags' variables and would
# ignore a misspelt one).
for pair in coordinator.env:shardline-coordinator worker.env:shardline-worker; do
  file=${pair%%:*}
  daemon=${pair##*:}
  help=$("$bin_dir/$daemon" --help)
  while IFS= read -r line; do
    [[ $line =~ ^SHARDLINE_([A-Z_]+)= ]] || continue
    flag=$(echo "${BASH_REMATCH[1]}" | tr 'A-Z' 'a-z')
    if ! grep -q -- "^  --$flag " <<<"$help"; then
      echo "FAIL: $file sets SHARDLINE_${BASH_REMATCH[1]}, but $daemon has no --$flag"
      exit 1
    fi
  done < "$source_dir/deploy/systemd/$file"
  echo "ok: $file sets only flags of $daemon"
done
