// The model's data structures in one place: ModelSpec (what the checkpoint's
// config says, as feature flags), Weights (canonical tensor set), KvCache.
//
// One decoder serves every family; families differ only by the flags here.
// Shapes use: V vocab, D hidden, L layers, H query heads, K kv heads,
// Dh head dim, F intermediate (MLP) size, T tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/owned_buffer.h"
#include "core/tensor.h"
#include "model/safetensors.h"

namespace tandem {

enum class NormStyle : uint8_t {
  Weight,         // y = x̂ · w            (Llama, Qwen, Gemma 4)
  OnePlusWeight,  // y = x̂ · (1 + w)      (Gemma 1-3: weights stored zero-centred)
};

enum class Activation : uint8_t { SiLU, GeluTanh };

enum class RopeType : uint8_t {
  Default,
  Linear,
  Llama3,
  Yarn,
  Proportional,  // Gemma 4: the first partial_rotary_factor of the frequencies rotate, over the
                 // whole head
};

enum class AttentionKind : uint8_t { Full, Sliding };

// One RoPE configuration (a model has one per attention kind). The inverse
// frequencies are derived from it once at load (see model/rope.h).
struct RopeSpec {
  RopeType type = RopeType::Default;
  double theta = 10000.0;
  double factor = 1.0;                // linear / llama3 / yarn scaling factor
  double low_freq_factor = 1.0;       // llama3
  double high_freq_factor = 4.0;      // llama3
  int64_t original_max_position = 0;  // llama3 / yarn
  double beta_fast = 32.0;            // yarn
  double beta_slow = 1.0;             // yarn
  double attention_factor = 0.0;      // yarn: multiplies cos and sin; 0 = derive from factor
  bool truncate = true;               // yarn: round the correction range outward
  double partial_rotary_factor = 1.0;
  // Per-frequency divisors applied after the type's own scaling (llama.cpp's
  // `rope_freqs` tensor, how GGUF files carry Llama 3 scaling); empty = none,
  // else one per rotary frequency (rotary_dim / 2).
  std::vector<float> freq_factors;
};

// What differs from layer to layer (Gemma 4 varies all of these).
struct LayerSpec {
  AttentionKind kind = AttentionKind::Full;
  int64_t head_dim = 0;      // Dh of this layer
  int64_t kv_heads = 0;      // K of this layer
  int64_t intermediate = 0;  // F of this layer (Gemma 4 doubles it on KV-shared layers)
  int64_t kv_source = 0;     // layer whose keys/values this layer attends over: itself, or
                          // the last earlier layer of the same kind that has its own (KV sharing)
  bool k_eq_v = false;  // values are the key projection (Gemma 4 attention_k_eq_v, full layers)

  int64_t q_dim(int64_t heads) const { return heads * head_dim; }  // H·Dh
  int64_t kv_dim() const { return kv_heads * head_dim; }           // K·Dh
};

struct ModelSpec {
  std::string
      arch;  // normalized model_type: llama, qwen2, qwen3, gemma3_text, gemma4_text, ministral3
  int64_t vocab = 0;         // V
  int64_t hidden = 0;        // D
  int64_t layers = 0;        // L
  int64_t heads = 0;         // H (same on every layer)
  int64_t kv_heads = 0;      // config's K; per-layer values are in layer[]
  int64_t head_dim = 0;      // config's Dh; per-layer values are in layer[]
  int64_t intermediate = 0;  // config's F; per-layer values are in layer[]
  int64_t max_position = 0;  // max_position_embeddings
  float norm_eps = 1e-6f;
  NormStyle norm_style = NormStyle::Weight;
  Activation activation = Activation::SiLU;
  bool qkv_bias = false;          // q/k/v projections have biases (Qwen2, Llama attention_bias)
  bool o_bias = false;            // o projection has a bias (Llama attention_bias)
  bool mlp_bias = false;          // gate/up/down have biases (Llama mlp_bias)
  bool qk_norm = false;           // RMSNorm over Dh on q and k before RoPE (Qwen3, Gemma 3/4)
  bool v_norm = false;            // weightless RMSNorm over Dh on v (Gemma 4)
  bool sandwich_norms = false;    // extra norms after attention and after the MLP (Gemma)
  bool scale_embeddings = false;  // h = E[id] · sqrt(D), the scale rounded to E's dtype (Gemma)
  bool tied_embeddings = false;   // the head is E itself
  bool layer_scalars = false;     // h *= layer_scalar[l] after each layer (Gemma 4)
  int64_t ple_dim = 0;            // per-layer embedding width (Gemma 4 PLE); 0 = none
  int64_t ple_vocab = 0;          // rows of the per-layer embedding table
  float attn_scale = 0.0f;  // score multiplier: Dh^-0.5, query_pre_attn_scalar^-0.5, or 1 (Gemma 4)
  float attn_softcap = 0.0f;   // 0 = off; else scores = c · tanh(scores / c)
  float final_softcap = 0.0f;  // 0 = off; else logits = c · tanh(logits / c)
  float query_temperature_beta =
      0.0f;  // Llama 4 / Ministral 3: q *= 1 + beta·ln(1 + floor(pos / base))
  int64_t query_temperature_base = 0;
  int64_t sliding_window = 0;    // keys visible to a sliding layer, itself included
  std::vector<LayerSpec> layer;  // [L]
  RopeSpec rope_full;            // RoPE of full-attention layers
  RopeSpec rope_sliding;         // RoPE of sliding layers (Gemma: local base frequency)
  std::vector<int32_t> eos_ids;  // generation stops on any of these
  int32_t bos_id = -1;           // -1 = none
  int32_t pad_id = -1;           // pad_token_id, -1 = none (Gemma 4's PLE reads it for images)

  const RopeSpec& rope_for(int64_t l) const {
    return layer[size_t(l)].kind == AttentionKind::Sliding ? rope_sliding : rope_full;
  }
  bool has_kind(AttentionKind k) const {
    for (const auto& l : layer)
      if (l.kind == k) return true;
    return false;
  }
  int64_t max_head_dim() const;
  int64_t max_intermediate() const;
};

// Reads config.json (and generation_config.json when present) of a checkpoint
// folder. Accepts both config schemas (rope_theta/rope_scaling/
// sliding_window_pattern and rope_parameters/layer_types) and the text_config
// of multimodal configs. Throws Error naming the file and the field.
ModelSpec load_model_spec(const std::string& dir);
ModelSpec parse_model_spec(const std::string& config_json_text, const std::string& source_name);

// A per-channel vector (norm weight or bias) converted to f32 at load. Norm
// weights of NormStyle::OnePlusWeight already have the 1 added, so every norm
// computes x̂ · w.
using Vec = std::vector<float>;

struct LayerWeights {
  Vec attn_in_norm;  // [D]   input_layernorm
  WeightMatrix q, k,
      v;  // [H·Dh, D], [K·Dh, D], [K·Dh, D]; k and v empty on KV-shared layers, v on k_eq_v
  Vec q_bias, k_bias, v_bias;  // [H·Dh], [K·Dh], [K·Dh] or empty
  Vec q_norm, k_norm;          // [Dh] or empty
  WeightMatrix o;              // [D, H·Dh]
  Vec o_bias;                  // [D] or empty
  Vec attn_out_norm;           // [D] Gemma post_attention_layernorm, or empty
  Vec mlp_in_norm;        // [D] Llama post_attention_layernorm / Gemma pre_feedforward_layernorm
  WeightMatrix gate, up;  // [F, D]
  WeightMatrix down;      // [D, F]
  Vec gate_bias, up_bias, down_bias;  // or empty
  Vec mlp_out_norm;                   // [D] Gemma post_feedforward_layernorm, or empty
  WeightMatrix ple_gate;              // [P, D] Gemma 4 per_layer_input_gate, or empty
  WeightMatrix ple_proj;              // [D, P] per_layer_projection
  Vec ple_out_norm;                   // [D]    post_per_layer_input_norm
  float scalar = 1.0f;                // Gemma 4 layer_scalar
};

struct Weights {
  WeightMatrix embed;                // [V, D], read row by row (dequantize_row); may be quantized
  std::vector<LayerWeights> layers;  // [L]
  Vec final_norm;                    // [D]
  WeightMatrix head;                 // [V, D]; the embedding itself when tied
  float embed_scale = 1.0f;          // sqrt(D) rounded to embed's dtype, or 1
  // Gemma 4 per-layer embeddings (P = ple_dim), or empty.
  WeightMatrix ple_embed;        // [ple_vocab, L·P], read row by row
  float ple_embed_scale = 1.0f;  // sqrt(P) rounded to ple_embed's dtype (a quantized table's
                                 // scale dtype)
  WeightMatrix ple_model_proj;   // [L·P, D] per_layer_model_projection
  Vec ple_proj_norm;             // [P]      per_layer_projection_norm
};

// A loaded model: spec + weights viewing the mmapped checkpoint.
struct Model {
  ModelSpec spec;
  Checkpoint checkpoint;  // owns the mappings the weights point into
  Weights weights;
  // Buffers of weights converted at load (FP8 dequantized to bf16, weights
  // quantized by LoadOptions::quantize_bits); the other weights view the
  // checkpoint's mappings.
  OwnedBuffers owned;
  uint64_t owned_bytes = 0;
  // Other mappings the weights view: always a GgufFile (model/gguf_model.h)
  // when set; null for safetensors checkpoints.
  std::shared_ptr<const void> source;
  // A llama.cpp mmproj GGUF whose vision tower VisionTower::load uses
  // (--mmproj; model/gguf_mmproj.h); "" = the checkpoint's own tower, if any.
  std::string mmproj;
};

// How load_model converts weights as it loads them.
struct LoadOptions {
  // 0: keep every weight as stored. 4 or 8: quantize every dense matrix and
  // embedding whose row length the group size divides to MLX affine
  // `quantize_bits` (--quantize q4|q8); already quantized ones are kept.
  int quantize_bits = 0;
  int quantize_group_size = 64;
  // Pack the layers' dense BF16 matrices for the CPU's outer-product kernels
  // (WeightFormat::PackedBf16; cpu::packed_weights_preferred() says where
  // they are faster). Embeddings and the head stay as stored. Only for a
  // model that runs on the CPU: the CUDA upload takes row-major weights.
  bool pack_for_cpu = false;
  // Progress: called after each matrix is read (and converted) with the
  // bytes it takes in the checkpoint.
  std::function<void(uint64_t bytes)> on_matrix;
};

// Loads config + weights of a checkpoint folder (or a GGUF file, or a folder
// holding one: see model/gguf_model.h), checking that every tensor the
// spec needs is present with the expected shape (Error names tensor, file,
// expected and actual shape). Weights may be dense (F32/F16/BF16), MLX
// affine-quantized (a `.scales` tensor beside the weight; config.json's
// "quantization"), or FP8 e4m3 with `weight_scale_inv` (dequantized to bf16).
std::unique_ptr<Model> load_model(const std::string& dir, const LoadOptions& options = {});

}  // namespace tandem
