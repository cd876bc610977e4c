// Checkpoint tensors -> the canonical Weights set.
//
// Families name their tensors differently and multimodal checkpoints nest the
// language model under a prefix; this file is the one place that knows those
// names. Everything after it sees only Weights.
#include <cmath>

#include "core/error.h"
#include "model/gguf.h"
#include "model/gguf_model.h"
#include "model/model.h"
#include "model/quantized.h"

namespace tandem {

namespace {

// Prefixes under which checkpoints store the language model, most specific first.
const char* const kPrefixes[] = {"model.language_model.", "language_model.model.", "model."};

class WeightReader {
 public:
  WeightReader(const Checkpoint& ckpt, const ModelSpec& spec, MatrixLoader& matrices)
      : ckpt_(ckpt), spec_(spec), matrices_(matrices) {
    for (const char* p : kPrefixes)
      if (ckpt.has(std::string(p) + "embed_tokens.weight")) {
        prefix_ = p;
        return;
      }
    fail(
        "%s: no embedding tensor found (looked for %sembed_tokens.weight, %sembed_tokens.weight, "
        "%sembed_tokens.weight)",
        ckpt.dir().c_str(), kPrefixes[0], kPrefixes[1], kPrefixes[2]);
  }

  const std::string& prefix() const { return prefix_; }

  TensorView tensor(const std::string& name, const Shape& shape) const {
    TensorView t = ckpt_.require(name, shape);
    if (t.dtype != DType::F32 && t.dtype != DType::F16 && t.dtype != DType::BF16)
      fail("tensor \"%s\" in %s: dtype %s is not supported (F32, F16, BF16)", name.c_str(),
           ckpt_.file_of(name).c_str(), std::string(dtype_name(t.dtype)).c_str());
    return t;
  }

  // A matrix in any stored form (dense, MLX-quantized, FP8), converted as the
  // load options ask (model/quantized.h).
  WeightMatrix matrix(const std::string& name, int64_t rows, int64_t cols) const {
    return matrices_.load(name, rows, cols);
  }
  // The same for a matrix only ever multiplied by (never a lookup table):
  // packed for the CPU where the options ask.
  WeightMatrix linear(const std::string& name, int64_t rows, int64_t cols) const {
    return matrices_.load(name, rows, cols, /*packable=*/true);
  }

  // A norm weight in f32, with Gemma's +1 folded in.
  Vec norm(const std::string& name, int64_t dim) const {
    Vec v = vec(name, dim);
    if (spec_.norm_style == NormStyle::OnePlusWeight)
      for (float& x : v) x += 1.0f;
    return v;
  }

  Vec vec(const std::string& name, int64_t dim) const {
    TensorView t = tensor(name, {dim});
    Vec v(static_cast<size_t>(dim));
    convert_to_f32(t.data, t.dtype, dim, v.data());
    return v;
  }

 private:
  const Checkpoint& ckpt_;
  const ModelSpec& spec_;
  MatrixLoader& matrices_;
  std::string prefix_;
};

LayerWeights read_layer(const WeightReader& r, const ModelSpec& s, int64_t i) {
  const std::string p = r.prefix() + "layers." + std::to_string(i) + ".";
  const LayerSpec& ls = s.layer[size_t(i)];
  const int64_t D = s.hidden, Q = ls.q_dim(s.heads), KV = ls.kv_dim(), F = ls.intermediate,
                Dh = ls.head_dim;
  const bool own_kv = ls.kv_source == i;  // KV-shared layers have no k/v projections
  LayerWeights l;
  l.attn_in_norm = r.norm(p + "input_layernorm.weight", D);
  l.q = r.linear(p + "self_attn.q_proj.weight", Q, D);
  if (own_kv) {
    l.k = r.linear(p + "self_attn.k_proj.weight", KV, D);
    if (!ls.k_eq_v) l.v = r.linear(p + "self_attn.v_proj.weight", KV, D);
  }
  l.o = r.linear(p + "self_attn.o_proj.weight", D, Q);
  if (s.qkv_bias) {
    l.q_bias = r.vec(p + "self_attn.q_proj.bias", Q);
    if (own_kv) {
      l.k_bias = r.vec(p + "self_attn.k_proj.bias", KV);
      if (!ls.k_eq_v) l.v_bias = r.vec(p + "self_attn.v_proj.bias", KV);
    }
  }
  if (s.o_bias) l.o_bias = r.vec(p + "self_attn.o_proj.bias", D);
  if (s.qk_norm) {
    l.q_norm = r.norm(p + "self_attn.q_norm.weight", Dh);
    if (own_kv) l.k_norm = r.norm(p + "self_attn.k_norm.weight", Dh);
  }
  if (s.sandwich_norms) {
    l.attn_out_norm = r.norm(p + "post_attention_layernorm.weight", D);
    l.mlp_in_norm = r.norm(p + "pre_feedforward_layernorm.weight", D);
    l.mlp_out_norm = r.norm(p + "post_feedforward_layernorm.weight", D);
  } else {
    l.mlp_in_norm = r.norm(p + "post_attention_layernorm.weight", D);
  }
  l.gate = r.linear(p + "mlp.gate_proj.weight", F, D);
  l.up = r.linear(p + "mlp.up_proj.weight", F, D);
  l.down = r.linear(p + "mlp.down_proj.weight", D, F);
  if (s.mlp_bias) {
    l.gate_bias = r.vec(p + "mlp.gate_proj.bias", F);
    l.up_bias = r.vec(p + "mlp.up_proj.bias", F);
    l.down_bias = r.vec(p + "mlp.down_proj.bias", D);
  }
  if (s.ple_dim > 0) {
    l.ple_gate = r.linear(p + "per_layer_input_gate.weight", s.ple_dim, D);
    l.ple_proj = r.linear(p + "per_layer_projection.weight", D, s.ple_dim);
    l.ple_out_norm = r.norm(p + "post_per_layer_input_norm.weight", D);
  }
  if (s.layer_scalars) l.scalar = r.vec(p + "layer_scalar", 1)[0];
  return l;
}

// The untied head: "lm_head.weight" beside the model, or under the
// multimodal wrapper.
WeightMatrix read_head(const Checkpoint& ckpt, const WeightReader& r, const ModelSpec& s) {
  for (const char* name :
       {"lm_head.weight", "language_model.lm_head.weight", "model.lm_head.weight"})
    if (ckpt.has(name)) return r.matrix(name, s.vocab, s.hidden);
  fail("%s: config says tie_word_embeddings is false but there is no lm_head.weight tensor",
       ckpt.dir().c_str());
}

}  // namespace

std::unique_ptr<Model> load_model(const std::string& dir, const LoadOptions& options) {
  if (const std::string gguf = find_gguf_model(dir); !gguf.empty())
    return load_gguf_model(gguf, options);
  auto model = std::make_unique<Model>(
      Model{load_model_spec(dir), Checkpoint::open(dir), {}, {}, 0, {}, ""});
  const ModelSpec& s = model->spec;
  MatrixLoader matrices(model->checkpoint, read_quant_config(dir), options.quantize_bits,
                        options.quantize_group_size, model->owned, model->owned_bytes);
  matrices.set_pack_for_cpu(options.pack_for_cpu);
  matrices.set_progress(options.on_matrix);
  WeightReader r(model->checkpoint, s, matrices);
  Weights& w = model->weights;
  w.embed = r.matrix(r.prefix() + "embed_tokens.weight", s.vocab, s.hidden);
  if (s.scale_embeddings)  // transformers casts sqrt(D) to the weight dtype first
    w.embed_scale = round_to_dtype(std::sqrt(float(s.hidden)), w.embed.dtype);
  w.layers.reserve(size_t(s.layers));
  for (int64_t i = 0; i < s.layers; ++i) w.layers.push_back(read_layer(r, s, i));
  w.final_norm = r.norm(r.prefix() + "norm.weight", s.hidden);
  if (s.ple_dim > 0) {
    w.ple_embed =
        r.matrix(r.prefix() + "embed_tokens_per_layer.weight", s.ple_vocab, s.layers * s.ple_dim);
    w.ple_embed_scale = round_to_dtype(std::sqrt(float(s.ple_dim)), w.ple_embed.dtype);
    w.ple_model_proj =
        r.linear(r.prefix() + "per_layer_model_projection.weight", s.layers * s.ple_dim, s.hidden);
    // per_layer_projection_norm is an RMSNorm of the model's own style.
    w.ple_proj_norm = r.norm(r.prefix() + "per_layer_projection_norm.weight", s.ple_dim);
  }
  w.head = s.tied_embeddings ? w.embed : read_head(model->checkpoint, r, s);
  if (options.pack_for_cpu) keep_head_resident(w.head, w.embed, model->owned, model->owned_bytes);
  return model;
}

}  // namespace tandem
