#include "model/decoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/quant.h"

namespace tandem {

namespace {

// True when the sequence's block tables cover positions [0, end).
bool covers(const ModelSpec& s, const SequenceKv& kv, int64_t end) {
  const int64_t blocks = (end + KvPool::kBlockSize - 1) / KvPool::kBlockSize;
  if (s.has_kind(AttentionKind::Full) && int64_t(kv.full.size()) < blocks) return false;
  if (s.has_kind(AttentionKind::Sliding) && kv.sliding_first + int64_t(kv.sliding.size()) < blocks)
    return false;
  return true;
}

}  // namespace

void Decoder::linear(const float* x, int64_t n, const WeightMatrix& w, const Vec& bias, float* y) {
  matmul(x, n, w, bias.empty() ? nullptr : bias.data(), y);
}

void Decoder::matmul(const float* x, int64_t n, const WeightMatrix& w, const float* bias,
                     float* y) {
  const bool bf16 = round_inputs_rows_ > 0 && n >= round_inputs_rows_;
  cpu::matmul(pool_, x, n, w, bias, y, bf16 ? cpu::MatmulInputs::Bf16 : cpu::MatmulInputs::F32);
}

Decoder::Decoder(const Model& model, ThreadPool& pool, KvPool& kv_pool, int64_t max_step_tokens)
    : model_(model), pool_(pool), kv_pool_(kv_pool), max_step_tokens_(max_step_tokens) {
  const ModelSpec& s = model.spec;
  if (!kv_pool.has_host_storage()) fail("the CPU decoder needs a KV pool with host storage");
  for (int64_t l = 0; l < s.layers; ++l)
    rope_.push_back(make_rope_table(s.rope_for(l), s.layer[size_t(l)].head_dim));
  const size_t T = size_t(max_step_tokens), Dh = size_t(s.max_head_dim()),
               F = size_t(s.max_intermediate());
  size_t kv_heads = 0;
  for (const auto& l : s.layer) kv_heads = std::max(kv_heads, size_t(l.kv_heads));
  h_.resize(T * s.hidden);
  x_.resize(T * s.hidden);
  q_.resize(T * s.heads * Dh);
  k_.resize(T * kv_heads * Dh);
  v_.resize(T * kv_heads * Dh);
  attn_.resize(T * s.heads * Dh);
  out_.resize(T * s.hidden);
  gate_.resize(T * F);
  up_.resize(T * F);
  ple_.resize(T * size_t(s.layers * s.ple_dim));
  ple_gate_.resize(T * size_t(s.ple_dim));
}

int64_t check_step(const ModelSpec& s, std::span<const SeqStep> batch, int64_t max_step_tokens,
                   bool samples_on_device) {
  const int64_t V = s.vocab;
  int64_t tokens = 0;
  for (const SeqStep& q : batch) {
    if (q.n <= 0) fail("step: a sequence with no tokens");
    for (int64_t i = 0; i < q.n; ++i)
      if (q.ids[i] < 0 || q.ids[i] >= V)
        fail("token id %d at index %lld is outside the vocabulary [0, %lld)", q.ids[i],
             (long long)i, (long long)V);
    if (q.key_end)
      for (int64_t i = 0; i < q.n; ++i)
        if (q.key_end[i] <= q.kv->length + i || q.key_end[i] > q.kv->length + q.n)
          fail("step: token %lld's visible keys end at %lld, outside this step", (long long)i,
               (long long)q.key_end[i]);
    if (q.sampling && !samples_on_device)
      fail("step: this runner does not sample on the device; ask for logits instead");
    if (q.sampling && (q.logits || !q.sampling->token))
      fail("step: a sampled sequence takes a token slot and no logits");
    if (!covers(s, *q.kv, q.kv->length + q.n))
      fail("step: KV blocks not reserved for %lld positions", (long long)(q.kv->length + q.n));
    tokens += q.n;
  }
  if (tokens > max_step_tokens)
    fail("step: %lld tokens exceed the step budget of %lld", (long long)tokens,
         (long long)max_step_tokens);
  return tokens;
}

void Decoder::step(std::span<const SeqStep> batch) {
  const ModelSpec& s = model_.spec;
  const Weights& w = model_.weights;
  const int64_t D = s.hidden, V = s.vocab;
  int64_t logit_rows = 0;
  const int64_t tokens = check_step(s, batch, max_step_tokens_);
  for (const SeqStep& q : batch)
    if (q.logits) logit_rows += q.all_logits ? q.n : 1;

  // Embeddings of every new token, sequences back to back (a quantized table's
  // rows are dequantized).
  int64_t t = 0;
  for (const SeqStep& q : batch)
    for (int64_t i = 0; i < q.n; ++i, ++t) {
      float* h = h_.data() + t * D;
      if (q.embeds && q.embeds[i]) {  // image features replace the placeholder, unscaled
        std::copy(q.embeds[i], q.embeds[i] + D, h);
        continue;
      }
      dequantize_row(w.embed, q.ids[i], h);
      if (w.embed_scale != 1.0f)
        for (int64_t j = 0; j < D; ++j) h[j] *= w.embed_scale;
    }
  if (s.ple_dim > 0) per_layer_inputs(batch, tokens);
  for (int64_t l = 0; l < s.layers; ++l) {
    attention_block(l, batch, tokens);
    mlp_block(l, tokens);
    if (s.ple_dim > 0) per_layer_block(l, tokens);
    const float scalar = model_.weights.layers[size_t(l)].scalar;
    if (scalar != 1.0f)
      for (int64_t i = 0; i < tokens * D; ++i) h_[size_t(i)] *= scalar;
  }
  for (const SeqStep& q : batch) q.kv->length += q.n;
  if (logit_rows == 0) return;

  // Final norm + head only for the rows whose logits are wanted, gathered
  // into one matmul so the head streams once per step.
  t = 0;
  int64_t r = 0;
  for (const SeqStep& q : batch) {
    if (q.logits) {
      const int64_t first = q.all_logits ? t : t + q.n - 1, rows = q.all_logits ? q.n : 1;
      cpu::rmsnorm(h_.data() + first * D, w.final_norm.data(), rows, D, s.norm_eps,
                   x_.data() + r * D);
      r += rows;
    }
    t += q.n;
  }
  // One sequence writes straight into its buffer; several share a scratch
  // matrix that is then split.
  const bool direct = batch.size() == 1;
  float* dst = batch[0].logits;
  if (!direct) {
    if (logit_rows_.size() < size_t(logit_rows * V)) logit_rows_.resize(size_t(logit_rows * V));
    dst = logit_rows_.data();
  }
  matmul(x_.data(), logit_rows, w.head, nullptr, dst);
  if (s.final_softcap > 0.0f) cpu::softcap(dst, logit_rows * V, s.final_softcap);
  if (direct) return;
  r = 0;
  for (const SeqStep& q : batch) {
    if (!q.logits) continue;
    const int64_t rows = q.all_logits ? q.n : 1;
    std::memcpy(q.logits, dst + r * V, sizeof(float) * size_t(rows * V));
    r += rows;
  }
}

// Gemma 4 per-layer inputs, from the input embeddings (h_ before layer 0):
//   ple[t, l] = (norm(proj(h) · D^-0.5)[l] + E_ple[id] · sqrt(P))[l] · 2^-0.5
void Decoder::per_layer_inputs(std::span<const SeqStep> batch, int64_t tokens) {
  const ModelSpec& s = model_.spec;
  const Weights& w = model_.weights;
  const int64_t P = s.ple_dim, LP = s.layers * P;
  matmul(h_.data(), tokens, w.ple_model_proj, nullptr, ple_.data());
  const float proj_scale = 1.0f / std::sqrt(float(s.hidden));
  for (int64_t i = 0; i < tokens * LP; ++i) ple_[size_t(i)] *= proj_scale;
  cpu::rmsnorm(ple_.data(), w.ple_proj_norm.data(), tokens * s.layers, P, s.norm_eps, ple_.data());
  std::vector<float> tok(static_cast<size_t>(LP));
  const float mix = 1.0f / std::sqrt(2.0f);
  int64_t t = 0;
  for (const SeqStep& q : batch)
    for (int64_t i = 0; i < q.n; ++i, ++t) {
      // A token whose embedding an image replaced reads the pad token's row
      // (transformers swaps multimodal ids for pad_token_id); ids beyond the
      // per-layer table read row 0.
      int64_t id = q.ids[i];
      if (q.embeds && q.embeds[i] && s.pad_id >= 0) id = s.pad_id;
      if (id >= s.ple_vocab) id = 0;
      dequantize_row(w.ple_embed, id, tok.data());
      float* row = ple_.data() + t * LP;
      for (int64_t j = 0; j < LP; ++j) row[j] = (row[j] + tok[size_t(j)] * w.ple_embed_scale) * mix;
    }
}

void Decoder::attention_block(int64_t layer, std::span<const SeqStep> batch, int64_t tokens) {
  const ModelSpec& s = model_.spec;
  const LayerSpec& ls = s.layer[size_t(layer)];
  const LayerWeights& lw = model_.weights.layers[size_t(layer)];
  const int64_t D = s.hidden, Q = ls.q_dim(s.heads), KV = ls.kv_dim(), Dh = ls.head_dim;
  const bool own_kv = ls.kv_source == layer;
  cpu::rmsnorm(h_.data(), lw.attn_in_norm.data(), tokens, D, s.norm_eps, x_.data());
  linear(x_.data(), tokens, lw.q, lw.q_bias, q_.data());
  if (s.qk_norm)
    cpu::rmsnorm(q_.data(), lw.q_norm.data(), tokens * s.heads, Dh, s.norm_eps, q_.data());
  if (own_kv) {
    linear(x_.data(), tokens, lw.k, lw.k_bias, k_.data());
    if (ls.k_eq_v)
      std::copy(k_.begin(), k_.begin() + tokens * KV, v_.begin());  // values = raw keys
    else
      linear(x_.data(), tokens, lw.v, lw.v_bias, v_.data());
    if (s.qk_norm)
      cpu::rmsnorm(k_.data(), lw.k_norm.data(), tokens * ls.kv_heads, Dh, s.norm_eps, k_.data());
    if (s.v_norm) cpu::rmsnorm(v_.data(), nullptr, tokens * ls.kv_heads, Dh, s.norm_eps, v_.data());
  }
  const RopeTable& rope = rope_[size_t(layer)];
  cpu::AttentionParams p;
  p.heads = s.heads;
  p.kv_heads = ls.kv_heads;
  p.head_dim = Dh;
  p.scale = s.attn_scale;
  p.softcap = s.attn_softcap;
  p.window = ls.kind == AttentionKind::Sliding ? s.sliding_window : 0;
  p.k_base = kv_pool_.keys(layer);
  p.v_base = kv_pool_.values(layer);
  p.block_size = KvPool::kBlockSize;
  int64_t t0 = 0;
  for (const SeqStep& q : batch) {
    const SequenceKv& kv = *q.kv;
    for (int64_t i = 0; i < q.n; ++i) {
      const int64_t t = t0 + i, pos = kv.length + i;
      float* qt = q_.data() + t * Q;
      apply_rope(rope, pos, qt, s.heads, Dh);
      if (s.query_temperature_beta != 0.0f) {
        const float temp =
            1.0f + s.query_temperature_beta *
                       std::log(1.0f + std::floor(float(pos) / float(s.query_temperature_base)));
        for (int64_t j = 0; j < Q; ++j) qt[j] *= temp;
      }
      if (!own_kv) continue;  // its source layer already wrote this position
      apply_rope(rope, pos, k_.data() + t * KV, ls.kv_heads, Dh);
      const int32_t block = kv.block_of(ls.kind, pos);
      const int64_t row = pos % KvPool::kBlockSize;
      std::memcpy(kv_pool_.keys(layer, block) + row * KV, k_.data() + t * KV, sizeof(float) * KV);
      std::memcpy(kv_pool_.values(layer, block) + row * KV, v_.data() + t * KV, sizeof(float) * KV);
      if (round_kv_bf16_) {
        float* kr = kv_pool_.keys(layer, block) + row * KV;
        float* vr = kv_pool_.values(layer, block) + row * KV;
        for (int64_t j = 0; j < KV; ++j) {
          kr[j] = bf16_to_f32(f32_to_bf16(kr[j]));
          vr[j] = bf16_to_f32(f32_to_bf16(vr[j]));
        }
      }
    }
    p.blocks = ls.kind == AttentionKind::Full ? kv.full.data() : kv.sliding.data();
    p.first_block = ls.kind == AttentionKind::Full ? 0 : kv.sliding_first;
    p.key_end = q.key_end;
    cpu::attention(pool_, q_.data() + t0 * Q, kv.length, q.n, p, attn_.data() + t0 * Q);
    t0 += q.n;
  }
  linear(attn_.data(), tokens, lw.o, lw.o_bias, out_.data());
  if (!lw.attn_out_norm.empty())
    cpu::rmsnorm(out_.data(), lw.attn_out_norm.data(), tokens, D, s.norm_eps, out_.data());
  cpu::add_inplace(h_.data(), out_.data(), tokens * D);
}

void Decoder::mlp_block(int64_t layer, int64_t tokens) {
  const ModelSpec& s = model_.spec;
  const LayerWeights& lw = model_.weights.layers[size_t(layer)];
  const int64_t D = s.hidden, F = s.layer[size_t(layer)].intermediate;
  cpu::rmsnorm(h_.data(), lw.mlp_in_norm.data(), tokens, D, s.norm_eps, x_.data());
  linear(x_.data(), tokens, lw.gate, lw.gate_bias, gate_.data());
  linear(x_.data(), tokens, lw.up, lw.up_bias, up_.data());
  // Element-wise, so split over the pool (libm's tanh/exp cost a quantized
  // decode step as much as several of its matmuls on one thread).
  pool_.parallel_for(tokens * F, 2048, [&](int64_t b, int64_t e) {
    if (s.activation == Activation::SiLU)
      cpu::silu_mul(gate_.data() + b, up_.data() + b, e - b);
    else
      cpu::gelu_tanh_mul(gate_.data() + b, up_.data() + b, e - b);
  });
  linear(gate_.data(), tokens, lw.down, lw.down_bias, out_.data());
  if (!lw.mlp_out_norm.empty())
    cpu::rmsnorm(out_.data(), lw.mlp_out_norm.data(), tokens, D, s.norm_eps, out_.data());
  cpu::add_inplace(h_.data(), out_.data(), tokens * D);
}

// Gemma 4: h += norm(proj(gelu(gate(h)) · ple[:, layer]))
void Decoder::per_layer_block(int64_t layer, int64_t tokens) {
  const ModelSpec& s = model_.spec;
  const LayerWeights& lw = model_.weights.layers[size_t(layer)];
  const int64_t D = s.hidden, P = s.ple_dim, LP = s.layers * P;
  matmul(h_.data(), tokens, lw.ple_gate, nullptr, ple_gate_.data());
  for (int64_t t = 0; t < tokens; ++t) {
    float* g = ple_gate_.data() + t * P;
    const float* in = ple_.data() + t * LP + layer * P;
    if (s.activation == Activation::SiLU)
      cpu::silu_mul(g, in, P);
    else
      cpu::gelu_tanh_mul(g, in, P);
  }
  matmul(ple_gate_.data(), tokens, lw.ple_proj, nullptr, out_.data());
  cpu::rmsnorm(out_.data(), lw.ple_out_norm.data(), tokens, D, s.norm_eps, out_.data());
  cpu::add_inplace(h_.data(), out_.data(), tokens * D);
}

KvPool single_sequence_pool(const ModelSpec& spec, int64_t capacity, int64_t max_step_tokens,
                            bool host_storage, DType row_dtype) {
  const int64_t full = (capacity + KvPool::kBlockSize - 1) / KvPool::kBlockSize;
  const int64_t sliding =
      std::min(full, KvPool::sliding_blocks_per_sequence(spec, max_step_tokens));
  return KvPool(spec, full, sliding, host_storage, row_dtype);
}

void run_sequence(StepRunner& decoder, const int32_t* ids, int64_t n, SequenceKv& kv, float* logits,
                  bool all_logits, const float* const* embeds, const int64_t* key_end) {
  const ModelSpec& s = decoder.spec();
  if (n <= 0) fail("no tokens given");
  const int64_t base = kv.length;  // key_end is in absolute positions
  for (int64_t done = 0; done < n;) {
    int64_t chunk = std::min(decoder.max_step_tokens(), n - done);
    if (key_end) {
      // Pull the boundary back until no token needs keys past it.
      auto fits = [&](int64_t c) {
        for (int64_t i = done; i < done + c; ++i)
          if (key_end[i] > base + done + c) return false;
        return true;
      };
      while (chunk > 0 && !fits(chunk)) --chunk;
      if (chunk == 0)
        fail("an image run at token %lld is longer than a step of %lld tokens", (long long)done,
             (long long)decoder.max_step_tokens());
    }
    if (!kv_reserve(decoder.kv_pool(), s, kv, kv.length + chunk))
      fail("context overflow: %lld cached + %lld new tokens do not fit in the KV cache",
           (long long)kv.length, (long long)chunk);
    const bool last = done + chunk == n;
    SeqStep q{ids + done, chunk, &kv,
              all_logits ? logits + done * s.vocab : (last ? logits : nullptr), all_logits};
    if (embeds) q.embeds = embeds + done;
    if (key_end) q.key_end = key_end + done;
    decoder.step(std::span<const SeqStep>(&q, 1));
    kv_trim_sliding(decoder.kv_pool(), s, kv);
    done += chunk;
  }
}

}  // namespace tandem
