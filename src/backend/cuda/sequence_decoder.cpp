#include "backend/cuda/sequence_decoder.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>

#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"
#include "core/dtype.h"
#include "core/error.h"
#include "model/rope.h"

namespace tandem::cuda {

namespace {

constexpr int64_t kChunk = 64;  // tokens per forward chunk

// A weight matrix on the device: bf16 or f32.
struct DevMatrix {
  DType dtype = DType::F32;
  DeviceBuffer buf;
  int64_t rows = 0, cols = 0;
  bool empty() const { return rows == 0; }
};

DevMatrix upload_matrix(DType dtype, const void* data, int64_t rows, int64_t cols, size_t& total) {
  DevMatrix m;
  m.rows = rows;
  m.cols = cols;
  if (!data || rows == 0) return m;
  const size_t n = size_t(rows * cols);
  if (dtype == DType::BF16 || dtype == DType::F32) {
    m.dtype = dtype;
    m.buf = DeviceBuffer(n * dtype_size(dtype));
    m.buf.upload(data, m.buf.bytes());
  } else {  // f16 (and anything convert_to_f32 reads) widened to f32
    std::vector<float> f(n);
    convert_to_f32(data, dtype, int64_t(n), f.data());
    m.dtype = DType::F32;
    m.buf = DeviceBuffer(n * sizeof(float));
    m.buf.upload(f.data(), m.buf.bytes());
  }
  total += m.buf.bytes();
  return m;
}

DevMatrix upload_matrix(const WeightMatrix& w, size_t& total) {
  return upload_matrix(w.dtype, w.data, w.rows, w.cols, total);
}

DeviceBuffer upload_vec(const std::vector<float>& v, size_t& total) {
  DeviceBuffer b(v.size() * sizeof(float));
  if (!v.empty()) b.upload(v.data(), b.bytes());
  total += b.bytes();
  return b;
}

float* ptr(const DeviceBuffer& b) {
  return b.bytes() ? b.as<float>() : nullptr;
}

// y[n, rows] = x[n, cols] · Wᵀ (+ bias)
void linear(const DevMatrix& w, const DeviceBuffer& bias, const float* x, int64_t n, float* y) {
  if (w.dtype == DType::BF16)
    gemv_bf16(w.buf.as<uint16_t>(), w.rows, w.cols, x, n, y, nullptr);
  else
    gemv_f32(w.buf.as<float>(), w.rows, w.cols, x, n, y, nullptr);
  if (bias.bytes()) add_bias(y, bias.as<float>(), n, w.rows, nullptr);
}

struct Layer {
  DeviceBuffer attn_in_norm, q_bias, k_bias, v_bias, q_norm, k_norm, o_bias, attn_out_norm,
      mlp_in_norm, gate_bias, up_bias, down_bias, mlp_out_norm;
  DevMatrix q, k, v, o, gate, up, down;
  DeviceBuffer keys, values;  // [max_context, K·Dh]
  DeviceBuffer inv_freq;
  int64_t rotary_dim = 0;
  float rope_scaling = 1.f;
  float scalar = 1.f;
};

}  // namespace

struct SequenceDecoder::Impl {
  const ModelSpec& spec;
  int64_t max_context;
  DevMatrix embed, head;  // head may alias embed (tied): head_tied
  bool head_tied = false;
  float embed_scale = 1.f;
  DeviceBuffer final_norm;
  std::vector<Layer> layers;
  DeviceBuffer block_table;  // [0]: one block spanning the context
  // Scratch for one chunk.
  DeviceBuffer ids, positions, h, x, q, k, v, attn, out, gate, up, logits;

  Impl(const Model& m, int64_t ctx, size_t& total) : spec(m.spec), max_context(ctx) {}
};

SequenceDecoder::SequenceDecoder(const Model& model, int64_t max_context) {
  const ModelSpec& s = model.spec;
  const Weights& w = model.weights;
  if (s.ple_dim > 0) fail("CUDA decoder: per-layer embeddings (Gemma 4) are not on CUDA yet");
  if (s.query_temperature_beta != 0.0f)
    fail("CUDA decoder: the query temperature (Ministral 3) is not on CUDA yet");
  for (int64_t l = 0; l < s.layers; ++l) {
    if (s.layer[size_t(l)].kv_source != l)
      fail("CUDA decoder: KV-shared layers (Gemma 4) are not on CUDA yet");
    if (s.layer[size_t(l)].k_eq_v) fail("CUDA decoder: attention_k_eq_v is not on CUDA yet");
  }
  if (max_context <= 0 || max_context > s.max_position)
    fail("CUDA decoder: max_context %lld outside [1, %lld]", (long long)max_context,
         (long long)s.max_position);
  impl_ = std::make_unique<Impl>(model, max_context, weight_bytes_);
  Impl& m = *impl_;
  size_t& total = weight_bytes_;
  m.embed = upload_matrix(w.embed.dtype, w.embed.data, s.vocab, s.hidden, total);
  m.embed_scale = w.embed_scale;
  m.head_tied = w.head.data == w.embed.data;
  if (!m.head_tied) m.head = upload_matrix(w.head, total);
  m.final_norm = upload_vec(w.final_norm, total);
  int64_t max_q = 0, max_kv = 0, max_f = 0;
  for (int64_t l = 0; l < s.layers; ++l) {
    const LayerSpec& ls = s.layer[size_t(l)];
    const LayerWeights& lw = w.layers[size_t(l)];
    Layer L;
    L.attn_in_norm = upload_vec(lw.attn_in_norm, total);
    L.q_bias = upload_vec(lw.q_bias, total);
    L.k_bias = upload_vec(lw.k_bias, total);
    L.v_bias = upload_vec(lw.v_bias, total);
    L.q_norm = upload_vec(lw.q_norm, total);
    L.k_norm = upload_vec(lw.k_norm, total);
    L.o_bias = upload_vec(lw.o_bias, total);
    L.attn_out_norm = upload_vec(lw.attn_out_norm, total);
    L.mlp_in_norm = upload_vec(lw.mlp_in_norm, total);
    L.gate_bias = upload_vec(lw.gate_bias, total);
    L.up_bias = upload_vec(lw.up_bias, total);
    L.down_bias = upload_vec(lw.down_bias, total);
    L.mlp_out_norm = upload_vec(lw.mlp_out_norm, total);
    L.q = upload_matrix(lw.q, total);
    L.k = upload_matrix(lw.k, total);
    L.v = upload_matrix(lw.v, total);
    L.o = upload_matrix(lw.o, total);
    L.gate = upload_matrix(lw.gate, total);
    L.up = upload_matrix(lw.up, total);
    L.down = upload_matrix(lw.down, total);
    L.scalar = lw.scalar;
    const size_t kv_bytes = size_t(max_context * ls.kv_dim()) * sizeof(float);
    L.keys = DeviceBuffer(kv_bytes);
    L.values = DeviceBuffer(kv_bytes);
    const RopeTable rope = make_rope_table(s.rope_for(l), ls.head_dim);
    L.inv_freq = upload_vec(rope.inv_freq, total);
    L.rotary_dim = rope.rotary_dim;
    L.rope_scaling = rope.attention_scaling;
    max_q = std::max(max_q, ls.q_dim(s.heads));
    max_kv = std::max(max_kv, ls.kv_dim());
    max_f = std::max(max_f, ls.intermediate);
    m.layers.push_back(std::move(L));
  }
  const int32_t zero = 0;
  m.block_table = DeviceBuffer(sizeof(int32_t));
  m.block_table.upload(&zero, sizeof zero);
  const int64_t D = s.hidden;
  m.ids = DeviceBuffer(kChunk * sizeof(int32_t));
  m.positions = DeviceBuffer(kChunk * sizeof(int64_t));
  for (DeviceBuffer* b : {&m.h, &m.x, &m.out}) *b = DeviceBuffer(size_t(kChunk * D) * 4);
  m.q = DeviceBuffer(size_t(kChunk * max_q) * 4);
  m.attn = DeviceBuffer(size_t(kChunk * max_q) * 4);
  m.k = DeviceBuffer(size_t(kChunk * max_kv) * 4);
  m.v = DeviceBuffer(size_t(kChunk * max_kv) * 4);
  m.gate = DeviceBuffer(size_t(kChunk * max_f) * 4);
  m.up = DeviceBuffer(size_t(kChunk * max_f) * 4);
  m.logits = DeviceBuffer(size_t(kChunk * s.vocab) * 4);
}

SequenceDecoder::~SequenceDecoder() = default;

void SequenceDecoder::feed(const int32_t* ids, int64_t n, float* logits, bool all_logits) {
  Impl& m = *impl_;
  const ModelSpec& s = m.spec;
  const int64_t D = s.hidden, V = s.vocab;
  if (length_ + n > m.max_context)
    fail("CUDA decoder: %lld positions exceed the context of %lld", (long long)(length_ + n),
         (long long)m.max_context);
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= V) fail("token id %d is outside the vocabulary", ids[i]);
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const int64_t T = std::min(kChunk, n - c0), pos0 = length_;
    std::vector<int64_t> pos(static_cast<size_t>(T));
    for (int64_t i = 0; i < T; ++i) pos[size_t(i)] = pos0 + i;
    m.ids.upload(ids + c0, size_t(T) * sizeof(int32_t));
    m.positions.upload(pos.data(), size_t(T) * sizeof(int64_t));
    float* h = m.h.as<float>();
    float* x = m.x.as<float>();
    if (m.embed.dtype == DType::BF16)
      embed_rows_bf16(m.embed.buf.as<uint16_t>(), D, m.ids.as<int32_t>(), T, m.embed_scale, h,
                      nullptr);
    else
      embed_rows_f32(m.embed.buf.as<float>(), D, m.ids.as<int32_t>(), T, m.embed_scale, h, nullptr);
    for (int64_t l = 0; l < s.layers; ++l) {
      const LayerSpec& ls = s.layer[size_t(l)];
      Layer& L = m.layers[size_t(l)];
      const int64_t KV = ls.kv_dim(), Dh = ls.head_dim;
      float *q = m.q.as<float>(), *k = m.k.as<float>(), *v = m.v.as<float>();
      // Attention.
      rmsnorm(h, ptr(L.attn_in_norm), T, D, s.norm_eps, x, nullptr);
      linear(L.q, L.q_bias, x, T, q);
      if (s.qk_norm) rmsnorm(q, ptr(L.q_norm), T * s.heads, Dh, s.norm_eps, q, nullptr);
      linear(L.k, L.k_bias, x, T, k);
      linear(L.v, L.v_bias, x, T, v);
      if (s.qk_norm) rmsnorm(k, ptr(L.k_norm), T * ls.kv_heads, Dh, s.norm_eps, k, nullptr);
      if (s.v_norm) rmsnorm(v, nullptr, T * ls.kv_heads, Dh, s.norm_eps, v, nullptr);
      rope_rotate_half(q, T, s.heads, Dh, m.positions.as<int64_t>(), L.inv_freq.as<float>(),
                       L.rotary_dim, L.rope_scaling, nullptr);
      rope_rotate_half(k, T, ls.kv_heads, Dh, m.positions.as<int64_t>(), L.inv_freq.as<float>(),
                       L.rotary_dim, L.rope_scaling, nullptr);
      kv_write(k, pos0, T, KV, L.keys.as<float>(), m.block_table.as<int32_t>(), 0, m.max_context,
               nullptr);
      kv_write(v, pos0, T, KV, L.values.as<float>(), m.block_table.as<int32_t>(), 0, m.max_context,
               nullptr);
      PagedAttention p;
      p.heads = s.heads;
      p.kv_heads = ls.kv_heads;
      p.head_dim = Dh;
      p.scale = s.attn_scale;
      p.softcap = s.attn_softcap;
      p.window = ls.kind == AttentionKind::Sliding ? s.sliding_window : 0;
      p.k_base = L.keys.as<float>();
      p.v_base = L.values.as<float>();
      p.blocks = m.block_table.as<int32_t>();
      p.block_size = m.max_context;
      attention_paged(q, pos0, T, p, m.attn.as<float>(), nullptr);
      float* out = m.out.as<float>();
      linear(L.o, L.o_bias, m.attn.as<float>(), T, out);
      if (L.attn_out_norm.bytes())
        rmsnorm(out, ptr(L.attn_out_norm), T, D, s.norm_eps, out, nullptr);
      add_inplace(h, out, T * D, nullptr);
      // MLP.
      rmsnorm(h, ptr(L.mlp_in_norm), T, D, s.norm_eps, x, nullptr);
      linear(L.gate, L.gate_bias, x, T, m.gate.as<float>());
      linear(L.up, L.up_bias, x, T, m.up.as<float>());
      if (s.activation == Activation::SiLU)
        silu_mul(m.gate.as<float>(), m.up.as<float>(), T * ls.intermediate, nullptr);
      else
        gelu_tanh_mul(m.gate.as<float>(), m.up.as<float>(), T * ls.intermediate, nullptr);
      linear(L.down, L.down_bias, m.gate.as<float>(), T, out);
      if (L.mlp_out_norm.bytes()) rmsnorm(out, ptr(L.mlp_out_norm), T, D, s.norm_eps, out, nullptr);
      add_inplace(h, out, T * D, nullptr);
      if (L.scalar != 1.0f) scale_inplace(h, T * D, L.scalar, nullptr);
    }
    length_ += T;
    const bool last_chunk = c0 + T == n;
    if (!all_logits && !last_chunk) continue;
    const int64_t first = all_logits ? 0 : T - 1, rows = all_logits ? T : 1;
    rmsnorm(h + first * D, ptr(m.final_norm), rows, D, s.norm_eps, x, nullptr);
    const DevMatrix& head = m.head_tied ? m.embed : m.head;
    linear(head, DeviceBuffer(), x, rows, m.logits.as<float>());
    if (s.final_softcap > 0.0f) softcap(m.logits.as<float>(), rows * V, s.final_softcap, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    float* dst = all_logits ? logits + c0 * V : logits;
    m.logits.download(dst, size_t(rows * V) * sizeof(float));
  }
  CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace tandem::cuda
