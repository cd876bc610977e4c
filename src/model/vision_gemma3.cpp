#include "model/vision_gemma3.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/quantized.h"
#include "model/vision_common.h"

namespace tandem {

namespace {

// Prefixes of the tower and the projector across checkpoint layouts.
const char* const kTowerPrefixes[] = {"model.vision_tower.vision_model.",
                                      "vision_tower.vision_model.", "model.vision_tower.",
                                      "vision_tower."};
const char* const kProjectorPrefixes[] = {"model.multi_modal_projector.", "multi_modal_projector."};

}  // namespace

std::unique_ptr<Gemma3Vision> Gemma3Vision::load(const Checkpoint& ckpt,
                                                 const nlohmann::json& config,
                                                 int64_t text_hidden) {
  const nlohmann::json& vc = vision::vision_config(ckpt, config);
  auto v = std::unique_ptr<Gemma3Vision>(new Gemma3Vision());
  v->hidden_ = vision::config_int(vc, "hidden_size", 1152);
  v->heads_ = vision::config_int(vc, "num_attention_heads", 16);
  v->intermediate_ = vision::config_int(vc, "intermediate_size", 4304);
  v->image_size_ = vision::config_int(vc, "image_size", 896);
  v->patch_ = vision::config_int(vc, "patch_size", 14);
  v->eps_ = vc.contains("layer_norm_eps") ? vc["layer_norm_eps"].get<float>() : 1e-6f;
  v->tokens_ = vision::config_int(config, "mm_tokens_per_image", 256);
  v->text_hidden_ = text_hidden;
  const int64_t layers = vision::config_int(vc, "num_hidden_layers", 27), H = v->hidden_,
                F = v->intermediate_;
  const int64_t side = v->image_size_ / v->patch_,
                per_side = int64_t(std::lround(std::sqrt(double(v->tokens_))));
  if (v->hidden_ % v->heads_ != 0 || side * v->patch_ != v->image_size_ ||
      per_side * per_side != v->tokens_ || side % per_side != 0)
    fail("%s: vision_config (image %lld, patch %lld, %lld tokens per image) does not tile",
         ckpt.dir().c_str(), (long long)v->image_size_, (long long)v->patch_,
         (long long)v->tokens_);

  const std::string p =
      vision::find_prefix(ckpt, kTowerPrefixes, "embeddings.patch_embedding.weight");
  if (p.empty())
    fail("%s: no vision tower tensors (vision_tower.*embeddings.patch_embedding.weight)",
         ckpt.dir().c_str());
  // OIHW (transformers) in place, or OHWI (MLX) permuted.
  v->patch_embed_ = read_conv_weight(ckpt, p + "embeddings.patch_embedding.weight", H, 3, v->patch_,
                                     v->patch_owned_);
  v->patch_bias_ = vision::read_f32(ckpt, p + "embeddings.patch_embedding.bias", {H});
  v->positions_ =
      vision::read_f32(ckpt, p + "embeddings.position_embedding.weight", {side * side, H});
  for (int64_t i = 0; i < layers; ++i) {
    const std::string l = p + "encoder.layers." + std::to_string(i) + ".";
    Layer L;
    L.ln1_w = vision::read_f32(ckpt, l + "layer_norm1.weight", {H});
    L.ln1_b = vision::read_f32(ckpt, l + "layer_norm1.bias", {H});
    L.ln2_w = vision::read_f32(ckpt, l + "layer_norm2.weight", {H});
    L.ln2_b = vision::read_f32(ckpt, l + "layer_norm2.bias", {H});
    L.q = vision::read_matrix(ckpt, l + "self_attn.q_proj.weight", H, H);
    L.k = vision::read_matrix(ckpt, l + "self_attn.k_proj.weight", H, H);
    L.v = vision::read_matrix(ckpt, l + "self_attn.v_proj.weight", H, H);
    L.o = vision::read_matrix(ckpt, l + "self_attn.out_proj.weight", H, H);
    L.q_b = vision::read_f32(ckpt, l + "self_attn.q_proj.bias", {H});
    L.k_b = vision::read_f32(ckpt, l + "self_attn.k_proj.bias", {H});
    L.v_b = vision::read_f32(ckpt, l + "self_attn.v_proj.bias", {H});
    L.o_b = vision::read_f32(ckpt, l + "self_attn.out_proj.bias", {H});
    L.fc1 = vision::read_matrix(ckpt, l + "mlp.fc1.weight", F, H);
    L.fc2 = vision::read_matrix(ckpt, l + "mlp.fc2.weight", H, F);
    L.fc1_b = vision::read_f32(ckpt, l + "mlp.fc1.bias", {F});
    L.fc2_b = vision::read_f32(ckpt, l + "mlp.fc2.bias", {H});
    v->layers_.push_back(std::move(L));
  }
  v->post_w_ = vision::read_f32(ckpt, p + "post_layernorm.weight", {H});
  v->post_b_ = vision::read_f32(ckpt, p + "post_layernorm.bias", {H});

  const std::string m = vision::find_prefix(ckpt, kProjectorPrefixes, "mm_input_projection_weight");
  if (m.empty())
    fail("%s: no multi_modal_projector.mm_input_projection_weight", ckpt.dir().c_str());
  v->soft_norm_ = vision::read_f32(ckpt, m + "mm_soft_emb_norm.weight", {H});
  // Gemma RMSNorm: x̂ · (1 + w); llama.cpp's mmproj files store 1 + w already.
  if (!config.value("tandem_soft_emb_norm_plus_one", false))
    for (float& w : v->soft_norm_) w += 1.0f;
  // Stored [in = H, out = D]; matmul wants rows of outputs.
  std::vector<float> proj =
      vision::read_f32(ckpt, m + "mm_input_projection_weight", {H, text_hidden});
  v->projection_.resize(proj.size());
  for (int64_t i = 0; i < H; ++i)
    for (int64_t o = 0; o < text_hidden; ++o)
      v->projection_[size_t(o * H + i)] = proj[size_t(i * text_hidden + o)];
  return v;
}

void Gemma3Vision::encode(VisionOps& ops, const float* pixels, float* out) const {
  const int64_t H = hidden_, F = intermediate_, p = patch_, side = image_size_ / p, N = side * side;
  const int64_t S = image_size_, Dh = H / heads_;
  // Patches in (c, ky, kx) order, row-major over the patch grid.
  const std::vector<float> patches = vision::patches_chw(pixels, S, S, p);
  VisionBuffer in = ops.alloc(N * 3 * p * p), h = ops.alloc(N * H), x = ops.alloc(N * H),
               q = ops.alloc(N * H), k = ops.alloc(N * H), v = ops.alloc(N * H),
               attn = ops.alloc(N * H), mlp = ops.alloc(N * F);
  ops.upload(patches.data(), in.size(), in.data());
  ops.matmul(in.data(), N, patch_embed_, ops.param(patch_bias_), h.data());
  ops.add(h.data(), ops.param(positions_), N * H);

  const float scale = 1.0f / std::sqrt(float(Dh));
  for (const Layer& L : layers_) {
    ops.layernorm(h.data(), ops.param(L.ln1_w), ops.param(L.ln1_b), N, H, eps_, x.data());
    ops.matmul(x.data(), N, L.q, ops.param(L.q_b), q.data());
    ops.matmul(x.data(), N, L.k, ops.param(L.k_b), k.data());
    ops.matmul(x.data(), N, L.v, ops.param(L.v_b), v.data());
    // Bidirectional attention over all patches.
    ops.attention(q.data(), k.data(), v.data(), N, heads_, heads_, Dh, scale, attn.data());
    ops.matmul(attn.data(), N, L.o, ops.param(L.o_b), x.data());
    ops.add(h.data(), x.data(), N * H);
    ops.layernorm(h.data(), ops.param(L.ln2_w), ops.param(L.ln2_b), N, H, eps_, x.data());
    ops.matmul(x.data(), N, L.fc1, ops.param(L.fc1_b), mlp.data());
    ops.activate(VisionAct::GeluTanh, mlp.data(), nullptr, N * F);
    ops.matmul(mlp.data(), N, L.fc2, ops.param(L.fc2_b), x.data());
    ops.add(h.data(), x.data(), N * H);
  }
  ops.layernorm(h.data(), ops.param(post_w_), ops.param(post_b_), N, H, eps_, h.data());

  // Average-pool the patch grid down to tokens_per_side², row-major, then
  // the soft-token norm and the projection to the text width.
  const int64_t per_side = int64_t(std::lround(std::sqrt(double(tokens_))));
  VisionBuffer pooled = ops.alloc(tokens_ * H), projected = ops.alloc(tokens_ * text_hidden_);
  ops.pool_grid(h.data(), side, side, H, side / per_side, pooled.data());
  ops.rmsnorm(pooled.data(), ops.param(soft_norm_), tokens_, H, eps_, pooled.data());
  ops.matmul(pooled.data(), tokens_, projection_matrix(), nullptr, projected.data());
  ops.download(projected.data(), projected.size(), out);
}

}  // namespace tandem
