#!/bin/sh
# The CUDA paths written without a GPU and still opt-in, checked and timed in
# one call on the GPU machine, so one session can decide whether each
# becomes the default:
#
#   scripts/gpu-opt-in.sh BUILD_DIR OUT_DIR
#
# BUILD_DIR: a CUDA build with tandem_cuda_tests and bench_cuda_decode
# (bench_cuda_attention too, where carried; scripts/gpu-carry.sh). Writes
# OUT_DIR/tests.log (every CUDA test: the opt-in kernels' own tests switch
# them on themselves), OUT_DIR/tests-opt-in.log (the decoder tests — parity
# fixtures, greedy continuations, chunked prefill — with every opt-in path
# on), OUT_DIR/prefill.jsonl (prefill of 4,096 tokens on each model shape:
# defaults, each opt-in path alone, all of them; the "opt_in" field says
# which), OUT_DIR/decode.jsonl (Gemma 4's decode at 1 and 2 sequences with
# and without its fused per-layer block) and OUT_DIR/attention.txt (the
# prefill attention kernels alone).
# Exit status: non-zero when a test failed.
set -u
build=$1
out=$2
mkdir -p "$out"
[ -d "$build/libs" ] && export LD_LIBRARY_PATH="$build/libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
TANDEM_SOURCE_DIR=$(pwd)
export TANDEM_SOURCE_DIR
status=0
paths="TANDEM_CUDA_PREFILL_BF16 TANDEM_CUDA_QKV_POST_WARPS TANDEM_CUDA_GATED_VEC4 TANDEM_CUDA_FUSE_PLE"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$out/gpu.txt" 2>&1
timeout 300 "$build/tandem_cuda_tests" >"$out/tests.log" 2>&1 || status=1
(
  for v in $paths; do export "$v=1"; done
  timeout 240 "$build/tandem_cuda_tests" --gtest_filter='CudaDecoder*' >"$out/tests-opt-in.log" 2>&1
) || status=1

# One JSON line per run, its opt-in paths added as a field.
bench() {
  label=$1
  shift
  timeout 120 "$build/bench_cuda_decode" "$@" | sed "s/^{/{\"opt_in\": \"$label\", /"
}
for m in llama-3.2-1b qwen3-1.7b ministral-3-3b gemma-3-1b gemma-4-e2b; do
  c=bench/configs/$m.json
  [ -f "$c" ] || continue
  set -- "$c" --context 16 --tokens 1 --prefill 4096
  bench none "$@"
  for v in $paths; do
    (export "$v=1" && bench "$v" "$@")
  done
  (for v in $paths; do export "$v=1"; done && bench all "$@")
done >"$out/prefill.jsonl" 2>"$out/prefill-stderr.log"

# Gemma 4's fused per-layer block is a decode-step change: batch 1 and 2
# sequences (the fused steps), context 128, without and with it.
for b in 1 2; do
  set -- bench/configs/gemma-4-e2b.json --context 128 --tokens 128 --prefill 16 --batch $b
  bench none "$@"
  (export TANDEM_CUDA_FUSE_PLE=1 && bench TANDEM_CUDA_FUSE_PLE "$@")
done >"$out/decode.jsonl" 2>"$out/decode-stderr.log"

[ -x "$build/bench_cuda_attention" ] &&
  timeout 180 "$build/bench_cuda_attention" >"$out/attention.txt" 2>&1
exit $status
