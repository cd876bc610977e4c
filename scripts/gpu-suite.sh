#!/bin/sh
# The GPU checks and benchmarks in one command, for the GPU machine:
#
#   scripts/gpu-suite.sh BUILD_DIR OUT_DIR [quick]
#
# BUILD_DIR holds a CUDA build (tandem, tandem_cuda_tests, bench_cuda_decode,
# bench_cuda_kernels, bench_cuda_attention, bench_cuda_vision;
# built here or carried from a build machine with the same toolkit). Writes
# OUT_DIR/cuda-tests.log (every CUDA kernel and the decoder against the CPU
# backend), OUT_DIR/bench.jsonl (bench_cuda_decode: batch-1 decode at
# contexts 128 and 4096, 32 sequences at context 1024, prefill of 512 and
# 4096 tokens, for each model shape in bench/configs; 8-128 sequences for
# llama-3.2-1b; 4- and 8-bit weights; f32 KV rows against the default
# bf16), OUT_DIR/profile.txt (device time per
# op of a decode step; gemma-3-1b's knockouts), OUT_DIR/gemv.txt (bench_cuda_kernels: each
# decode GEMV shape alone, its launch's waves and bandwidth), OUT_DIR/attention.txt (bench_cuda_attention: the
# prefill and decode attention kernels alone), OUT_DIR/vision.jsonl and
# vision-profile.txt (bench_cuda_vision: each tower's encode) and
# OUT_DIR/serve.log (each demo model in models/, or the built-in one, served
# with --device cuda and checked by tandem coherence on both lanes; a seeded
# sampling check; loadgen TTFT / ITL on llama-3.2-1b's shapes; the prefix
# cache against --no-prefix-cache, scripts/gpu-prefix-check.py, and on the
# vision lane, scripts/gpu-vision-prefix-check.py). `quick` runs
# the tests and one shape. Each part runs only when BUILD_DIR has its binary
# (tandem_cuda_tests, bench_cuda_decode, tandem + loadgen), so a build can be
# carried to the GPU machine in pieces.
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
if [ -x "$build/tandem_cuda_tests" ]; then
  timeout 300 "$build/tandem_cuda_tests" >"$out/cuda-tests.log" 2>&1 || status=1
fi

configs="llama-3.2-1b gemma-3-1b qwen3-1.7b gemma-4-e2b ministral-3-3b"
[ "$mode" = quick ] && configs="llama-3.2-1b"
[ -x "$build/bench_cuda_decode" ] || configs=""
for m in $configs; do
  c=bench/configs/$m.json
  [ -f "$c" ] || continue
  timeout 120 "$build/bench_cuda_decode" "$c" --context 128 --tokens 128 --prefill 512
  timeout 120 "$build/bench_cuda_decode" "$c" --context 4096 --tokens 64 --prefill 4096
  [ "$mode" = quick ] && continue
  for b in 8 32 64 128; do
    [ "$b" != 32 ] && [ "$m" != llama-3.2-1b ] && continue  # every batch for one shape
    timeout 120 "$build/bench_cuda_decode" "$c" --context 1024 --tokens 32 --batch $b --prefill 16
  done
done >"$out/bench.jsonl" 2>"$out/bench-stderr.log"

# Affine 4/8-bit weights quantized on load (group 64) and kept packed on the
# device: batch 1 on two 1B shapes, and 32 sequences. Then batch 1 with
# programmatic dependent launch off (it is on for GEMV-sized steps by default).
if [ -n "$configs" ] && [ "$mode" != quick ]; then
  export TANDEM_CUDA_PACKED_QUANT=1
  for q in 4 8; do
    timeout 120 "$build/bench_cuda_decode" bench/configs/gemma-3-1b.json --context 128 \
      --tokens 128 --prefill 512 --quantize $q
    timeout 120 "$build/bench_cuda_decode" bench/configs/llama-3.2-1b.json --context 128 \
      --tokens 128 --prefill 512 --quantize $q
  done
  timeout 120 "$build/bench_cuda_decode" bench/configs/llama-3.2-1b.json --context 1024 \
    --tokens 32 --batch 32 --prefill 16 --quantize 4
  unset TANDEM_CUDA_PACKED_QUANT
  TANDEM_CUDA_PDL=0 timeout 120 "$build/bench_cuda_decode" bench/configs/llama-3.2-1b.json \
    --context 128 --tokens 128 --prefill 512
  # f32-level GEMM inputs (--gemm-precision f32), against the default bf16 ones above.
  timeout 120 "$build/bench_cuda_decode" bench/configs/llama-3.2-1b.json --context 4096 \
    --tokens 64 --prefill 4096 --gemm-precision f32
  timeout 120 "$build/bench_cuda_decode" bench/configs/llama-3.2-1b.json --context 1024 \
    --tokens 32 --batch 32 --prefill 16 --gemm-precision f32
  # f32 KV rows (--kv-cache-dtype f32), against the default bf16 ones above.
  timeout 120 "$build/bench_cuda_decode" bench/configs/llama-3.2-1b.json --context 4096 \
    --tokens 64 --prefill 4096 --kv-dtype f32
  timeout 120 "$build/bench_cuda_decode" bench/configs/llama-3.2-1b.json --context 1024 \
    --tokens 32 --batch 64 --prefill 16 --kv-dtype f32
fi >>"$out/bench.jsonl" 2>>"$out/bench-stderr.log"

# The vision towers at real shapes on the GPU (ms per image, op profile).
[ -x "$build/bench_cuda_vision" ] && [ "$mode" != quick ] &&
  timeout 150 "$build/bench_cuda_vision" --profile >"$out/vision.jsonl" 2>"$out/vision-profile.txt"

# Each decode GEMV shape alone (its launch's waves and bandwidth), then the
# attention kernels alone (tensor-core prefill vs the decode kernel).
[ -x "$build/bench_cuda_kernels" ] && [ "$mode" != quick ] &&
  timeout 300 "$build/bench_cuda_kernels" >"$out/gemv.txt" 2>&1
[ -x "$build/bench_cuda_attention" ] && timeout 120 "$build/bench_cuda_attention" >"$out/attention.txt" 2>&1

# Which ops take a decode step's time: the decoder's own per-op timing
# (bench_cuda_decode --profile: eager, an event after each op, so each op
# carries a little event overhead), batch 1 for each shape, batch 32 for
# llama-3.2-1b and gemma-3-1b; and for gemma-3-1b (the farthest from its
# targets) the knockouts, what each op costs the replayed graph.
for m in $configs; do
  c=bench/configs/$m.json
  [ -f "$c" ] || continue
  timeout 120 "$build/bench_cuda_decode" "$c" --context 1024 --tokens 16 --prefill 16 --profile
  [ "$mode" = quick ] && continue
  case $m in llama-3.2-1b | gemma-3-1b) ;; *) continue ;; esac
  timeout 120 "$build/bench_cuda_decode" "$c" --context 1024 --tokens 16 --batch 32 --prefill 16 \
    --profile
  [ "$m" = gemma-3-1b ] || continue
  for b in 1 32; do
    timeout 120 "$build/bench_cuda_decode" "$c" --context 1024 --tokens 16 --batch $b \
      --prefill 16 --knockout
  done
done >"$out/profile.jsonl" 2>"$out/profile.txt"

# `tandem serve [MODEL] --device cuda` (no MODEL: the built-in one) on PORT
# twice, with the prefix cache and with --no-prefix-cache, each time running
# CHECK URL OUT_DIR/NAME-on|off.json within SECONDS once the model is loaded
# (server logs: OUT_DIR/serve-NAME-on|off.log).
#   cache_on_and_off NAME PORT CHECK SECONDS [MODEL]
cache_on_and_off() {
  name=$1 port=$2 check=$3 seconds=$4
  shift 4
  for cache in on off; do
    flag=""
    [ $cache = off ] && flag=--no-prefix-cache
    "$build/tandem" serve "$@" --device cuda --port "$port" $flag \
      >"$out/serve-$name-$cache.log" 2>&1 &
    pid=$!
    python3 scripts/gpu-serve-check.py "http://127.0.0.1:$port" "" --wait-only &&
      timeout "$seconds" python3 "$check" "http://127.0.0.1:$port" "$out/$name-$cache.json" ||
      status=1
    kill $pid
    wait $pid 2>/dev/null
  done
}

# The server on the GPU (when BUILD_DIR has tandem): the demo models in
# models/ (or, where their weights are not in this checkout, the built-in
# one) through tandem coherence on both lanes; the same seeded request twice
# (device sampling must repeat itself); /v1/status; and TTFT / ITL at
# concurrency 1 and 32 on llama-3.2-1b's shapes (loadgen).
if [ -x "$build/tandem" ]; then
  {
    served=0
    for model in models/*-demo; do
      [ -f "$model/model.safetensors" ] || continue
      served=1
      for set in demo-text demo-vision; do
        echo "== $model --set $set --device cuda"
        timeout 120 "$build/tandem" coherence "$model" --set "$set" --timeout 30 -- --device cuda ||
          status=1
      done
    done
    port=8131
    "$build/tandem" serve --device cuda --port $port >"$out/serve-builtin.log" 2>&1 &
    pid=$!
    python3 scripts/gpu-serve-check.py "http://127.0.0.1:$port" "$out/status.json" || status=1
    if [ $served = 0 ]; then
      for set in demo-text demo-vision seed; do
        echo "== built-in demo model --set $set --device cuda"
        timeout 120 "$build/tandem" coherence --url "http://127.0.0.1:$port" --set "$set" \
          --timeout 30 || status=1
      done
    fi
    kill $pid
    wait $pid 2>/dev/null
    # The prefix cache on the vision lane (the built-in demo model): another
    # question about the same image, with the cache (its prefix may end
    # inside the image's soft tokens) and without, must answer the same text
    # with logprobs within 1e-2: the cached request prefills its last 30
    # tokens in a 30-token step (the skinny GEMM), the other all 46 (cuBLAS),
    # and the f32 sums' order reaches the logprobs through the bf16
    # activations (-0.8592 against -0.8616 in session 28, -0.8616 both in
    # session 27); KV rows reused wrongly would change the answer.
    echo "== vision prefix cache, built-in demo model, --device cuda"
    cache_on_and_off vision-prefix 8134 scripts/gpu-vision-prefix-check.py 120
    python3 - "$out/vision-prefix-on.json" "$out/vision-prefix-off.json" <<'PY' || status=1
import json, sys
on, off = (json.load(open(p))["second"] for p in sys.argv[1:])
same = on["text"] == off["text"] and len(on["logprobs"]) == len(off["logprobs"]) and all(
    abs(a - b) <= 1e-2 for a, b in zip(on["logprobs"], off["logprobs"]))
print("vision prefix cache: second answer equal without it:", same, "- cached tokens",
      on["cached_tokens"], "of", on["prompt_tokens"])
sys.exit(0 if same and on["cached_tokens"] > 0 else 1)
PY
    if [ -x "$build/loadgen" ]; then
      "$build/tandem" synth bench/configs/llama-3.2-1b.json /tmp/tandem-l1b >/dev/null 2>&1
      "$build/tandem" serve /tmp/tandem-l1b --device cuda --port 8132 --max-concurrent 64 \
        >"$out/serve-l1b.log" 2>&1 &
      pid=$!
      python3 scripts/gpu-serve-check.py "http://127.0.0.1:8132" "" --wait-only || status=1
      echo "== loadgen, llama-3.2-1b shapes, --device cuda"
      timeout 300 "$build/loadgen" --url http://127.0.0.1:8132 --concurrency 1,32 --requests 64 \
        --prompt-tokens 128 --max-tokens 64 || status=1
      kill $pid
      wait $pid 2>/dev/null
      # The prefix cache: the same requests with it and without it must
      # generate the same ids, and only the first report cached tokens.
      echo "== prefix cache, llama-3.2-1b shapes, --device cuda"
      cache_on_and_off prefix 8133 scripts/gpu-prefix-check.py 150 /tmp/tandem-l1b
      python3 - "$out/prefix-on.json" "$out/prefix-off.json" <<'PY' || status=1
import json, sys
on, off = (json.load(open(p)) for p in sys.argv[1:])
same = all(on[k]["ids"] == off[k]["ids"] for k in on)
hits = on["same"]["cached_tokens"] > 0 and on["extended"]["cached_tokens"] > 0
print("prefix cache: ids equal without it:", same, "- cached tokens reported:", hits)
sys.exit(0 if same and hits else 1)
PY
    fi
  } >"$out/serve.log" 2>&1
fi
exit $status
