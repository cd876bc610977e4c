#include "model/vision_gemma3.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "core/error.h"

namespace tandem {

namespace {

// Prefixes of the tower and the projector across checkpoint layouts.
const char* const kTowerPrefixes[] = {"model.vision_tower.vision_model.",
                                      "vision_tower.vision_model.", "model.vision_tower.",
                                      "vision_tower."};
const char* const kProjectorPrefixes[] = {"model.multi_modal_projector.", "multi_modal_projector."};

std::vector<float> vec(const Checkpoint& c, const std::string& name, const Shape& shape) {
  TensorView t = c.require(name, shape);
  std::vector<float> v(size_t(t.numel()));
  convert_to_f32(t.data, t.dtype, t.numel(), v.data());
  return v;
}

WeightMatrix matrix(const Checkpoint& c, const std::string& name, int64_t rows, int64_t cols) {
  TensorView t = c.require(name, {rows, cols});
  return WeightMatrix{t.dtype, t.data, rows, cols};
}

int64_t field(const nlohmann::json& j, const char* key, int64_t fallback) {
  return j.contains(key) && j[key].is_number_integer() ? j[key].get<int64_t>() : fallback;
}

}  // namespace

std::unique_ptr<Gemma3Vision> Gemma3Vision::load(const Checkpoint& ckpt,
                                                 const nlohmann::json& config,
                                                 int64_t text_hidden) {
  if (!config.contains("vision_config") || !config["vision_config"].is_object())
    fail("%s: config.json has no vision_config, so this checkpoint cannot take images",
         ckpt.dir().c_str());
  const nlohmann::json& vc = config["vision_config"];
  auto v = std::unique_ptr<Gemma3Vision>(new Gemma3Vision());
  v->hidden_ = field(vc, "hidden_size", 1152);
  v->heads_ = field(vc, "num_attention_heads", 16);
  v->intermediate_ = field(vc, "intermediate_size", 4304);
  v->image_size_ = field(vc, "image_size", 896);
  v->patch_ = field(vc, "patch_size", 14);
  v->eps_ = vc.contains("layer_norm_eps") ? vc["layer_norm_eps"].get<float>() : 1e-6f;
  v->tokens_ = field(config, "mm_tokens_per_image", 256);
  v->text_hidden_ = text_hidden;
  const int64_t layers = field(vc, "num_hidden_layers", 27), H = v->hidden_, F = v->intermediate_;
  const int64_t side = v->image_size_ / v->patch_,
                per_side = int64_t(std::lround(std::sqrt(double(v->tokens_))));
  if (v->hidden_ % v->heads_ != 0 || side * v->patch_ != v->image_size_ ||
      per_side * per_side != v->tokens_ || side % per_side != 0)
    fail("%s: vision_config (image %lld, patch %lld, %lld tokens per image) does not tile",
         ckpt.dir().c_str(), (long long)v->image_size_, (long long)v->patch_,
         (long long)v->tokens_);

  std::string p;
  for (const char* prefix : kTowerPrefixes)
    if (ckpt.has(std::string(prefix) + "embeddings.patch_embedding.weight")) {
      p = prefix;
      break;
    }
  if (p.empty())
    fail("%s: no vision tower tensors (vision_tower.*embeddings.patch_embedding.weight)",
         ckpt.dir().c_str());
  TensorView conv =
      ckpt.require(p + "embeddings.patch_embedding.weight", {H, 3, v->patch_, v->patch_});
  v->patch_embed_ = WeightMatrix{conv.dtype, conv.data, H, 3 * v->patch_ * v->patch_};
  v->patch_bias_ = vec(ckpt, p + "embeddings.patch_embedding.bias", {H});
  v->positions_ = vec(ckpt, p + "embeddings.position_embedding.weight", {side * side, H});
  for (int64_t i = 0; i < layers; ++i) {
    const std::string l = p + "encoder.layers." + std::to_string(i) + ".";
    Layer L;
    L.ln1_w = vec(ckpt, l + "layer_norm1.weight", {H});
    L.ln1_b = vec(ckpt, l + "layer_norm1.bias", {H});
    L.ln2_w = vec(ckpt, l + "layer_norm2.weight", {H});
    L.ln2_b = vec(ckpt, l + "layer_norm2.bias", {H});
    L.q = matrix(ckpt, l + "self_attn.q_proj.weight", H, H);
    L.k = matrix(ckpt, l + "self_attn.k_proj.weight", H, H);
    L.v = matrix(ckpt, l + "self_attn.v_proj.weight", H, H);
    L.o = matrix(ckpt, l + "self_attn.out_proj.weight", H, H);
    L.q_b = vec(ckpt, l + "self_attn.q_proj.bias", {H});
    L.k_b = vec(ckpt, l + "self_attn.k_proj.bias", {H});
    L.v_b = vec(ckpt, l + "self_attn.v_proj.bias", {H});
    L.o_b = vec(ckpt, l + "self_attn.out_proj.bias", {H});
    L.fc1 = matrix(ckpt, l + "mlp.fc1.weight", F, H);
    L.fc2 = matrix(ckpt, l + "mlp.fc2.weight", H, F);
    L.fc1_b = vec(ckpt, l + "mlp.fc1.bias", {F});
    L.fc2_b = vec(ckpt, l + "mlp.fc2.bias", {H});
    v->layers_.push_back(std::move(L));
  }
  v->post_w_ = vec(ckpt, p + "post_layernorm.weight", {H});
  v->post_b_ = vec(ckpt, p + "post_layernorm.bias", {H});

  std::string m;
  for (const char* prefix : kProjectorPrefixes)
    if (ckpt.has(std::string(prefix) + "mm_input_projection_weight")) m = prefix;
  if (m.empty())
    fail("%s: no multi_modal_projector.mm_input_projection_weight", ckpt.dir().c_str());
  v->soft_norm_ = vec(ckpt, m + "mm_soft_emb_norm.weight", {H});
  for (float& w : v->soft_norm_) w += 1.0f;  // Gemma RMSNorm: x̂ · (1 + w)
  // Stored [in = H, out = D]; matmul wants rows of outputs.
  std::vector<float> proj = vec(ckpt, m + "mm_input_projection_weight", {H, text_hidden});
  v->projection_.resize(proj.size());
  for (int64_t i = 0; i < H; ++i)
    for (int64_t o = 0; o < text_hidden; ++o)
      v->projection_[size_t(o * H + i)] = proj[size_t(i * text_hidden + o)];
  return v;
}

void Gemma3Vision::encode(ThreadPool& pool, const float* pixels, float* out) const {
  const int64_t H = hidden_, F = intermediate_, p = patch_, side = image_size_ / p, N = side * side;
  const int64_t S = image_size_, Dh = H / heads_;
  // Patches in (c, ky, kx) order, row-major over the patch grid.
  std::vector<float> patches(size_t(N * 3 * p * p));
  for (int64_t r = 0; r < side; ++r)
    for (int64_t c = 0; c < side; ++c) {
      float* dst = patches.data() + (r * side + c) * 3 * p * p;
      for (int64_t ch = 0; ch < 3; ++ch)
        for (int64_t y = 0; y < p; ++y)
          for (int64_t x = 0; x < p; ++x) *dst++ = pixels[(ch * S + r * p + y) * S + c * p + x];
    }
  std::vector<float> h(size_t(N * H)), x(size_t(N * H)), q(size_t(N * H)), k(size_t(N * H)),
      v(size_t(N * H)), attn(size_t(N * H)), mlp(size_t(N * F));
  cpu::matmul(pool, patches.data(), N, patch_embed_, patch_bias_.data(), h.data());
  for (size_t i = 0; i < h.size(); ++i) h[i] += positions_[i];

  const float scale = 1.0f / std::sqrt(float(Dh));
  for (const Layer& L : layers_) {
    cpu::layernorm(h.data(), L.ln1_w.data(), L.ln1_b.data(), N, H, eps_, x.data());
    cpu::matmul(pool, x.data(), N, L.q, L.q_b.data(), q.data());
    cpu::matmul(pool, x.data(), N, L.k, L.k_b.data(), k.data());
    cpu::matmul(pool, x.data(), N, L.v, L.v_b.data(), v.data());
    // Bidirectional attention over all patches, one task per (query, head).
    pool.parallel_for(N * heads_, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> scores(static_cast<size_t>(N));
      for (int64_t task = begin; task < end; ++task) {
        const int64_t t = task / heads_, hd = task % heads_;
        const float* qt = q.data() + t * H + hd * Dh;
        float mx = -INFINITY;
        for (int64_t j = 0; j < N; ++j) {
          scores[size_t(j)] = cpu::dot(qt, k.data() + j * H + hd * Dh, Dh) * scale;
          mx = std::max(mx, scores[size_t(j)]);
        }
        float sum = 0.0f;
        for (float& s : scores) sum += (s = std::exp(s - mx));
        float* o = attn.data() + t * H + hd * Dh;
        std::fill(o, o + Dh, 0.0f);
        for (int64_t j = 0; j < N; ++j)
          cpu::axpy(scores[size_t(j)] / sum, v.data() + j * H + hd * Dh, o, Dh);
      }
    });
    cpu::matmul(pool, attn.data(), N, L.o, L.o_b.data(), x.data());
    cpu::add_inplace(h.data(), x.data(), N * H);
    cpu::layernorm(h.data(), L.ln2_w.data(), L.ln2_b.data(), N, H, eps_, x.data());
    cpu::matmul(pool, x.data(), N, L.fc1, L.fc1_b.data(), mlp.data());
    cpu::gelu_tanh(mlp.data(), N * F);
    cpu::matmul(pool, mlp.data(), N, L.fc2, L.fc2_b.data(), x.data());
    cpu::add_inplace(h.data(), x.data(), N * H);
  }
  cpu::layernorm(h.data(), post_w_.data(), post_b_.data(), N, H, eps_, h.data());

  // Average-pool the patch grid down to tokens_per_side², row-major.
  const int64_t per_side = int64_t(std::lround(std::sqrt(double(tokens_)))), kern = side / per_side;
  std::vector<float> pooled(size_t(tokens_ * H), 0.0f);
  for (int64_t r = 0; r < side; ++r)
    for (int64_t c = 0; c < side; ++c) {
      float* dst = pooled.data() + ((r / kern) * per_side + c / kern) * H;
      cpu::axpy(1.0f / float(kern * kern), h.data() + (r * side + c) * H, dst, H);
    }
  cpu::rmsnorm(pooled.data(), soft_norm_.data(), tokens_, H, eps_, pooled.data());
  cpu::matmul(pool, pooled.data(), tokens_,
              WeightMatrix{DType::F32, projection_.data(), text_hidden_, H}, nullptr, out);
}

}  // namespace tandem
