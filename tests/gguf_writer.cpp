#include "gguf_writer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <stdexcept>

#include "core/dtype.h"
#include "core/quant.h"

namespace tandem::test {

namespace {

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

void put_string(std::vector<uint8_t>& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

void put_f16(std::vector<uint8_t>& out, float v) {
  put<uint16_t>(out, f32_to_f16(v));
}

float f16_round(float v) {
  return f16_to_f32(f32_to_f16(v));
}

void q8_0(const float* x, std::vector<uint8_t>& out) {
  float amax = 0;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = f16_round(amax / 127.0f);
  put_f16(out, d);
  for (int i = 0; i < 32; ++i)
    put<int8_t>(out, int8_t(d == 0 ? 0 : std::clamp(std::lround(x[i] / d), -128L, 127L)));
}

void q4_0(const float* x, std::vector<uint8_t>& out) {
  float max = 0;  // the value of largest magnitude, with its sign
  for (int i = 0; i < 32; ++i)
    if (std::fabs(x[i]) > std::fabs(max)) max = x[i];
  const float d = f16_round(max / -8.0f);
  put_f16(out, d);
  auto q = [&](float v) { return d == 0 ? 8 : int(std::clamp(std::lround(v / d) + 8, 0L, 15L)); };
  for (int j = 0; j < 16; ++j) put<uint8_t>(out, uint8_t(q(x[j]) | (q(x[j + 16]) << 4)));
}

void q4_k(const float* x, std::vector<uint8_t>& out) {
  float scale[8], mins[8];
  for (int j = 0; j < 8; ++j) {
    float lo = 0, hi = 0;
    for (int i = 0; i < 32; ++i) {
      lo = std::min(lo, x[32 * j + i]);
      hi = std::max(hi, x[32 * j + i]);
    }
    scale[j] = (hi - lo) / 15.0f;
    mins[j] = -lo;
  }
  const float d = f16_round(*std::max_element(scale, scale + 8) / 63.0f);
  const float dmin = f16_round(*std::max_element(mins, mins + 8) / 63.0f);
  uint8_t sc[8], m[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = uint8_t(d == 0 ? 0 : std::clamp(std::lround(scale[j] / d), 0L, 63L));
    m[j] = uint8_t(dmin == 0 ? 0 : std::clamp(std::lround(mins[j] / dmin), 0L, 63L));
  }
  put_f16(out, d);
  put_f16(out, dmin);
  uint8_t s[12];
  for (int j = 0; j < 4; ++j) {
    s[j] = uint8_t((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = uint8_t((m[j] & 63) | ((m[j + 4] >> 4) << 6));
    s[j + 8] = uint8_t((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
  }
  out.insert(out.end(), s, s + 12);
  int q[256];
  for (int i = 0; i < 256; ++i) {
    const float a = d * float(sc[i / 32]), c = dmin * float(m[i / 32]);
    q[i] = a == 0 ? 0 : int(std::clamp(std::lround((x[i] + c) / a), 0L, 15L));
  }
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l)
      put<uint8_t>(out, uint8_t(q[64 * c + l] | (q[64 * c + 32 + l] << 4)));
}

void q6_k(const float* x, std::vector<uint8_t>& out) {
  float scale[16];
  for (int j = 0; j < 16; ++j) {
    float amax = 0;
    for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(x[16 * j + i]));
    scale[j] = amax / 31.0f;
  }
  const float d = f16_round(*std::max_element(scale, scale + 16) / 127.0f);
  int8_t sc[16];
  for (int j = 0; j < 16; ++j)
    sc[j] = int8_t(d == 0 ? 0 : std::clamp(std::lround(scale[j] / d), -128L, 127L));
  int q[256];  // 0..63
  for (int i = 0; i < 256; ++i) {
    const float a = d * float(sc[i / 16]);
    q[i] = (a == 0 ? 0 : int(std::clamp(std::lround(x[i] / a), -32L, 31L))) + 32;
  }
  uint8_t ql[128] = {}, qh[64] = {};
  for (int n = 0; n < 2; ++n)
    for (int l = 0; l < 32; ++l) {
      const int* v = q + 128 * n;
      ql[64 * n + l] = uint8_t((v[l] & 0xF) | ((v[l + 64] & 0xF) << 4));
      ql[64 * n + l + 32] = uint8_t((v[l + 32] & 0xF) | ((v[l + 96] & 0xF) << 4));
      qh[32 * n + l] = uint8_t((v[l] >> 4) | ((v[l + 32] >> 4) << 2) | ((v[l + 64] >> 4) << 4) |
                               ((v[l + 96] >> 4) << 6));
    }
  out.insert(out.end(), ql, ql + 128);
  out.insert(out.end(), qh, qh + 64);
  for (int j = 0; j < 16; ++j) put<int8_t>(out, sc[j]);
  put_f16(out, d);
}

std::string gguf_arch(const std::string& arch) {
  if (arch == "gemma3_text") return "gemma3";
  if (arch == "gemma4_text") return "gemma4";
  if (arch == "ministral3") return "mistral3";
  return arch;
}

// The metadata llama.cpp's converter (Gemma4Model over Gemma3Model) writes for
// Gemma 4: per-kind head dims and rotary dims, per-layer kv heads and MLP
// widths as arrays where they vary, KV sharing, the per-layer embedding width.
void gemma4_metadata(GgufWriter& g, const std::string& a, const ModelSpec& s) {
  int64_t full = -1, swa = -1;
  std::vector<bool> pattern;
  std::vector<int32_t> kv, ff;
  int64_t shared = 0;
  for (int64_t i = 0; i < s.layers; ++i) {
    const LayerSpec& l = s.layer[size_t(i)];
    const bool sliding = l.kind == AttentionKind::Sliding;
    pattern.push_back(sliding);
    (sliding ? swa : full) = l.head_dim;
    kv.push_back(int32_t(l.kv_heads));
    ff.push_back(int32_t(l.intermediate));
    if (l.kv_source != i) ++shared;
  }
  g.u32(a + ".attention.key_length", uint32_t(full));
  g.u32(a + ".attention.value_length", uint32_t(full));
  g.u32(a + ".attention.key_length_swa", uint32_t(swa));
  g.u32(a + ".attention.value_length_swa", uint32_t(swa));
  if (std::adjacent_find(ff.begin(), ff.end(), std::not_equal_to<>()) != ff.end())
    g.i32_array(a + ".feed_forward_length", ff);
  else
    g.u32(a + ".feed_forward_length", uint32_t(ff[0]));
  if (std::adjacent_find(kv.begin(), kv.end(), std::not_equal_to<>()) != kv.end())
    g.i32_array(a + ".attention.head_count_kv", kv);
  else
    g.u32(a + ".attention.head_count_kv", uint32_t(kv[0]));
  g.f32(a + ".rope.freq_base_swa", float(s.rope_sliding.theta));
  g.u32(a + ".rope.dimension_count", uint32_t(full));  // proportional: rope_freqs
  g.u32(a + ".rope.dimension_count_swa",
        uint32_t(double(swa) * s.rope_sliding.partial_rotary_factor));
  g.u32(a + ".attention.sliding_window", uint32_t(s.sliding_window));
  g.bool_array(a + ".attention.sliding_window_pattern", pattern);
  g.u32(a + ".attention.shared_kv_layers", uint32_t(shared));
  g.u32(a + ".embedding_length_per_layer_input", uint32_t(s.ple_dim));
}

// Gemma 4's full-layer `rope_freqs`: divisor 1 for the rotating frequencies,
// 1e30 for the unrotated ones (the converter's generate_extra_tensors).
std::vector<float> proportional_factors(const ModelSpec& s) {
  int64_t full = 0;
  for (const LayerSpec& l : s.layer)
    if (l.kind == AttentionKind::Full) full = l.head_dim;
  const int64_t rotating = int64_t(double(full) * s.rope_full.partial_rotary_factor / 2);
  std::vector<float> f(size_t(full / 2), 1e30f);
  std::fill_n(f.begin(), rotating, 1.0f);
  return f;
}

// llama.cpp's `permute` for the llama architecture: within each head, HF row
// half·Dh/2 + i goes to row 2·i + half.
std::vector<float> permute_rows(const std::vector<float>& v, int64_t rows, int64_t cols,
                                int64_t head_dim) {
  std::vector<float> out(v.size());
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < rows / head_dim; ++h)
    for (int64_t s = 0; s < 2; ++s)
      for (int64_t i = 0; i < half; ++i) {
        const int64_t from = h * head_dim + s * half + i, to = h * head_dim + 2 * i + s;
        std::copy_n(v.begin() + from * cols, cols, out.begin() + to * cols);
      }
  return out;
}

// Llama 3 rope factors as llama.cpp's converter computes them.
std::vector<float> llama3_factors(const RopeSpec& r, int64_t dim) {
  std::vector<float> f;
  const double low_wavelen = double(r.original_max_position) / r.low_freq_factor;
  const double high_wavelen = double(r.original_max_position) / r.high_freq_factor;
  for (int64_t i = 0; i < dim; i += 2) {
    const double freq = 1.0 / std::pow(r.theta, double(i) / double(dim));
    const double wavelen = 2 * M_PI / freq;
    if (wavelen < high_wavelen) {
      f.push_back(1.0f);
    } else if (wavelen > low_wavelen) {
      f.push_back(float(r.factor));
    } else {
      const double smooth = (double(r.original_max_position) / wavelen - r.low_freq_factor) /
                            (r.high_freq_factor - r.low_freq_factor);
      f.push_back(float(1.0 / ((1 - smooth) / r.factor + smooth)));
    }
  }
  return f;
}

}  // namespace

void GgufWriter::raw(const std::string& key, uint32_t type, const std::vector<uint8_t>& value) {
  if (key == skip_key) return;
  std::vector<uint8_t> b;
  put<uint32_t>(b, type);
  b.insert(b.end(), value.begin(), value.end());
  kv_.push_back({key, std::move(b)});
}

void GgufWriter::u32(const std::string& key, uint32_t v) {
  std::vector<uint8_t> b;
  put(b, v);
  raw(key, 4, b);
}
void GgufWriter::i32(const std::string& key, int32_t v) {
  std::vector<uint8_t> b;
  put(b, v);
  raw(key, 5, b);
}
void GgufWriter::f32(const std::string& key, float v) {
  std::vector<uint8_t> b;
  put(b, v);
  raw(key, 6, b);
}
void GgufWriter::boolean(const std::string& key, bool v) {
  raw(key, 7, {uint8_t(v ? 1 : 0)});
}
void GgufWriter::str(const std::string& key, const std::string& v) {
  std::vector<uint8_t> b;
  put_string(b, v);
  raw(key, 8, b);
}
void GgufWriter::str_array(const std::string& key, const std::vector<std::string>& v) {
  std::vector<uint8_t> b;
  put<uint32_t>(b, 8);
  put<uint64_t>(b, v.size());
  for (const auto& s : v) put_string(b, s);
  raw(key, 9, b);
}
void GgufWriter::i32_array(const std::string& key, const std::vector<int32_t>& v) {
  std::vector<uint8_t> b;
  put<uint32_t>(b, 5);
  put<uint64_t>(b, v.size());
  for (int32_t x : v) put(b, x);
  raw(key, 9, b);
}
void GgufWriter::bool_array(const std::string& key, const std::vector<bool>& v) {
  std::vector<uint8_t> b;
  put<uint32_t>(b, 7);
  put<uint64_t>(b, v.size());
  for (bool x : v) put<uint8_t>(b, x ? 1 : 0);
  raw(key, 9, b);
}
void GgufWriter::f32_array(const std::string& key, const std::vector<float>& v) {
  std::vector<uint8_t> b;
  put<uint32_t>(b, 6);
  put<uint64_t>(b, v.size());
  for (float x : v) put(b, x);
  raw(key, 9, b);
}

void GgufWriter::tensor(const std::string& name, GgmlType type, std::vector<int64_t> dims,
                        std::vector<uint8_t> data) {
  tensor_code(name, uint32_t(type), std::move(dims), std::move(data));
}

void GgufWriter::tensor_code(const std::string& name, uint32_t type, std::vector<int64_t> dims,
                             std::vector<uint8_t> data) {
  tensors_.push_back({name, type, std::move(dims), std::move(data)});
}

std::vector<uint8_t> GgufWriter::bytes() const {
  std::vector<uint8_t> out;
  for (char c : std::string("GGUF")) out.push_back(uint8_t(c));
  put<uint32_t>(out, version);
  put<uint64_t>(out, tensors_.size());
  put<uint64_t>(out, kv_.size());
  for (const auto& [key, value] : kv_) {
    put_string(out, key);
    out.insert(out.end(), value.begin(), value.end());
  }
  auto align = [&](uint64_t x) { return (x + alignment - 1) / alignment * alignment; };
  uint64_t offset = 0;
  std::vector<uint64_t> offsets;
  for (const Tensor& t : tensors_) {
    put_string(out, t.name);
    put<uint32_t>(out, uint32_t(t.dims.size()));
    for (int64_t d : t.dims) put<uint64_t>(out, uint64_t(d));
    put<uint32_t>(out, t.type);
    put<uint64_t>(out, offset);
    offsets.push_back(offset);
    offset = align(offset + t.data.size());
  }
  out.resize(align(out.size()), 0);
  const size_t data_start = out.size();
  for (size_t i = 0; i < tensors_.size(); ++i) {
    out.resize(data_start + offsets[i], 0);
    out.insert(out.end(), tensors_[i].data.begin(), tensors_[i].data.end());
  }
  return out;
}

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + path);
}

void GgufWriter::write(const std::string& path) const {
  write_file(path, bytes());
}

std::vector<uint8_t> encode_rows(GgmlType t, const float* x, int64_t rows, int64_t cols) {
  std::vector<uint8_t> out;
  const int64_t n = rows * cols;
  switch (t) {
    case GgmlType::F32:
      out.resize(size_t(n) * 4);
      std::memcpy(out.data(), x, out.size());
      break;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) put<uint16_t>(out, f32_to_f16(x[i]));
      break;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) put<uint16_t>(out, f32_to_bf16(x[i]));
      break;
    case GgmlType::Q8_0:
      for (int64_t i = 0; i < n; i += 32) q8_0(x + i, out);
      break;
    case GgmlType::Q4_0:
      for (int64_t i = 0; i < n; i += 32) q4_0(x + i, out);
      break;
    case GgmlType::Q4_K:
      for (int64_t i = 0; i < n; i += 256) q4_k(x + i, out);
      break;
    case GgmlType::Q6_K:
      for (int64_t i = 0; i < n; i += 256) q6_k(x + i, out);
      break;
  }
  return out;
}

std::vector<float> matrix_values(const WeightMatrix& w) {
  std::vector<float> v(size_t(w.rows * w.cols));
  for (int64_t r = 0; r < w.rows; ++r) dequantize_row(w, r, v.data() + r * w.cols);
  return v;
}

std::vector<float> permute_head_rows(const std::vector<float>& v, int64_t rows, int64_t cols,
                                     int64_t head_dim) {
  return permute_rows(v, rows, cols, head_dim);
}

void write_model_gguf(const Model& m, const std::string& path, GgmlType type, GgmlType head_type,
                      const std::string& skip, const std::vector<std::string>& tokens) {
  const ModelSpec& s = m.spec;
  const Weights& w = m.weights;
  const std::string a = gguf_arch(s.arch);
  const bool gemma4 = s.arch == "gemma4_text";
  GgufWriter g;
  g.skip_key = skip;
  g.str("general.architecture", a);
  g.u32("general.alignment", 32);
  g.u32(a + ".block_count", uint32_t(s.layers));
  g.u32(a + ".context_length", uint32_t(s.max_position));
  g.u32(a + ".embedding_length", uint32_t(s.hidden));
  g.u32(a + ".attention.head_count", uint32_t(s.heads));
  g.f32(a + ".attention.layer_norm_rms_epsilon", s.norm_eps);
  g.f32(a + ".rope.freq_base", float(s.rope_full.theta));
  if (gemma4) {
    gemma4_metadata(g, a, s);
  } else {
    g.u32(a + ".feed_forward_length", uint32_t(s.intermediate));
    g.u32(a + ".attention.head_count_kv", uint32_t(s.kv_heads));
    g.u32(a + ".attention.key_length", uint32_t(s.head_dim));
    g.u32(a + ".attention.value_length", uint32_t(s.head_dim));
    g.u32(a + ".rope.dimension_count", uint32_t(s.head_dim));
  }
  if (s.rope_full.type == RopeType::Linear) {
    g.str(a + ".rope.scaling.type", "linear");
    g.f32(a + ".rope.scaling.factor", float(s.rope_full.factor));
  }
  if (s.rope_full.type == RopeType::Yarn) {
    g.str(a + ".rope.scaling.type", "yarn");
    g.f32(a + ".rope.scaling.factor", float(s.rope_full.factor));
    g.u32(a + ".rope.scaling.original_context_length", uint32_t(s.rope_full.original_max_position));
    g.f32(a + ".rope.scaling.yarn_beta_fast", float(s.rope_full.beta_fast));
    g.f32(a + ".rope.scaling.yarn_beta_slow", float(s.rope_full.beta_slow));
    // mscale_all_dim; the spec keeps only the attention factor it gives (1
    // for the Ministral 3 fixture, mscale = mscale_all_dim = 1).
    g.f32(a + ".rope.scaling.yarn_log_multiplier", 1.0f);
  }
  if (s.query_temperature_beta != 0)
    g.f32(a + ".attention.temperature_scale", s.query_temperature_beta);
  if (s.arch == "gemma3_text") {
    g.u32(a + ".attention.sliding_window", uint32_t(s.sliding_window));
    g.f32(a + ".rope.freq_base_swa", float(s.rope_sliding.theta));
    std::vector<bool> pattern;
    for (const LayerSpec& l : s.layer) pattern.push_back(l.kind == AttentionKind::Sliding);
    g.bool_array(a + ".attention.sliding_window_pattern", pattern);
    g.f32(a + ".attention.scale", s.attn_scale);
  }
  if (s.final_softcap != 0) g.f32(a + ".final_logit_softcapping", s.final_softcap);
  if (s.bos_id >= 0) g.u32("tokenizer.ggml.bos_token_id", uint32_t(s.bos_id));
  if (!s.eos_ids.empty()) g.u32("tokenizer.ggml.eos_token_id", uint32_t(s.eos_ids[0]));
  if (!tokens.empty()) g.str_array("tokenizer.ggml.tokens", tokens);

  auto vec = [&](const std::string& name, const std::vector<float>& v) {
    if (name == skip) return;
    g.tensor(name, GgmlType::F32, {int64_t(v.size())},
             encode_rows(GgmlType::F32, v.data(), 1, int64_t(v.size())));
  };
  auto mat = [&](const std::string& name, const WeightMatrix& x, GgmlType t, int64_t permute) {
    if (name == skip || x.rows == 0) return;  // rows 0: none (KV-shared layers' k/v)
    std::vector<float> v = matrix_values(x);
    if (permute) v = permute_rows(v, x.rows, x.cols, permute);
    if (x.cols % ggml_block_values(t) != 0) t = GgmlType::F32;
    g.tensor(name, t, {x.cols, x.rows}, encode_rows(t, v.data(), x.rows, x.cols));
  };
  mat("token_embd.weight", w.embed, type, 0);
  if (s.rope_full.type == RopeType::Llama3)
    vec("rope_freqs.weight", llama3_factors(s.rope_full, s.head_dim));
  if (s.rope_full.type == RopeType::Proportional) vec("rope_freqs.weight", proportional_factors(s));
  if (s.ple_dim > 0) {
    mat("per_layer_token_embd.weight", w.ple_embed, type, 0);
    mat("per_layer_model_proj.weight", w.ple_model_proj, type, 0);
    vec("per_layer_proj_norm.weight", w.ple_proj_norm);
  }
  const int64_t permute = s.arch == "llama" || s.arch == "ministral3" ? s.head_dim : 0;
  for (int64_t i = 0; i < s.layers; ++i) {
    const LayerWeights& l = w.layers[size_t(i)];
    const std::string p = "blk." + std::to_string(i) + ".";
    vec(p + "attn_norm.weight", l.attn_in_norm);
    mat(p + "attn_q.weight", l.q, type, permute);
    mat(p + "attn_k.weight", l.k, type, permute);
    mat(p + "attn_v.weight", l.v, type, 0);
    mat(p + "attn_output.weight", l.o, type, 0);
    if (!l.q_bias.empty()) {
      vec(p + "attn_q.bias", permute ? permute_rows(l.q_bias, l.q.rows, 1, permute) : l.q_bias);
      vec(p + "attn_k.bias", permute ? permute_rows(l.k_bias, l.k.rows, 1, permute) : l.k_bias);
      vec(p + "attn_v.bias", l.v_bias);
    }
    if (!l.o_bias.empty()) vec(p + "attn_output.bias", l.o_bias);
    if (!l.q_norm.empty()) vec(p + "attn_q_norm.weight", l.q_norm);
    if (!l.k_norm.empty()) vec(p + "attn_k_norm.weight", l.k_norm);
    vec(p + "ffn_norm.weight", l.mlp_in_norm);
    if (!l.attn_out_norm.empty()) vec(p + "post_attention_norm.weight", l.attn_out_norm);
    if (!l.mlp_out_norm.empty()) vec(p + "post_ffw_norm.weight", l.mlp_out_norm);
    mat(p + "ffn_gate.weight", l.gate, type, 0);
    mat(p + "ffn_up.weight", l.up, type, 0);
    mat(p + "ffn_down.weight", l.down, type, 0);
    if (s.ple_dim > 0) {
      mat(p + "inp_gate.weight", l.ple_gate, type, 0);
      mat(p + "proj.weight", l.ple_proj, type, 0);
      vec(p + "post_norm.weight", l.ple_out_norm);
    }
    if (s.layer_scalars) vec(p + "layer_output_scale.weight", {l.scalar});
  }
  vec("output_norm.weight", w.final_norm);
  if (!s.tied_embeddings) mat("output.weight", w.head, head_type, 0);
  g.write(path);
}

}  // namespace tandem::test
