#!/bin/sh
# The tensor-core decode attention's split policy, measured on the GPU
# machine (bench_cuda_decode, tok/s):
#
#   scripts/gpu-split-sweep.sh BUILD_DIR
#
# For each shape and batch, the default (8 one-warp blocks per SM, no cap on
# keys per split: TANDEM_DECODE_MIN_SPLIT_KEYS=1) against caps of 64 and
# 128 keys per split and against 2 blocks per SM (the CUDA-core kernel's
# aim). One line per run.
set -u
build=$1
[ -d "$build/libs" ] && export LD_LIBRARY_PATH="$build/libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for c in "llama-3.2-1b 1 128" "llama-3.2-1b 1 1024" "llama-3.2-1b 32 1024" "llama-3.2-1b 64 1024" \
  "gemma-3-1b 1 1024" "gemma-3-1b 32 1024" "gemma-4-e2b 32 1024"; do
  for k in "8 1" "8 64" "8 128" "2 1"; do
    set -- $k $c
    r=$(TANDEM_DECODE_BLOCKS_PER_SM=$1 TANDEM_DECODE_MIN_SPLIT_KEYS=$2 timeout 60 \
      "$build/bench_cuda_decode" "bench/configs/$3.json" --context "$5" --tokens 32 --batch "$4" \
      --prefill 16 2>/dev/null | sed -n 's/.*"decode_tok_s": \([0-9.]*\).*/\1/p')
    echo "blocks/SM $1, min split keys $2: $3 batch $4 context $5: ${r:-failed} tok/s"
  done
done
