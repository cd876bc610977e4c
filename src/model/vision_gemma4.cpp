#include "model/vision_gemma4.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "core/error.h"
#include "image/preprocess.h"
#include "image/resize.h"
#include "model/vision_common.h"
#include "model/vision_tower.h"

namespace tandem {

namespace {

const char* const kTowerPrefixes[] = {"model.vision_tower.", "vision_tower."};
const char* const kEmbedderPrefixes[] = {"model.embed_vision.", "embed_vision."};

}  // namespace

std::unique_ptr<Gemma4Vision> Gemma4Vision::load(const Checkpoint& ckpt,
                                                 const nlohmann::json& config,
                                                 int64_t text_hidden) {
  const nlohmann::json& vc = vision::vision_config(ckpt, config);
  auto v = std::unique_ptr<Gemma4Vision>(new Gemma4Vision());
  v->hidden_ = vision::config_int(vc, "hidden_size", 768);
  v->heads_ = vision::config_int(vc, "num_attention_heads", 12);
  v->kv_heads_ = vision::config_int(vc, "num_key_value_heads", v->heads_);
  v->head_dim_ = vision::config_int(vc, "head_dim", 64);
  v->intermediate_ = vision::config_int(vc, "intermediate_size", 3072);
  v->patch_ = vision::config_int(vc, "patch_size", 16);
  v->pooling_ = vision::config_int(vc, "pooling_kernel_size", 3);
  v->positions_ = vision::config_int(vc, "position_embedding_size", 10240);
  v->text_hidden_ = text_hidden;
  if (vc.contains("rms_norm_eps") && vc["rms_norm_eps"].is_number())
    v->eps_ = vc["rms_norm_eps"].get<float>();
  v->clipped_ = vc.value("use_clipped_linears", false);
  const bool standardize = vc.value("standardize", false);
  const std::string act = vc.value("hidden_activation", std::string("gelu_pytorch_tanh"));
  if (act == "gelu_pytorch_tanh")
    v->act_ = Act::GeluTanh;
  else if (act == "gelu")
    v->act_ = Act::GeluErf;
  else if (act == "silu")
    v->act_ = Act::SiLU;
  else
    fail(
        "%s: vision_config.hidden_activation \"%s\" is not supported (gelu_pytorch_tanh, gelu, "
        "silu)",
        ckpt.dir().c_str(), act.c_str());
  double theta = 100.0;
  if (vc.contains("rope_parameters") && vc["rope_parameters"].is_object()) {
    const nlohmann::json& rp = vc["rope_parameters"];
    if (rp.value("rope_type", std::string("axial")) != "axial")
      fail("%s: vision_config.rope_parameters.rope_type must be \"axial\"", ckpt.dir().c_str());
    if (rp.contains("rope_theta") && rp["rope_theta"].is_number())
      theta = rp["rope_theta"].get<double>();
  }
  const int64_t H = v->hidden_, F = v->intermediate_, Dh = v->head_dim_, Q = v->heads_ * Dh,
                KV = v->kv_heads_ * Dh, P = v->patch_,
                layers = vision::config_int(vc, "num_hidden_layers", 16);
  if (Dh % 4 != 0 || v->kv_heads_ <= 0 || v->heads_ % v->kv_heads_ != 0 || v->pooling_ <= 0)
    fail(
        "%s: vision_config (head_dim %lld, %lld heads, %lld kv heads, pooling %lld) is not "
        "supported: head_dim must be a multiple of 4 and heads a multiple of kv heads",
        ckpt.dir().c_str(), (long long)Dh, (long long)v->heads_, (long long)v->kv_heads_,
        (long long)v->pooling_);
  // Axial RoPE: Dh/4 frequencies over a spatial dim of Dh/2, shared by both axes.
  const int64_t spatial = Dh / 2;
  for (int64_t i = 0; i < spatial; i += 2)
    v->inv_freq_.push_back(1.0f / std::pow(float(theta), float(i) / float(spatial)));

  const std::string p =
      vision::find_prefix(ckpt, kTowerPrefixes, "patch_embedder.input_proj.weight");
  if (p.empty())
    fail("%s: no Gemma 4 vision tower tensors (vision_tower.patch_embedder.input_proj.weight)",
         ckpt.dir().c_str());
  v->input_proj_ = vision::read_matrix(ckpt, p + "patch_embedder.input_proj.weight", H, 3 * P * P);
  v->table_ =
      vision::read_f32(ckpt, p + "patch_embedder.position_embedding_table", {2, v->positions_, H});
  for (int64_t i = 0; i < layers; ++i) {
    const std::string l = p + "encoder.layers." + std::to_string(i) + ".";
    Layer L;
    L.in_norm = vision::read_f32(ckpt, l + "input_layernorm.weight", {H});
    L.post_attn_norm = vision::read_f32(ckpt, l + "post_attention_layernorm.weight", {H});
    L.pre_ffn_norm = vision::read_f32(ckpt, l + "pre_feedforward_layernorm.weight", {H});
    L.post_ffn_norm = vision::read_f32(ckpt, l + "post_feedforward_layernorm.weight", {H});
    L.q_norm = vision::read_f32(ckpt, l + "self_attn.q_norm.weight", {Dh});
    L.k_norm = vision::read_f32(ckpt, l + "self_attn.k_norm.weight", {Dh});
    L.q = v->read_linear(ckpt, l + "self_attn.q_proj", Q, H);
    L.k = v->read_linear(ckpt, l + "self_attn.k_proj", KV, H);
    L.v = v->read_linear(ckpt, l + "self_attn.v_proj", KV, H);
    L.o = v->read_linear(ckpt, l + "self_attn.o_proj", H, Q);
    L.gate = v->read_linear(ckpt, l + "mlp.gate_proj", F, H);
    L.up = v->read_linear(ckpt, l + "mlp.up_proj", F, H);
    L.down = v->read_linear(ckpt, l + "mlp.down_proj", H, F);
    v->layers_.push_back(std::move(L));
  }
  if (standardize) {
    v->std_bias_ = vision::read_f32(ckpt, p + "std_bias", {H});
    v->std_scale_ = vision::read_f32(ckpt, p + "std_scale", {H});
  }
  const std::string m = vision::find_prefix(ckpt, kEmbedderPrefixes, "embedding_projection.weight");
  if (m.empty()) fail("%s: no embed_vision.embedding_projection.weight", ckpt.dir().c_str());
  v->projection_ = vision::read_matrix(ckpt, m + "embedding_projection.weight", text_hidden, H);
  return v;
}

Gemma4Vision::Linear Gemma4Vision::read_linear(const Checkpoint& ckpt, const std::string& name,
                                               int64_t rows, int64_t cols) const {
  Linear l;
  l.w = vision::read_matrix(ckpt, name + ".linear.weight", rows, cols);
  l.clip = clipped_;
  if (l.clip) {
    l.in_min = vision::read_f32(ckpt, name + ".input_min", {})[0];
    l.in_max = vision::read_f32(ckpt, name + ".input_max", {})[0];
    l.out_min = vision::read_f32(ckpt, name + ".output_min", {})[0];
    l.out_max = vision::read_f32(ckpt, name + ".output_max", {})[0];
  }
  return l;
}

void Gemma4Vision::linear(ThreadPool& pool, const Linear& l, const float* x, int64_t n,
                          float* y) const {
  if (!l.clip) {
    cpu::matmul(pool, x, n, l.w, nullptr, y);
    return;
  }
  // torch.clamp(x, min, max): max(x, min) then min(·, max).
  std::vector<float> in(x, x + n * l.w.cols);
  for (float& e : in) e = std::min(std::max(e, l.in_min), l.in_max);
  cpu::matmul(pool, in.data(), n, l.w, nullptr, y);
  for (int64_t i = 0; i < n * l.w.rows; ++i) y[i] = std::min(std::max(y[i], l.out_min), l.out_max);
}

void Gemma4Vision::rope(float* x, int64_t n, int64_t heads, int64_t cols) const {
  const int64_t Dh = head_dim_, half = Dh / 2, quarter = Dh / 4;
  for (int64_t t = 0; t < n; ++t) {
    const float pos[2] = {float(t % cols), float(t / cols)};  // (x, y)
    for (int64_t axis = 0; axis < 2; ++axis)
      for (int64_t i = 0; i < quarter; ++i) {
        const float angle = pos[axis] * inv_freq_[size_t(i)], c = std::cos(angle),
                    s = std::sin(angle);
        for (int64_t hd = 0; hd < heads; ++hd) {
          float* e = x + (t * heads + hd) * Dh + axis * half;
          const float a = e[i], b = e[i + quarter];
          e[i] = a * c - b * s;
          e[i + quarter] = b * c + a * s;
        }
      }
  }
}

void Gemma4Vision::encode(ThreadPool& pool, const float* patches, int64_t rows, int64_t cols,
                          float* out) const {
  const int64_t k = pooling_, H = hidden_, F = intermediate_, Dh = head_dim_, Q = heads_ * Dh,
                KV = kv_heads_ * Dh, N = rows * cols, in = 3 * patch_ * patch_;
  if (rows <= 0 || cols <= 0 || rows % k != 0 || cols % k != 0)
    fail("gemma4 vision: a %lldx%lld patch grid does not pool by %lld", (long long)cols,
         (long long)rows, (long long)k);
  if (rows > positions_ || cols > positions_)
    fail("gemma4 vision: a %lldx%lld patch grid exceeds the position table (%lld)", (long long)cols,
         (long long)rows, (long long)positions_);

  // Patch embedding: the model maps [0, 1] to [-1, 1] itself.
  std::vector<float> x(size_t(N * std::max(in, H))), h(size_t(N * H)), q(size_t(N * Q)),
      kb(size_t(N * Q)), vb(size_t(N * Q)), attn(size_t(N * Q)), gate(size_t(N * F)),
      up(size_t(N * F));
  for (int64_t i = 0; i < N * in; ++i) x[size_t(i)] = 2.0f * (patches[i] - 0.5f);
  cpu::matmul(pool, x.data(), N, input_proj_, nullptr, h.data());
  for (int64_t t = 0; t < N; ++t) {
    const float* col = table_.data() + (t % cols) * H;
    const float* row = table_.data() + (positions_ + t / cols) * H;
    float* dst = h.data() + t * H;
    for (int64_t j = 0; j < H; ++j) dst[j] += col[j] + row[j];
  }

  const int64_t group = heads_ / kv_heads_;
  for (const Layer& L : layers_) {
    cpu::rmsnorm(h.data(), L.in_norm.data(), N, H, eps_, x.data());
    linear(pool, L.q, x.data(), N, q.data());
    linear(pool, L.k, x.data(), N, kb.data());
    linear(pool, L.v, x.data(), N, vb.data());
    cpu::rmsnorm(q.data(), L.q_norm.data(), N * heads_, Dh, eps_, q.data());
    cpu::rmsnorm(kb.data(), L.k_norm.data(), N * kv_heads_, Dh, eps_, kb.data());
    cpu::rmsnorm(vb.data(), nullptr, N * kv_heads_, Dh, eps_, vb.data());
    rope(q.data(), N, heads_, cols);
    rope(kb.data(), N, kv_heads_, cols);
    if (group > 1)  // grouped K/V: widen to one per query head, back to front in place
      for (float* m : {kb.data(), vb.data()})
        for (int64_t t = N - 1; t >= 0; --t)
          for (int64_t hd = heads_ - 1; hd >= 0; --hd) {
            const float* src = m + t * KV + (hd / group) * Dh;
            float* dst = m + t * Q + hd * Dh;  // never a partial overlap: both step by Dh
            if (dst != src) std::copy_n(src, Dh, dst);
          }
    vision::full_attention(pool, q.data(), kb.data(), vb.data(), N, heads_, Dh, 1.0f, attn.data());
    linear(pool, L.o, attn.data(), N, x.data());
    cpu::rmsnorm(x.data(), L.post_attn_norm.data(), N, H, eps_, x.data());
    cpu::add_inplace(h.data(), x.data(), N * H);

    cpu::rmsnorm(h.data(), L.pre_ffn_norm.data(), N, H, eps_, x.data());
    linear(pool, L.gate, x.data(), N, gate.data());
    linear(pool, L.up, x.data(), N, up.data());
    switch (act_) {
      case Act::GeluTanh: cpu::gelu_tanh_mul(gate.data(), up.data(), N * F); break;
      case Act::GeluErf: cpu::gelu_erf_mul(gate.data(), up.data(), N * F); break;
      case Act::SiLU: cpu::silu_mul(gate.data(), up.data(), N * F); break;
    }
    linear(pool, L.down, gate.data(), N, x.data());
    cpu::rmsnorm(x.data(), L.post_ffn_norm.data(), N, H, eps_, x.data());
    cpu::add_inplace(h.data(), x.data(), N * H);
  }

  // Average k x k blocks of patches, row-major over the pooled grid, then
  // scale by sqrt(H) (and standardize).
  const int64_t pc = cols / k, T = (rows / k) * pc;
  std::vector<float> pooled(size_t(T * H), 0.0f);
  for (int64_t t = 0; t < N; ++t)
    cpu::axpy(1.0f / float(k * k), h.data() + t * H,
              pooled.data() + ((t / cols) / k * pc + (t % cols) / k) * H, H);
  const float root = float(std::sqrt(double(H)));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < H; ++j) {
      float& e = pooled[size_t(t * H + j)];
      e *= root;
      if (!std_bias_.empty()) e = (e - std_bias_[size_t(j)]) * std_scale_[size_t(j)];
    }
  // embed_vision: weightless RMSNorm, then the projection to the text width.
  cpu::rmsnorm(pooled.data(), nullptr, T, H, eps_, pooled.data());
  cpu::matmul(pool, pooled.data(), T, projection_, nullptr, out);
}

// ---- The VisionTower adapter: the processor's settings and the prompt layout.

namespace {

// Gemma4ImageProcessor's settings: preprocessor_config.json (top level) or
// processor_config.json ("image_processor"), else the processor's defaults
// (max_soft_tokens 280) with the tower's patch and pooling sizes.
struct ProcessorSettings {
  int64_t patch = 16, pooling = 3, max_soft_tokens = 280;
};

ProcessorSettings processor_settings(const std::string& dir, int64_t patch, int64_t pooling) {
  ProcessorSettings s{patch, pooling, 280};
  for (const char* file : {"preprocessor_config.json", "processor_config.json"}) {
    const std::string path = dir + "/" + file;
    if (!std::filesystem::exists(path)) continue;
    std::ifstream f(path);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(f);
    } catch (const nlohmann::json::exception& e) {
      fail("%s: not valid JSON: %s", path.c_str(), e.what());
    }
    if (j.contains("image_processor") && j["image_processor"].is_object()) j = j["image_processor"];
    s.patch = vision::config_int(j, "patch_size", s.patch);
    s.pooling = vision::config_int(j, "pooling_kernel_size", s.pooling);
    s.max_soft_tokens = vision::config_int(j, "max_soft_tokens", s.max_soft_tokens);
    if (s.patch != patch || s.pooling != pooling)
      fail("%s: patch_size %lld / pooling_kernel_size %lld differ from vision_config's %lld / %lld",
           path.c_str(), (long long)s.patch, (long long)s.pooling, (long long)patch,
           (long long)pooling);
    const int64_t allowed[] = {70, 140, 280, 560, 1120};
    if (std::find(std::begin(allowed), std::end(allowed), s.max_soft_tokens) == std::end(allowed))
      fail("%s: max_soft_tokens must be one of 70, 140, 280, 560, 1120, found %lld", path.c_str(),
           (long long)s.max_soft_tokens);
    break;
  }
  return s;
}

int32_t config_id(const nlohmann::json& config, const char* key, int32_t fallback) {
  return config.contains(key) && config[key].is_number_integer() ? config[key].get<int32_t>()
                                                                 : fallback;
}

class Gemma4Tower : public VisionTower {
 public:
  Gemma4Tower(const Model& model, const nlohmann::json& config)
      : tower_(Gemma4Vision::load(model.checkpoint, config, model.spec.hidden)),
        settings_(
            processor_settings(model.checkpoint.dir(), tower_->patch_size(), tower_->pooling())) {
    layout_ = ImageLayout::Gemma4;
    ids_.placeholder = config_id(config, "image_token_id", 258880);
    ids_.begin = config_id(config, "boi_token_id", 255999);
    ids_.end = config_id(config, "eoi_token_id", 258882);
    ids_.marker = ids_.placeholder;  // the chat template writes <|image|> itself
    bidirectional_ = false;
    text_hidden_ = model.spec.hidden;
    max_tokens_ = settings_.max_soft_tokens;
  }

  PreparedImage prepare(const Image& image) const override {
    const int patch = int(settings_.patch), k = int(settings_.pooling);
    const Size2 size = gemma4_target_size(image.height, image.width, patch,
                                          int(settings_.max_soft_tokens) * k * k, k);
    PreparedImage p;
    p.pixels = patchify(resize_image(image, size.width, size.height, ResizeFilter::Bicubic), patch);
    p.height = size.height;
    p.width = size.width;
    p.rows = size.height / (patch * k);
    p.cols = size.width / (patch * k);
    p.tokens = p.rows * p.cols;
    return p;
  }

  void encode(ThreadPool& pool, const PreparedImage& image, float* out) const override {
    tower_->encode(pool, image.pixels.data(), image.height / settings_.patch,
                   image.width / settings_.patch, out);
  }

 private:
  std::unique_ptr<Gemma4Vision> tower_;
  ProcessorSettings settings_;
};

}  // namespace

std::unique_ptr<VisionTower> load_gemma4_tower(const Model& model, const nlohmann::json& config) {
  // "vision" makes image tokens attend to each other on sliding layers only
  // (global layers stay causal); the decoder's one key_end per token cannot
  // say that yet.
  const nlohmann::json text = config.value("text_config", nlohmann::json::object());
  if (text.contains("use_bidirectional_attention") &&
      text["use_bidirectional_attention"].is_string())
    fail(
        "%s: text_config.use_bidirectional_attention \"%s\" is not supported for images yet "
        "(image tokens would attend to each other on sliding layers only)",
        model.checkpoint.dir().c_str(),
        text["use_bidirectional_attention"].get<std::string>().c_str());
  return std::make_unique<Gemma4Tower>(model, config);
}

}  // namespace tandem
