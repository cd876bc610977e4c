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

const char* const kArchs[] = {"llama", "qwen2", "qwen3", "gemma3"};

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

// HF row r of a head-permuted projection reads GGUF row src_row(r): llama.cpp
// stores each head's rows [2, Dh/2] swapped to [Dh/2, 2] (interleaved RoPE).
int64_t src_row(int64_t r, int64_t head_dim) {
  const int64_t h = r / head_dim, i = r % head_dim, half = head_dim / 2;
  return h * head_dim + (i % half) * 2 + i / half;
}

class GgufWeights {
 public:
  GgufWeights(const GgufFile& f, const LoadOptions& o, Model& m) : f_(f), o_(o), m_(m) {}

  // The tensor with ggml dims `dims` (innermost first).
  const GgufTensor& require(const std::string& name, const std::vector<int64_t>& dims) const {
    const GgufTensor* t = f_.tensor(name);
    if (!t) fail("%s: missing tensor \"%s\"", f_.path().c_str(), name.c_str());
    if (t->dims != dims)
      fail("%s: tensor \"%s\": expected dims %s, found %s", f_.path().c_str(), name.c_str(),
           dims_str(dims).c_str(), dims_str(t->dims).c_str());
    return *t;
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
      case GgmlType::Q6_K: {
        w.dtype = DType::BF16;
        auto* dst = reinterpret_cast<uint16_t*>(allocate(size_t(rows * cols) * 2));
        std::vector<float> row(static_cast<size_t>(cols));
        for (int64_t r = 0; r < rows; ++r) {
          gguf_dequantize(t.type, src + size_t(r) * row_bytes, cols, row.data());
          for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = f32_to_bf16(row[size_t(c)]);
        }
        src = reinterpret_cast<const uint8_t*>(dst);
        break;
      }
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
    m_.owned.push_back(std::make_unique<uint8_t[]>(bytes));
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
  const int64_t permute = s.arch == "llama" ? Dh : 0;
  LayerWeights l;
  l.attn_in_norm = r.vec(p + "attn_norm.weight", D);
  l.q = r.matrix(p + "attn_q.weight", Q, D, permute);
  l.k = r.matrix(p + "attn_k.weight", KV, D, permute);
  l.v = r.matrix(p + "attn_v.weight", KV, D);
  l.o = r.matrix(p + "attn_output.weight", D, Q);
  if (s.qkv_bias) {
    l.q_bias = r.vec(p + "attn_q.bias", Q, permute);
    l.k_bias = r.vec(p + "attn_k.bias", KV, permute);
    l.v_bias = r.vec(p + "attn_v.bias", KV);
  }
  if (s.o_bias) l.o_bias = r.vec(p + "attn_output.bias", D);
  if (s.qk_norm) {
    l.q_norm = r.vec(p + "attn_q_norm.weight", Dh);
    l.k_norm = r.vec(p + "attn_k_norm.weight", Dh);
  }
  if (s.sandwich_norms) {
    l.attn_out_norm = r.vec(p + "post_attention_norm.weight", D);
    l.mlp_in_norm = r.vec(p + "ffn_norm.weight", D);
    l.mlp_out_norm = r.vec(p + "post_ffw_norm.weight", D);
  } else {
    l.mlp_in_norm = r.vec(p + "ffn_norm.weight", D);
  }
  l.gate = r.matrix(p + "ffn_gate.weight", F, D);
  l.up = r.matrix(p + "ffn_up.weight", F, D);
  l.down = r.matrix(p + "ffn_down.weight", D, F);
  if (s.mlp_bias) {
    l.gate_bias = r.vec(p + "ffn_gate.bias", F);
    l.up_bias = r.vec(p + "ffn_up.bias", F);
    l.down_bias = r.vec(p + "ffn_down.bias", D);
  }
  return l;
}

}  // namespace

json gguf_spec_config(const GgufFile& f) {
  const std::string arch = f.get_string("general.architecture", "");
  if (arch.empty()) fail("%s: missing metadata \"general.architecture\"", f.path().c_str());
  bool known = false;
  for (const char* a : kArchs) known |= arch == a;
  if (!known)
    fail("%s: GGUF architecture \"%s\" is not supported (supported: llama, qwen2, qwen3, gemma3)",
         f.path().c_str(), arch.c_str());
  const bool gemma = arch == "gemma3";
  const std::string p = arch + ".";
  const GgufTensor* embd = f.tensor("token_embd.weight");
  if (!embd || embd->dims.size() != 2)
    fail("%s: missing 2-D tensor \"token_embd.weight\"", f.path().c_str());

  json c;
  c["model_type"] = gemma ? "gemma3_text" : arch;
  c["vocab_size"] = embd->dims[1];
  c["hidden_size"] = f.require_int(p + "embedding_length");
  const int64_t layers = f.require_int(p + "block_count");
  c["num_hidden_layers"] = layers;
  const int64_t heads = f.require_int(p + "attention.head_count");
  c["num_attention_heads"] = heads;
  c["num_key_value_heads"] = f.get_int(p + "attention.head_count_kv", heads);
  c["intermediate_size"] = f.require_int(p + "feed_forward_length");
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
  if (gemma) {
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
  const std::string arch = f.get_string("general.architecture", "");
  return arch == "gemma3" ? "gemma3_text" : arch;
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
  w.head = s.tied_embeddings ? w.embed : r.matrix("output.weight", s.vocab, s.hidden);
  return model;
}

}  // namespace tandem
