#include "model/vision_gemma4.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

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
    v->act_ = VisionAct::GeluTanh;
  else if (act == "gelu")
    v->act_ = VisionAct::GeluErf;
  else if (act == "silu")
    v->act_ = VisionAct::SiLU;
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

void Gemma4Vision::linear(VisionOps& ops, const Linear& l, const float* x, int64_t n, float* y,
                          float* scratch) const {
  if (!l.clip) {
    ops.matmul(x, n, l.w, nullptr, y);
    return;
  }
  // torch.clamp(x, min, max): max(x, min) then min(·, max).
  ops.copy(x, n * l.w.cols, scratch);
  ops.clamp(scratch, n * l.w.cols, l.in_min, l.in_max);
  ops.matmul(scratch, n, l.w, nullptr, y);
  ops.clamp(y, n * l.w.rows, l.out_min, l.out_max);
}

void Gemma4Vision::rope_table(int64_t n, int64_t cols, std::vector<float>& cos,
                              std::vector<float>& sin) const {
  // Axial: the first half of each head rotates with the column (x), the
  // second with the row (y), each over Dh/4 frequencies.
  const int64_t quarter = head_dim_ / 4;
  cos.resize(size_t(n * 2 * quarter));
  sin.resize(cos.size());
  for (int64_t t = 0; t < n; ++t) {
    const float pos[2] = {float(t % cols), float(t / cols)};
    for (int64_t axis = 0; axis < 2; ++axis)
      for (int64_t i = 0; i < quarter; ++i) {
        const float angle = pos[axis] * inv_freq_[size_t(i)];
        cos[size_t((t * 2 + axis) * quarter + i)] = std::cos(angle);
        sin[size_t((t * 2 + axis) * quarter + i)] = std::sin(angle);
      }
  }
}

void Gemma4Vision::encode(VisionOps& ops, const float* patches, int64_t rows, int64_t cols,
                          float* out) const {
  const int64_t k = pooling_, H = hidden_, F = intermediate_, Dh = head_dim_, Q = heads_ * Dh,
                KV = kv_heads_ * Dh, N = rows * cols, in = 3 * patch_ * patch_;
  if (rows <= 0 || cols <= 0 || rows % k != 0 || cols % k != 0)
    fail("gemma4 vision: a %lldx%lld patch grid does not pool by %lld", (long long)cols,
         (long long)rows, (long long)k);
  if (rows > positions_ || cols > positions_)
    fail("gemma4 vision: a %lldx%lld patch grid exceeds the position table (%lld)", (long long)cols,
         (long long)rows, (long long)positions_);

  // Host-side inputs: the patches mapped from [0, 1] to [-1, 1] (as the
  // model does), the position embeddings (column + row) and RoPE's angles.
  std::vector<float> host(size_t(N * in));
  for (int64_t i = 0; i < N * in; ++i) host[size_t(i)] = 2.0f * (patches[i] - 0.5f);
  std::vector<float> position(size_t(N * H)), cos, sin;
  for (int64_t t = 0; t < N; ++t) {
    const float* col = table_.data() + (t % cols) * H;
    const float* row = table_.data() + (positions_ + t / cols) * H;
    for (int64_t j = 0; j < H; ++j) position[size_t(t * H + j)] = col[j] + row[j];
  }
  rope_table(N, cols, cos, sin);

  const int64_t widest = std::max({in, H, Q, F});
  VisionBuffer x = ops.alloc(N * std::max(in, H)), h = ops.alloc(N * H), q = ops.alloc(N * Q),
               kb = ops.alloc(N * KV), vb = ops.alloc(N * KV), attn = ops.alloc(N * Q),
               gate = ops.alloc(N * F), up = ops.alloc(N * F), pos = ops.alloc(N * H),
               rc = ops.alloc(int64_t(cos.size())), rs = ops.alloc(int64_t(sin.size())),
               clip = ops.alloc(clipped_ ? N * widest : 0);
  ops.upload(host.data(), N * in, x.data());
  ops.upload(position.data(), N * H, pos.data());
  ops.upload(cos.data(), rc.size(), rc.data());
  ops.upload(sin.data(), rs.size(), rs.data());
  ops.matmul(x.data(), N, input_proj_, nullptr, h.data());
  ops.add(h.data(), pos.data(), N * H);

  for (const Layer& L : layers_) {
    ops.rmsnorm(h.data(), ops.param(L.in_norm), N, H, eps_, x.data());
    linear(ops, L.q, x.data(), N, q.data(), clip.data());
    linear(ops, L.k, x.data(), N, kb.data(), clip.data());
    linear(ops, L.v, x.data(), N, vb.data(), clip.data());
    ops.rmsnorm(q.data(), ops.param(L.q_norm), N * heads_, Dh, eps_, q.data());
    ops.rmsnorm(kb.data(), ops.param(L.k_norm), N * kv_heads_, Dh, eps_, kb.data());
    ops.rmsnorm(vb.data(), nullptr, N * kv_heads_, Dh, eps_, vb.data());
    ops.rope(q.data(), N, heads_, Dh, 2, rc.data(), rs.data());
    ops.rope(kb.data(), N, kv_heads_, Dh, 2, rc.data(), rs.data());
    ops.attention(q.data(), kb.data(), vb.data(), N, heads_, kv_heads_, Dh, 1.0f, attn.data());
    linear(ops, L.o, attn.data(), N, x.data(), clip.data());
    ops.rmsnorm(x.data(), ops.param(L.post_attn_norm), N, H, eps_, x.data());
    ops.add(h.data(), x.data(), N * H);

    ops.rmsnorm(h.data(), ops.param(L.pre_ffn_norm), N, H, eps_, x.data());
    linear(ops, L.gate, x.data(), N, gate.data(), clip.data());
    linear(ops, L.up, x.data(), N, up.data(), clip.data());
    ops.activate(act_, gate.data(), up.data(), N * F);
    linear(ops, L.down, gate.data(), N, x.data(), clip.data());
    ops.rmsnorm(x.data(), ops.param(L.post_ffn_norm), N, H, eps_, x.data());
    ops.add(h.data(), x.data(), N * H);
  }

  // Average k x k blocks of patches, row-major over the pooled grid, then
  // scale by sqrt(H) (and standardize).
  const int64_t T = (rows / k) * (cols / k);
  VisionBuffer pooled = ops.alloc(T * H), projected = ops.alloc(T * text_hidden_);
  ops.pool_grid(h.data(), rows, cols, H, k, pooled.data());
  const bool standardize = !std_bias_.empty();
  ops.scale_shift(pooled.data(), T, H, float(std::sqrt(double(H))),
                  standardize ? ops.param(std_bias_) : nullptr,
                  standardize ? ops.param(std_scale_) : nullptr);
  // embed_vision: weightless RMSNorm, then the projection to the text width.
  ops.rmsnorm(pooled.data(), nullptr, T, H, eps_, pooled.data());
  ops.matmul(pooled.data(), T, projection_, nullptr, projected.data());
  ops.download(projected.data(), projected.size(), out);
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

  void encode_with(VisionOps& ops, const PreparedImage& image, float* out) const override {
    tower_->encode(ops, image.pixels.data(), image.height / settings_.patch,
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
