#include "model/vision_pixtral.h"

#include <cmath>

#include "core/error.h"
#include "model/quantized.h"
#include "model/vision_common.h"

namespace tandem {

namespace {

const char* const kTowerPrefixes[] = {"model.vision_tower.", "vision_tower."};
const char* const kProjectorPrefixes[] = {"model.multi_modal_projector.", "multi_modal_projector."};

}  // namespace

std::unique_ptr<PixtralVision> PixtralVision::load(const Checkpoint& ckpt,
                                                   const nlohmann::json& config,
                                                   int64_t text_hidden) {
  const nlohmann::json& vc = vision::vision_config(ckpt, config);
  auto v = std::unique_ptr<PixtralVision>(new PixtralVision());
  v->hidden_ = vision::config_int(vc, "hidden_size", 1024);
  v->heads_ = vision::config_int(vc, "num_attention_heads", 16);
  v->head_dim_ = vision::config_int(vc, "head_dim", v->hidden_ / v->heads_);
  v->intermediate_ = vision::config_int(vc, "intermediate_size", 4096);
  v->image_size_ = vision::config_int(vc, "image_size", 1540);
  v->patch_ = vision::config_int(vc, "patch_size", 14);
  v->merge_ = vision::config_int(config, "spatial_merge_size", 2);
  v->text_hidden_ = text_hidden;
  if (vc.contains("rope_parameters") && vc["rope_parameters"].contains("rope_theta"))
    v->theta_ = vc["rope_parameters"]["rope_theta"].get<double>();
  else if (vc.contains("rope_theta"))
    v->theta_ = vc["rope_theta"].get<double>();
  v->mlp_silu_ = vc.value("hidden_act", std::string("silu")) == "silu";
  v->projector_silu_ = config.value("projector_hidden_act", std::string("gelu")) == "silu";
  if (config.contains("text_config") && config["text_config"].contains("rms_norm_eps"))
    v->text_eps_ = config["text_config"]["rms_norm_eps"].get<float>();
  const bool bias = config.value("multimodal_projector_bias", false);
  const int64_t H = v->hidden_, F = v->intermediate_, Q = v->heads_ * v->head_dim_,
                layers = vision::config_int(vc, "num_hidden_layers", 24);

  const std::string p = vision::find_prefix(ckpt, kTowerPrefixes, "patch_conv.weight");
  if (p.empty())
    fail("%s: no Pixtral vision tower tensors (vision_tower.patch_conv.weight)",
         ckpt.dir().c_str());
  // OIHW (transformers) in place, or OHWI (MLX) permuted.
  v->patch_embed_ =
      read_conv_weight(ckpt, p + "patch_conv.weight", H, 3, v->patch_, v->patch_owned_);
  v->ln_pre_ = vision::read_f32(ckpt, p + "ln_pre.weight", {H});
  for (int64_t i = 0; i < layers; ++i) {
    const std::string l = p + "transformer.layers." + std::to_string(i) + ".";
    Layer L;
    L.attn_norm = vision::read_f32(ckpt, l + "attention_norm.weight", {H});
    L.ffn_norm = vision::read_f32(ckpt, l + "ffn_norm.weight", {H});
    L.q = vision::read_matrix(ckpt, l + "attention.q_proj.weight", Q, H);
    L.k = vision::read_matrix(ckpt, l + "attention.k_proj.weight", Q, H);
    L.v = vision::read_matrix(ckpt, l + "attention.v_proj.weight", Q, H);
    L.o = vision::read_matrix(ckpt, l + "attention.o_proj.weight", H, Q);
    L.gate = vision::read_matrix(ckpt, l + "feed_forward.gate_proj.weight", F, H);
    L.up = vision::read_matrix(ckpt, l + "feed_forward.up_proj.weight", F, H);
    L.down = vision::read_matrix(ckpt, l + "feed_forward.down_proj.weight", H, F);
    v->layers_.push_back(std::move(L));
  }
  const std::string m = vision::find_prefix(ckpt, kProjectorPrefixes, "norm.weight");
  if (m.empty()) fail("%s: no multi_modal_projector.norm.weight", ckpt.dir().c_str());
  const int64_t M = v->merge_ * v->merge_;
  v->proj_norm_ = vision::read_f32(ckpt, m + "norm.weight", {H});
  v->merging_ = vision::read_matrix(ckpt, m + "patch_merger.merging_layer.weight", H, H * M);
  v->linear_1_ = vision::read_matrix(ckpt, m + "linear_1.weight", text_hidden, H);
  v->linear_2_ = vision::read_matrix(ckpt, m + "linear_2.weight", text_hidden, text_hidden);
  if (bias) {
    v->linear_1_b_ = vision::read_f32(ckpt, m + "linear_1.bias", {text_hidden});
    v->linear_2_b_ = vision::read_f32(ckpt, m + "linear_2.bias", {text_hidden});
  }
  return v;
}

void PixtralVision::encode(VisionOps& ops, const float* pixels, int64_t h, int64_t w,
                           float* out) const {
  const int64_t p = patch_, H = hidden_, F = intermediate_, Dh = head_dim_, Q = heads_ * Dh;
  if (h % patch_multiple() != 0 || w % patch_multiple() != 0)
    fail("pixtral: image %lldx%lld is not a multiple of %lld", (long long)w, (long long)h,
         (long long)patch_multiple());
  const int64_t rows = h / p, cols = w / p, N = rows * cols;
  const std::vector<float> patches = vision::patches_chw(pixels, h, w, p);

  // 2D RoPE: the first Dh/4 frequency slots rotate with the row (even
  // frequencies), the next Dh/4 with the column (odd ones); rotate-half.
  const int64_t half = Dh / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv[size_t(i)] = 1.0f / std::pow(float(theta_), float(2 * i) / float(Dh));
  std::vector<float> cosv(size_t(N * half)), sinv(size_t(N * half));
  for (int64_t t = 0; t < N; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const bool row_part = i < half / 2;
      const float f = row_part ? inv[size_t(2 * i)] : inv[size_t(2 * (i - half / 2) + 1)];
      const float angle = float(row_part ? t / cols : t % cols) * f;
      cosv[size_t(t * half + i)] = std::cos(angle);
      sinv[size_t(t * half + i)] = std::sin(angle);
    }

  VisionBuffer in = ops.alloc(int64_t(patches.size())), hs = ops.alloc(N * H), x = ops.alloc(N * H),
               q = ops.alloc(N * Q), k = ops.alloc(N * Q), v = ops.alloc(N * Q),
               attn = ops.alloc(N * Q), gate = ops.alloc(N * F), up = ops.alloc(N * F),
               rc = ops.alloc(N * half), rs = ops.alloc(N * half);
  ops.upload(patches.data(), in.size(), in.data());
  ops.upload(cosv.data(), rc.size(), rc.data());
  ops.upload(sinv.data(), rs.size(), rs.data());
  ops.matmul(in.data(), N, patch_embed_, nullptr, hs.data());
  ops.rmsnorm(hs.data(), ops.param(ln_pre_), N, H, 1e-5f, hs.data());

  const float scale = 1.0f / std::sqrt(float(Dh));
  const VisionAct act = mlp_silu_ ? VisionAct::SiLU : VisionAct::GeluErf;
  for (const Layer& L : layers_) {
    ops.rmsnorm(hs.data(), ops.param(L.attn_norm), N, H, 1e-5f, x.data());
    ops.matmul(x.data(), N, L.q, nullptr, q.data());
    ops.matmul(x.data(), N, L.k, nullptr, k.data());
    ops.matmul(x.data(), N, L.v, nullptr, v.data());
    ops.rope(q.data(), N, heads_, Dh, 1, rc.data(), rs.data());
    ops.rope(k.data(), N, heads_, Dh, 1, rc.data(), rs.data());
    ops.attention(q.data(), k.data(), v.data(), N, heads_, heads_, Dh, scale, attn.data());
    ops.matmul(attn.data(), N, L.o, nullptr, x.data());
    ops.add(hs.data(), x.data(), N * H);
    ops.rmsnorm(hs.data(), ops.param(L.ffn_norm), N, H, 1e-5f, x.data());
    ops.matmul(x.data(), N, L.gate, nullptr, gate.data());
    ops.matmul(x.data(), N, L.up, nullptr, up.data());
    ops.activate(act, gate.data(), up.data(), N * F);
    ops.matmul(gate.data(), N, L.down, nullptr, x.data());
    ops.add(hs.data(), x.data(), N * H);
  }

  // Projector: norm, then merge each 2x2 block of patches into one vector
  // (torch's unfold order), the merging layer and the two-layer MLP.
  ops.rmsnorm(hs.data(), ops.param(proj_norm_), N, H, text_eps_, hs.data());
  const int64_t T = (rows / merge_) * (cols / merge_);
  VisionBuffer merged = ops.alloc(T * H * merge_ * merge_), m1 = ops.alloc(T * H),
               m2 = ops.alloc(T * text_hidden_), projected = ops.alloc(T * text_hidden_);
  ops.merge_grid(hs.data(), rows, cols, H, merge_, merged.data());
  ops.matmul(merged.data(), T, merging_, nullptr, m1.data());
  ops.matmul(m1.data(), T, linear_1_, linear_1_b_.empty() ? nullptr : ops.param(linear_1_b_),
             m2.data());
  ops.activate(projector_silu_ ? VisionAct::SiLU : VisionAct::GeluErf, m2.data(), nullptr,
               m2.size());
  ops.matmul(m2.data(), T, linear_2_, linear_2_b_.empty() ? nullptr : ops.param(linear_2_b_),
             projected.data());
  ops.download(projected.data(), projected.size(), out);
}

}  // namespace tandem
