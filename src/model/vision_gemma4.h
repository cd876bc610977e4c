// Gemma 4's vision tower and embedder: an image's patches in (the
// processor's [rows·cols, P·P·3] in (py, px, c) order, values p / 255, rows
// and cols multiples of the pooling kernel k), its (rows/k)(cols/k) soft
// tokens [T, D_text] out, row-major over the pooled grid — the order of the
// <|image|> placeholders in the prompt (unscaled).
//
//   2·(p − 0.5) -> input_proj (no bias) + table[0][column] + table[1][row]
//   (learned positions [2, position_embedding_size, H]) -> L blocks:
//     RMSNorm -> q/k/v -> RMSNorm over Dh on q, k (weighted) and v
//     (weightless) -> 2D RoPE: the first Dh/2 channels rotate with the
//     column, the last Dh/2 with the row (rotate-half within each, Dh/4
//     frequencies of rope_theta) -> attention over every patch, scale 1 ->
//     o -> RMSNorm -> residual; RMSNorm -> act(gate)·up -> down -> RMSNorm
//     -> residual
//   -> average pool k x k -> × sqrt(H) -> standardize when configured:
//   (x − std_bias)·std_scale -> embed_vision: weightless RMSNorm -> linear
//   to D_text.
//
// Every q/k/v/o and MLP linear is "clippable": with use_clipped_linears its
// input and output are clamped to the checkpoint's scalar input_min/max and
// output_min/max. Each image is encoded alone, which is what transformers'
// padded batch computes (padding patches are masked keys and are dropped
// before pooling). Loaded only when an image needs it; matmul weights stay
// views of the checkpoint (any float dtype).
//
// The prompt side (load_gemma4_tower): <|image|> expands to boi, T ×
// <|image|>, eoi; the language model stays causal over image tokens, and
// Gemma 4's per-layer embeddings read pad_token_id's row at image positions.
// UNFINISHED: text_config.use_bidirectional_attention "vision" (image tokens
// attending to each other on sliding layers only, global layers causal)
// needs per-layer masks the decoder does not have; such checkpoints' images
// are refused with an Error naming the field. With null (the fixture; per
// transformers' Gemma4Model comment, the smaller models) images work.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/tensor.h"
#include "model/safetensors.h"
#include "model/vision_ops.h"

namespace tandem {

class Gemma4Vision {
 public:
  // `config` is the checkpoint's whole config.json (vision_config);
  // `text_hidden` the language model's D. Throws Error naming the tensor or
  // field at fault.
  static std::unique_ptr<Gemma4Vision> load(const Checkpoint& ckpt, const nlohmann::json& config,
                                            int64_t text_hidden);

  int64_t patch_size() const { return patch_; }
  int64_t pooling() const { return pooling_; }
  int64_t text_hidden() const { return text_hidden_; }

  // patches: [rows·cols, P·P·3]; out: [(rows/k)·(cols/k), D_text]. Throws
  // Error when the grid does not pool or exceeds the position table.
  void encode(VisionOps& ops, const float* patches, int64_t rows, int64_t cols, float* out) const;

 private:
  // A linear without bias whose input and output may be clamped.
  struct Linear {
    WeightMatrix w;
    bool clip = false;
    float in_min = 0, in_max = 0, out_min = 0, out_max = 0;
  };
  struct Layer {
    std::vector<float> in_norm, post_attn_norm, pre_ffn_norm, post_ffn_norm, q_norm, k_norm;
    Linear q, k, v, o, gate, up, down;
  };

  Linear read_linear(const Checkpoint& ckpt, const std::string& name, int64_t rows,
                     int64_t cols) const;
  // y = l(x); `scratch` holds a clamped copy of x when l clips.
  void linear(VisionOps& ops, const Linear& l, const float* x, int64_t n, float* y,
              float* scratch) const;
  // cos and sin [n, Dh/2] of the 2D RoPE (VisionOps::rope with two
  // segments), positions row-major over `cols`.
  void rope_table(int64_t n, int64_t cols, std::vector<float>& cos, std::vector<float>& sin) const;

  int64_t hidden_ = 0, heads_ = 0, kv_heads_ = 0, head_dim_ = 0, intermediate_ = 0, patch_ = 0,
          pooling_ = 0, positions_ = 0, text_hidden_ = 0;
  float eps_ = 1e-6f;
  bool clipped_ = false;
  VisionAct act_ = VisionAct::GeluTanh;
  std::vector<float> inv_freq_;  // [Dh/4]
  WeightMatrix input_proj_;      // [H, 3·P·P] in (py, px, c) order
  std::vector<float> table_;     // [2, positions, H]: column, then row
  std::vector<Layer> layers_;
  std::vector<float> std_bias_, std_scale_;  // [H], empty unless standardize
  WeightMatrix projection_;                  // [D_text, H] embed_vision.embedding_projection
};

}  // namespace tandem
