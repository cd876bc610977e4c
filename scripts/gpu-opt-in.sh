#!/bin/sh
# CUDA paths switched by environment variables, checked and timed against
# the defaults in one call on the GPU machine: how a path written without a
# GPU (on only with its variable set) is checked and measured before it
# becomes the default, and how a default is measured against what it
# replaced:
#
#   scripts/gpu-opt-in.sh BUILD_DIR OUT_DIR [VAR=VALUE ...]
#
# Without settings it measures the four paths the twentieth session made the
# defaults, each switched off (=0). BUILD_DIR: a CUDA build with
# tandem_cuda_tests and bench_cuda_decode (bench_cuda_attention too, where
# carried; scripts/gpu-carry.sh). Writes OUT_DIR/tests.log (every CUDA test,
# defaults), OUT_DIR/tests-settings.log (the decoder tests — parity
# fixtures, greedy continuations, chunked prefill — with every setting
# applied), OUT_DIR/prefill.jsonl (prefill of 4,096 tokens on each model
# shape: defaults, each setting alone, all of them; the "setting" field says
# which), OUT_DIR/decode.jsonl (batch-1 and 2-sequence decode of gemma-4-e2b
# and llama-3.2-1b the same way), OUT_DIR/attention.txt (the attention
# kernels alone) and OUT_DIR/bench-stderr.log: seven files, since the GPU
# machine returns only about eight a call. BENCH_ARGS: more bench_cuda_decode
# arguments for every benchmark, e.g. packed 4-bit weights with the skinny
# GEMM's row groups:
#
#   BENCH_ARGS="--quantize 4" scripts/gpu-opt-in.sh B OUT \
#     TANDEM_CUDA_SKINNY_ROW_GROUPS=4
#
# Exit status: non-zero when a test failed.
set -u
build=$1
out=$2
shift 2
settings=${*:-TANDEM_CUDA_PREFILL_BF16=0 TANDEM_CUDA_QKV_POST_WARPS=0 TANDEM_CUDA_GATED_VEC4=0 TANDEM_CUDA_FUSE_PLE=0}
mkdir -p "$out"
[ -d "$build/libs" ] && export LD_LIBRARY_PATH="$build/libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
TANDEM_SOURCE_DIR=$(pwd)
export TANDEM_SOURCE_DIR
status=0

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$out/gpu.txt" 2>&1
timeout 300 "$build/tandem_cuda_tests" >"$out/tests.log" 2>&1 || status=1
(
  for s in $settings; do export "$s"; done
  timeout 240 "$build/tandem_cuda_tests" --gtest_filter='CudaDecoder*' >"$out/tests-settings.log" 2>&1
) || status=1

# One JSON line per run of bench_cuda_decode under the settings given first
# (a space-separated list, "" for the defaults), which become its field.
bench() {
  label=$1
  shift
  (
    for s in $label; do export "$s"; done
    # shellcheck disable=SC2086 # BENCH_ARGS is a list of arguments
    timeout 120 "$build/bench_cuda_decode" "$@" ${BENCH_ARGS:-} |
      sed "s/^{/{\"setting\": \"${label:-defaults}\", /"
  )
}
# The defaults, each setting alone, and all of them (when there are several).
each() {
  bench "" "$@"
  for s in $settings; do bench "$s" "$@"; done
  [ "$settings" = "${settings% *}" ] || bench "$settings" "$@"
}
for m in llama-3.2-1b qwen3-1.7b ministral-3-3b gemma-3-1b gemma-4-e2b; do
  c=bench/configs/$m.json
  [ -f "$c" ] && each "$c" --context 16 --tokens 1 --prefill 4096
done >"$out/prefill.jsonl" 2>"$out/bench-stderr.log"

for m in gemma-4-e2b llama-3.2-1b; do
  for b in 1 2; do
    each "bench/configs/$m.json" --context 128 --tokens 128 --prefill 16 --batch $b
  done
done >"$out/decode.jsonl" 2>>"$out/bench-stderr.log"

[ -x "$build/bench_cuda_attention" ] &&
  timeout 180 "$build/bench_cuda_attention" >"$out/attention.txt" 2>&1
exit $status
