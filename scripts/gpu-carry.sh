#!/bin/sh
# Packs a CUDA build for the GPU machine, which takes at most 64 MiB of
# working tree plus carried paths per call:
#
#   scripts/gpu-carry.sh [BUILD_DIR]      (default build-gpu)
#
# Writes build-carry/gpu.tar.xz (ignored by git): the stripped test and
# benchmark binaries, tandem, loadgen and BUILD_DIR/libs, ~19 MB. The demo
# models' safetensors (37 MB) still have to leave the tree for the call. On
# the GPU machine:
#
#   mkdir -p /tmp/gb && tar -C /tmp/gb -xJf build-carry/gpu.tar.xz &&
#     scripts/gpu-suite.sh /tmp/gb/build-gpu /tmp/out
#
# and copy the few files wanted to $OUT (only ~8 files come back per call).
set -eu
build=${1:-build-gpu}
stage=$(mktemp -d)
mkdir -p "$stage/build-gpu" build-carry
for f in tandem_cuda_tests bench_cuda_decode bench_cuda_attention tandem loadgen; do
  [ -x "$build/$f" ] && cp "$build/$f" "$stage/build-gpu/" && strip "$stage/build-gpu/$f"
done
[ -d "$build/libs" ] && cp -r "$build/libs" "$stage/build-gpu/"
tar -C "$stage" -cJf build-carry/gpu.tar.xz build-gpu
rm -rf "$stage"
ls -l build-carry/gpu.tar.xz
