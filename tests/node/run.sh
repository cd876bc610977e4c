#!/usr/bin/env bash
# ctest ServerNodeClient: the official OpenAI Node SDK (npm `openai`, pinned
# in package-lock.json; and Anthropic's, `@anthropic-ai/sdk`, for /v1/messages) against three live `tandem serve` processes: the
# model, the model with a fault injected, and a tiny Gemma 4 (real tokenizer
# and chat template, random weights) whose every answer is forced with
# TANDEM_FORCE_OUTPUT to a recorded reasoning + tool call, for the tool-call
# round trip (random weights never write a call).
#
# Usage: run.sh TANDEM_BINARY MODEL_DIR WORK_DIR
# Skips (exit 77) only when node or npm is absent. The SDK is installed with
# `npm ci` into WORK_DIR (kept between runs; npm's cache in ~/.npm makes a
# re-install offline).
set -euo pipefail
tandem=$(realpath "$1") model=$(realpath "$2") work=$3
here=$(cd "$(dirname "$0")" && pwd)

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "SKIP: node/npm not installed (apt-get install nodejs npm); the OpenAI SDK test did not run"
  exit 77
fi

mkdir -p "$work"
cp "$here/package.json" "$here/package-lock.json" "$here/client.mjs" "$here/messages_responses.mjs" "$work/"
cd "$work"
# The pinned versions of both SDKs (openai, @anthropic-ai/sdk) against what is installed.
pinned=$(node -e 'const d = require("./package.json").dependencies; console.log(d.openai, d["@anthropic-ai/sdk"])')
installed=$(node -e 'const v = (p) => { try { return require(`./node_modules/${p}/package.json`).version } catch { return "none" } }; console.log(v("openai"), v("@anthropic-ai/sdk"))')
if [ "$installed" != "$pinned" ]; then
  npm ci --no-audit --no-fund --prefer-offline >npm.log 2>&1 || { cat npm.log; echo "error: npm ci failed"; exit 1; }
fi

pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# Starts `tandem serve LOG MODEL [ARGS]` in the background; sets $port once it is ready.
start_server() {
  local log=$1 dir=$2; shift 2
  : >"$log"  # not the last run's ready line: the child truncates it only once it runs
  "$tandem" serve "$dir" --port 0 --threads 1 --api-key test-key --served-model-name node-test "$@" 2>"$log" &
  pids+=($!)
  for _ in $(seq 300); do
    kill -0 "${pids[-1]}" 2>/dev/null || break
    if grep -q "tandem serve: ready:" "$log"; then
      port=$(grep -o 'http://127.0.0.1:[0-9]*' "$log" | head -1 | sed 's/.*://')
      return 0
    fi
    sleep 0.1
  done
  cat "$log"; echo "error: tandem serve did not become ready"; exit 1
}

# The Gemma 4 folder as tests/test_util.cpp's vision_model_dir makes it, its
# context raised from 256 so that a conversation with a call and its result fits.
fixtures=$(cd "$here/../fixtures" && pwd)
gemma="$work/gemma4-tools"
rm -rf "$gemma" && mkdir -p "$gemma"
sed 's/"max_position_embeddings": 256,/"max_position_embeddings": 1024,/' \
  "$fixtures/parity/gemma4-f32/config.json" >"$gemma/config.json"
ln -s "$fixtures/parity/gemma4-f32/model.safetensors" "$fixtures"/vision/gemma4/tokenizer/* "$gemma/"
echo '{"image_processor_type": "Gemma4ImageProcessor", "max_soft_tokens": 70}' >"$gemma/preprocessor_config.json"
forced='<|channel>thought
The user wants the weather in Paris.<channel|><|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|><|tool_response>'

# A tiny Mistral 3 (JSON arguments: streamed in pieces as they are written).
mistral="$work/mistral3-tools"
rm -rf "$mistral" && mkdir -p "$mistral"
sed 's/"max_position_embeddings": 256,/"max_position_embeddings": 4096,/' \
  "$fixtures/parity/mistral3-f32/config.json" >"$mistral/config.json"
ln -s "$fixtures/parity/mistral3-f32/model.safetensors" "$fixtures"/vision/mistral3/tokenizer/* "$mistral/"
mistral_forced='[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "celsius"}'

start_server server.log "$model"; main_port=$port
TANDEM_FAULT=step-throw@3 start_server faulty.log "$model"; faulty_port=$port
TANDEM_FORCE_OUTPUT="$forced" start_server tools.log "$gemma"; tools_port=$port
TANDEM_FORCE_OUTPUT="$mistral_forced" start_server mistral.log "$mistral" --text-only; mistral_port=$port

node client.mjs "http://127.0.0.1:$main_port/v1" "http://127.0.0.1:$faulty_port/v1" \
  "http://127.0.0.1:$tools_port/v1" "$fixtures/vision/gemma4/input_0.png" \
  "http://127.0.0.1:$mistral_port/v1"
# /v1/responses through the OpenAI SDK, /v1/messages through Anthropic's.
node messages_responses.mjs "http://127.0.0.1:$tools_port/v1" "$fixtures/vision/gemma4/input_0.png"

# SIGTERM: the server drains and exits 0.
kill -TERM "${pids[0]}"
status=0; wait "${pids[0]}" || status=$?
[ "$status" -eq 0 ] || { cat server.log; echo "error: tandem serve exited $status after SIGTERM"; exit 1; }
