#!/usr/bin/env bash
# Creates the peer-benchmark venv with PyTorch from the Python package index
# (with its NVIDIA wheels: ~5 GB, a few minutes; it runs on the CPU here).
# Benchmarks only: never installed by CI or the product.
#
#   bench/peers/setup.sh            # venv at $SHARDLINE_PEERS_VENV or ~/.cache/shardline/peers-venv
set -euo pipefail
venv=${SHARDLINE_PEERS_VENV:-$HOME/.cache/shardline/peers-venv}
if [[ ! -x $venv/bin/python ]]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q torch numpy safetensors
"$venv/bin/python" -c 'import torch; print("torch", torch.__version__, torch.backends.mkl.is_available() and "MKL" or "no MKL")'
echo "$venv"
