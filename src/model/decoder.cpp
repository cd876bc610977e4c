#include "model/decoder.h"

#include <algorithm>
#include <cstring>

#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "core/error.h"

namespace tandem {

namespace {

void linear(ThreadPool& pool, const float* x, int64_t n, const WeightMatrix& w, const Vec& bias,
            float* y) {
  cpu::matmul(pool, x, n, w, bias.empty() ? nullptr : bias.data(), y);
}

}  // namespace

Decoder::Decoder(const Model& model, ThreadPool& pool, int64_t max_chunk)
    : model_(model), pool_(pool), max_chunk_(max_chunk) {
  const ModelSpec& s = model.spec;
  rope_full_ = make_rope_table(s.rope_full, s.head_dim);
  rope_sliding_ = make_rope_table(s.rope_sliding, s.head_dim);
  const size_t T = size_t(max_chunk);
  h_.resize(T * s.hidden);
  x_.resize(T * s.hidden);
  q_.resize(T * s.q_dim());
  k_.resize(T * s.kv_dim());
  v_.resize(T * s.kv_dim());
  attn_.resize(T * s.q_dim());
  out_.resize(T * s.hidden);
  gate_.resize(T * s.intermediate);
  up_.resize(T * s.intermediate);
}

void Decoder::forward(const int32_t* ids, int64_t n, KvCache& cache, float* logits,
                      bool all_logits) {
  const ModelSpec& s = model_.spec;
  if (n <= 0) fail("forward: no tokens given");
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= s.vocab)
      fail("token id %d at index %lld is outside the vocabulary [0, %lld)", ids[i], (long long)i,
           (long long)s.vocab);
  if (cache.length + n > cache.capacity)
    fail("context overflow: %lld cached + %lld new tokens exceed the context of %lld",
         (long long)cache.length, (long long)n, (long long)cache.capacity);
  for (int64_t done = 0; done < n; done += max_chunk_) {
    int64_t chunk = std::min(max_chunk_, n - done);
    bool last = done + chunk == n;
    float* out = all_logits ? logits + done * s.vocab : logits;
    // Non-final chunks of a last-logits-only call need no logits at all.
    forward_chunk(ids + done, chunk, cache, (all_logits || last) ? out : nullptr, all_logits);
  }
}

void Decoder::forward_chunk(const int32_t* ids, int64_t n, KvCache& cache, float* logits,
                            bool all_logits) {
  const ModelSpec& s = model_.spec;
  const Weights& w = model_.weights;
  const int64_t D = s.hidden;
  const size_t row_bytes = size_t(D) * dtype_size(w.embed.dtype);
  for (int64_t t = 0; t < n; ++t) {
    const auto* row = static_cast<const uint8_t*>(w.embed.data) + size_t(ids[t]) * row_bytes;
    float* h = h_.data() + t * D;
    convert_to_f32(row, w.embed.dtype, D, h);
    if (w.embed_scale != 1.0f)
      for (int64_t i = 0; i < D; ++i) h[i] *= w.embed_scale;
  }
  for (int64_t l = 0; l < s.layers; ++l) {
    attention_block(l, n, cache);
    mlp_block(l, n);
  }
  cache.length += n;
  if (!logits) return;
  // Only the rows whose logits are wanted go through the final norm and head.
  const int64_t first = all_logits ? 0 : n - 1, rows = n - first;
  cpu::rmsnorm(h_.data() + first * D, w.final_norm.data(), rows, D, s.norm_eps, x_.data());
  cpu::matmul(pool_, x_.data(), rows, w.head, nullptr, logits);
  if (s.final_softcap > 0.0f) cpu::softcap(logits, rows * s.vocab, s.final_softcap);
}

void Decoder::attention_block(int64_t layer, int64_t n, KvCache& cache) {
  const ModelSpec& s = model_.spec;
  const LayerWeights& lw = model_.weights.layers[layer];
  const int64_t D = s.hidden, Q = s.q_dim(), KV = s.kv_dim(), Dh = s.head_dim;
  cpu::rmsnorm(h_.data(), lw.attn_in_norm.data(), n, D, s.norm_eps, x_.data());
  linear(pool_, x_.data(), n, lw.q, lw.q_bias, q_.data());
  linear(pool_, x_.data(), n, lw.k, lw.k_bias, k_.data());
  linear(pool_, x_.data(), n, lw.v, lw.v_bias, v_.data());
  if (s.qk_norm) {
    cpu::rmsnorm(q_.data(), lw.q_norm.data(), n * s.heads, Dh, s.norm_eps, q_.data());
    cpu::rmsnorm(k_.data(), lw.k_norm.data(), n * s.kv_heads, Dh, s.norm_eps, k_.data());
  }
  const bool sliding = s.layer_kinds[layer] == AttentionKind::Sliding;
  const RopeTable& rope = sliding ? rope_sliding_ : rope_full_;
  KvCache::Layer& kv = cache.layers[layer];
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pos = cache.length + t;
    apply_rope(rope, pos, q_.data() + t * Q, s.heads, Dh);
    apply_rope(rope, pos, k_.data() + t * KV, s.kv_heads, Dh);
    const int64_t slot = pos % kv.slots;
    std::memcpy(kv.k.data() + slot * KV, k_.data() + t * KV, sizeof(float) * KV);
    std::memcpy(kv.v.data() + slot * KV, v_.data() + t * KV, sizeof(float) * KV);
  }
  cpu::AttentionParams p;
  p.heads = s.heads;
  p.kv_heads = s.kv_heads;
  p.head_dim = Dh;
  p.scale = s.attn_scale;
  p.softcap = s.attn_softcap;
  p.window = sliding ? s.sliding_window : 0;
  p.slots = kv.slots;
  cpu::attention(pool_, q_.data(), kv.k.data(), kv.v.data(), cache.length, n, p, attn_.data());
  linear(pool_, attn_.data(), n, lw.o, lw.o_bias, out_.data());
  if (!lw.attn_out_norm.empty())
    cpu::rmsnorm(out_.data(), lw.attn_out_norm.data(), n, D, s.norm_eps, out_.data());
  cpu::add_inplace(h_.data(), out_.data(), n * D);
}

void Decoder::mlp_block(int64_t layer, int64_t n) {
  const ModelSpec& s = model_.spec;
  const LayerWeights& lw = model_.weights.layers[layer];
  const int64_t D = s.hidden, F = s.intermediate;
  cpu::rmsnorm(h_.data(), lw.mlp_in_norm.data(), n, D, s.norm_eps, x_.data());
  linear(pool_, x_.data(), n, lw.gate, lw.gate_bias, gate_.data());
  linear(pool_, x_.data(), n, lw.up, lw.up_bias, up_.data());
  if (s.activation == Activation::SiLU)
    cpu::silu_mul(gate_.data(), up_.data(), n * F);
  else
    cpu::gelu_tanh_mul(gate_.data(), up_.data(), n * F);
  linear(pool_, gate_.data(), n, lw.down, lw.down_bias, out_.data());
  if (!lw.mlp_out_norm.empty())
    cpu::rmsnorm(out_.data(), lw.mlp_out_norm.data(), n, D, s.norm_eps, out_.data());
  cpu::add_inplace(h_.data(), out_.data(), n * D);
}

}  // namespace tandem
