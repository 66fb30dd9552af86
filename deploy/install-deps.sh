#!/usr/bin/env bash
# Installs the Debian 12 packages Shardline builds and tests with. Idempotent:
# packages already present are left alone and apt is not touched at all when
# nothing is missing. Run as root (or with sudo available).
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libgoogle-glog-dev libgflags-dev libgtest-dev libgmock-dev
  libgoogle-perftools-dev libopenblas-dev libsqlite3-dev libsystemd-dev libmicrohttpd-dev libssl-dev
  # For tests only: the Prometheus server and promtool, a Docker engine with
  # Compose and debootstrap for the Compose cluster (tests start their own).
  prometheus docker.io docker-compose debootstrap
  # deploy/certs.sh (development certificates) and the TLS tests; clang and
  # libFuzzer for the fuzz targets (tests/fuzz/run_fuzzers.sh).
  openssl clang libclang-rt-dev
)

# Python tools for tests and benchmarks only (the product never runs Python):
# a virtual environment with the `safetensors` package, to check our files,
# gRPC's reference clients, to check our daemons' health and reflection, and
# kubernetes-validate, to check the Kubernetes manifests offline.
pytools=${SHARDLINE_PYTOOLS:-/opt/shardline/pytools}
install_pytools() {
  if "$pytools/bin/python" -c 'import safetensors, numpy, grpc_health, grpc_reflection, kubernetes_validate' \
      2>/dev/null; then
    return 0
  fi
  echo "install-deps: creating $pytools (safetensors, numpy, grpcio-health-checking, grpcio-reflection," \
    "kubernetes-validate)"
  python3 -m venv "$pytools" 2>/dev/null || {
    $sudo apt-get install -y -qq --no-install-recommends python3-venv && python3 -m venv "$pytools"
  }
  "$pytools/bin/python" -m pip install -q --disable-pip-version-check safetensors numpy \
    grpcio-health-checking grpcio-reflection kubernetes-validate
}

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo=sudo; fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

export DEBIAN_FRONTEND=noninteractive
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
else
  if [ -n "$sudo" ] && ! command -v sudo >/dev/null; then
    echo "install-deps: run as root (missing: ${missing[*]})" >&2
    exit 1
  fi
  echo "install-deps: installing ${missing[*]}"
  $sudo apt-get update -qq
  # Packages with a service (prometheus) must not start it: tests start
  # their own, on ports of their own. A policy-rc.d saying "not now" is
  # what Debian offers for that, where none is in place.
  policy=/usr/sbin/policy-rc.d
  made_policy=""
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null && $sudo chmod 755 "$policy" && made_policy=1
  fi
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" || { [ -n "$made_policy" ] && $sudo rm -f "$policy"; exit 1; }
  if [ -n "$made_policy" ]; then $sudo rm -f "$policy"; fi
fi
install_pytools
