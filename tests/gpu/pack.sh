#!/usr/bin/env bash
# Builds the CUDA-enabled test and benchmark binaries on this (GPU-less)
# machine and bundles them, with the shared libraries they load, into
# .gpu-bundle/ (git-ignored) for tests/gpu/run.sh on the GPU machine.
#
# The GPU machine has CUDA 13 (driver, runtime, cuBLAS), CMake and Python,
# but none of our Debian libraries: gRPC, protobuf, Abseil, glog, OpenBLAS
# travel in the bundle, xz-compressed (OpenBLAS alone is ~35 MiB raw).
# glibc, libstdc++ and CUDA's own libraries do not travel.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${SHARDLINE_GPU_BUILD_DIR:-$root/build-gpu}
out=$root/.gpu-bundle
binaries=(backend_conformance_test backend_transfer_test backend_errors_test gradient_check_test
          worker_pipeline_equivalence_test worker_collective_test bench_backend bench_train
          bench_gpu_transport bench_pipeline shardline-train)

bash "$root/deploy/install-deps.sh"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DSHARDLINE_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
cmake --build "$build" -j2 --target "${binaries[@]}"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
for b in "${binaries[@]}"; do
  path=$build/bin/$b
  [ -x "$path" ] || { echo "pack: $b was not built" >&2; exit 1; }
  cp "$path" "$stage/bin/"
  strip "$stage/bin/$b"
done

# Every shared library the binaries load, except the C runtime and CUDA's.
ldd "$stage"/bin/* | awk '/=> \// {print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libresolv.so*) ;;
    libstdc++.so*|libgcc_s.so*) ;;
    libcuda.so*|libcudart.so*|libcublas.so*|libcublasLt.so*|libnvidia*) ;;
    *) cp -L "$lib" "$stage/lib/" ;;
  esac
done
strip --strip-unneeded "$stage"/lib/* 2>/dev/null || true

rm -rf "$out"
mkdir -p "$out"
tar -C "$stage" -cJf "$out/bundle.tar.xz" bin lib
git -C "$root" rev-parse --short HEAD >"$out/commit" 2>/dev/null || echo unknown >"$out/commit"
echo "pack: $(du -sh "$out" | cut -f1) in $out ($(ls "$stage/lib" | wc -l) libraries, commit $(cat "$out/commit"))"
