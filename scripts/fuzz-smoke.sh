#!/usr/bin/env bash
# A short libFuzzer run of every fuzz target (tests/fuzz), as the test suite's
# last step: each target runs for SECONDS (default 20) with ASan/UBSan, a
# per-input time limit and a memory cap, so a crash, a hang or runaway memory
# fails `make test`. The tokenizer target runs once per real tokenizer.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-20}
build=${FUZZ_BUILD:-build-fuzz}
CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTANDEM_FUZZ=ON \
  -DTANDEM_TESTS=OFF -DTANDEM_BENCH=OFF >/dev/null
ninja -C "$build" -j "$(nproc)" fuzz_tokenizer fuzz_template >/dev/null
cache="${TANDEM_CACHE:-$HOME/.cache/tandem}/tokenizers"
opts=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=4096 -print_final_stats=0)
run() {
  local name=$1
  shift
  echo "fuzz: $name (${seconds}s)"
  if ! "$@" "${opts[@]}" >"$build/$name.log" 2>&1; then
    tail -40 "$build/$name.log"
    echo "fuzz: $name FAILED (log: $build/$name.log)"
    exit 1
  fi
}
run template "./$build/fuzz_template"
run tokenizer-tekken "./$build/fuzz_tokenizer"
for t in llama3_1 gemma3; do
  [ -f "$cache/$t/tokenizer.json" ] && TANDEM_FUZZ_TOKENIZER="$cache/$t" run "tokenizer-$t" "./$build/fuzz_tokenizer"
done
echo "fuzz: all targets ran clean"
