// GGUF metadata and tensor names → ModelSpec and Weights.
#include "model/gguf_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "model/gguf_blocks.h"
#include "model/quantized.h"

namespace tandem {

using json = nlohmann::json;

namespace {

const char* const kArchs[] = {"llama", "qwen2", "qwen3", "gemma3", "gemma4", "mistral3"};

// config.json's model_type of a GGUF architecture.
std::string model_type_of(const std::string& arch) {
  if (arch == "gemma3") return "gemma3_text";
  if (arch == "gemma4") return "gemma4_text";
  if (arch == "mistral3") return "ministral3";
  return arch;
}

// `key` as one integer per layer: llama.cpp writes per-layer values either as
// one integer or as an array of one per layer. Absent: `fallback` for every
// layer, or an Error naming the key when fallback < 0.
std::vector<int64_t> per_layer_ints(const GgufFile& f, const std::string& key, int64_t layers,
                                    int64_t fallback) {
  const GgufValue* v = f.find(key);
  if (!v && fallback < 0) fail("%s: missing metadata \"%s\"", f.path().c_str(), key.c_str());
  if (!v || !v->is_array())
    return std::vector<int64_t>(size_t(layers), v ? f.get_int(key, 0) : fallback);
  const auto& a = v->as_array();
  if (int64_t(a.size()) != layers)
    fail("%s: metadata \"%s\" has %zu entries for %lld layers", f.path().c_str(), key.c_str(),
         a.size(), (long long)layers);
  std::vector<int64_t> out;
  for (const GgufValue& x : a) out.push_back(x.as_int());
  return out;
}

std::string dims_str(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

// The layer kinds of a Gemma 3 GGUF: `<arch>.attention.sliding_window_pattern`
// as a per-layer bool array (true = sliding) or an integer N (every N-th layer
// full), else llama.cpp's Gemma 3 default of 6.
json gemma_layer_types(const GgufFile& f, const std::string& p, int64_t layers) {
  json types = json::array();
  const GgufValue* v = f.find(p + "attention.sliding_window_pattern");
  if (v && v->is_array()) {
    const auto& a = v->as_array();
    if (int64_t(a.size()) != layers)
      fail("%s: %sattention.sliding_window_pattern has %zu entries for %lld layers",
           f.path().c_str(), p.c_str(), a.size(), (long long)layers);
    for (const GgufValue& x : a)
      types.push_back(x.as_int() ? "sliding_attention" : "full_attention");
    return types;
  }
  const int64_t pattern = v ? f.get_int(p + "attention.sliding_window_pattern", 6) : 6;
  if (pattern <= 0)
    fail("%s: %sattention.sliding_window_pattern must be positive", f.path().c_str(), p.c_str());
  for (int64_t i = 0; i < layers; ++i)
    types.push_back((i + 1) % pattern == 0 ? "full_attention" : "sliding_attention");
  return types;
}

// Gemma 4 (llama.cpp's `gemma4`): sliding layers have head dim
// attention.key_length_swa, full ones attention.key_length; kv heads and MLP
// widths may be per-layer arrays (the MLP doubled on KV-shared layers:
// use_double_wide_mlp); full layers' proportional RoPE is a `rope_freqs`
// tensor of 1 (rotating) and 1e30 (unrotated) divisors.
void gemma4_config(const GgufFile& f, const std::string& p, int64_t layers, json& c) {
  const char* path = f.path().c_str();
  if (!f.find(p + "attention.sliding_window_pattern"))
    fail("%s: missing metadata \"%sattention.sliding_window_pattern\"", path, p.c_str());
  const json types = gemma_layer_types(f, p, layers);
  c["layer_types"] = types;
  const int64_t swa_dim = f.require_int(p + "attention.key_length_swa");
  if (f.get_int(p + "attention.value_length_swa", swa_dim) != swa_dim)
    fail("%s: %sattention.key_length_swa and value_length_swa differ (not supported)", path,
         p.c_str());
  const int64_t full_dim = f.require_int(p + "attention.key_length");
  c["head_dim"] = swa_dim;
  const int64_t shared = f.get_int(p + "attention.shared_kv_layers", 0);
  c["num_kv_shared_layers"] = shared;
  const std::vector<int64_t> kv = per_layer_ints(f, p + "attention.head_count_kv", layers,
                                                 c["num_attention_heads"].get<int64_t>());
  const std::vector<int64_t> ff = per_layer_ints(f, p + "feed_forward_length", layers, -1);
  int64_t first_sliding = 0, first_full = -1;
  for (int64_t i = layers - 1; i >= 0; --i)
    (types[size_t(i)] == "sliding_attention" ? first_sliding : first_full) = i;
  c["num_key_value_heads"] = kv[size_t(first_sliding)];
  c["intermediate_size"] = ff[0];
  bool double_wide = false;
  for (int64_t i = 0; i < layers; ++i) {
    const bool doubled = i >= layers - shared && ff[size_t(i)] == 2 * ff[0];
    if (ff[size_t(i)] != ff[0] && !doubled)
      fail(
          "%s: %sfeed_forward_length[%lld] = %lld: per-layer widths other than Gemma 4's "
          "double-wide MLP on KV-shared layers are not supported",
          path, p.c_str(), (long long)i, (long long)ff[size_t(i)]);
    double_wide |= doubled;
  }
  if (double_wide)
    for (int64_t i = layers - shared; i < layers; ++i)
      if (ff[size_t(i)] != 2 * ff[0])
        fail("%s: %sfeed_forward_length: KV-shared layer %lld is not double-wide", path, p.c_str(),
             (long long)i);
  c["use_double_wide_mlp"] = double_wide;
  json plc = json::object();
  for (int64_t i = 0; i < layers; ++i) {
    json o = json::object();
    if (types[size_t(i)] == "full_attention") o["head_dim"] = full_dim;
    if (kv[size_t(i)] != kv[size_t(first_sliding)]) o["num_key_value_heads"] = kv[size_t(i)];
    if (!o.empty()) plc[std::to_string(i)] = o;
  }
  c["per_layer_config"] = plc;
  // attention_k_eq_v: full layers whose values are the keys have no attn_v.
  const std::string full = "blk." + std::to_string(first_full) + ".";
  c["attention_k_eq_v"] = first_full >= 0 && first_full < layers - shared &&
                          f.tensor(full + "attn_v.weight") == nullptr;
  const int64_t ple = f.require_int(p + "embedding_length_per_layer_input");
  c["hidden_size_per_layer_input"] = ple;
  if (const GgufTensor* t = f.tensor("per_layer_token_embd.weight"); ple > 0 && t)
    c["vocab_size_per_layer_input"] = t->dims.size() == 2 ? t->dims[1] : 0;
  c["sliding_window"] = f.require_int(p + "attention.sliding_window");

  json rope_full = {{"rope_type", "default"},
                    {"rope_theta", f.get_number(p + "rope.freq_base", 1000000.0)}};
  const int64_t rot_full = f.get_int(p + "rope.dimension_count", full_dim);
  if (const GgufTensor* t = f.tensor("rope_freqs.weight")) {
    if (t->dims != std::vector<int64_t>{full_dim / 2})
      fail("%s: tensor \"rope_freqs.weight\": expected dims [%lld], found %s", path,
           (long long)(full_dim / 2), dims_str(t->dims).c_str());
    std::vector<float> d(size_t(full_dim / 2));
    gguf_dequantize(t->type, f.data(*t), full_dim / 2, d.data());
    int64_t rotating = 0;
    while (rotating < int64_t(d.size()) && d[size_t(rotating)] == 1.0f) ++rotating;
    for (size_t k = size_t(rotating); k < d.size(); ++k)
      if (!(d[k] >= 1e20f))
        fail(
            "%s: tensor \"rope_freqs.weight\": Gemma 4 divisors must be 1 then unrotated (1e30), "
            "found %g at %zu",
            path, double(d[k]), k);
    double factor = double(rotating) / double(full_dim / 2);
    while (int64_t(factor * double(full_dim) / 2.0) < rotating)
      factor = std::nextafter(factor, 1.0);
    rope_full["rope_type"] = "proportional";
    rope_full["partial_rotary_factor"] = factor;
  } else {
    rope_full["partial_rotary_factor"] = double(rot_full) / double(full_dim);
  }
  const int64_t rot_swa = f.get_int(p + "rope.dimension_count_swa", swa_dim);
  json rope_swa = {{"rope_type", "default"},
                   {"rope_theta", f.get_number(p + "rope.freq_base_swa", 10000.0)},
                   {"partial_rotary_factor", double(rot_swa) / double(swa_dim)}};
  c["rope_parameters"] = {{"full_attention", rope_full}, {"sliding_attention", rope_swa}};
}

// Ministral 3 (llama.cpp's `mistral3`): YaRN from rope.scaling.*, the Llama 4
// query temperature beta from attention.temperature_scale over
// rope.scaling.original_context_length. llama.cpp's mistral3 graph cancels
// ggml's YaRN magnitude scaling, so cos/sin are unscaled (attention_factor 1,
// what transformers computes when mscale == mscale_all_dim, as Ministral 3 ships).
void mistral3_config(const GgufFile& f, const std::string& p, json& c) {
  const bool yarn = f.get_string(p + "rope.scaling.type", "none") == "yarn";
  const bool temperature = f.find(p + "attention.temperature_scale") != nullptr;
  if (!yarn) {
    if (temperature)
      fail(
          "%s: %sattention.temperature_scale needs YaRN rope scaling "
          "(%srope.scaling.original_context_length)",
          f.path().c_str(), p.c_str(), p.c_str());
    return;
  }
  json rp = {{"rope_type", "yarn"},
             {"rope_theta", c["rope_theta"]},
             {"factor", f.get_number(p + "rope.scaling.factor", 1.0)},
             {"original_max_position_embeddings",
              f.require_int(p + "rope.scaling.original_context_length")},
             {"beta_fast", f.get_number(p + "rope.scaling.yarn_beta_fast", 32.0)},
             {"beta_slow", f.get_number(p + "rope.scaling.yarn_beta_slow", 1.0)},
             {"attention_factor", 1.0}};
  if (temperature) rp["llama_4_scaling_beta"] = f.get_number(p + "attention.temperature_scale", 0);
  c.erase("rope_scaling");
  c["rope_parameters"] = rp;
}

// HF row r of a head-permuted projection reads GGUF row src_row(r): llama.cpp
// stores each head's rows [2, Dh/2] swapped to [Dh/2, 2] (interleaved RoPE).
int64_t src_row(int64_t r, int64_t head_dim) {
  const int64_t h = r / head_dim, i = r % head_dim, half = head_dim / 2;
  return h * head_dim + (i % half) * 2 + i / half;
}

class GgufWeights {
 public:
  GgufWeights(const GgufFile& f, const LoadOptions& o, Model& m) : f_(f), o_(o), m_(m) {}

  bool has(const std::string& name) const { return f_.tensor(name) != nullptr; }

  // The tensor with ggml dims `dims` (innermost first).
  const GgufTensor& require(const std::string& name, const std::vector<int64_t>& dims) const {
    const GgufTensor* t = f_.tensor(name);
    if (!t) fail("%s: missing tensor \"%s\"", f_.path().c_str(), name.c_str());
    if (t->dims != dims)
      fail("%s: tensor \"%s\": expected dims %s, found %s", f_.path().c_str(), name.c_str(),
           dims_str(dims).c_str(), dims_str(t->dims).c_str());
    return *t;
  }

  // A layer's projection: matrix(), packed for the CPU where the options
  // ask (LoadOptions::pack_for_cpu) and it has a packed layout (pack_for_cpu).
  WeightMatrix linear(const std::string& name, int64_t rows, int64_t cols, int64_t head_dim = 0) {
    const WeightMatrix w = matrix(name, rows, cols, head_dim);
    return o_.pack_for_cpu ? pack_for_cpu(w, m_.owned, m_.owned_bytes) : w;
  }

  // A [rows, cols] matrix. head_dim > 0 undoes llama.cpp's per-head Q/K
  // permutation (rows are whole, so any type permutes by rows).
  WeightMatrix matrix(const std::string& name, int64_t rows, int64_t cols, int64_t head_dim = 0) {
    const GgufTensor& t = require(name, {cols, rows});
    const size_t row_bytes =
        size_t(cols / ggml_block_values(t.type)) * size_t(ggml_block_bytes(t.type));
    const uint8_t* src = f_.data(t);
    const bool dense =
        t.type == GgmlType::F32 || t.type == GgmlType::F16 || t.type == GgmlType::BF16;
    std::vector<uint8_t> scratch;
    if (head_dim > 0) {
      if (rows % head_dim != 0)
        fail("%s: tensor \"%s\": %lld rows are not whole heads of %lld", f_.path().c_str(),
             name.c_str(), (long long)rows, (long long)head_dim);
      uint8_t* dst = dense ? allocate(size_t(rows) * row_bytes)
                           : (scratch.resize(size_t(rows) * row_bytes), scratch.data());
      for (int64_t r = 0; r < rows; ++r)
        std::memcpy(dst + size_t(r) * row_bytes, src + size_t(src_row(r, head_dim)) * row_bytes,
                    row_bytes);
      src = dst;
    }
    WeightMatrix w;
    w.rows = rows;
    w.cols = cols;
    switch (t.type) {
      case GgmlType::F32: w.dtype = DType::F32; break;
      case GgmlType::F16: w.dtype = DType::F16; break;
      case GgmlType::BF16: w.dtype = DType::BF16; break;
      case GgmlType::Q8_0:
      case GgmlType::Q4_0:
      case GgmlType::Q4_K: return gguf_to_affine(t.type, src, rows, cols, m_.owned, m_.owned_bytes);
      case GgmlType::Q6_K: return gguf_q6k_to_affine(src, rows, cols, m_.owned, m_.owned_bytes);
    }
    w.data = src;
    if (o_.quantize_bits != 0 && cols % o_.quantize_group_size == 0)
      return quantize_matrix(w, o_.quantize_bits, o_.quantize_group_size, w.dtype, m_.owned,
                             &m_.owned_bytes);
    return w;
  }

  // A vector of `dim` values in f32 (norm weights are taken as stored: Gemma
  // GGUFs hold 1 + w already). head_dim > 0: a permuted Q/K bias.
  Vec vec(const std::string& name, int64_t dim, int64_t head_dim = 0) const {
    const GgufTensor& t = require(name, {dim});
    Vec v(static_cast<size_t>(dim));
    gguf_dequantize(t.type, f_.data(t), dim, v.data());
    if (head_dim <= 0) return v;
    Vec out(v.size());
    for (int64_t r = 0; r < dim; ++r) out[size_t(r)] = v[size_t(src_row(r, head_dim))];
    return out;
  }

 private:
  uint8_t* allocate(size_t bytes) {
    m_.owned.push_back(allocate_owned(bytes));
    m_.owned_bytes += bytes;
    return m_.owned.back().get();
  }

  const GgufFile& f_;
  const LoadOptions& o_;
  Model& m_;
};

LayerWeights read_layer(GgufWeights& r, const ModelSpec& s, int64_t i) {
  const std::string p = "blk." + std::to_string(i) + ".";
  const LayerSpec& ls = s.layer[size_t(i)];
  const int64_t D = s.hidden, Q = ls.q_dim(s.heads), KV = ls.kv_dim(), F = ls.intermediate,
                Dh = ls.head_dim;
  const int64_t permute = s.arch == "llama" || s.arch == "ministral3" ? Dh : 0;
  const bool own_kv = ls.kv_source == i;  // KV-shared layers have no k/v projections
  const bool own_v = own_kv && !ls.k_eq_v;
  LayerWeights l;
  l.attn_in_norm = r.vec(p + "attn_norm.weight", D);
  l.q = r.linear(p + "attn_q.weight", Q, D, permute);
  if (own_kv) l.k = r.linear(p + "attn_k.weight", KV, D, permute);
  if (own_v) l.v = r.linear(p + "attn_v.weight", KV, D);
  l.o = r.linear(p + "attn_output.weight", D, Q);
  if (s.qkv_bias) {
    l.q_bias = r.vec(p + "attn_q.bias", Q, permute);
    if (own_kv) l.k_bias = r.vec(p + "attn_k.bias", KV, permute);
    if (own_v) l.v_bias = r.vec(p + "attn_v.bias", KV);
  }
  if (s.o_bias) l.o_bias = r.vec(p + "attn_output.bias", D);
  if (s.qk_norm) {
    l.q_norm = r.vec(p + "attn_q_norm.weight", Dh);
    if (own_kv) l.k_norm = r.vec(p + "attn_k_norm.weight", Dh);
  }
  if (s.sandwich_norms) {
    l.attn_out_norm = r.vec(p + "post_attention_norm.weight", D);
    l.mlp_in_norm = r.vec(p + "ffn_norm.weight", D);
    l.mlp_out_norm = r.vec(p + "post_ffw_norm.weight", D);
  } else {
    l.mlp_in_norm = r.vec(p + "ffn_norm.weight", D);
  }
  l.gate = r.linear(p + "ffn_gate.weight", F, D);
  l.up = r.linear(p + "ffn_up.weight", F, D);
  l.down = r.linear(p + "ffn_down.weight", D, F);
  if (s.mlp_bias) {
    l.gate_bias = r.vec(p + "ffn_gate.bias", F);
    l.up_bias = r.vec(p + "ffn_up.bias", F);
    l.down_bias = r.vec(p + "ffn_down.bias", D);
  }
  if (s.ple_dim > 0) {  // Gemma 4 per-layer embeddings
    l.ple_gate = r.linear(p + "inp_gate.weight", s.ple_dim, D);
    l.ple_proj = r.linear(p + "proj.weight", D, s.ple_dim);
    l.ple_out_norm = r.vec(p + "post_norm.weight", D);
  }
  // llama.cpp treats the layer scalar as optional (1 when absent).
  if (s.layer_scalars && r.has(p + "layer_output_scale.weight"))
    l.scalar = r.vec(p + "layer_output_scale.weight", 1)[0];
  return l;
}

}  // namespace

json gguf_spec_config(const GgufFile& f) {
  const std::string arch = f.get_string("general.architecture", "");
  if (arch.empty()) fail("%s: missing metadata \"general.architecture\"", f.path().c_str());
  bool known = false;
  for (const char* a : kArchs) known |= arch == a;
  if (!known)
    fail(
        "%s: GGUF architecture \"%s\" is not supported (supported: llama, qwen2, qwen3, gemma3, "
        "gemma4, mistral3)",
        f.path().c_str(), arch.c_str());
  const bool gemma = arch == "gemma3" || arch == "gemma4";
  const std::string p = arch + ".";
  const GgufTensor* embd = f.tensor("token_embd.weight");
  if (!embd || embd->dims.size() != 2)
    fail("%s: missing 2-D tensor \"token_embd.weight\"", f.path().c_str());

  json c;
  c["model_type"] = model_type_of(arch);
  c["vocab_size"] = embd->dims[1];
  c["hidden_size"] = f.require_int(p + "embedding_length");
  const int64_t layers = f.require_int(p + "block_count");
  c["num_hidden_layers"] = layers;
  const int64_t heads = f.require_int(p + "attention.head_count");
  c["num_attention_heads"] = heads;
  if (arch != "gemma4") {  // gemma4: per-layer values, read below
    c["num_key_value_heads"] = f.get_int(p + "attention.head_count_kv", heads);
    c["intermediate_size"] = f.require_int(p + "feed_forward_length");
  }
  if (f.find(p + "attention.key_length")) {
    c["head_dim"] = f.get_int(p + "attention.key_length", 0);
    if (f.get_int(p + "attention.value_length", c["head_dim"].get<int64_t>()) != c["head_dim"])
      fail("%s: attention.key_length and value_length differ (not supported)", f.path().c_str());
  }
  c["max_position_embeddings"] = f.get_int(p + "context_length", 4096);
  c["rms_norm_eps"] = f.get_number(p + "attention.layer_norm_rms_epsilon", 1e-6);
  c["rope_theta"] = f.get_number(p + "rope.freq_base", gemma ? 1000000.0 : 10000.0);
  const std::string scaling = f.get_string(p + "rope.scaling.type", "none");
  if (scaling == "linear" || scaling == "yarn") {
    json rs = {{"rope_type", scaling}, {"factor", f.get_number(p + "rope.scaling.factor", 1.0)}};
    if (scaling == "yarn")
      rs["original_max_position_embeddings"] =
          f.get_int(p + "rope.scaling.original_context_length", 0);
    c["rope_scaling"] = rs;
  } else if (scaling != "none" && !scaling.empty()) {
    fail("%s: rope scaling type \"%s\" is not supported (none, linear, yarn)", f.path().c_str(),
         scaling.c_str());
  }
  c["tie_word_embeddings"] = f.tensor("output.weight") == nullptr;
  if (arch == "llama") {
    c["attention_bias"] = f.tensor("blk.0.attn_q.bias") != nullptr;
    c["mlp_bias"] = f.tensor("blk.0.ffn_gate.bias") != nullptr;
  }
  if (arch == "gemma4") gemma4_config(f, p, layers, c);
  if (arch == "mistral3") mistral3_config(f, p, c);
  if (arch == "gemma3") {
    c["sliding_window"] = f.get_int(p + "attention.sliding_window", 4096);
    c["rope_local_base_freq"] = f.get_number(p + "rope.freq_base_swa", 10000.0);
    c["layer_types"] = gemma_layer_types(f, p, layers);
  }
  if (f.find(p + "final_logit_softcapping"))
    c["final_logit_softcapping"] = f.get_number(p + "final_logit_softcapping", 0.0);
  json eos = json::array();
  for (const char* k : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                        "tokenizer.ggml.eom_token_id"}) {
    const int64_t id = f.get_int(k, -1);
    if (id >= 0 && std::find(eos.begin(), eos.end(), json(id)) == eos.end()) eos.push_back(id);
  }
  c["eos_token_id"] = eos;
  if (f.find("tokenizer.ggml.bos_token_id"))
    c["bos_token_id"] = f.get_int("tokenizer.ggml.bos_token_id", 0);
  if (f.find("tokenizer.ggml.padding_token_id"))
    c["pad_token_id"] = f.get_int("tokenizer.ggml.padding_token_id", 0);
  return c;
}

std::string gguf_model_type(const GgufFile& f) {
  return model_type_of(f.get_string("general.architecture", ""));
}

ModelSpec gguf_model_spec(const GgufFile& f) {
  const json c = gguf_spec_config(f);
  ModelSpec s = parse_model_spec(c.dump(), f.path() + " (GGUF metadata)");
  const std::string p = f.get_string("general.architecture", "") + ".";
  // Gemma 3's query_pre_attn_scalar is not in GGUF: llama.cpp uses
  // hidden / heads for the 27B model (62 layers) and head_dim otherwise;
  // `<arch>.attention.scale` (a score multiplier) overrides both.
  if (s.arch == "gemma3_text") {
    const double scalar = s.layers == 62 ? double(s.hidden / s.heads) : double(s.head_dim);
    s.attn_scale = float(1.0 / std::sqrt(scalar));
  }
  // Gemma 4: llama.cpp fixes the score scale at 1 and reads head dims and
  // RoPE per layer kind (gemma4_config).
  if (s.arch == "gemma4_text") return s;
  if (f.find(p + "attention.scale")) s.attn_scale = float(f.get_number(p + "attention.scale", 0));
  const int64_t rope_dims = f.get_int(p + "rope.dimension_count", s.head_dim);
  if (rope_dims <= 0 || rope_dims > s.head_dim || rope_dims % 2 != 0)
    fail("%s: %srope.dimension_count %lld does not fit head_dim %lld", f.path().c_str(), p.c_str(),
         (long long)rope_dims, (long long)s.head_dim);
  if (rope_dims != s.head_dim)
    s.rope_full.partial_rotary_factor = s.rope_sliding.partial_rotary_factor =
        double(rope_dims) / double(s.head_dim);
  if (const GgufTensor* t = f.tensor("rope_freqs.weight")) {
    if (t->dims != std::vector<int64_t>{rope_dims / 2})
      fail("%s: tensor \"rope_freqs.weight\": expected dims [%lld], found %s", f.path().c_str(),
           (long long)(rope_dims / 2), dims_str(t->dims).c_str());
    std::vector<float> factors(size_t(rope_dims / 2));
    gguf_dequantize(t->type, f.data(*t), rope_dims / 2, factors.data());
    s.rope_full.freq_factors = factors;
    if (s.arch == "llama") s.rope_sliding.freq_factors = factors;
  }
  return s;
}

std::unique_ptr<Model> load_gguf_model(const std::string& path, const LoadOptions& options) {
  std::shared_ptr<GgufFile> f = GgufFile::open(path);
  if (options.quantize_bits != 0 && options.quantize_bits != 4 && options.quantize_bits != 8)
    fail("quantize: bits must be 4 or 8, got %d", options.quantize_bits);
  auto model = std::make_unique<Model>(Model{gguf_model_spec(*f), Checkpoint{}, {}, {}, 0, f, ""});
  const ModelSpec& s = model->spec;
  GgufWeights r(*f, options, *model);
  Weights& w = model->weights;
  w.embed = r.matrix("token_embd.weight", s.vocab, s.hidden);
  if (s.scale_embeddings)  // as the safetensors loader: sqrt(D) in the embedding's dtype
    w.embed_scale = round_to_dtype(std::sqrt(float(s.hidden)), w.embed.dtype);
  w.layers.reserve(size_t(s.layers));
  for (int64_t i = 0; i < s.layers; ++i) w.layers.push_back(read_layer(r, s, i));
  w.final_norm = r.vec("output_norm.weight", s.hidden);
  if (s.ple_dim > 0) {  // as the safetensors loader: sqrt(P) in the table's dtype
    w.ple_embed = r.matrix("per_layer_token_embd.weight", s.ple_vocab, s.layers * s.ple_dim);
    w.ple_embed_scale = round_to_dtype(std::sqrt(float(s.ple_dim)), w.ple_embed.dtype);
    w.ple_model_proj = r.linear("per_layer_model_proj.weight", s.layers * s.ple_dim, s.hidden);
    w.ple_proj_norm = r.vec("per_layer_proj_norm.weight", s.ple_dim);
  }
  w.head = s.tied_embeddings ? w.embed : r.matrix("output.weight", s.vocab, s.hidden);
  if (options.pack_for_cpu) keep_head_resident(w.head, w.embed, model->owned, model->owned_bytes);
  return model;
}

}  // namespace tandem
