// Gemma 3's vision tower (SigLIP) and projector: an image's normalized pixels
// [3, S, S] in, its soft tokens [T, D_text] out, ready to replace the
// <image_soft_token> placeholders (unscaled).
//
//   patches (conv k=p, s=p, bias) + learned positions -> L pre-LN blocks
//   (LayerNorm, MHA with biases, scale Dh^-0.5, bidirectional; LayerNorm,
//   fc1 -> gelu_tanh -> fc2) -> post LayerNorm -> average pool to T tokens ->
//   Gemma RMSNorm (1 + w) -> x @ W, W stored [in, out].
//
// Loaded only when an image needs it: text-only use never reads these
// tensors. Weights stay views of the checkpoint (any float dtype) except the
// projection, transposed to f32 at load.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/tensor.h"
#include "model/safetensors.h"
#include "model/vision_ops.h"

namespace tandem {

class Gemma3Vision {
 public:
  // `config` is the checkpoint's whole config.json (vision_config,
  // mm_tokens_per_image; "tandem_soft_emb_norm_plus_one": true when the
  // soft-token norm weight is stored as 1 + w, as in a GGUF mmproj);
  // `text_hidden` the language model's D. Throws Error naming the tensor or
  // field at fault.
  static std::unique_ptr<Gemma3Vision> load(const Checkpoint& ckpt, const nlohmann::json& config,
                                            int64_t text_hidden);

  int64_t image_size() const { return image_size_; }
  int64_t tokens_per_image() const { return tokens_; }
  int64_t text_hidden() const { return text_hidden_; }

  // pixels: [3, S, S] normalized; out: [T, D_text] (host memory).
  void encode(VisionOps& ops, const float* pixels, float* out) const;

 private:
  struct Layer {
    std::vector<float> ln1_w, ln1_b, ln2_w, ln2_b;
    WeightMatrix q, k, v, o, fc1, fc2;
    std::vector<float> q_b, k_b, v_b, o_b, fc1_b, fc2_b;
  };
  int64_t hidden_ = 0, heads_ = 0, intermediate_ = 0, image_size_ = 0, patch_ = 0, tokens_ = 0;
  int64_t text_hidden_ = 0;
  float eps_ = 1e-6f;
  WeightMatrix patch_embed_;          // [H, 3·p·p] in (c, ky, kx) order
  std::vector<uint8_t> patch_owned_;  // the OIHW copy of an OHWI (MLX) conv weight
  std::vector<float> patch_bias_;     // [H]
  std::vector<float> positions_;      // [N, H]
  std::vector<Layer> layers_;
  std::vector<float> post_w_, post_b_;  // [H]
  std::vector<float> soft_norm_;        // [H], 1 + w folded in
  std::vector<float> projection_;       // [D_text, H] (transposed from [H, D_text])
  WeightMatrix projection_matrix() const {
    return WeightMatrix{DType::F32, projection_.data(), text_hidden_, hidden_};
  }
};

}  // namespace tandem
