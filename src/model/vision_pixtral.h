// Ministral 3 / Mistral 3's vision tower (Pixtral) and projector: an image's
// normalized pixels [3, h, w] (sides multiples of patch x merge) in, its
// (h/p/2)(w/p/2) soft tokens [T, D_text] out, in row-major order of the
// merged grid — the order of the [IMG] placeholders in the prompt.
//
//   patch conv (no bias) -> RMSNorm ln_pre -> L blocks (RMSNorm, attention
//   with 2D RoPE over (row, column), RMSNorm, gated MLP) -> projector:
//   RMSNorm -> 2x2 patch merge (features channel-major) -> merging linear ->
//   linear_1 -> GELU -> linear_2.
//
// Each image is encoded on its own, which is what the block-diagonal mask of
// transformers' batched encoder computes. Loaded only when an image needs it.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/tensor.h"
#include "model/safetensors.h"
#include "model/vision_ops.h"

namespace tandem {

class PixtralVision {
 public:
  static std::unique_ptr<PixtralVision> load(const Checkpoint& ckpt, const nlohmann::json& config,
                                             int64_t text_hidden);

  int64_t image_size() const { return image_size_; }  // longest edge
  int64_t patch_multiple() const { return patch_ * merge_; }
  int64_t text_hidden() const { return text_hidden_; }
  // Soft tokens of an image of height h and width w.
  int64_t tokens_for(int64_t h, int64_t w) const {
    return (h / patch_multiple()) * (w / patch_multiple());
  }

  // pixels: [3, h, w] normalized; out: [tokens_for(h, w), D_text].
  void encode(VisionOps& ops, const float* pixels, int64_t h, int64_t w, float* out) const;

 private:
  struct Layer {
    std::vector<float> attn_norm, ffn_norm;
    WeightMatrix q, k, v, o, gate, up, down;
  };
  int64_t hidden_ = 0, heads_ = 0, head_dim_ = 0, intermediate_ = 0, image_size_ = 0, patch_ = 0,
          merge_ = 2;
  int64_t text_hidden_ = 0;
  double theta_ = 10000.0;
  bool mlp_silu_ = true;         // vision hidden_act: silu, else exact gelu
  bool projector_silu_ = false;  // projector_hidden_act: gelu (exact) unless silu
  float text_eps_ = 1e-5f;
  WeightMatrix patch_embed_;          // [H, 3·p·p] in (c, ky, kx) order
  std::vector<uint8_t> patch_owned_;  // the OIHW copy of an OHWI (MLX) conv weight
  std::vector<float> ln_pre_;
  std::vector<Layer> layers_;
  std::vector<float> proj_norm_;
  WeightMatrix merging_, linear_1_, linear_2_;
  std::vector<float> linear_1_b_, linear_2_b_;
};

}  // namespace tandem
