#!/bin/sh
# The GPU checks and benchmarks in one command, for the GPU machine:
#
#   scripts/gpu-suite.sh BUILD_DIR OUT_DIR [quick]
#
# BUILD_DIR holds a CUDA build (tandem, tandem_cuda_tests, bench_cuda_decode;
# built here or carried from a build machine with the same toolkit). Writes
# OUT_DIR/cuda-tests.log (every CUDA kernel and the decoder against the CPU
# backend), OUT_DIR/bench.jsonl (bench_cuda_decode: batch-1 decode at
# contexts 128 and 4096, 32 sequences at context 1024, prefill of 512 and
# 4096 tokens, for each model shape in bench/configs; 8-128 sequences for
# llama-3.2-1b), OUT_DIR/profile.txt (nsys kernel summary, if nsys exists) and
# OUT_DIR/serve.log (each demo model in models/ served with --device cuda
# and checked by tandem coherence on both lanes). `quick` runs the tests and one shape.
# Exit status: non-zero when a test or the coherence check failed.
set -u
build=$1
out=$2
mode=${3:-full}
mkdir -p "$out"
export TANDEM_SOURCE_DIR="$(pwd)"
# Shared libraries carried beside a build made on another machine (the GPU
# machine's image lacks cpp-httplib, libcurl, stb...): BUILD_DIR/libs.
[ -d "$build/libs" ] && export LD_LIBRARY_PATH="$build/libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
status=0

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$out/gpu.txt" 2>&1
timeout 300 "$build/tandem_cuda_tests" >"$out/cuda-tests.log" 2>&1 || status=1

configs="llama-3.2-1b gemma-3-1b qwen3-1.7b gemma-4-e2b ministral-3-3b"
[ "$mode" = quick ] && configs="llama-3.2-1b"
for m in $configs; do
  c=bench/configs/$m.json
  [ -f "$c" ] || continue
  timeout 120 "$build/bench_cuda_decode" "$c" --context 128 --tokens 128 --prefill 512
  timeout 120 "$build/bench_cuda_decode" "$c" --context 4096 --tokens 64 --prefill 4096
  [ "$mode" = quick ] && continue
  for b in 8 32 64 128; do
    [ "$b" != 32 ] && [ "$m" != llama-3.2-1b ] && continue  # every batch for one shape
    timeout 120 "$build/bench_cuda_decode" "$c" --context 1024 --tokens 32 --batch $b --prefill 512
  done
done >"$out/bench.jsonl" 2>"$out/bench-stderr.log"

# Which kernels take a decode step's time (when Nsight Systems is there).
if command -v nsys >/dev/null 2>&1; then
  nsys profile --stats=true --force-overwrite=true -o /tmp/tandem-decode-profile \
    "$build/bench_cuda_decode" bench/configs/llama-3.2-1b.json --context 128 --tokens 256 \
    --prefill 16 >"$out/profile.txt" 2>&1
fi

{
  for model in models/*-demo; do
    [ -f "$model/model.safetensors" ] || continue
    for set in demo-text demo-vision; do
      echo "== $model --set $set --device cuda"
      timeout 120 "$build/tandem" coherence "$model" --set "$set" --timeout 30 -- --device cuda ||
        status=1
    done
  done
} >"$out/serve.log" 2>&1
exit $status
