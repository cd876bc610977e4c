#!/bin/sh
# Batched decode under several settings of the CUDA switches, in one call
# on the GPU machine (the A/B measurement of a switch before it becomes a
# default, or of a default against what it replaced):
#
#   scripts/gpu-ab.sh BUILD_DIR OUT_DIR [SETTING ...]
#
# A SETTING is a space-separated list of VAR=VALUE ("" for the defaults).
# MODELS (default: the five shapes in bench/configs) and BATCHES (default
# 32) choose the runs: bench_cuda_decode at CONTEXT (default 1,024) and
# TOKENS (default 32), every model at every batch under every setting, the
# settings alternated REPEATS times (default 1), one JSON line each in
# OUT_DIR/ab.jsonl with a "setting" field, and one line each in
# OUT_DIR/ab-summary.txt (setting, model, batch, context, tok/s, fraction
# of the bandwidth or roofline), also printed. PROFILE_MODEL (default
# gemma-3-1b) is also profiled op by op at the first batch under each
# setting: OUT_DIR/ab-profile.txt (PROFILE_MODEL=none: no profiles). Errors
# in OUT_DIR/ab-stderr.log.
# BENCH_ARGS: more bench_cuda_decode arguments for every run, e.g. packed
# 4-bit weights at 16 and 32 sequences under two dequantized tile sizes:
#
#   BATCHES="16 32" BENCH_ARGS="--quantize 4" scripts/gpu-ab.sh B OUT \
#     TANDEM_CUDA_PACKED_QUANT=1 \
#     "TANDEM_CUDA_PACKED_QUANT=1 TANDEM_CUDA_DEQUANT_TILE_WEIGHTS=8388608"
set -u
build=$1
out=$2
shift 2
[ $# -gt 0 ] || set -- ""
models=${MODELS:-llama-3.2-1b qwen3-1.7b ministral-3-3b gemma-3-1b gemma-4-e2b}
batches=${BATCHES:-32}
profile_model=${PROFILE_MODEL:-gemma-3-1b}
mkdir -p "$out"
[ -d "$build/libs" ] && export LD_LIBRARY_PATH="$build/libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
TANDEM_SOURCE_DIR=$(pwd)
export TANDEM_SOURCE_DIR

# bench_cuda_decode under the setting given first, its JSON line labelled.
bench() {
  label=$1
  shift
  (
    for v in $label; do export "$v"; done
    timeout 120 "$build/bench_cuda_decode" "$@" | sed "s/^{/{\"setting\": \"${label:-defaults}\", /"
  )
}
context=${CONTEXT:-1024}
tokens=${TOKENS:-32}
repeats=${REPEATS:-1}
r=0
while [ "$r" -lt "$repeats" ]; do
  r=$((r + 1))
  for m in $models; do
    for b in $batches; do
      for s in "$@"; do
        # shellcheck disable=SC2086 # BENCH_ARGS is a list of arguments
        bench "$s" "bench/configs/$m.json" --context "$context" --tokens "$tokens" --batch "$b" \
          --prefill 16 ${BENCH_ARGS:-}
      done
    done
  done
done >"$out/ab.jsonl" 2>"$out/ab-stderr.log"
python3 - "$out/ab.jsonl" <<'SUMMARY' | tee "$out/ab-summary.txt"
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    print(d["setting"], d["config"].split("/")[-1].removesuffix(".json"), "batch", d["batch"],
          "context", d["context"], "%.1f tok/s" % d["decode_tok_s"], "%.1f%%" % (100 * d["fraction"]))
SUMMARY

[ "$profile_model" = none ] && exit 0
first_batch=${batches%% *}
for s in "$@"; do
  echo "== setting: ${s:-defaults}"
  (
    for v in $s; do export "$v"; done
    timeout 120 "$build/bench_cuda_decode" "bench/configs/$profile_model.json" --context 1024 \
      --tokens 16 --batch "$first_batch" --prefill 16 ${BENCH_ARGS:-} --profile 2>&1 >/dev/null
  )
done >"$out/ab-profile.txt"
