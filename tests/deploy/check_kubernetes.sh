#!/usr/bin/env bash
# Validates deploy/kubernetes's manifests offline against the Kubernetes
# API schemas (the kubernetes-validate package in the tools venv, --strict:
# an unknown field is an error) for the oldest and newest Kubernetes
# versions we name, and checks that every SHARDLINE_ variable they set names
# a flag of its daemon. Exit 77 (skipped) without the package.
#
#   check_kubernetes.sh SOURCE_DIR BIN_DIR PYTHON
set -euo pipefail
source_dir=$1
bin_dir=$2
python=$3
validate=$(dirname "$python")/kubernetes-validate
[[ -x $validate ]] || { echo "skipped: kubernetes-validate is not in the tools venv (deploy/install-deps.sh)"; exit 77; }
manifests=("$source_dir"/deploy/kubernetes/*.yaml)
# 1.25: the oldest whose schemas the package holds (gRPC probes: 1.24 on).
for version in 1.25.0 1.33.0; do
  "$validate" --strict --quiet -k "$version" "${manifests[@]}"
done
echo "ok: ${#manifests[@]} manifests valid for Kubernetes 1.25 and 1.33"
for pair in coordinator.yaml:shardline-coordinator workers.yaml:shardline-worker; do
  file=${pair%%:*}
  daemon=${pair##*:}
  help=$("$bin_dir/$daemon" --help)
  for variable in $(grep -o 'SHARDLINE_[A-Z_]*' "$source_dir/deploy/kubernetes/$file" | sort -u); do
    flag=$(echo "${variable#SHARDLINE_}" | tr 'A-Z' 'a-z')
    grep -q -- "^  --$flag " <<<"$help" || { echo "FAIL: $file sets $variable, but $daemon has no --$flag"; exit 1; }
  done
  echo "ok: $file sets only flags of $daemon"
done
