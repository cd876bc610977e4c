// A GGUF checkpoint (llama.cpp's format) as a tandem Model: metadata →
// ModelSpec, GGUF tensor names → the canonical Weights.
//
// Architectures (general.architecture): llama, qwen2, qwen3, gemma3, gemma4,
// mistral3 (Ministral 3's text model). The
// metadata is translated into the config.json fields config.cpp reads, so a
// GGUF model gets exactly the spec its safetensors twin would, except where
// GGUF does not carry a value (see gguf_spec_config). Conventions of
// llama.cpp's converter that are undone here:
//  - `llama`, `mistral3`: attn_q / attn_k rows are permuted per head to the
//    interleaved RoPE layout; they are permuted back to transformers'
//    rotate-half layout.
//  - Gemma 3: norm weights are stored as 1 + w (what the decoder computes
//    with), so they are taken as they are. Gemma 4 norms are stored as w.
//  - Gemma 4's proportional RoPE (full layers) is a `rope_freqs` tensor of
//    divisors 1 (rotating) and 1e30 (unrotated); read back as the rotating
//    fraction. KV-shared layers have no attn_k / attn_v / attn_k_norm.
//  - Llama 3 RoPE scaling is a `rope_freqs` tensor of frequency divisors.
//
// Tensor types: F32/F16/BF16 are viewed in place (zero-copy); Q8_0, Q4_0 and
// Q4_K are re-packed losslessly into the MLX affine storage
// (model/gguf_blocks.h); Q6_K is dequantized to BF16. LoadOptions::
// quantize_bits quantizes the dense matrices as for safetensors.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "model/gguf.h"
#include "model/model.h"

namespace tandem {

// The config.json (HF schema) that describes the GGUF model; Error naming the
// file for an unsupported architecture or missing metadata.
nlohmann::json gguf_spec_config(const GgufFile& f);

// The config.json model_type of the file's architecture ("gemma3_text",
// "gemma4_text", "ministral3" for gemma3, gemma4, mistral3, else
// general.architecture as it is).
std::string gguf_model_type(const GgufFile& f);

// The ModelSpec of a GGUF file (gguf_spec_config parsed, plus the values a
// config.json cannot express: attention scale, rope frequency factors).
ModelSpec gguf_model_spec(const GgufFile& f);

// Loads a .gguf file as a Model; Error naming the file and tensor on a
// missing tensor, a shape that does not match the metadata, or a type that
// cannot be used where it is.
std::unique_ptr<Model> load_gguf_model(const std::string& path, const LoadOptions& options = {});

}  // namespace tandem
