#!/bin/sh
# Packs a CUDA build for the GPU machine, which takes at most 64 MiB of
# working tree plus carried paths per call:
#
#   scripts/gpu-carry.sh [--lean] [BUILD_DIR]      (default build-gpu)
#
# Writes build-carry/gpu.tar.xz (ignored by git): the stripped test and
# benchmark binaries, tandem, loadgen and BUILD_DIR/libs, ~19 MB; with
# --lean only tandem_cuda_tests and bench_cuda_decode (~11 MB: the kernel
# tests and decode benchmarks, which most runs need); CARRY_BINARIES="a b"
# names the binaries instead. The demo
# models' safetensors (37 MB) still have to leave the tree for the call. On
# the GPU machine:
#
#   mkdir -p /tmp/gb && tar -C /tmp/gb -xJf build-carry/gpu.tar.xz &&
#     scripts/gpu-suite.sh /tmp/gb/build-gpu /tmp/out
#
# and copy the few files wanted to $OUT (only ~8 files come back per call).
set -eu
binaries=${CARRY_BINARIES:-"tandem_cuda_tests bench_cuda_decode bench_cuda_kernels bench_cuda_attention bench_cuda_gemm bench_cuda_vision tandem loadgen"}
if [ "${1:-}" = "--lean" ]; then
  binaries="tandem_cuda_tests bench_cuda_decode"
  shift
fi
build=${1:-build-gpu}
stage=$(mktemp -d)
mkdir -p "$stage/build-gpu" build-carry
for f in $binaries; do
  [ -x "$build/$f" ] && cp "$build/$f" "$stage/build-gpu/" && strip "$stage/build-gpu/$f"
done
# Shared libraries the GPU machine's image may lack (cpp-httplib, libcurl,
# libwebp, pcre2 ...): every non-CUDA, non-libc dependency of the binaries.
# cuBLAS is not carried (hundreds of MB): the GPU machine has it.
mkdir -p "$stage/build-gpu/libs"
for f in "$stage"/build-gpu/*; do
  [ -f "$f" ] && ldd "$f" 2>/dev/null
done | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
  grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda|libcublas[^/]*|libgcc_s|libresolv|libnsl|libutil)\.so' |
  while read -r lib; do cp -L "$lib" "$stage/build-gpu/libs/"; done
[ -d "$build/libs" ] && cp -r "$build/libs/." "$stage/build-gpu/libs/"
tar -C "$stage" -cJf build-carry/gpu.tar.xz build-gpu
rm -rf "$stage"
ls -l build-carry/gpu.tar.xz
