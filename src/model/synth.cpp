#include "model/synth.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/hash.h"
#include "model/model.h"
#include "model/safetensors.h"

namespace tandem {

namespace {

// splitmix64: fast, seedable, good enough for random weights.
struct Rng {
  uint64_t state;
  uint64_t next() { return mix64(state += 0x9e3779b97f4a7c15ull); }
  float uniform() { return float(next() >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f; }  // [-1, 1)
};

class Writer {
 public:
  Writer(DType dtype, uint64_t seed) : dtype_(dtype), rng_{seed} {}

  // Values center + uniform noise with standard deviation `std`.
  void add(const std::string& name, const Shape& shape, float center, float std) {
    TensorData t{name, dtype_, shape, {}};
    const int64_t n = shape_numel(shape);
    t.bytes.resize(size_t(n) * dtype_size(dtype_));
    const float amp = std * std::sqrt(3.0f);  // uniform [-a, a] has std a / sqrt(3)
    for (int64_t i = 0; i < n; ++i) store(t.bytes.data(), i, center + amp * rng_.uniform());
    bytes_ += t.bytes.size();
    tensors_.push_back(std::move(t));
  }
  void matrix(const std::string& name, int64_t rows, int64_t cols) {
    add(name, {rows, cols}, 0.0f, 1.0f / std::sqrt(float(cols)));
  }

  const std::vector<TensorData>& tensors() const { return tensors_; }
  uint64_t bytes() const { return bytes_; }

 private:
  void store(uint8_t* base, int64_t i, float v) {
    switch (dtype_) {
      case DType::F32: reinterpret_cast<float*>(base)[i] = v; break;
      case DType::BF16: reinterpret_cast<uint16_t*>(base)[i] = f32_to_bf16(v); break;
      case DType::F16: reinterpret_cast<uint16_t*>(base)[i] = f32_to_f16(v); break;
      default: fail("synth: dtype %s is not a float type", std::string(dtype_name(dtype_)).c_str());
    }
  }

  DType dtype_;
  Rng rng_;
  std::vector<TensorData> tensors_;
  uint64_t bytes_ = 0;
};

}  // namespace

uint64_t synth_checkpoint(const std::string& config_path, const std::string& out_dir, DType dtype,
                          uint64_t seed) {
  std::ifstream f(config_path);
  if (!f) fail("synth: cannot read %s", config_path.c_str());
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  const ModelSpec s = parse_model_spec(text, config_path);
  const bool multimodal = nlohmann::json::parse(text).contains("text_config");
  const std::string p = multimodal ? "model.language_model." : "model.";
  const float norm_center = s.norm_style == NormStyle::OnePlusWeight ? 0.0f : 1.0f;
  const int64_t D = s.hidden;

  Writer w(dtype, seed);
  w.add(p + "embed_tokens.weight", {s.vocab, D}, 0.0f, 0.5f);
  for (int64_t i = 0; i < s.layers; ++i) {
    const LayerSpec& ls = s.layer[size_t(i)];
    const int64_t Q = ls.q_dim(s.heads), KV = ls.kv_dim(), F = ls.intermediate;
    const bool own_kv = ls.kv_source == i;
    const std::string l = p + "layers." + std::to_string(i) + ".";
    w.add(l + "input_layernorm.weight", {D}, norm_center, 0.1f);
    w.matrix(l + "self_attn.q_proj.weight", Q, D);
    if (own_kv) w.matrix(l + "self_attn.k_proj.weight", KV, D);
    if (own_kv && !ls.k_eq_v) w.matrix(l + "self_attn.v_proj.weight", KV, D);
    w.matrix(l + "self_attn.o_proj.weight", D, Q);
    if (s.qkv_bias) {
      w.add(l + "self_attn.q_proj.bias", {Q}, 0.0f, 0.1f);
      if (own_kv) w.add(l + "self_attn.k_proj.bias", {KV}, 0.0f, 0.1f);
      if (own_kv && !ls.k_eq_v) w.add(l + "self_attn.v_proj.bias", {KV}, 0.0f, 0.1f);
    }
    if (s.o_bias) w.add(l + "self_attn.o_proj.bias", {D}, 0.0f, 0.1f);
    if (s.qk_norm) {
      w.add(l + "self_attn.q_norm.weight", {ls.head_dim}, norm_center, 0.1f);
      if (own_kv) w.add(l + "self_attn.k_norm.weight", {ls.head_dim}, norm_center, 0.1f);
    }
    w.add(l + "post_attention_layernorm.weight", {D}, norm_center, 0.1f);
    if (s.sandwich_norms) {
      w.add(l + "pre_feedforward_layernorm.weight", {D}, norm_center, 0.1f);
      w.add(l + "post_feedforward_layernorm.weight", {D}, norm_center, 0.1f);
    }
    w.matrix(l + "mlp.gate_proj.weight", F, D);
    w.matrix(l + "mlp.up_proj.weight", F, D);
    w.matrix(l + "mlp.down_proj.weight", D, F);
    if (s.mlp_bias) {
      w.add(l + "mlp.gate_proj.bias", {F}, 0.0f, 0.1f);
      w.add(l + "mlp.up_proj.bias", {F}, 0.0f, 0.1f);
      w.add(l + "mlp.down_proj.bias", {D}, 0.0f, 0.1f);
    }
    if (s.ple_dim > 0) {
      w.matrix(l + "per_layer_input_gate.weight", s.ple_dim, D);
      w.matrix(l + "per_layer_projection.weight", D, s.ple_dim);
      w.add(l + "post_per_layer_input_norm.weight", {D}, norm_center, 0.1f);
    }
    if (s.layer_scalars) w.add(l + "layer_scalar", {1}, 1.0f, 0.0f);
  }
  w.add(p + "norm.weight", {D}, norm_center, 0.1f);
  if (s.ple_dim > 0) {
    w.add(p + "embed_tokens_per_layer.weight", {s.ple_vocab, s.layers * s.ple_dim}, 0.0f, 0.5f);
    w.matrix(p + "per_layer_model_projection.weight", s.layers * s.ple_dim, D);
    w.add(p + "per_layer_projection_norm.weight", {s.ple_dim}, norm_center, 0.1f);
  }
  if (!s.tied_embeddings) w.matrix("lm_head.weight", s.vocab, D);

  std::filesystem::create_directories(out_dir);
  write_safetensors(out_dir + "/model.safetensors", w.tensors(), {{"format", "pt"}});
  std::ofstream cfg(out_dir + "/config.json");
  cfg << text;
  if (!cfg) fail("synth: cannot write %s/config.json", out_dir.c_str());
  return w.bytes();
}

}  // namespace tandem
